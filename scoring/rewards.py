"""Rewards of the trainer: one grader per task, returning the grader's verdict, from which the reward follows.

``grade_task_batch(task, responses, examples)`` gives one ``scoring.verdict.Verdict`` per response:
``correct`` is the grader's word (pass), ``verdict`` says what happened. The reward of a graded response is 1.0
when correct and 0.0 otherwise (``reward_of``). A response the grader could not grade (``UNGRADED_VERDICTS``:
``grader_error`` — the grading worker crashed, the sandbox could not start — or ``timeout``, the grader's own
hard limit) has no reward: the trainer counts it (``reward/ungraded``) and by default leaves its group out of the
update (``ungraded: drop_group``), so an infrastructure failure never becomes a wrong answer.

Every batch goes through ``scoring.grading.grade_batch`` (the one batch grader, which turns a grader's failure
into the ungraded verdict): ``math`` grades ``example['answer']`` with math-verify (scoring.math) in a worker pool
with a hard per-item timeout (``scoring.grading.grade_math_batch``); ``code`` (and the embedded ``minicode`` task)
runs the example's tests in the sandbox (scoring.code) with LiveCodeBench's harness and passes only when every test
passes, graded in worker processes (``grade_code_batch``); the other embedded tasks grade inline with their own
checker.
"""

from __future__ import annotations

import atexit
import math
import os
from typing import Callable, Sequence

from scoring.code import extract_code, grade_assert_script, grade_code
from scoring.grading import grade_batch, grade_math_batch
from scoring.limits import CODE_LIMITS
from scoring.math import grade_math
from scoring.pool import WorkerPool, default_workers
from scoring.sandbox import CASE_GRACE_S, SETUP_GRACE_S, SandboxError
from scoring.tasks import get_task
from scoring.verdict import GRADER_ERROR, UNGRADED_VERDICTS, Verdict

Grader = Callable[[str, dict], Verdict]

__all__ = ["CODE_TASKS", "GRADERS", "Grader", "UNGRADED_VERDICTS", "code_time_bound", "get_grader",
           "grade_code_batch", "grade_code_example", "grade_program", "grade_task_batch", "reward_of"]


def _task_grader(name: str) -> Grader:
    def grade(response: str, example: dict) -> Verdict:
        ok = float(get_task(name).reward(response, example)) > 0
        return Verdict(ok, "pass" if ok else "wrong_answer")
    grade.__name__ = f"grade_{name}"
    return grade


def grade_math_example(response: str, example: dict) -> Verdict:
    return grade_math(response, str(example["answer"]))


# ---- code --------------------------------------------------------------------------------------------------
# A code example carries its tests in one normalized form (``trainer.data`` reads the published data sets into it;
# ``scoring.tasks.minicode`` writes it directly):
#   testtype     "stdin" | "functional" | "assert"
#   tests        stdin/functional: [{"input", "output"}] (functional: one JSON argument per input line, JSON output)
#   fn_name      functional: the function (or ``Solution`` method) to call
#   test_match   functional: "lcb" (LiveCodeBench's ==, default) | "taco" (also gold[0], TACO/APPS list-wrapped golds)
#   test_scripts assert: test programs appended to the solution, each must exit 0 (LeetCode-style data)
#   time_limit_s per-test seconds (default CODE_LIMITS.test_s, LiveCodeBench's 6 s); assert: per script
#                (default CODE_LIMITS.assert_script_s); memory: CODE_LIMITS.memory_mb (scoring.limits)

# names LeetCode-style test scripts use without importing them (our own helpers, written for the data's tests)
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

CODE_TESTTYPES = ("stdin", "functional", "assert")


def code_time_bound(example: dict) -> float:
    """Seconds the sandbox may take for one response to ``example`` before it gives up itself (its own budget:
    set-up grace, then the whole-problem limit ``(t + 1) * n + 5`` of the lcb harness, or ``t`` per test
    script): the worker pool's hard timeout sits above this, so it only fires when the sandbox's own watchdog
    failed."""
    kind = example.get("testtype", "stdin")
    if kind == "assert":
        t = float(example.get("time_limit_s") or CODE_LIMITS.assert_script_s)
        return len(example["test_scripts"]) * (SETUP_GRACE_S + t + CASE_GRACE_S)
    t = float(example.get("time_limit_s") or CODE_LIMITS.test_s)
    return SETUP_GRACE_S + (t + 1) * len(example["tests"]) + 5 + CASE_GRACE_S


