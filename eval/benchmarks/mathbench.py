"""What the six math benchmarks share: where their problems come from, JSONL reading, grading a Problem.

Problems are read from, in order:

1. an explicit path (``load(path)``, ``python -m eval.run --problems FILE``);
2. ``$THINKING_SEEDS_DATA/math/<dir>/test.jsonl`` — a folder laid out like the project's ``shared/data``;
3. the benchmark's Hugging Face dataset (``datasets`` imported lazily; offline this fails with a message naming
   options 1 and 2).

Library code never guesses a path relative to the repository.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from eval.benchmarks.base import Benchmark, Problem, Verdict
from contracts.jsonl import iter_jsonl

__all__ = ["DATA_ENV", "MATH_GENERATION", "read_jsonl", "load_rows", "grade_problem", "math_benchmark"]

DATA_ENV = "THINKING_SEEDS_DATA"
# the paper reports avg@32 at temperature 0.6, top-p 0.95
MATH_GENERATION = {"n": 32, "temperature": 0.6, "top_p": 0.95, "max_tokens": 4096}


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL file (or a JSON array in a ``.json`` file). A malformed line raises ValueError naming the
    file and the 1-based line number; blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"problems file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip().startswith("["):
        rows = json.loads(text)
        if not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{path}: expected a JSON array of objects")
        return rows
    return [row for _, row in iter_jsonl(path)]


def load_rows(path, *, name: str, data_dir: str, hub_id: str, hub_split: str = "test",
              hub_config: str | None = None) -> tuple[list[dict], str]:
    """Raw rows and where they came from (explicit path, $THINKING_SEEDS_DATA, or the hub)."""
    if path is not None:
        return read_jsonl(path), str(path)
    root = os.environ.get(DATA_ENV)
    if root:
        file = Path(root) / "math" / data_dir / "test.jsonl"
        if not file.is_file():
            raise FileNotFoundError(f"{DATA_ENV}={root} but {file} does not exist; lay the folder out like "
                                    f"shared/data (math/{data_dir}/test.jsonl) or pass --problems FILE")
        return read_jsonl(file), str(file)
    try:
        import datasets
    except ImportError:
        raise RuntimeError(f"{name}: no problems file given and {DATA_ENV} is not set, and the `datasets` package "
                           f"needed to fetch {hub_id} is not installed. Pass --problems FILE (a JSONL file), set "
                           f"{DATA_ENV} to a folder laid out like shared/data, or pip install datasets") from None
    try:
        ds = datasets.load_dataset(hub_id, hub_config, split=hub_split)
    except Exception as e:
        raise RuntimeError(f"{name}: could not load the hub dataset {hub_id} ({type(e).__name__}: {e}). Offline? "
                           f"Pass --problems FILE or set {DATA_ENV} to a folder laid out like shared/data") from e
    return [dict(r) for r in ds], f"hf:{hub_id}"


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
