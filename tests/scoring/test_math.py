"""Math grading: extraction, math-verify equivalences, the six benchmarks' golds and reference solutions,
the Qwen-style cross-check, the process pool's hard timeout, templates, and layering."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scoring.benchmarks import BENCHMARKS, MATH_BENCHMARKS, get_benchmark
from scoring.benchmarks.base import Problem
from scoring.math import (extract_answer, extract_boxed, extract_final, gold_parses, grade_math, normalize_gold,
                          split_top_level)
from scoring.grading import grade_math_many
from scoring.pool import WorkerPool, apply, math_item, qwen_item
from scoring.qwen import disagreements, math_equal, strip_string
from scoring.templates import MATH_TEMPLATES, TASK_TEMPLATES, TEMPLATES, render_prompt

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
REPO = Path(__file__).resolve().parents[2]
needs_data = pytest.mark.skipif(not (DATA / "math").is_dir(), reason=f"benchmark data not found at {DATA}")

# MATH-500 / Minerva problems whose reference solution is NOT accepted against its own gold, with the reason.
# All three are data quirks: the solution's box holds Python, which scoring.benchmarks.minerva.GOLD_FIXES turns
# into LaTeX for the gold (so models are graded against the intended answer); the stored box stays unparseable.
REFERENCE_ALLOW_LIST = {
    "minerva:5": "box holds numpy code 'np.arcsin(10/13)'; gold fixed to \\arcsin(10/13)",
    "minerva:38": "box holds the Python literal '-1./3'; gold fixed to -1/3",
    "minerva:49": "box holds the Python literal '-3./2'; gold fixed to -3/2",
}
# Golds math-verify leaves as strings (compared as canonical strings instead): a prose answer. (Minerva 269
# "E_{1},E_{2}" parses since subscripted capital E is respelled; scoring.math._symbols.)
UNPARSED_GOLDS = {"olympiadbench:1965": "$f(x)=a x+b$, where $b$ is an arbitrary integer, and $a$ is an arbitrary "
                                        "positive integer with $\\mho(a)=0$"}


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(apply, workers=2, timeout=20.0) as p:
        yield p


@pytest.fixture(scope="module")
def problems():
    if not (DATA / "math").is_dir():
        pytest.skip(f"benchmark data not found at {DATA}")
    dirs = {"aime24": "aime24", "aime25": "aime25", "amc23": "amc23", "math500": "math500",
            "minerva": "minerva_math", "olympiadbench": "olympiadbench"}
    return {b: get_benchmark(b).load(DATA / "math" / d / "test.jsonl") for b, d in dirs.items()}


# ---- extraction -------------------------------------------------------------------------------------------------

def test_extract_answer_hand_cases():
    assert extract_answer(r"so \boxed{\frac{1}{\sqrt{2}}} done") == r"\frac{1}{\sqrt{2}}"
    assert extract_answer(r"first \boxed{1}, finally \boxed{\{1, 2\}}") == r"\{1, 2\}"   # last box, escaped braces
    assert extract_answer(r"\boxed{a^{b^{c}}}") == "a^{b^{c}}"                                   # nested braces
    # only the text after </think> counts
    assert extract_answer(r"<think>maybe \boxed{3}</think> The result is \boxed{4}.") == "4"
    assert extract_answer(r"<think>maybe \boxed{3}</think> I am not sure.") is None
    assert extract_answer(r"thinking... \boxed{7}") == "7"               # no </think>: the whole response
    assert extract_answer(r"\fbox{12}") == "12"
    assert extract_answer(r"$\boxed 5$") == "5"
    # a final box cut off by the token limit is the answer (and wrong), never the earlier box it replaced
    assert extract_answer(r"cut off \boxed{2} then \boxed{\frac{1}{") == r"\frac{1}{"
    assert extract_final(r"cut off \boxed{2} then \boxed{\frac{1}{") == (r"\frac{1}{", True)
    assert extract_final(r"\boxed{2} and \boxed{3}") == ("3", False)
    assert extract_boxed(r"cut off \boxed{2} then \boxed{\frac{1}{") == ["2"]   # complete boxes only
    assert extract_answer("The answer is 42.") == "42"
    assert extract_answer("Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.") == r"\frac{3}{4}"
    assert extract_answer("no box, just 17 and 18") is None               # no last-number fallback
    assert extract_boxed(r"\boxed{1} and \boxed{2}") == ["1", "2"]
    assert split_top_level(r"(1,2), (3,4), \{5,6\}") == ["(1,2)", "(3,4)", r"\{5,6\}"]


def test_normalize_gold():
    assert normalize_gold(27.0) == "27"
    assert normalize_gold(2.5) == "2.5"
    assert normalize_gold("$(-\\infty, 0) \\cup\\{1\\}$.") == "(-\\infty, 0) \\cup\\{1\\}"
    assert normalize_gold("$69$,$84$") == "69,84"


# ---- equivalences ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("response, gold, ok", [
    (r"\boxed{0.5}", r"\frac{1}{2}", True),
    (r"\boxed{\frac12}", "0.5", True),
    (r"\boxed{25}", "025", True),            # AIME zero padding
    (r"\boxed{025}", "25", True),
    (r"\boxed{27}", 27.0, True),              # AMC float gold
    (r"\boxed{26}", 27.0, False),
    (r"\boxed{x = 5}", "5", True),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)", True),
    (r"\boxed{(3, \pi)}", r"\left( 3, \frac{\pi}{2} \right)", False),
    ("I give up.", "3", False),
])
def test_grade_math_equivalences(response, gold, ok):
    v = grade_math(response, gold)
    assert v.correct is ok
    assert v.verdict == ("pass" if ok else ("no_answer" if v.answer is None else "wrong_answer"))


def test_grade_math_no_answer_verdict():
    v = grade_math("I give up.", "3")
    assert (v.correct, v.verdict, v.answer) == (False, "no_answer", None)


def test_olympiadbench_multi_answer_and_units():
    gold = "$(1,8,19), (2,7,13), (4,5,7)$"
    assert grade_math(r"\boxed{(4,5,7), (1,8,19), (2,7,13)}", gold, multiple_answer=True).correct   # any order
    assert not grade_math(r"\boxed{(4,5,7), (1,8,19)}", gold, multiple_answer=True).correct          # one missing
    assert grade_math(r"so \boxed{84} and \boxed{69}", "$69$,$84$", multiple_answer=True).correct      # two boxes
    assert not grade_math(r"\boxed{84}", "$69$,$84$", multiple_answer=True).correct
    assert grade_math(r"\boxed{f(x)=-x, f(x)=x}", "$f(x)=x,f(x)=-x$", multiple_answer=True).correct
    # units given separately by OlympiadBench, stripped from both sides
    assert grade_math(r"\boxed{4.2\%}", "4.2", unit="%").correct
    assert not grade_math(r"\boxed{4.2\%}", "4.2").correct          # without the unit the % changes the value
    assert grade_math(r"\boxed{45 \text{ minutes}}", "45", unit="minute").correct
    assert grade_math(r"\boxed{\frac{600}{7} \text{ km/h}}", r"$\frac{600}{7}$", unit="km/h").correct
    assert grade_math(r"\boxed{166 \mathrm{~cm^2}}", "$166$", unit="$cm^2$").correct
    assert not grade_math(r"\boxed{167 \text{ km}}", r"$\frac{41}{12}$", unit="km").correct


# ---- the six benchmarks ---------------------------------------------------------------------------------------

@pytest.mark.slow
@needs_data
def test_benchmark_sizes_ids_and_gold_parse(problems, pool):
    sizes = {b: len(p) for b, p in problems.items()}
    assert sizes == {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "minerva": 272, "olympiadbench": 675}
    for b, ps in problems.items():
        assert len({p.id for p in ps}) == len(ps), f"{b}: duplicate problem ids"
    keyed = [(f"{b}:{p.id}", p.gold) for b in MATH_BENCHMARKS for p in problems[b]]
    res = pool.map([(apply, gold_parses, g) for _, g in keyed])
    assert all(r.status == "ok" for r in res)
    unparsed = {k: g for (k, g), r in zip(keyed, res) if not r.value}
    assert unparsed == UNPARSED_GOLDS
    parsed = {b: sum(1 for p in problems[b] if f"{b}:{p.id}" not in unparsed) for b in MATH_BENCHMARKS}
    assert parsed == {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "minerva": 272, "olympiadbench": 674}
    # the unparsed one still grades, as a canonical string; it no longer reads as the 0 inside it
    prose = UNPARSED_GOLDS["olympiadbench:1965"]
    assert grade_math(r"\boxed{f(x)=a x+b, where b is an arbitrary integer, and a is an arbitrary positive integer "
                      r"with \mho(a)=0}", prose).correct
    assert not grade_math(r"\boxed{0}", prose).correct
    assert grade_math(r"\boxed{E_1, E_2}", "E_{1},E_{2}").correct
    assert not grade_math(r"\boxed{E_1}", "E_{1},E_{2}").correct
    assert problems["amc23"][0].gold == "27"
    assert sum(p.gold.startswith("0") for p in problems["aime24"]) == 7           # zero-padded, kept as given
    ob = problems["olympiadbench"]
    assert sum(p.meta["multiple_answer"] for p in ob) == 94
    assert sum(p.meta["unit"] is not None for p in ob) == 8
    # the two OlympiadBench golds fixed in olympiadbench.GOLD_FIXES
    assert {p.id: p.gold for p in ob if p.id in ("1782", "2045")} == {"1782": "n^{2}-n-1", "2045": "(0,4]"}


@needs_data
@pytest.mark.slow
def test_reference_solutions_are_accepted(problems, pool):
    """MATH-500 and Minerva reference solutions, graded as responses against their own golds: 769/772 accepted
    by math-verify (the 3 misses are the allow-listed data quirks); the Qwen-style cross-check agrees on 768."""
    refs = [(b, p) for b in ("math500", "minerva") for p in problems[b]]
    items = []
    for b, p in refs:
        items.append((apply, math_item, p.meta["solution"], p.gold, False, None))
        items.append((apply, qwen_item, p.meta["solution"], p.gold, False, None, b))
    res = pool.map(items)
    assert all(r.status == "ok" for r in res), [r.detail for r in res if r.status != "ok"][:3]
    mv = [r.value.correct for r in res[0::2]]
    qw = [r.value for r in res[1::2]]
    missed = {f"{b}:{p.id}" for (b, p), ok in zip(refs, mv) if not ok}
    assert missed == set(REFERENCE_ALLOW_LIST)
    assert sum(mv) == 769
    # Qwen-style accepts minerva 38 and 49 (the boxed "-1./3" reads as -1/3); it rejects two that math-verify
    # accepts, as Qwen's own code does (checked against it): its answer goes through strip_string twice, the gold
    # once, so "x \in [-2,7]" loses "x\in" only on the answer side, and the second pass's trailing-\text{} rule
    # cuts "\lambda_{\text{red}}/\sqrt{2}" to "\lambda_{".
    assert sum(qw) == 769
    differ = {f"{b}:{p.id}": (m, q) for (b, p), m, q in zip(refs, mv, qw) if m != q}
    assert differ == {"minerva:38": (False, True), "minerva:49": (False, True),
                      "math500:test/algebra/101.json": (True, False), "minerva:139": (True, False)}


@pytest.mark.slow
@needs_data
def test_wrong_golds_are_rejected(problems, pool):
    """The same solutions against the next problem's gold: only coincidentally equal golds pass."""
    ps = problems["math500"]
    items = [(apply, math_item, p.meta["solution"], ps[(i + 1) % len(ps)].gold, False, None)
             for i, p in enumerate(ps)]
    res = pool.map(items)
    accepted = [(p.gold, ps[(i + 1) % len(ps)].gold) for i, (p, r) in enumerate(zip(ps, res)) if r.value.correct]
    # three neighbours share an answer: 5 vs "x=5", 7 vs 7, 3 vs 3
    assert accepted == [("5", "x=5"), ("7", "7"), ("3", "3")]


