"""Rewards of the trainer: one grader per task, returning the grader's verdict, from which the reward follows.

``grade_task_batch(task, responses, examples)`` gives one ``scoring.verdict.Verdict`` per response:
``correct`` is the grader's word (pass), ``verdict`` says what happened. The reward of a graded response is 1.0
when correct and 0.0 otherwise (``reward_of``), or the grader's own ``score`` when it has one (KlearReasoner's code
reward). A response the grader could not grade (``UNGRADED_VERDICTS``:
``grader_error`` — the grading worker crashed, the sandbox could not start — or ``timeout``, the grader's own
hard limit) has no reward: the trainer counts it (``reward/ungraded``) and by default leaves its group out of the
update (``ungraded: drop_group``), so an infrastructure failure never becomes a wrong answer.

Every batch goes through ``scoring.grading.grade_batch`` (the one batch grader, which turns a grader's failure
into the ungraded verdict): ``math`` grades ``example['answer']`` with math-verify (scoring.math) in a worker pool
with a hard per-item timeout (``scoring.grading.grade_math_batch``); ``code`` (and the embedded ``minicode`` task)
runs the example's tests in the sandbox (scoring.code), graded in worker processes (``grade_code_batch``) under one
of two rewards (``CODE_REWARDS``, the ``code_reward`` argument): ``lcb`` (the default) runs LiveCodeBench's harness
and passes only when every test passes, reward 1/0; ``klear`` is KlearReasoner's verifier, the one its data sets
were written for (``scoring.klear``: a fraction of sampled tests for ``coder1`` rows, format penalties, rewards in
[-2, 1]). Both honour a row's own ``timeout`` / ``max_test_cases`` (``scoring.klear.row_limits``). The other embedded
tasks grade inline with their own checker.

``reward_fn`` (the trainer's config field, ``module:function``) replaces the task's grader with a user function of
the graders' signature, ``fn(response: str, example: dict) -> Verdict | bool`` (``example`` is the data row: its
``prompt``, ``answer`` and every other column): ``load_reward_fn`` resolves it (``RewardFnError``, one line naming
the field, for a bad spec), ``grade_custom_batch`` grades a batch with it in worker processes with the math
grader's hard per-item limit (``GRADE_TIMEOUT_S``), so a function that raises is that response's
``grader_error``, one that returns no reward (a NaN or infinite score, a verdict name that is none of ``VERDICTS``,
a string: ``_as_verdict``) its ``grader_error`` too, and one that hangs its ``timeout``: counted, never a crash of
the run, never a NaN reward. What it leaves running (a forked process, however detached) is killed after each
response (``scoring.pool``).
"""

from __future__ import annotations

import atexit
import functools
import importlib
import math
import numbers
import sys
from pathlib import Path
from typing import Callable, Literal, Sequence

from scoring.code import LEETCODE_PRELUDE, extract_code, grade_assert_script, grade_code
from scoring.grading import GRADE_TIMEOUT_S, grade_batch, grade_math_batch
from scoring.klear import grade_klear_example, grade_klear_program, klear_format, klear_time_bound, row_limits, \
    sample_indices, tests_key
from scoring.limits import CODE_LIMITS
from scoring.math import grade_math
from scoring.pool import WorkerPool, workers_per_rank
from scoring.sandbox import CASE_GRACE_S, SETUP_GRACE_S, SandboxError
from scoring.tasks import get_task
from scoring.verdict import GRADER_ERROR, UNGRADED_VERDICTS, VERDICTS, Verdict

Grader = Callable[[str, dict], Verdict]

__all__ = ["CODE_REWARDS", "CODE_TASKS", "CodeReward", "GRADERS", "Grader", "RewardFnError", "UNGRADED_VERDICTS",
           "code_time_bound", "custom_item", "get_grader", "grade_code_batch", "grade_code_example",
           "grade_custom_batch", "grade_program", "grade_task_batch", "load_reward_fn", "module_root",
           "parse_reward_fn", "reward_of"]


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
#   max_test_cases  at most this many tests (or scripts) graded, a deterministic sample (scoring.klear.sample_indices)
#   data_source  the published row's source (the klear reward picks its verifier by it)
# A row's own limits: time_limit_s / max_test_cases when set, else the ``timeout`` / ``max_test_cases`` of a
# ground truth that is a JSON object (KlearReasoner's coder1 rows; scoring.klear.row_limits). Under ``lcb`` a stated
# timeout replaces LiveCodeBench's 6 s (that default is LiveCodeBench's, for its own problems; a row that states
# its limit was built with it) and a stated cap grades the same sample ``klear`` grades; without them every test
# runs at 6 s, as before.

