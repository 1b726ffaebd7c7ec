"""The trainer's embedded tasks (``scoring.tasks``: addition, countdown, minicode) as benchmarks for the tiny models.

Default problems: a held-out split generated with a fixed seed (``scoring.tasks.HELDOUT_SEED``, far from the seeds
training uses) and the task's default difficulty; ``--problems FILE`` reads rows of the same format instead (JSONL,
``{"id", "prompt", "answer", ...}``, as ``python -m scoring.tasks.make`` writes). Template ``raw`` (the prompt
is the model's input as is), 8 samples at temperature 1.0, 64 new tokens. A response is correct when the
task's reward is positive; ``minicode`` (kind ``code``, 64 new tokens) takes its verdict from the trainer's code
reward (``scoring.rewards.grade_code_example``: the program run on the problem's tests in the sandbox), so a
sandbox failure is ``grader_error`` (not scored) rather than a wrong answer.
"""

from __future__ import annotations

from functools import partial

from contracts.jsonl import read_rows
from scoring.benchmarks.base import Benchmark, Problem, Verdict
from scoring.tasks import HELDOUT_SEED, TASKS

__all__ = ["ADDITION", "COUNTDOWN", "MINICODE", "TEST_SIZE", "load_task", "grade_task", "grade_code_task"]

TEST_SIZE = 200
VERSION = "1"
GENERATION = {"n": 8, "temperature": 1.0, "top_p": 1.0, "max_tokens": 64}


def load_task(path=None, *, task: str, n: int = TEST_SIZE, seed: int = HELDOUT_SEED) -> list[Problem]:
    """Problems of ``task``: from ``path`` (JSONL rows) or ``make_examples(n, seed=seed)``."""
    if path is not None:
        located = read_rows(path, what="problems file")
        rows = [x.row for x in located]
        for where, _, r in located:
            missing = [k for k in ("id", "prompt", "answer") if k not in r]
            if missing:
                raise ValueError(f"{where}: a {task} problem needs fields id, prompt, answer; missing {missing}")
    else:
        rows = TASKS[task].make_examples(n, seed=seed)
    return [Problem(id=str(r["id"]), question=r["prompt"], gold=str(r["answer"]), meta={"task": task, "row": r})
            for r in rows]


def grade_task(response: str, problem: Problem) -> Verdict:
    """Correct iff the task's reward is positive. ``answer``: what the task's ``parse_answer`` reads when it has
    one (None -> verdict no_answer), else the response's last non-blank line."""
    mod = TASKS[problem.meta["task"]]
    ok = mod.reward(response, problem.meta["row"]) > 0
    parse = getattr(mod, "parse_answer", None)
    if parse is not None:
        got = parse(response)
        answer = None if got is None else str(got)
    else:
        lines = [line.strip() for line in response.splitlines() if line.strip()]
        answer = lines[-1] if lines else None
    return Verdict(ok, "pass" if ok else ("wrong_answer" if answer is not None else "no_answer"), answer)


def grade_code_task(response: str, problem: Problem) -> Verdict:
    """The verdict of the trainer's code reward on the problem's row (its tests run in the sandbox)."""
    from scoring.rewards import grade_code_example
    return grade_code_example(response, problem.meta["row"])


def _benchmark(task: str, description: str, *, kind: str = "task", grade=grade_task) -> Benchmark:
    return Benchmark(name=task, version=f"{task}-{VERSION}-seed{HELDOUT_SEED}-n{TEST_SIZE}", kind=kind,
                     load=partial(load_task, task=task), grade=grade, default_template="raw",
                     generation=dict(GENERATION), description=description)


ADDITION = _benchmark("addition", f"scoring.tasks.addition, {TEST_SIZE} problems, seed {HELDOUT_SEED}")
COUNTDOWN = _benchmark("countdown", f"scoring.tasks.countdown, {TEST_SIZE} problems, seed {HELDOUT_SEED}")
MINICODE = _benchmark("minicode", f"scoring.tasks.minicode, {TEST_SIZE} problems, seed {HELDOUT_SEED}, graded in the "
                      f"sandbox", kind="code", grade=grade_code_task)
