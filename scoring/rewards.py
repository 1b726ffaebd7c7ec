"""Reward functions: one signature for the embedded tasks and for the math and code rewards of real runs.

Every reward is ``fn(response: str, example: dict) -> float``. ``math`` grades ``example['answer']`` with
math-verify (scoring.math); ``code`` runs the example's tests in the sandbox (scoring.code) and gives
1.0 only when every test passes. Imports are lazy so that a tiny run needs neither.
"""

from __future__ import annotations

from typing import Callable, Sequence

Reward = Callable[[str, dict], float]


def _task_reward(name: str) -> Reward:
    def reward(response: str, example: dict) -> float:
        from scoring.tasks import get_task
        return float(get_task(name).reward(response, example))
    reward.__name__ = f"{name}_reward"
    return reward


def math_reward(response: str, example: dict) -> float:
    from scoring.math import grade_math
    return 1.0 if grade_math(response, str(example["answer"])).correct else 0.0


def code_reward(response: str, example: dict) -> float:
    """Example fields: 'tests' (list of {input, output}), 'testtype' (stdin | functional), 'fn_name'."""
    from scoring.code import extract_code, grade_code
    tests = example["tests"] if "tests" in example else example["answer"]
    verdict = grade_code(extract_code(response), tests, kind=example.get("testtype", "stdin"),
                         fn_name=example.get("fn_name"))
    return 1.0 if verdict.correct else 0.0


REWARDS: dict[str, Reward] = {
    "addition": _task_reward("addition"),
    "countdown": _task_reward("countdown"),
    "math": math_reward,
    "code": code_reward,
}


def get_reward(name: str) -> Reward:
    if name not in REWARDS:
        raise ValueError(f"unknown task/reward '{name}'; choose one of {sorted(REWARDS)}")
    return REWARDS[name]


def compute_rewards(name: str, responses: Sequence[str], examples: Sequence[dict]) -> list[float]:
    """Rewards for a batch. Math answers are graded in a process pool with a hard per-item timeout."""
    if name == "math":
        try:
            from scoring.pool import grade_math_batch
        except ImportError:
            grade_math_batch = None
        if grade_math_batch is not None:
            verdicts = grade_math_batch(list(responses), [str(e["answer"]) for e in examples])
            return [1.0 if v.correct else 0.0 for v in verdicts]
    fn = get_reward(name)
    return [fn(r, e) for r, e in zip(responses, examples)]