CODE_TESTTYPES = ("stdin", "functional", "assert")


def _lcb_selection(example: dict) -> tuple[list, float]:
    """(tests or scripts graded, per-test seconds) of ``example`` under the lcb reward (the comment above)."""
    lim = row_limits(example)
    if example.get("testtype", "stdin") == "assert":
        items, t = list(example["test_scripts"]), lim.timeout_s or CODE_LIMITS.assert_script_s
    else:
        tests = example["tests"] if "tests" in example else example["answer"]
        items, t = list(tests), lim.timeout_s or CODE_LIMITS.test_s
    if lim.max_test_cases is not None:
        items = [items[i] for i in sample_indices(len(items), lim.max_test_cases, tests_key(items))]
    return items, float(t)


def code_time_bound(example: dict, *, code_reward: str = "lcb") -> float:
    """Seconds the sandbox may take for one response to ``example`` before it gives up itself (its own budget:
    set-up grace, then the whole-problem limit ``(t + 1) * n + 5`` of the lcb harness, or ``t`` per test
    script; ``klear``: ``scoring.klear.klear_time_bound``): the worker pool's hard timeout sits above this, so it
    only fires when the sandbox's own watchdog failed."""
    if code_reward == "klear":
        return klear_time_bound(example)
    items, t = _lcb_selection(example)
    if example.get("testtype", "stdin") == "assert":
        return len(items) * (SETUP_GRACE_S + t + CASE_GRACE_S)
    return SETUP_GRACE_S + (t + 1) * len(items) + 5 + CASE_GRACE_S


def grade_program(program: str, example: dict) -> Verdict:
    """The verdict of an extracted ``program`` on ``example``'s tests (the normalized form above): ``pass`` only
    when every test passes. A sandbox that cannot run is ``grader_error``, never a wrong answer."""
    kind = example.get("testtype", "stdin")
    if kind not in CODE_TESTTYPES:
        raise ValueError(f"testtype must be one of {CODE_TESTTYPES}, got {kind!r}")
    items, t = _lcb_selection(example)
    try:
        if kind == "assert":
            v = Verdict(False, "no_answer", None, "no test scripts")
            for i, script in enumerate(items):
                v = grade_assert_script(program, script, prelude=LEETCODE_PRELUDE, timeout_s=t,
                                        memory_mb=CODE_LIMITS.memory_mb)
                if not v.correct:
                    n = len(items)
                    return Verdict(False, v.verdict, None, f"script {i + 1}/{n}: {v.detail}" if n > 1 else v.detail)
            return v
        return grade_code(program, items, kind=kind, fn_name=example.get("fn_name"),
                          match=example.get("test_match", "lcb"), timeout_s=t, memory_mb=CODE_LIMITS.memory_mb)
    except SandboxError as e:
        return Verdict(False, GRADER_ERROR, None, f"sandbox: {e}"[:2000])


def grade_code_example(response: str, example: dict) -> Verdict:
    """The trainer's code reward: the program (``scoring.code.extract_code``: the last python block after
    ``</think>``, else the whole response) run on the example's tests in the sandbox, with LiveCodeBench's
    harness and comparison; 1 only when all tests pass."""
    return grade_program(extract_code(response), example)


# code_reward -> (the reward of one response, the reward of one extracted program: what a grading worker runs)
CodeReward = Literal["lcb", "klear"]   # the trainer's `code_reward`: the keys of CODE_REWARDS
CODE_REWARDS: dict[str, tuple[Callable[..., Verdict], Callable[[str, dict], Verdict]]] = {
    "lcb": (grade_code_example, grade_program),
    "klear": (grade_klear_example, grade_klear_program),
}


def _check_code_reward(code_reward: str, examples: Sequence[dict]) -> None:
    if code_reward not in CODE_REWARDS:
        raise ValueError(f"code_reward must be one of {sorted(CODE_REWARDS)}, got {code_reward!r}")
    if code_reward == "klear":
        missing = sum(1 for ex in examples if "data_source" not in ex)
        if missing:
            raise ValueError(f"code_reward='klear' picks KlearReasoner's verifier by the row's data_source, and "
                             f"{missing} of {len(examples)} examples have none (the embedded tasks and rows without "
                             f"it): use code_reward='lcb' for them")


