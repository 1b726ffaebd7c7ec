"""AIME 2025 (30 problems: ids 0-14 from AIME 2025 I, 15-29 from II). Data: PassKEval's ``data/aime2025``.

Gold: the ``answer`` string (integers 0-999), compared numerically by math-verify. This copy has no broken
``\\f``/``\\t`` escapes (math-ai/aime25 does); three problems (17, 19, 20) carry TikZ source, kept as is.
"""

from __future__ import annotations

from scoring.benchmarks.base import Problem
from scoring.benchmarks.mathbench import field, load_rows, math_benchmark

VERSION = "aime25-1"


def load(path=None) -> list[Problem]:
    rows, _, wheres = load_rows(path, name="aime25", data_dir="aime25", hub_id="yentinglin/aime_2025", hub_split="train")
    return [Problem(id=str(field(r, "id", where=wheres[i])),
                    question=field(r, "problem", "question", where=wheres[i]),
                    gold=str(field(r, "answer", where=wheres[i])).strip(),
                    meta={"url": r.get("url")})
            for i, r in enumerate(rows)]


BENCHMARK = math_benchmark("aime25", VERSION, load, "AIME 2025 I+II, 30 integer answers 0-999")
