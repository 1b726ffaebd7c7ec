"""Code grading: take the program out of a response, run it in ``scoring.sandbox``, compare like LiveCodeBench.

The program never reports its own verdict: the sandbox returns what it printed (stdin problems) or the value a
function returned (functional problems) and the comparison happens here, in the grader.

Comparison semantics follow LiveCodeBench's ``lcb_runner/evaluation/testing_util.py`` (``grade_stdio`` and
``grade_call_based``):

- **stdin**: both outputs are ``strip()``-ed, split at ``\\n`` and each line stripped (so leading/trailing blank
  lines and ``\\r`` do not matter, interior blank lines do). Line counts must agree. Two lines match when they are
  equal, or when every whitespace-separated token of both parses as a ``decimal.Decimal`` and the two token lists
  are equal as numbers (``2.50`` == ``2.5``, ``1e3`` == ``1000``). That is LiveCodeBench's "numeric" rule: exact
  decimal equality, no epsilon. ``abs_tol``/``rel_tol`` add an epsilon for datasets that want one (off by
  default, so LiveCodeBench scores are reproduced).
- **functional** (LeetCode ``Solution().method``): each input line is one JSON argument; the gold output is JSON;
  a returned tuple counts as a list; the comparison is Python ``==`` on the parsed values (so ``1 == 1.0`` and
  ``True == 1``, as in LiveCodeBench).
- Tests run in order (public, then private); the first failing test stops grading and is named in the verdict.
- The LiveCodeBench evaluator prepends a block of imports (``from typing import *``, ``from collections import
  *``, ... ``sys.setrecursionlimit(50000)``) to every program; ``LCB_IMPORT_PRELUDE`` is that block, run before
  the program (its line numbers are kept).

Where we deliberately differ from LiveCodeBench's in-process runner: stdin programs run as ``__main__`` scripts
with a real stdin (LiveCodeBench wraps them in a function and mocks ``sys.stdin``, which breaks ``global`` and
``sys.stdin.buffer``); every test case is a fresh process (LiveCodeBench shares one ``Solution()`` across a
problem's functional tests); a value that JSON cannot hold (a nested tuple, a set) is unequal to every gold, as in
LiveCodeBench, except integer scalars with ``__index__`` (``numpy.int64``), which compare as ints.

Verdicts (``eval.benchmarks.base.Verdict``): ``pass``, ``wrong_answer`` (including output over the size limit),
``runtime_error`` (exception, non-zero exit, crash by signal, syntax error), ``time_limit``, ``memory_limit``,
``no_answer`` (nothing that could be a program). ``detail`` starts with ``test i/n`` for the first failing test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable, Mapping, Sequence

from scoring.verdict import Verdict
from scoring.sandbox import DEFAULT_MAX_OUTPUT, RunResult, parse_json, run_cases

__all__ = ["LCB_IMPORT_PRELUDE", "CodeTest", "extract_code", "stdout_matches", "grade_code", "verdict_of_status",
           "short_repr"]

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

_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)
_PY_TAGS = {"python", "py", "python3", "py3", ""}


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
               fn_name: str | None = None, timeout_s: float = 6.0, memory_mb: int = 1024,
               prelude: str = LCB_IMPORT_PRELUDE, abs_tol: float = 0.0, rel_tol: float = 0.0,
               max_output_bytes: int | None = None, require_isolation: bool | None = None) -> Verdict:
    """Run ``program`` on ``tests`` (in order, stopping at the first failure) and return the verdict.

    ``kind``: ``"stdin"`` or ``"functional"`` (LiveCodeBench's ``testtype``; ``fn_name`` is required then).
    ``timeout_s`` is per test (LiveCodeBench: 6 s). Output may be up to ``max_output_bytes`` (default: 1 MiB or
    twice the largest expected output, whichever is larger) before the run is stopped as ``wrong_answer``.
    """
    if kind not in ("stdin", "functional"):
        raise ValueError(f"kind must be 'stdin' or 'functional', got {kind!r}")
    if kind == "functional" and not fn_name:
        raise ValueError("functional tests need fn_name")
    tests = _tests(tests)
    if not tests:
        raise ValueError("no tests to grade against")
    if not program.strip():
        return Verdict(False, "no_answer", None, "no program in the response")
    if kind == "functional":
        try:
            gold = [parse_json(t.output) for t in tests]
        except ValueError as e:
            raise ValueError(f"a functional test's expected output is not JSON: {e}") from None
    if max_output_bytes is None:
        longest = max(len(t.output.encode()) for t in tests)
        max_output_bytes = max(DEFAULT_MAX_OUTPUT, 2 * longest + 4096)
    n = len(tests)
    failure: list[Verdict] = []

    def check(i: int, r: RunResult) -> bool:
        where = f"test {i + 1}/{n}"
        if r.status != "ok":
            failure.append(Verdict(False, verdict_of_status(r.status), None, f"{where}: {r.status}: {_failure(r)}"))
            return False
        if kind == "stdin":
            ok, why = stdout_matches(r.stdout, tests[i].output, abs_tol=abs_tol, rel_tol=rel_tol)
        else:
            if not r.value_ok:
                ok, why = False, r.detail
            else:
                ok = r.value == gold[i]
                why = "" if ok else f"returned {short_repr(r.value)}, expected {short_repr(gold[i])}"
        if not ok:
            failure.append(Verdict(False, "wrong_answer", None, f"{where}: wrong_answer: {why}"))
        return ok

    results = run_cases(program, [t.input for t in tests], mode="stdin" if kind == "stdin" else "function",
                        fn_name=fn_name, on_case=check, timeout_s=timeout_s, memory_mb=memory_mb, prelude=prelude,
                        max_output_bytes=max_output_bytes, require_isolation=require_isolation)
    if failure:
        return failure[0]
    assert len(results) == n, f"sandbox returned {len(results)} results for {n} tests"
    return Verdict(True, "pass", None, f"{n}/{n} tests")