def _grade_code_item(code_reward: str, program: str, example: dict) -> Verdict:
    """What a grading worker runs: ``code_reward``'s verdict of one extracted program."""
    return CODE_REWARDS[code_reward][1](program, example)


# Code grading processes per trainer rank: the one rule of every grading pool (``scoring.pool.workers_per_rank``).
# Each grading process waits on one sandboxed program at a time, so this many programs run at once.
code_workers = workers_per_rank


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
        _CODE_POOL = WorkerPool(_grade_code_item, workers=workers, timeout=timeout,
                                preload=("scoring.code", "scoring.klear", "scoring.sandbox"))
    return _CODE_POOL


def grade_code_batch(responses: Sequence[str], examples: Sequence[dict], *, workers: int | None = None,
                     code_reward: str = "lcb", prompt_opens_think: bool = False) -> list[Verdict]:
    """Code verdicts for a batch under ``code_reward`` (``CODE_REWARDS``), graded in ``workers`` processes
    (``code_workers()``), each running one sandboxed program at a time. Identical programs for the same example are
    graded once (a sharpened policy repeats itself); ``klear``'s format penalties are decided here, without a
    sandbox (``prompt_opens_think``: the prompt ends in the ``<think>`` the chat template wrote,
    ``scoring.klear.klear_format``). A worker past the hard timeout (``code_time_bound`` + 30 s, rounded up to a
    minute: the sandbox's own limits come first) is killed and its item is ``timeout``; a worker that dies or
    raises, ``grader_error``: never a wrong answer (``scoring.grading.grade_batch``). ``workers=1`` grades in this
    process."""
    _check_code_reward(code_reward, examples)
    out: list[Verdict | None] = [None] * len(responses)
    keys, items, where = {}, [], {}
    for j, (resp, ex) in enumerate(zip(responses, examples)):
        if code_reward == "klear":
            prog = klear_format(resp, ex["data_source"], prompt_opens_think=prompt_opens_think)
            if isinstance(prog, Verdict):   # a format penalty: no program to run
                out[j] = prog
                continue
        else:
            prog = extract_code(resp)
        key = (prog, id(ex))
        if key not in where:
            where[key] = len(items)
            items.append((code_reward, prog, ex))
        keys[j] = where[key]
    if items:
        workers = workers or code_workers()
        if workers <= 1:
            uniq = grade_batch(_grade_code_item, items, mode="inline")
        else:
            bound = max(code_time_bound(ex, code_reward=code_reward) for _, _, ex in items) + 30.0
            uniq = grade_batch(_grade_code_item, items, mode="process", pool=_code_pool(bound, workers))
        for j, k in keys.items():
            out[j] = uniq[k]
    return out


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


# The largest score magnitude taken as a reward: rewards are O(1) by design, and the advantages are computed in
# float32 (trainer.update), where the square of a reward past ~1e19 is inf and its group's advantages NaN.
SCORE_LIMIT = 1e6


def _finite_score(score) -> float | None:
    """``score`` as a float when it is a number within +-``SCORE_LIMIT`` (numpy's too), else None."""
    if not isinstance(score, numbers.Real):
        return None
    try:
        x = float(score)
    except OverflowError:   # an int past float's range
        return None
    return x if math.isfinite(x) and abs(x) <= SCORE_LIMIT else None


def reward_of(v: Verdict) -> float:
    """The grader's ``score`` when it has one (KlearReasoner's code reward: in [-2, 1]); else 1.0 for a correct
    response, 0.0 for a graded wrong one (an ungraded one is the trainer's to handle).

    Every verdict becomes a reward here (the trainer's rollouts, the launch check), so this is the last gate: a
    score that is not a finite number within +-``SCORE_LIMIT`` raises ``ValueError`` (one NaN would poison its
    whole group's advantages). A user's ``reward_fn`` never gets here with one (``custom_item`` makes such a return
    its row's ``grader_error``); from a built-in grader it is a bug, stopped loudly rather than trained on."""
    if v.score is not None:
        score = _finite_score(v.score)
        if score is None:
            raise ValueError(f"score {v.score!r:.100} is not a finite number within +-{SCORE_LIMIT:g}: the reward "
                             f"would poison its group's advantages (the grader's verdict: {v!r:.300})")
        return score
    return 1.0 if v.correct else 0.0


