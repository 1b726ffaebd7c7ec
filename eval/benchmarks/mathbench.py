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

__all__ = ["DATA_ENV", "MATH_GENERATION", "read_jsonl", "read_jsonl_located", "load_rows", "grade_problem", "math_benchmark"]

DATA_ENV = "THINKING_SEEDS_DATA"
# the paper reports avg@32 at temperature 0.6, top-p 0.95
MATH_GENERATION = {"n": 32, "temperature": 0.6, "top_p": 0.95, "max_tokens": 4096}


def read_jsonl_located(path: str | os.PathLike) -> tuple[list[dict], list[str]]:
    """Rows of a JSONL file (or a JSON array in a ``.json`` file) and where each is: ``FILE:LINE`` (1-based file
    lines, blank lines counted), ``FILE[i]`` for an array's item. A malformed line raises ValueError naming the
    file and line; a missing file, FileNotFoundError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"problems file {path} does not exist")
    if path.suffix == ".json":
        text = path.read_text(encoding="utf-8")
        if text.lstrip().startswith("["):
            try:
                rows = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{e.lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
            bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
            if bad is not None:
                raise ValueError(f"{path}[{bad}]: expected a JSON array of objects, got {type(rows[bad]).__name__}")
            return rows, [f"{path}[{i}]" for i in range(len(rows))]
    located = list(iter_jsonl(path))
    return [row for _, row in located], [f"{path}:{lineno}" for lineno, _ in located]


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows of a JSONL file (or a JSON array in a ``.json`` file); errors as ``read_jsonl_located``."""
    return read_jsonl_located(path)[0]


def load_rows(path, *, name: str, data_dir: str, hub_id: str, hub_split: str = "test",
              hub_config: str | None = None) -> tuple[list[dict], str, list[str]]:
    """Raw rows, where they came from (explicit path, $THINKING_SEEDS_DATA, or the hub), and where each row is
    (``FILE:LINE``, or ``hf:ID row N``) for error messages."""
    if path is not None:
        rows, wheres = read_jsonl_located(path)
        return rows, str(path), wheres
    root = os.environ.get(DATA_ENV)
    if root:
        file = Path(root) / "math" / data_dir / "test.jsonl"
        if not file.is_file():
            raise FileNotFoundError(f"{DATA_ENV}={root} but {file} does not exist; lay the folder out like "
                                    f"shared/data (math/{data_dir}/test.jsonl) or pass --problems FILE")
        rows, wheres = read_jsonl_located(file)
        return rows, str(file), wheres
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
