"""What the six math benchmarks share: where their problems come from (``contracts.jsonl.read_rows``: JSON lines
or a JSON array), grading a Problem.

Problems are read from, in order:

1. an explicit path (``load(path)``, ``python -m eval.run --problems FILE``);
2. ``$THINKING_SEEDS_DATA/math/<dir>/test.jsonl``: JSON lines with the fields ``STORED`` names, a byte-for-byte
   copy of the file ``STORED`` names (a public GitHub repository at a commit; docs/data.md lists each benchmark's
   source, fields and checksum);
3. the benchmark's Hugging Face dataset at the hub's current revision (none is pinned: every result line records
   a sha256 of the problems as loaded); ``datasets`` is imported lazily, and offline this fails with a message
   naming options 1 and 2 and the layout.

Library code never guesses a path relative to the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

from scoring.benchmarks.base import DATA_ENV, Benchmark, Problem, Verdict
from contracts.jsonl import read_rows

__all__ = ["DATA_ENV", "MATH_GENERATION", "STORED", "layout_hint", "load_rows", "grade_problem", "math_benchmark"]

# n 32: the paper's avg@32 (§5.1); temperature 0.6 / top-p 0.95 are not the paper's (it states none) but the
# DeepSeek-R1 card's evaluation setting (docs/evaluation.md); a backbone's profile (eval/configs/) overrides them
MATH_GENERATION = {"n": 32, "temperature": 0.6, "top_p": 0.95, "max_tokens": 4096}


# what $THINKING_SEEDS_DATA/math/<dir>/test.jsonl holds, per <dir>: the upstream file it copies (repository@commit
# path) and the fields the loader reads (docs/data.md has the same table, with records and sha256)
STORED = {
    "aime24": ("QwenLM/Qwen2.5-Math@a45202bd16f1ec06f433442dc1152d0074773465 evaluation/data/aime24/test.jsonl",
               "id, problem (or question), answer"),
    "aime25": ("ZhangShimin1/PassKEval@4a1495c890778fc3f477853e13db03cc5ec772c2 data/aime2025/test.jsonl",
               "id, problem (or question), answer"),
    "amc23": ("QwenLM/Qwen2.5-Math@a45202bd16f1ec06f433442dc1152d0074773465 evaluation/data/amc23/test.jsonl",
              "id, problem (or question), answer"),
    "math500": ("hkust-nlp/simpleRL-reason@cf1c7858bfc145a27aa733e75d930d34f0d318a6 "
                "examples/simplelr_math_eval/data/math500/test.jsonl", "unique_id, problem, answer"),
    "minerva_math": ("QwenLM/Qwen2.5-Math@a45202bd16f1ec06f433442dc1152d0074773465 "
                     "evaluation/data/minerva_math/test.jsonl",
                     "idx, problem, solution (the gold is its last \\boxed{}; an answer field wins when present)"),
    "olympiadbench": ("QwenLM/Qwen2.5-Math@a45202bd16f1ec06f433442dc1152d0074773465 "
                      "evaluation/data/olympiadbench/test.jsonl",
                      "id, question, final_answer (a one-element list), is_multiple_answer, unit, context"),
}


def layout_hint(data_dir: str, *, hub_id: str | None = None, hub_split: str = "test",
                hub_config: str | None = None) -> str:
    """Where a math benchmark's problems can come from, as the sentence every loading error ends with."""
    source, fields = STORED[data_dir]
    hub = "" if hub_id is None else (
        f"; or, with network and the `datasets` package, the hub dataset {hub_id}"
        + (f" (config {hub_config})" if hub_config else "") + f", split {hub_split}, at its current revision")
    return (f"put the problems at ${DATA_ENV}/math/{data_dir}/test.jsonl ({DATA_ENV} names the data folder, the one "
            f"holding math/ and code/; JSON lines with {fields}; the tested copy is {source}, byte for byte: "
            f"docs/data.md), or pass --problems FILE{hub}")


def load_rows(path, *, name: str, data_dir: str, hub_id: str, hub_split: str = "test",
              hub_config: str | None = None) -> tuple[list[dict], str, list[str]]:
    """Raw rows, where they came from (explicit path, $THINKING_SEEDS_DATA, or the hub), and where each row is
    (``FILE:LINE``, or ``hf:ID row N``) for error messages."""
    if path is not None:
        located = read_rows(path, what="problems file")
        return [x.row for x in located], str(path), [x.where for x in located]
    root = os.environ.get(DATA_ENV)
    if root:
        file = Path(root) / "math" / data_dir / "test.jsonl"
        if not file.is_file():
            raise FileNotFoundError(f"{name}: {DATA_ENV}={root} but {file} does not exist; "
                                    + layout_hint(data_dir))
        located = read_rows(file, what="problems file")
        return [x.row for x in located], str(file), [x.where for x in located]
    try:
        import datasets
    except ImportError:
        raise RuntimeError(f"{name}: no problems file given and {DATA_ENV} is not set, and the `datasets` package "
                           f"needed to fetch {hub_id} is not installed: "
                           + layout_hint(data_dir, hub_id=hub_id, hub_split=hub_split, hub_config=hub_config)) from None
    try:
        ds = datasets.load_dataset(hub_id, hub_config, split=hub_split)
    except Exception as e:
        raise RuntimeError(f"{name}: no problems file given, {DATA_ENV} is not set, and the hub dataset {hub_id} "
                           f"could not be loaded ({type(e).__name__}: {' '.join(str(e).split())[:200]}; offline?): "
                           + layout_hint(data_dir)) from e
    rows = [dict(r) for r in ds]
    return rows, f"hf:{hub_id}", [f"hf:{hub_id} row {i + 1}" for i in range(len(rows))]


def field(row: dict, *names: str, where: str):
    """The first of ``names`` present in ``row``; a clear error otherwise."""
    for n in names:
        if n in row and row[n] is not None:
            return row[n]
    raise ValueError(f"{where}: row has none of the fields {list(names)} (keys: {sorted(row)})")


def grade_problem(response: str, problem: Problem) -> Verdict:
    """math-verify grading of one response (``scoring.math.grade_math``) with the problem's flags.

    math-verify's SIGALRM timeout is off: the runner grades in ``scoring.pool`` with a hard timeout.
    """
    from scoring.math import grade_math
    return grade_math(response, problem.gold, multiple_answer=problem.meta.get("multiple_answer", False),
                      unit=problem.meta.get("unit"))


def math_benchmark(name: str, version: str, load, description: str) -> Benchmark:
    return Benchmark(name=name, version=version, kind="math", load=load, grade=grade_problem,
                     default_template="qwen-math", generation=dict(MATH_GENERATION), description=description)
