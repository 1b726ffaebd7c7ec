"""KlearReasoner's code reward (scoring.klear) next to the lcb one, on rows in KlearReasoner-CodeSub-15K's published
layout, read by the trainer's loader (trainer.data) and graded in the sandbox.

Hand-derived numbers: coder1's score is the mean of +1/-1 over the tests run (3 of 4 passed: (3 - 1) / 4 = 0.5,
the fraction 0.75 rescaled to [-1, 1]); every rllm source is +1/-1; the format penalties are -0.5 (no </think>),
-2.0 (no <think>), -1 (no program). The lcb reward is 1 only when every test passes.
"""

from __future__ import annotations

import json

import pytest

from scoring import klear, rewards
from scoring.klear import KLEAR_SCORES, klear_format, row_limits, sample_indices, taco_output_matches
from scoring.limits import CODE_LIMITS
from scoring.sandbox import CASE_GRACE_S, SETUP_GRACE_S
from scoring.verdict import Verdict
from trainer.config import load_config
from trainer.data import load_examples

CODE = ["task=code", "answer_key=reward_model.ground_truth", "template=lcb"]
MAX_STDIN = "You are given N and then N integers on one line. Print the largest of them."


def row(h, source, ground_truth, statement=MAX_STDIN):
    return {"hash": h, "ability": "code", "data_source": source, "prompt": [{"content": statement, "role": "user"}],
            "reward_model": {"ground_truth": json.dumps(ground_truth), "style": "rule"}}


def load(tmp_path, rows):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {e["hash"]: e for e in load_examples(load_config(None, [*CODE, f"train_file={path}"]))}


def answer(prog: str) -> str:
    """A well-formed thinking response (its <think> written by the model, as KlearReasoner's did)."""
    return f"<think>\nplan\n</think>\nHere:\n```python\n{prog}\n```"


FOUR = {"inputs": ["3\n1 5 2\n", "1\n7\n", "4\n-3 -1 -2 -9\n", "2\n4 4\n"], "outputs": ["5\n", "7\n", "-1\n", "4\n"]}
MAX = "n = int(input())\nprint(max(map(int, input().split())))"
# right except on the one-number test
THREE_OF_FOUR = "n = int(input())\nxs = list(map(int, input().split()))\nprint(max(xs) if n > 1 else 0)"
# right, but never ends on the one-number test
HANGS_ON_ONE = "n = int(input())\nxs = list(map(int, input().split()))\nwhile n == 1:\n    pass\nprint(max(xs))"


# ---- pure rules: no sandbox -------------------------------------------------------------------------------
def test_sources_select_the_verifier_and_the_think_penalties_as_klearreasoners_dispatch():
    assert klear.klear_source("coder1") == ("coder1", False)
    assert klear.klear_source("coder1_longcot") == ("coder1", True)
    assert klear.klear_source("coder1_longcot_lcbv6") == ("coder1", True)   # `"coder1_longcot" in data_source`
    assert klear.klear_source("taco_longcot") == ("taco", True)
    assert klear.klear_source("livecodebench") == ("livecodebench", False)
    with pytest.raises(ValueError, match="kodcode"):
        klear.klear_source("kodcode")


