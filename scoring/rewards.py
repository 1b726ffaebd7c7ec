"""Rewards of the trainer: one grader per task, returning the grader's verdict, from which the reward follows.

``grade_responses(name, responses, examples)`` gives one ``scoring.verdict.Verdict`` per response:
``correct`` is the grader's word (pass), ``verdict`` says what happened. The reward of a graded response is 1.0
when correct and 0.0 otherwise (``reward_of``). A response the grader could not grade (``UNGRADED_VERDICTS``:
``grader_error`` — the grading worker crashed, the sandbox could not start — or ``timeout``, the grader's own
hard limit) has no reward: the trainer counts it (``reward/ungraded``) and by default leaves its group out of the
update (``ungraded: drop_group``), so an infrastructure failure never becomes a wrong answer.

``math`` grades ``example['answer']`` with math-verify (scoring.math) in a worker pool with a hard per-item
timeout (scoring.pool); ``code`` runs the example's tests in the sandbox (scoring.code) and passes only when every
test passes; the embedded tasks grade with their own checker. Imports are lazy so that a tiny run needs neither.
"""

from __future__ import annotations

from typing import Callable, Sequence

from scoring.verdict import GRADER_ERROR, UNGRADED_VERDICTS, Verdict

Grader = Callable[[str, dict], Verdict]

__all__ = ["GRADERS", "Grader", "UNGRADED_VERDICTS", "get_grader", "grade_responses", "reward_of"]


def _task_grader(name: str) -> Grader:
    def grade(response: str, example: dict) -> Verdict:
        from scoring.tasks import get_task
        ok = float(get_task(name).reward(response, example)) > 0
        return Verdict(ok, "pass" if ok else "wrong_answer")
    grade.__name__ = f"grade_{name}"
    return grade


def grade_math_example(response: str, example: dict) -> Verdict:
    from scoring.math import grade_math
    return grade_math(response, str(example["answer"]))


def grade_code_example(response: str, example: dict) -> Verdict:
    """Example fields: 'tests' (list of {input, output}), 'testtype' (stdin | functional), 'fn_name'. A sandbox
    that cannot run is ``grader_error``, never a wrong answer."""
    from scoring.code import extract_code, grade_code
    from scoring.sandbox import SandboxError
    tests = example["tests"] if "tests" in example else example["answer"]
    try:
        return grade_code(extract_code(response), tests, kind=example.get("testtype", "stdin"),
                          fn_name=example.get("fn_name"))
    except SandboxError as e:
        return Verdict(False, GRADER_ERROR, None, f"sandbox: {e}"[:2000])


GRADERS: dict[str, Grader] = {
    "addition": _task_grader("addition"),
    "countdown": _task_grader("countdown"),
    "math": grade_math_example,
    "code": grade_code_example,
}


def get_grader(name: str) -> Grader:
    if name not in GRADERS:
        raise ValueError(f"unknown task/reward '{name}'; choose one of {sorted(GRADERS)}")
    return GRADERS[name]


def reward_of(v: Verdict) -> float:
    """1.0 for a correct response, 0.0 for a graded wrong one (an ungraded one is the trainer's to handle)."""
    return 1.0 if v.correct else 0.0


def grade_responses(name: str, responses: Sequence[str], examples: Sequence[dict]) -> list[Verdict]:
    """Verdicts for a batch. Math answers are graded in a process pool with a hard per-item timeout; any
    exception of a grader becomes that response's ``grader_error``."""
    if name == "math":
        try:
            from scoring.pool import grade_math_batch
        except ImportError:
            grade_math_batch = None
        if grade_math_batch is not None:
            return list(grade_math_batch(list(responses), [str(e["answer"]) for e in examples]))
    fn = get_grader(name)
    out = []
    for r, e in zip(responses, examples):
        try:
            out.append(fn(r, e))
        except Exception as exc:   # a grader's crash is not the response's fault
            out.append(Verdict(False, GRADER_ERROR, None, f"{type(exc).__name__}: {exc}"[:2000]))
    return out