# ---- Qwen-style grader -----------------------------------------------------------------------------------------

def test_qwen_math_equal_cases():
    # math_equal takes strings already through strip_string, as in Qwen's pipeline
    def eq(a, b):
        return math_equal(strip_string(a), strip_string(b))
    assert eq("0.5", r"\frac{1}{2}")
    assert eq("025", "25")
    assert eq("27.0", "27")
    assert eq(r"\dfrac{3}{4}", "3/4")
    assert eq(r"2\sqrt{2}", r"\sqrt{8}")
    assert eq("x=5", "5")
    assert eq("(1,2)", r"\left(1, 2\right)")
    assert eq("[1,2)", "(1,2)")        # Qwen compares intervals element-wise and ignores the bracket kind,
    assert eq("[1,2]", "(1,2)")        # as its own math_equal does (checked against its code)
    assert eq("2", "200")              # Qwen's include_percentage: 2 vs 200/100 (math-verify says no)
    assert eq("13536", "13535")        # relative tolerance 1e-4
    assert not eq("3", "4")
    assert strip_string(r"\left( 3, \dfrac{\pi}{2} \right)") == r"(3,\frac{\pi}{2})"
    assert strip_string(r"45 \text{ minutes}") == "45"


def test_disagreements_rows():
    rows = [{"problem_id": "p1", "gold": "200", "responses": [r"\boxed{2}", r"\boxed{200}"], "answers": ["2", "200"],
             "correct": [False, True], "correct_qwen": [True, True]}]
    rate, dis = disagreements(rows)
    assert rate == 0.5
    assert dis == [{"problem_id": "p1", "sample": 0, "gold": "200", "answer": "2", "qwen_answer": "2",
                    "qwen_gold": "200", "math_verify": False, "qwen": True, "response": r"\boxed{2}"}]