def test_format_penalties_and_extraction():
    s = KLEAR_SCORES
    assert (s.correct, s.incorrect, s.format_error, s.no_think_open, s.no_think_close) == (1.0, -1.0, -1.0, -2.0, -0.5)
    block = "```python\nprint(1)\n```"
    # *_longcot: no </think> -> -0.5 (checked first), else no <think> -> -2.0
    v = klear_format(f"<think>still thinking {block}", "coder1_longcot")
    assert (v.verdict, v.score) == ("no_answer", -0.5)
    v = klear_format(f"</think>{block}", "coder1_longcot")
    assert (v.verdict, v.score) == ("no_answer", -2.0)
    # a chat template that opens the block itself (Qwen3-*-Thinking-2507): the response only closes it
    assert klear_format(f"plan</think>\n{block}", "coder1_longcot", prompt_opens_think=True) == "print(1)"
    v = klear_format(f"plan {block}", "coder1_longcot", prompt_opens_think=True)
    assert v.score == -0.5
    # coder1 (no _longcot): no think penalty, but the program must be a python block after </think>
    assert klear_format(block, "coder1").score == -1.0
    assert klear_format(f"</think>\n```py\nprint(1)\n```", "coder1").score == -1.0    # tag exactly "python"
    assert klear_format(f"{block}</think>\n```python\nx\n```\n```python\ny\n```", "coder1") == "y"   # the last
    # rllm: the last fenced block of any tag, anywhere; no think check without _longcot
    assert klear_format("```\na = 1\n```\ntext\n```cpp\nb = 2\n```", "taco") == "b = 2"
    assert klear_format("no code", "taco").score == -1.0
    assert klear_format("</think>no code", "taco_longcot").score == -2.0


def test_sampling_is_the_same_for_a_row_and_at_most_k():
    a = sample_indices(40, 16, "row A")
    assert a == sample_indices(40, 16, "row A") and len(a) == len(set(a)) == 16 and a == sorted(a)
    assert all(0 <= i < 40 for i in a)
    assert sample_indices(40, 16, "row B") != a          # another row, another subset
    assert sample_indices(5, 16, "row A") == [0, 1, 2, 3, 4]
    # the rllm sources keep the 32 shortest inputs (a stable sort: ties in order), call-based ones the first 32
    tests = [klear.CodeTest("x" * (40 - i % 10), "") for i in range(40)]    # lengths 40, 39, ..., 31, 40, ...
    assert klear._shortest_indices(tests, 32, "stdin") == [i for i in range(40) if i % 10 > 1]   # not 40, 39
    assert klear._shortest_indices(tests, 32, "functional") == list(range(32))


def test_taco_comparison_is_float_tolerant_and_coder1s_is_exact():
    assert taco_output_matches("0.3333333\n", "0.33333333")                # |d| = 3e-8 <= 1e-8 + 1e-5 * 0.33
    assert taco_output_matches("Case 1: 0.3333333\n\n2 3\n", "Case 1: 0.33333333\n2 3")   # tokens, blank lines
    assert not taco_output_matches("0.3334", "0.3333")                      # 1e-4 > 3.3e-6
    assert not taco_output_matches("YES", "NO")                            # taco.py lets this through; not here
    assert not taco_output_matches("1 2", "1 2 3")
    assert not taco_output_matches("nan", "NaN")                           # numpy.isclose: NaN is close to nothing
    assert klear._exact_matches(" 5 \n", "5") and not klear._exact_matches("0.3333333", "0.33333333")
    # the tolerance is numpy.isclose's, written out (the reference: numpy itself)
    np = pytest.importorskip("numpy")
    pairs = [(0.3333333, 0.33333333), (1e-9, 0.0), (2e-8, 0.0), (100.0, 100.001), (100.0, 100.0011),
             (1e300, 1.00001e300), (float("inf"), float("inf")), (float("inf"), 1e308), (-0.0, 0.0), (1.0, -1.0),
             (5e-9, -5e-9)]
    for a, b in pairs:
        assert klear._close(a, b) == bool(np.isclose(a, b)), (a, b)


def test_row_limits_come_from_the_ground_truth_or_the_normalized_fields():
    gt = json.dumps({"inputs": ["1\n"], "outputs": ["1\n"], "timeout": 2, "max_test_cases": 3})
    assert row_limits({"answer": gt}) == klear.RowLimits(2.0, 3)
    assert row_limits({"answer": gt, "time_limit_s": 0.5}) == klear.RowLimits(0.5, 3)
    assert row_limits({"answer": json.dumps({"inputs": [], "outputs": []})}) == klear.RowLimits(None, None)
    assert row_limits({"answer": [{"input": "1", "output": "1"}]}) == klear.RowLimits(None, None)
    with pytest.raises(ValueError, match="max_test_cases must be a positive integer"):
        row_limits({"answer": json.dumps({"max_test_cases": 0})})
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        row_limits({"answer": json.dumps({"timeout": "35"})})