# ---- a user's reward function (config reward_fn) -------------------------------------------------------------
class RewardFnError(ValueError):
    """A ``reward_fn`` spec that names no callable (the message is one line naming the field and the fix)."""


def parse_reward_fn(spec: str) -> tuple[str, str]:
    """(module, function) of a ``module:function`` spec, read without importing anything (the config's check);
    ``RewardFnError`` when it is not of that form."""
    module, sep, name = (x.strip() for x in spec.partition(":"))
    if not sep or not module or not name:
        raise RewardFnError(f"reward_fn='{spec}' is not module:function (e.g. reward_fn=my_rewards:score for "
                            f"def score(response, example) in my_rewards.py on the Python path)")
    return module, name


def load_reward_fn(spec: str) -> Callable[[str, dict], object]:
    """The function ``spec`` names: ``module:function``, the module importable from the Python path (the working
    directory and PYTHONPATH, as ``python -m`` finds modules). ``RewardFnError`` when the spec has no colon, the
    module does not import, the attribute is missing or is not callable."""
    module, name = parse_reward_fn(spec)
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and (module == exc.name or module.startswith(exc.name + ".")):
            raise RewardFnError(f"reward_fn='{spec}': no module '{module}' on the Python path (the working directory "
                                f"and PYTHONPATH); run from its folder or add the folder to PYTHONPATH") from None
        raise RewardFnError(f"reward_fn='{spec}': importing '{module}' failed: {exc}") from None
    except Exception as exc:   # the user's module raised while importing: say what, without its traceback
        raise RewardFnError(f"reward_fn='{spec}': importing '{module}' raised {type(exc).__name__}: {exc}") from None
    if not hasattr(mod, name):
        where = getattr(mod, "__file__", None) or module
        raise RewardFnError(f"reward_fn='{spec}': module '{module}' ({where}) has no attribute '{name}'")
    fn = getattr(mod, name)
    if not callable(fn):
        raise RewardFnError(f"reward_fn='{spec}': '{module}.{name}' is not callable (it is of type "
                            f"{type(fn).__name__}); name a function of (response, example)")
    return fn


def module_root(spec: str) -> str | None:
    """The folder of the Python path that the module of ``spec`` was imported from here (None: no file), so that
    grading workers import it from there too, whenever and from whichever path their fork server started."""
    module, _ = parse_reward_fn(spec)
    file = getattr(importlib.import_module(module), "__file__", None)
    if not file:
        return None
    path = Path(file)
    path = path.parent if path.name == "__init__.py" else path
    return str(path.parents[len(module.split(".")) - 1])


@functools.lru_cache(maxsize=8)
def _reward_fn(spec: str, root: str | None):
    if root and root not in sys.path:
        sys.path.insert(0, root)
    return load_reward_fn(spec)   # once per worker process


_ALLOWED = (f"return a bool (or 0/1) or a scoring.verdict.Verdict whose verdict is one of {', '.join(VERDICTS)}, "
            f"whose correct is a bool, True exactly for pass, whose score is a finite number within +-{SCORE_LIMIT:g} "
            f"or None, answer a str or None and detail a str")


def _as_bool(x) -> bool | None:
    """``x`` when it is a bool, numpy's ``bool_`` as Python's; None for anything else."""
    np = sys.modules.get("numpy")   # (a numpy bool exists only where numpy was imported)
    return bool(x) if isinstance(x, bool) or (np is not None and isinstance(x, np.bool_)) else None


