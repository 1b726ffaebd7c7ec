"""OlympiadBench, OE_TO_maths_en_COMP: 675 English open-ended text-only competition problems.
Data: Qwen2.5-Math's ``evaluation/data/olympiadbench/test.jsonl``.

Gold: ``final_answer[0]`` (always one element) with ``$...$`` delimiters stripped at grading time. 94 problems have
``is_multiple_answer``: the gold lists several comma-separated answers, all must be given (any order; see
``scoring.math.grade_math``). 8 give a ``unit`` (``km/h``, ``%``, ``^{\\circ}``...), stripped from gold and
response before comparing.

Two golds are not parseable as written; their parseable form is substituted (``GOLD_FIXES``), keeping the meaning.
"""

from __future__ import annotations

from scoring.benchmarks.base import Problem
from scoring.benchmarks.mathbench import field, load_rows, math_benchmark

VERSION = "olympiadbench-1"

# id -> (gold as stored, gold used). Data quirks, checked by hand against the solutions:
GOLD_FIXES = {
    # "\max" inside a subscript breaks the LaTeX parser; the answer is the expression n^2 - n - 1
    "1782": ("$m_{\\max }=n^{2}-n-1$", "n^{2}-n-1"),
    # a stray "t" before the interval (0, 4]
    "2045": ("$t(0,4]$", "(0,4]"),
}


def load(path=None) -> list[Problem]:
    rows, _, wheres = load_rows(path, name="olympiadbench", data_dir="olympiadbench", hub_id="Hothan/OlympiadBench",
                          hub_config="OE_TO_maths_en_COMP", hub_split="train")
    out = []
    for i, r in enumerate(rows):
        where = wheres[i]
        pid = str(field(r, "id", where=where))
        final = field(r, "final_answer", where=where)
        gold = final[0] if isinstance(final, list) else final
        if pid in GOLD_FIXES and gold == GOLD_FIXES[pid][0]:
            gold = GOLD_FIXES[pid][1]
        question = field(r, "question", where=where)
        if r.get("context"):
            question = f"{r['context']}\n{question}"
        out.append(Problem(id=pid, question=question, gold=gold,
                           meta={"multiple_answer": bool(r.get("is_multiple_answer")), "unit": r.get("unit") or None,
                                 "answer_type": r.get("answer_type"), "subfield": r.get("subfield")}))
    return out


BENCHMARK = math_benchmark("olympiadbench", VERSION, load, "OlympiadBench OE_TO_maths_en_COMP, 675 problems")
