"""AIME 2024 (30 problems, I and II). Data: Qwen2.5-Math's ``evaluation/data/aime24/test.jsonl``.

Gold: the ``answer`` string; seven are zero-padded ("025"), so answers are compared as numbers by math-verify
(``025`` and ``25`` both parse to 25), never as strings.
"""

from __future__ import annotations

from scoring.benchmarks.base import Problem
from scoring.benchmarks.mathbench import field, load_rows, math_benchmark

VERSION = "aime24-1"


def load(path=None) -> list[Problem]:
    rows, _, wheres = load_rows(path, name="aime24", data_dir="aime24", hub_id="HuggingFaceH4/aime_2024",
                          hub_split="train")
    return [Problem(id=str(field(r, "id", where=wheres[i])),
                    question=field(r, "problem", "question", where=wheres[i]),
                    gold=str(field(r, "answer", where=wheres[i])).strip(),
                    meta={"url": r.get("url")})
            for i, r in enumerate(rows)]


BENCHMARK = math_benchmark("aime24", VERSION, load, "AIME 2024 I+II, 30 integer answers 0-999")