# ---- the pool's hard timeout -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_pool_kills_a_hung_item_and_keeps_grading():
    # sympy evaluates 9^(9^(9^9)) for ever; math-verify's own alarm is off inside the pool
    items = [(r"\boxed{5}", "5", False, None), (r"\boxed{9^{9^{9^{9}}}}", "5", False, None)]
    items += [(rf"\boxed{{{i}}}", str(i % 3), False, None) for i in range(12)]
    t0 = time.monotonic()
    verdicts, counts = grade_math_many(items, workers=2, timeout=2.0)
    elapsed = time.monotonic() - t0
    assert counts == {"timeout": 1, "error": 0}
    assert verdicts[1].verdict == "timeout" and verdicts[1].answer == "9^{9^{9^{9}}}" and not verdicts[1].correct
    assert verdicts[0].correct
    assert [v.correct for v in verdicts[2:]] == [i % 3 == i for i in range(12)]   # 0, 1, 2 correct
    assert elapsed < 15, elapsed


def test_pool_reports_item_errors_and_preserves_order():
    with WorkerPool(apply, workers=2, timeout=5.0, context="spawn") as p:
        res = p.map([(int, "3"), (int, "x"), (int, "5"), (os._exit, 3), (int, "7")])
    assert [r.status for r in res] == ["ok", "error", "ok", "error", "ok"]
    assert [res[0].value, res[2].value, res[4].value] == [3, 5, 7]
    assert "ValueError" in res[1].detail and res[3].detail == "worker died (exit code 3)"