def test_klear_needs_a_data_source_and_a_known_reward():
    with pytest.raises(ValueError, match="data_source"):
        rewards.grade_code_batch(["x"], [{"testtype": "stdin", "tests": [{"input": "", "output": ""}]}],
                                 code_reward="klear")
    with pytest.raises(ValueError, match="code_reward must be one of"):
        rewards.grade_code_batch(["x"], [{}], code_reward="rllm")


def test_reward_of_reads_the_score():
    assert rewards.reward_of(Verdict(False, "wrong_answer", None, "", 0.5)) == 0.5
    assert rewards.reward_of(Verdict(False, "no_answer", None, "", -2.0)) == -2.0
    assert rewards.reward_of(Verdict(True, "pass")) == 1.0 and rewards.reward_of(Verdict(False, "wrong_answer")) == 0.0


# ---- in the sandbox -----------------------------------------------------------------------------------------
def test_coder1_fraction_vs_lcb_all_or_nothing(tmp_path):
    ex = load(tmp_path, [row("c", "coder1_longcot", FOUR)])["c"]
    right, partial = answer(MAX), answer(THREE_OF_FOUR)
    k = rewards.grade_code_batch([right, partial], [ex, ex], workers=1, code_reward="klear")
    lcb = rewards.grade_code_batch([right, partial], [ex, ex], workers=1)
    assert [(v.verdict, rewards.reward_of(v)) for v in k] == [("pass", 1.0), ("wrong_answer", 0.5)]
    assert k[0].correct and not k[1].correct and k[1].detail.startswith("3/4 tests passed; test 2/4: wrong_answer")
    assert [(v.verdict, rewards.reward_of(v)) for v in lcb] == [("pass", 1.0), ("wrong_answer", 0.0)]


def test_the_rows_timeout_fails_the_tests_that_exceed_it_in_both_rewards(tmp_path):
    ex = load(tmp_path, [row("c", "coder1", dict(FOUR, timeout=0.5))])["c"]
    assert row_limits(ex).timeout_s == 0.5
    [v] = rewards.grade_code_batch([answer(HANGS_ON_ONE)], [ex], workers=1, code_reward="klear")
    assert (v.verdict, v.score) == ("time_limit", 0.5) and "3/4 tests passed; test 2/4: time_limit" in v.detail
    [v] = rewards.grade_code_batch([answer(HANGS_ON_ONE)], [ex], workers=1)
    assert (v.verdict, rewards.reward_of(v)) == ("time_limit", 0.0)
    # the budgets follow the row's 0.5 s, not 35 s (klear) or 6 s (lcb): 4 tests
    assert rewards.code_time_bound(ex, code_reward="klear") == SETUP_GRACE_S + 4 * (0.5 + CASE_GRACE_S)
    assert rewards.code_time_bound(ex) == SETUP_GRACE_S + (0.5 + 1) * 4 + 5 + CASE_GRACE_S
    plain = load(tmp_path, [row("c", "coder1", FOUR)])["c"]
    assert rewards.code_time_bound(plain, code_reward="klear") == \
        SETUP_GRACE_S + 4 * (CODE_LIMITS.klear_coder1_test_s + CASE_GRACE_S)


def test_float_tolerance_only_where_klearreasoner_has_it(tmp_path):
    third = {"inputs": ["1 3\n"], "outputs": ["0.33333333\n"]}
    exs = load(tmp_path, [row("taco", "taco", third), row("coder1", "coder1", third)])
    prog = "a, b = map(int, input().split())\nprint(f'{a / b:.7f}')"   # 0.3333333
    resp = answer(prog)
    got = rewards.grade_code_batch([resp, resp], [exs["taco"], exs["coder1"]], workers=1, code_reward="klear")
    assert [(v.verdict, v.score) for v in got] == [("pass", 1.0), ("wrong_answer", -1.0)]
    [v] = rewards.grade_code_batch([resp], [exs["taco"]], workers=1)   # lcb: exact decimals
    assert (v.verdict, rewards.reward_of(v)) == ("wrong_answer", 0.0)