def _as_verdict(out, spec: str) -> Verdict:
    """A user function's return value as a verdict, checked: what it returns becomes a reward (``reward_of``) and
    then its group's advantages, where one NaN poisons the group and a string crashes the step.

    A ``Verdict`` whose ``verdict`` is one of ``VERDICTS``, ``correct`` a bool True exactly for ``pass``, ``score``
    None or a finite number within +-``SCORE_LIMIT``, as it is; a bool, or the numbers 0 and 1, as ``pass`` /
    ``wrong_answer``. numpy's bools and numbers are taken as Python's (``correct`` a bool, ``score`` a float).
    Anything else is the row's ``grader_error`` (ungraded: counted, its group left out), its detail one line
    naming the function, what it returned and what is allowed."""
    def bad(why: str) -> Verdict:
        what = repr(out) if isinstance(out, Verdict) else f"{type(out).__name__} {out!r}"
        return Verdict(False, GRADER_ERROR, None, f"reward_fn '{spec}' returned {what:.300}: {why}{_ALLOWED}")

    if not isinstance(out, Verdict):
        ok = _as_bool(out)
        if ok is None and isinstance(out, numbers.Real) and out in (0, 1):
            ok = bool(out)
        return bad("") if ok is None else Verdict(ok, "pass" if ok else "wrong_answer")
    correct, score = _as_bool(out.correct), _finite_score(out.score)
    if out.verdict not in VERDICTS:
        return bad(f"verdict {out.verdict!r} is not a known verdict; ")
    if correct is None:
        return bad(f"correct {out.correct!r} is not a bool; ")
    if correct != (out.verdict == "pass"):
        return bad(f"correct={correct} with verdict {out.verdict!r}; ")
    if out.score is not None and score is None:
        kind = f"finite number within +-{SCORE_LIMIT:g}" if isinstance(out.score, numbers.Real) else "number"
        return bad(f"score {out.score!r:.100} is not a {kind}; ")
    if not (out.answer is None or isinstance(out.answer, str)) or not isinstance(out.detail, str):
        return bad(f"answer {out.answer!r:.100} or detail {out.detail!r:.100} is not a str; ")
    return Verdict(correct, out.verdict, out.answer, out.detail, score)


def custom_item(spec: str, root: str | None, response: str, example: dict) -> Verdict:
    """Pool function (module level, importable by reference): the user function of ``spec``, imported from the
    Python path folder ``root`` (``module_root``), on one response; a return value that is no reward is the row's
    ``grader_error`` (``_as_verdict``)."""
    return _as_verdict(_reward_fn(spec, root)(response, example), spec)


_CUSTOM_POOLS: dict[tuple[str, float], WorkerPool] = {}


def _custom_pool(spec: str, timeout_s: float) -> WorkerPool:
    """One pool per spec kept between steps (worker start-up paid once); the fork server imports the user's module
    once where it starts here, so each replacement worker (after a timeout) starts with it loaded."""
    key = (spec, float(timeout_s))
    if key not in _CUSTOM_POOLS:
        if not _CUSTOM_POOLS:
            atexit.register(lambda: [p.close() for p in _CUSTOM_POOLS.values()])
        _CUSTOM_POOLS[key] = WorkerPool(custom_item, timeout=timeout_s,
                                        preload=("scoring.rewards", parse_reward_fn(spec)[0]))
    return _CUSTOM_POOLS[key]


def grade_custom_batch(spec: str, responses: Sequence[str], examples: Sequence[dict], *,
                       timeout_s: float = GRADE_TIMEOUT_S) -> list[Verdict]:
    """Verdicts of the user function ``spec`` (``module:function``) for a batch, graded in worker processes with a
    hard limit of ``timeout_s`` seconds per response (the math grader's, ``GRADE_TIMEOUT_S``): a response whose
    call raises is ``grader_error`` (the exception in its detail), one past the limit ``timeout``
    (``scoring.grading.grade_batch``)."""
    try:
        root = module_root(spec)
    except Exception:   # the workers meet the same failure: each row's grader_error says what it is
        root = None
    items = [(spec, root, r, ex) for r, ex in zip(responses, examples)]
    return grade_batch(custom_item, items, mode="process", pool=_custom_pool(spec, timeout_s))


def grade_task_batch(task: str, responses: Sequence[str], examples: Sequence[dict], *, reward_fn: str = "",
                     code_reward: str = "lcb", prompt_opens_think: bool = False) -> list[Verdict]:
    """Verdicts for a batch of responses to ``task``'s examples. Math answers and programs are graded in process
    pools with a hard per-item timeout (``grade_math_batch``, ``grade_code_batch``, which reads ``code_reward`` and
    ``prompt_opens_think``; other tasks ignore them), the embedded tasks inline; any failure of a grader becomes
    that response's ``grader_error`` (``scoring.grading.grade_batch``). ``reward_fn`` (``module:function``): that
    function grades instead of the task's grader (``grade_custom_batch``)."""
    if reward_fn:
        return grade_custom_batch(reward_fn, responses, examples)
    if task in CODE_TASKS:
        return grade_code_batch(responses, examples, code_reward=code_reward, prompt_opens_think=prompt_opens_think)
    if task == "math":
        return grade_math_batch(list(responses), [str(e["answer"]) for e in examples])
    return grade_batch(get_grader(task), list(zip(responses, examples)), mode="inline")