def test_pool_rejects_fork_context():
    with pytest.raises(ValueError, match="never 'fork'"):
        WorkerPool(apply, context="fork")


# ---- templates and registry ------------------------------------------------------------------------------------

def test_templates():
    q = "What is 1+1?"
    assert render_prompt("raw", q) == q
    assert render_prompt("qwen-math", q) == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n")
    boxed = "\nPlease reason step by step, and put your final answer within \\boxed{}."
    assert render_prompt("qwen-boxed", q) == q + boxed + "\n"
    r1 = render_prompt("r1", q)
    assert r1 == "<｜begin▁of▁sentence｜><｜User｜>What is 1+1?" + boxed + "<｜Assistant｜><think>\n"
    with pytest.raises(ValueError, match="choose one of"):
        render_prompt("chatml", q)
    assert set(TEMPLATES) == {"raw", "qwen-math", "qwen-boxed", "r1", "lcb"}


def test_templates_per_task_live_with_the_templates():
    from scoring.tasks import TASKS
    # which templates suit each training task (the trainer's preflight refuses the others)
    assert TASK_TEMPLATES == {"code": ("lcb",), "math": ("qwen-math", "qwen-boxed", "r1"), "addition": ("raw",),
                              "countdown": ("raw",), "minicode": ("raw",)}
    assert TASK_TEMPLATES["math"] is MATH_TEMPLATES and set(TASKS) < set(TASK_TEMPLATES)
    assert {t for ts in TASK_TEMPLATES.values() for t in ts} == set(TEMPLATES)
    # eval's default per benchmark is one of them: math benchmarks qwen-math, the embedded tasks raw
    for name in MATH_BENCHMARKS:
        assert get_benchmark(name).default_template in TASK_TEMPLATES["math"]
    for name in TASKS:
        assert get_benchmark(name).default_template in TASK_TEMPLATES[name]


