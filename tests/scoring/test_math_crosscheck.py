"""The primary grader (scoring.math, math-verify) and the Qwen-style cross-check (scoring.qwen) side by side.

1. A table of hand cases — e-notation, truncation, units, percentages, intervals, fractions, extraction — with the
   verdict each grader must give, where they agree and where they differ (the reason is in the comment and in
   docs/graders.md, "Math").
2. ``tests/fixtures/math/qwen_reference.jsonl``: 2347 responses built from golds of the six benchmarks, each with
   the verdict of Qwen2.5-Math's own evaluation code (made by ``make_qwen_reference.py`` beside it). The
   cross-check must agree with it on exactly the counted cases; the primary's agreement is counted too.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from scoring.math import grade_math
from scoring.pool import WorkerPool, apply, math_item, qwen_item
from scoring.qwen import disagreements, extract_answer_qwen, grade_qwen, math_equal, qwen_reading, strip_string

pytestmark = pytest.mark.slow   # the reference grader runs in worker processes over every benchmark gold

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "math" / "qwen_reference.jsonl"
HBAR = r"\hbar \omega(v+1 / 2)-\frac{E_{0}^{2} e^{2}}{2 m \omega^{2}}"   # Minerva 261

# (response, gold, grading flags, primary verdict, cross-check verdict)
CASES = [
    # e-notation golds are numbers: 4.5e33 = 4.5·10^33, never 4.5·e·33
    (r"\boxed{4.5 \times 10^{33}}", "4.5e33", {}, "pass", True),
    (r"\boxed{4.5e33}", "4.5e33", {}, "pass", True),
    (r"\boxed{L = 4.5e33}", "4.5e33", {}, "pass", True),
    (r"\boxed{e-5}", "1e-5", {}, "wrong_answer", False),                # Euler's e minus 5
    (r"\boxed{10^{-5}}", "1e-5", {}, "pass", True),
    (r"\boxed{3.9 \times 10^{-10}}", "3.89e-10", {}, "wrong_answer", False),
    (r"\boxed{4.5 \cdot 10^{33} \mathrm{~erg}}", "4.5e33", {}, "pass", False),  # Qwen keeps a \mathrm unit
    (r"\boxed{1.4904 \times 10^{4}}", "1.4903e4", {}, "wrong_answer", True),    # Qwen: relative 1e-4
    # truncation: a final box cut off is the answer; never the earlier box
    (r"First \boxed{7}. Wait, recheck: \boxed{\frac{7}{", "7", {}, "wrong_answer", False),
    (r"First \boxed{7}. Wait, recheck: \boxed{7", "7", {}, "wrong_answer", True),   # Qwen reads the cut "7"
    (r"\boxed{(a+5)", "(a+5)(b+2)", {}, "wrong_answer", False),
    # units
    (r"\boxed{45 \text{ minutes}}", "45", {}, "pass", True),
    (r"\boxed{45 \text{ minutes}}", "45", {"unit": "minute"}, "pass", True),
    (r"\boxed{12 \text{ cm}}", "12", {}, "pass", True),
    (r"\boxed{\frac{600}{7} \text{ km/h}}", r"\frac{600}{7}", {"unit": "km/h"}, "pass", True),
    # percentages
    (r"\boxed{4.2\%}", "4.2", {}, "wrong_answer", True),                 # math-verify: 4.2% is 0.042
    (r"\boxed{4.2\%}", "4.2", {"unit": "%"}, "pass", True),
    (r"\boxed{42\%}", "0.42", {}, "pass", True),
    (r"\boxed{2}", "200", {}, "wrong_answer", True),                     # Qwen's include_percentage
    # intervals and tuples
    (r"\boxed{(1,2)}", "(1,2)", {}, "pass", True),
    (r"\boxed{[1,2)}", "(1,2)", {}, "wrong_answer", True),               # Qwen ignores the bracket kind
    (r"\boxed{(-\infty, 3]}", r"(-\infty,3]", {}, "pass", True),
    (r"\boxed{84, 69}", "$69$,$84$", {"multiple_answer": True}, "pass", False),   # Qwen does not reorder
    # fractions and decimals
    (r"\boxed{\dfrac{3}{4}}", "3/4", {}, "pass", True),
    (r"\boxed{0.75}", r"\frac{3}{4}", {}, "pass", True),
    (r"\boxed{0.333333}", r"\frac{1}{3}", {}, "pass", True),
    (r"\boxed{0.33}", r"\frac{1}{3}", {}, "wrong_answer", False),
    (r"\boxed{\frac{2}{3}}", r"\frac{1}{3}", {}, "wrong_answer", False),
    (r"\boxed{13536}", "13535", {}, "wrong_answer", True),               # Qwen: relative 1e-4
    (r"\boxed{x = 5}", "5", {}, "pass", True),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", {}, "pass", True),
    # extraction
    (r"<think>\boxed{3}</think> I am not sure.", "3", {}, "no_answer", True),   # Qwen reads the thinking
    (r"<think>\boxed{3}</think> So \boxed{4}.", "4", {}, "pass", True),
    ("Multiplying, we get 12 and then 18", "18", {}, "no_answer", True),         # Qwen's last-number fallback
    ("The answer is 18.", "18", {}, "pass", True),
    (r"The answer is \frac{3}{2}. Done.", r"\frac{3}{2}", {}, "pass", False),    # Qwen takes the rest of the text
    # a gold the default math-verify parse read as the "2" inside it
    (r"\boxed{2}", HBAR, {}, "wrong_answer", False),
]


@pytest.mark.parametrize("response, gold, flags, primary, cross", CASES)
def test_primary_and_crosscheck_table(response, gold, flags, primary, cross):
    v = grade_math(response, gold, **flags)
    assert v.verdict == primary
    assert v.correct is (primary == "pass")
    assert grade_qwen(response, gold, unit=flags.get("unit")) is cross


def test_table_covers_agreement_and_disagreement():
    agree = sum((p == "pass") == c for _, _, _, p, c in CASES)
    assert (agree, len(CASES) - agree) == (26, 11)


def test_truncated_verdict_detail_and_answer():
    v = grade_math(r"So \boxed{12}. Hmm, no: \boxed{\frac{25}{", "12")
    assert (v.correct, v.verdict, v.answer) == (False, "wrong_answer", r"\frac{25}{")
    assert v.detail.startswith("truncated")
    # the cross-check reads the cut-off box too, as Qwen's extractor does
    assert extract_answer_qwen(r"So \boxed{12}. Hmm, no: \boxed{\frac{25}{") == r"\frac{25}{"


def test_crosscheck_reads_on_its_own():
    # its own extraction (no </think> split, Qwen's brace counting), normalisation and equality
    assert extract_answer_qwen(r"<think>\boxed{3}</think> unsure") == "3"
    assert extract_answer_qwen("final answer is $\\frac{1}{2}$. I hope it is correct.") == r"\frac{1}{2}"
    assert extract_answer_qwen("we get 12 then 18", use_last_number=False) == ""
    assert extract_answer_qwen(r"\boxed{\{1, 2\}}") == "{1,2}"
    assert strip_string(r"\left( 3, \dfrac{\pi}{2} \right)") == r"(3,\frac{\pi}{2})"
    assert strip_string("6 m") == "6" and strip_string("6m") == "6m"
    assert strip_string(r"\frac{37}{4} m", skip_unit=True) == r"\frac{37}{4}m"
    assert qwen_reading(r"\boxed{27}", 27.0) == ("27", "27")
    # Python syntax reaches sympy's parse_expr only as plain arithmetic: no builtins, attributes or dunders
    assert not math_equal("exec(chr(49))", "1") and not math_equal("__import__(1)", "1")
    assert math_equal("2*x+1", "1+2*x")


def test_disagreement_rows_say_both_readings():
    rows = [{"problem_id": "p7", "gold": r"\frac{3}{2}",
             "responses": [r"The answer is \frac{3}{2}. Done.", r"\boxed{\frac{3}{2}}"],
             "answers": [r"\frac{3}{2}", r"\frac{3}{2}"], "correct": [True, True], "correct_qwen": [False, True]}]
    rate, dis = disagreements(rows)
    assert rate == 0.5
    assert dis == [{"problem_id": "p7", "sample": 0, "gold": r"\frac{3}{2}", "answer": r"\frac{3}{2}",
                    "qwen_answer": r"\frac{3}{2}.Done", "qwen_gold": r"\frac{3}{2}", "math_verify": True,
                    "qwen": False, "response": r"The answer is \frac{3}{2}. Done."}]
    json.dumps(dis)   # written as JSONL by eval.run


@pytest.fixture(scope="module")
def reference():
    rows = [json.loads(line) for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    items = []
    for r in rows:
        items.append((apply, math_item, r["response"], r["gold"], r["multiple_answer"], r["unit"]))
        items.append((apply, qwen_item, r["response"], r["gold"], r["multiple_answer"], r["unit"], r["benchmark"]))
    with WorkerPool(apply, workers=2, timeout=30.0) as pool:
        res = pool.map(items)
    assert all(x.status == "ok" for x in res), [x.detail for x in res if x.status != "ok"][:2]
    for j, r in enumerate(rows):
        r["primary"], r["cross"] = res[2 * j].value.correct, bool(res[2 * j + 1].value)
    return rows


def test_crosscheck_agrees_with_qwen_code(reference):
    """The cross-check against Qwen2.5-Math's own code on 2347 cases: 2308 agree (98.3%). The 39 others: Qwen's
    vendored latex2sympy reads the longest parseable prefix and drops the rest ("\\frac{3}{2}.Done" is 3/2; 36
    "phrase_tail" cases), and its MathQA unit list strips single letters (a, b...) from the answer, which it
    normalises twice, and the gold, normalised once (one OlympiadBench prose gold, 3 cases)."""
    rows = reference
    assert len(rows) == 2347
    by_bench = Counter(r["benchmark"] for r in rows)
    assert by_bench == {"minerva": 790, "olympiadbench": 535, "math500": 522, "amc23": 200, "aime24": 150,
                        "aime25": 150}
    assert sum(r["cross"] == r["qwen"] for r in rows) == 2308
    assert Counter(r["kind"] for r in rows if r["cross"] != r["qwen"]) == {
        "phrase_tail": 36, "boxed": 1, "think_only": 1, "truncated_at_brace": 1}
    assert all(r["qwen"] and not r["cross"] for r in rows if r["cross"] != r["qwen"] and r["kind"] == "phrase_tail")
    assert sum(r["qwen"] for r in rows) == 1511 and sum(r["cross"] for r in rows) == 1478


def test_primary_against_qwen_and_crosscheck(reference):
    """How often math-verify (the score) agrees with Qwen's code and with the cross-check. The fixture is built to
    probe the differences (cut-off boxes, answers only in the thinking, last numbers...), so the rates are low by
    design; on answers in a complete final box they are high."""
    rows = reference
    assert sum(r["primary"] for r in rows) == 1231
    assert sum(r["primary"] == r["qwen"] for r in rows) == 1667
    assert sum(r["primary"] == r["cross"] for r in rows) == 1630
    differ = Counter((r["kind"], r["primary"]) for r in rows if r["primary"] != r["cross"])
    assert differ == {("phrase_tail", True): 161, ("truncated_at_brace", False): 153, ("think_only", False): 147,
                      ("last_number", False): 76, ("times_100", False): 69, ("sci_cdot_unit", True): 58,
                      ("truncated", False): 20, ("reordered", True): 16, ("percent", False): 9,
                      ("bracket_flip", False): 5, ("sci_off", False): 2, ("plus_one", False): 1}
    math500 = [r for r in rows if r["benchmark"] == "math500"]
    assert (len(math500), sum(r["primary"] == r["cross"] for r in math500)) == (522, 360)
    boxed = [r for r in math500 if r["kind"] in BOXED_KINDS]
    assert (len(boxed), sum(r["primary"] == r["cross"] for r in boxed)) == (BOXED_MATH500, BOXED_MATH500_AGREE)


# kinds whose answer sits in a complete final box: only the equality differs, not the extraction
BOXED_KINDS = {"boxed", "other_gold", "dfrac", "x_eq", "text_unit", "percent", "plus_one", "times_100", "decimal_6",
               "decimal_2", "bracket_flip", "reordered", "think_then_wrong"}
BOXED_MATH500, BOXED_MATH500_AGREE = 306, 289
