"""AMC 2023 (40 problems, AMC 12A+12B). Data: Qwen2.5-Math's ``evaluation/data/amc23/test.jsonl``.

Gold: ``answer`` is a JSON float (``27.0``); it is turned into the string "27" (non-integers keep their decimal
form) so the gold written to the samples file reads like an answer.
"""

from __future__ import annotations

from scoring.benchmarks.base import Problem
from scoring.benchmarks.mathbench import field, load_rows, math_benchmark
from scoring.math import normalize_gold

VERSION = "amc23-1"


def load(path=None) -> list[Problem]:
    rows, _, wheres = load_rows(path, name="amc23", data_dir="amc23", hub_id="math-ai/amc23")
    return [Problem(id=str(field(r, "id", where=wheres[i])),
                    question=field(r, "problem", "question", where=wheres[i]),
                    gold=normalize_gold(field(r, "answer", where=wheres[i])),
                    meta={"url": r.get("url")})
            for i, r in enumerate(rows)]


BENCHMARK = math_benchmark("amc23", VERSION, load, "AMC 2023 (12A+12B), 40 problems, numeric answers")