def grade_program(program: str, example: dict) -> Verdict:
    """The verdict of an extracted ``program`` on ``example``'s tests (the normalized form above): ``pass`` only
    when every test passes. A sandbox that cannot run is ``grader_error``, never a wrong answer."""
    kind = example.get("testtype", "stdin")
    try:
        if kind == "assert":
            t = float(example.get("time_limit_s") or CODE_LIMITS.assert_script_s)
            v = Verdict(False, "no_answer", None, "no test scripts")
            for i, script in enumerate(example["test_scripts"]):
                v = grade_assert_script(program, script, prelude=LEETCODE_PRELUDE, timeout_s=t,
                                        memory_mb=CODE_LIMITS.memory_mb)
                if not v.correct:
                    n = len(example["test_scripts"])
                    return Verdict(False, v.verdict, None, f"script {i + 1}/{n}: {v.detail}" if n > 1 else v.detail)
            return v
        if kind not in ("stdin", "functional"):
            raise ValueError(f"testtype must be one of {CODE_TESTTYPES}, got {kind!r}")
        tests = example["tests"] if "tests" in example else example["answer"]
        return grade_code(program, tests, kind=kind, fn_name=example.get("fn_name"),
                          match=example.get("test_match", "lcb"),
                          timeout_s=float(example.get("time_limit_s") or CODE_LIMITS.test_s),
                          memory_mb=CODE_LIMITS.memory_mb)
    except SandboxError as e:
        return Verdict(False, GRADER_ERROR, None, f"sandbox: {e}"[:2000])


def grade_code_example(response: str, example: dict) -> Verdict:
    """The trainer's code reward: the program (``scoring.code.extract_code``: the last python block after
    ``</think>``, else the whole response) run on the example's tests in the sandbox, with LiveCodeBench's
    harness and comparison; 1 only when all tests pass."""
    return grade_program(extract_code(response), example)


def code_workers() -> int:
    """Grading processes per trainer rank: the usable cores shared among the ranks of this node
    (``LOCAL_WORLD_SIZE``), at least 1; ``THINKING_SEEDS_CODE_WORKERS`` overrides. Each grading process waits on
    one sandboxed program at a time, so this many programs run at once."""
    env = os.environ.get("THINKING_SEEDS_CODE_WORKERS", "")
    if env:
        return max(1, int(env))
    return max(1, default_workers() // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


_CODE_POOL = None


def _code_pool(timeout: float, workers: int):
    """A pool kept between steps (worker start-up paid once); the hard timeout grows in 60 s steps when a batch
    needs more (a new pool then), so one pool serves most batches."""
    global _CODE_POOL
    timeout = 60.0 * math.ceil(timeout / 60.0)
    if _CODE_POOL is None or _CODE_POOL.timeout < timeout or _CODE_POOL.n_workers != workers:
        if _CODE_POOL is not None:
            _CODE_POOL.close()
        else:
            atexit.register(lambda: _CODE_POOL is not None and _CODE_POOL.close())
        _CODE_POOL = WorkerPool(grade_program, workers=workers, timeout=timeout,
                                preload=("scoring.code", "scoring.sandbox"))
    return _CODE_POOL


def grade_code_batch(responses: Sequence[str], examples: Sequence[dict], *, workers: int | None = None
                     ) -> list[Verdict]:
    """Code verdicts for a batch, graded in ``workers`` processes (``code_workers()``), each running one sandboxed
    program at a time. Identical programs for the same example are graded once (a sharpened policy repeats
    itself). A worker past the hard timeout (``code_time_bound`` + 30 s, rounded up to a minute: the sandbox's
    own limits come first) is killed and its item is ``timeout``; a worker that dies or raises, ``grader_error``:
    never a wrong answer (``scoring.grading.grade_batch``). ``workers=1`` grades in this process."""
    programs = [extract_code(r) for r in responses]
    keys, items, where = [], [], {}
    for prog, ex in zip(programs, examples):
        key = (prog, id(ex))
        if key not in where:
            where[key] = len(items)
            items.append((prog, ex))
        keys.append(where[key])
    workers = workers or code_workers()
    if workers <= 1:
        uniq = grade_batch(grade_program, items, mode="inline")
    else:
        bound = max(code_time_bound(ex) for _, ex in items) + 30.0
        uniq = grade_batch(grade_program, items, mode="process", pool=_code_pool(bound, workers))
    return [uniq[k] for k in keys]


GRADERS: dict[str, Grader] = {
    "addition": _task_grader("addition"),
    "countdown": _task_grader("countdown"),
    "math": grade_math_example,
    "code": grade_code_example,
    "minicode": grade_code_example,
}
CODE_TASKS = ("code", "minicode")   # graded by grade_code_batch (worker processes, one sandbox call each)


def get_grader(name: str) -> Grader:
    if name not in GRADERS:
        raise ValueError(f"unknown task/reward '{name}'; choose one of {sorted(GRADERS)}")
    return GRADERS[name]


def reward_of(v: Verdict) -> float:
    """1.0 for a correct response, 0.0 for a graded wrong one (an ungraded one is the trainer's to handle)."""
    return 1.0 if v.correct else 0.0


def grade_task_batch(task: str, responses: Sequence[str], examples: Sequence[dict]) -> list[Verdict]:
    """Verdicts for a batch of responses to ``task``'s examples. Math answers and programs are graded in process
    pools with a hard per-item timeout (``grade_math_batch``, ``grade_code_batch``), the embedded tasks inline; any
    failure of a grader becomes that response's ``grader_error`` (``scoring.grading.grade_batch``)."""
    if task in CODE_TASKS:
        return grade_code_batch(responses, examples)
    if task == "math":
        return grade_math_batch(list(responses), [str(e["answer"]) for e in examples])
    return grade_batch(get_grader(task), list(zip(responses, examples)), mode="inline")
