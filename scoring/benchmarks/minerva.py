"""Minerva math: 272 MIT OpenCourseWare science/engineering problems (Lewkowycz et al. 2022).
Data: Qwen2.5-Math's ``evaluation/data/minerva_math/test.jsonl``.

Gold: there is no answer field; the gold is the last ``\\boxed{...}`` of ``solution`` (brace matching), as in
Qwen2.5-Math's harness. Hub copies that carry an ``answer`` field use it directly. Three boxed golds are
Python, not LaTeX (``GOLD_FIXES``); one (idx 269, ``E_{1},E_{2}``) stays a string for math-verify, which does not
parse lists of subscripted symbols, and is compared as a canonical string.
"""

from __future__ import annotations

from scoring.benchmarks.base import Problem
from scoring.benchmarks.mathbench import field, load_rows, math_benchmark
from scoring.math import extract_boxed

VERSION = "minerva-1"

# idx -> (boxed gold as stored, gold used). Three boxes hold Python expressions instead of LaTeX:
GOLD_FIXES = {
    "5": ("np.arcsin(10/13)", "\\arcsin(10/13)"),   # numpy call
    "38": ("-1./3", "-1/3"),                          # Python float literal "1."
    "49": ("-3./2", "-3/2"),
}


def gold_from_solution(solution: str, *, where: str) -> str:
    boxes = extract_boxed(solution)
    if not boxes:
        raise ValueError(f"{where}: the solution has no \\boxed{{}} to take the gold answer from")
    return boxes[-1]


def load(path=None) -> list[Problem]:
    rows, _, wheres = load_rows(path, name="minerva", data_dir="minerva_math", hub_id="math-ai/minervamath")
    out = []
    for i, r in enumerate(rows):
        where = wheres[i]
        gold = r["answer"] if r.get("answer") is not None else gold_from_solution(
            field(r, "solution", where=where), where=where)
        pid = str(field(r, "idx", "id", where=where)) if ("idx" in r or "id" in r) else str(i)
        if pid in GOLD_FIXES and gold == GOLD_FIXES[pid][0]:
            gold = GOLD_FIXES[pid][1]
        out.append(Problem(id=pid, question=field(r, "problem", "question", where=where), gold=str(gold),
                           meta={"type": r.get("type"), "solution": r.get("solution")}))
    return out


BENCHMARK = math_benchmark("minerva", VERSION, load, "Minerva math (OCW), 272 problems, gold = last box")