def test_forty_tests_grade_sixteen_and_the_same_sixteen_every_time(tmp_path):
    inputs = [f"1\n{i}\n" for i in range(40)]
    gt = {"inputs": inputs, "outputs": [f"{i}\n" for i in range(40)]}
    exs = load(tmp_path, [row("c40", "coder1", gt), row("c3", "coder1", dict(gt, max_test_cases=3))])
    even_only = "input()\nx = int(input())\nprint(x if x % 2 == 0 else -1)"
    picked = sample_indices(40, 16, klear.tests_key(exs["c40"]["tests"]))
    evens = sum(1 for i in picked if i % 2 == 0)
    want = (evens - (16 - evens)) / 16
    a, b = rewards.grade_code_batch([answer(even_only)] * 2, [exs["c40"], dict(exs["c40"])], workers=1,
                                    code_reward="klear")
    assert a.score == b.score == want and a.detail.startswith(f"{evens}/16 tests passed")
    [v] = rewards.grade_code_batch([answer("input()\nprint(int(input()))")], [exs["c3"]], workers=1,
                                   code_reward="klear")
    assert (v.verdict, v.score, v.detail) == ("pass", 1.0, "3/3 tests")
    # lcb honours the row's cap too: the same 3 tests; a row without one grades all 40
    three = sample_indices(40, 3, klear.tests_key(exs["c3"]["tests"]))
    assert rewards._lcb_selection(exs["c3"])[0] == [exs["c3"]["tests"][i] for i in three]
    assert len(rewards._lcb_selection(exs["c40"])[0]) == 40


def test_functional_rows_and_the_all_or_nothing_sources(tmp_path):
    fn = "Write a function max_of(xs) that returns the largest element of the list xs."
    asserts = ["assert max_of([1, 5, 2]) == 5", "assert max_of([7]) == 7", "assert max_of([-3, -1]) == -1",
               "assert max_of([]) == None"]
    exs = load(tmp_path, [
        row("list", "coder1", {"functional": asserts}, fn),
        row("str", "coder1_longcot", {"functional": "\n".join(asserts)}, fn),
        row("taco", "taco", {"inputs": ["3\n1 5 2\n", "1\n7\n"], "outputs": ["5\n", "7\n"]}),
        row("lcb", "livecodebench", [{"input": "3\n1 5 2\n", "output": "5\n", "testtype": "stdin", "metadata": {}}]),
    ])
    max_of = "def max_of(xs):\n    return max(xs)"      # fails the empty list only
    responses = [answer(max_of), answer(max_of), answer(THREE_OF_FOUR), answer(MAX)]
    examples = [exs["list"], exs["str"], exs["taco"], exs["lcb"]]
    serial = rewards.grade_code_batch(responses, examples, workers=1, code_reward="klear")
    # coder1 list: one script per assertion, 3 of 4 -> 0.5; a string is one script: -1; taco 1 of 2 -> -1
    assert [(v.verdict, v.score) for v in serial] == [("runtime_error", 0.5), ("runtime_error", -1.0),
                                                      ("wrong_answer", -1.0), ("pass", 1.0)]
    via_task = rewards.grade_task_batch("code", [responses[3], "no code"], [exs["lcb"], exs["str"]],
                                        code_reward="klear", prompt_opens_think=True)
    assert [v.score for v in via_task] == [1.0, -0.5]


