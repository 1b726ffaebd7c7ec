"""MATH-500: the PRM800K 500-problem subset of the MATH test set. Data: simpleRL-reason's copy.

Gold: the ``answer`` field (LaTeX; it equals the last ``\\boxed{}`` of ``solution`` for all 500 problems).
Ids are ``unique_id`` (``test/precalculus/807.json``); subject and level go to ``meta``.
"""

from __future__ import annotations

from scoring.benchmarks.base import Problem
from scoring.benchmarks.mathbench import field, load_rows, math_benchmark

VERSION = "math500-1"


def load(path=None) -> list[Problem]:
    rows, _, wheres = load_rows(path, name="math500", data_dir="math500", hub_id="HuggingFaceH4/MATH-500")
    return [Problem(id=str(field(r, "unique_id", where=wheres[i])),
                    question=field(r, "problem", where=wheres[i]),
                    gold=str(field(r, "answer", where=wheres[i])),
                    meta={"subject": r.get("subject"), "level": r.get("level"), "solution": r.get("solution")})
            for i, r in enumerate(rows)]


BENCHMARK = math_benchmark("math500", VERSION, load, "MATH-500 (PRM800K test subset)")