def test_qwen_boxed_uses_the_chat_template():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert not tokenize and add_generation_prompt
            return f"<user>{messages[0]['content']}</user><assistant>"
    assert render_prompt("qwen-boxed", "Q", Tok()) == (
        "<user>Q\nPlease reason step by step, and put your final answer within \\boxed{}.</user><assistant>")


def test_registry_names_and_errors():
    assert list(BENCHMARKS) == ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench", "livecodebench",
                                "humaneval", "humaneval_plus", "mbpp_plus", "addition", "countdown", "minicode"]
    with pytest.raises(ValueError, match="aime24, aime25"):
        get_benchmark("gsm8k")
    b = get_benchmark("aime24")
    assert (b.kind, b.default_template, b.generation["n"], b.generation["temperature"], b.generation["top_p"]) == \
        ("math", "qwen-math", 32, 0.6, 0.95)


def test_math_loader_sources(tmp_path, monkeypatch):
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"id": 1, "problem": "a", "answer": "1"}\n{"id": 2, "problem": "b", "answer": \n')
    with pytest.raises(ValueError, match=r"p\.jsonl:2: malformed JSON"):
        get_benchmark("aime24").load(bad)
    monkeypatch.setenv("THINKING_SEEDS_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="math/aime24/test.jsonl"):
        get_benchmark("aime24").load()
    (tmp_path / "math" / "aime24").mkdir(parents=True)
    (tmp_path / "math" / "aime24" / "test.jsonl").write_text('{"id": 7, "problem": "q", "answer": "007"}\n')
    assert get_benchmark("aime24").load() == [Problem(id="7", question="q", gold="007", meta={"url": None})]
    # neither a path nor the variable: the hub, which offline fails with the way out in the message
    monkeypatch.delenv("THINKING_SEEDS_DATA")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(RuntimeError, match=r"put the problems at \$THINKING_SEEDS_DATA/math/amc23/test\.jsonl .*"
                                           r"or pass --problems FILE"):
        get_benchmark("amc23").load()


def test_pure_modules_import_nothing_heavy():
    code = ("import sys, scoring.math, scoring.qwen, eval.metrics, scoring.templates; "
            "bad = [m for m in ('torch', 'vllm', 'transformers', 'datasets', 'lm_eval', 'math_verify', 'sympy') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