@pytest.mark.slow   # starts the grading worker pool
def test_worker_processes_grade_klear_as_this_process_does(tmp_path):
    exs = load(tmp_path, [row("c", "coder1_longcot", FOUR), row("taco", "taco", FOUR)])
    responses = [answer(THREE_OF_FOUR), answer(MAX), "<think>no code</think>", answer(THREE_OF_FOUR)]
    examples = [exs["c"], exs["c"], exs["c"], exs["taco"]]
    want = [("wrong_answer", 0.5), ("pass", 1.0), ("no_answer", -1.0), ("wrong_answer", -1.0)]
    for workers in (1, 2):
        got = rewards.grade_code_batch(responses, examples, workers=workers, code_reward="klear")
        assert [(v.verdict, v.score) for v in got] == want


def test_the_klear_reward_imports_no_numpy_or_torch():
    """It runs in every grading worker: numpy.isclose is written out in Python (scoring.klear._close)."""
    import subprocess
    import sys
    code = "import sys, scoring.klear; print(sorted({'torch', 'numpy', 'transformers', 'vllm'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


CORRECT = {
    "max_stdin": MAX,
    "max_fn": "def max_of(xs):\n    return max(xs)",
    "max_method": "class Solution:\n    def maxOf(self, nums):\n        return max(nums)",
    "reverse": ("class Solution:\n    def reverseList(self, head):\n        prev = None\n        while head:\n"
                "            head.next, prev, head = prev, head, head.next\n        return prev"),
}


@pytest.mark.slow   # 15 sandboxed programs, one per published data_source
def test_a_correct_program_scores_one_on_every_published_fixture_row_under_both_rewards():
    from pathlib import Path
    fix = Path(__file__).resolve().parents[1] / "fixtures" / "klear" / "rows.jsonl"
    exs = load_examples(load_config(None, [*CODE, f"train_file={fix}"]))

    def problem(h):
        if h.endswith("stdin"):
            return "max_stdin"
        if h in ("lcb-functional", "leetcode-check"):
            return "max_method"
        return "reverse" if h == "leetcode-listnode" else "max_fn"
    responses = [answer(CORRECT[problem(e["hash"])]) for e in exs]
    for reward in ("klear", "lcb"):
        got = rewards.grade_code_batch(responses, exs, workers=1, code_reward=reward)
        assert {e["hash"]: (v.verdict, rewards.reward_of(v)) for e, v in zip(exs, got)} == \
            {e["hash"]: ("pass", 1.0) for e in exs}


class _CodePoints:   # a tokenizer whose ids are code points: the rollout decodes exactly the response written
    pad_token_id = 0

    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def test_the_trainers_code_reward_field_reaches_the_grader(tmp_path):
    """``code_reward`` in the config is what the rollout grades with: the same two responses to one coder1 row
    get rewards [1, 0.5] under klear and [1, 0] under lcb, through ``RolloutBuilder.reward``."""
    from trainer.fsdp import Dist
    from trainer.rollout import Rollout, RolloutBuilder
    ex = load(tmp_path, [row("c", "coder1_longcot", FOUR)])["c"]
    got = {}
    for mode in ("klear", "lcb"):
        cfg = load_config(None, [*CODE, f"code_reward={mode}", "overlong_buffer_tokens=0"])
        builder = RolloutBuilder(cfg=cfg, examples=[ex], prompt_ids=[[1]], loader=None, sampler=None,
                                 tokenizer=_CodePoints(), model=None, d=Dist())
        rows = [Rollout(example_idx=0, prompt_id="c", group=0, sample_idx=i, prompt_ids=[1],
                        response_ids=[ord(ch) for ch in text], finish_reason="stop")
                for i, text in enumerate((answer(MAX), answer(THREE_OF_FOUR)))]
        got[mode] = [(r.verdict, r.reward) for r in builder.reward(rows)]
    assert got == {"klear": [("pass", 1.0), ("wrong_answer", 0.5)], "lcb": [("pass", 1.0), ("wrong_answer", 0.0)]}


def test_code_reward_klear_is_refused_for_a_task_that_is_not_code():
    from contracts.config import ConfigError
    with pytest.raises(ConfigError, match="code_reward=klear grades task=code rows"):
        load_config(None, ["task=addition", "code_reward=klear"])
