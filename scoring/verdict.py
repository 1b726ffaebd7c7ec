"""The result of grading one response: shared by the math and code graders, the trainer's rewards and ``eval``.

``verdict`` names what happened (``pass``, ``wrong_answer``, ``no_answer``, ``runtime_error``, ``time_limit``,
``memory_limit``, ``timeout``, ``grader_error``); ``correct`` is True only for ``pass``.

``score`` is the reward of a grader whose reward is not just pass/fail (KlearReasoner's code reward,
``scoring.klear``: the mean of +1/-1 over the tests run, and format penalties); ``None`` for every other grader,
whose reward is 1 for ``correct`` and 0 otherwise (``scoring.rewards.reward_of``).

``UNGRADED_VERDICTS`` are not a grade: the grader crashed, its sandbox could not run, or it ran out of its own time
(math-verify's hard limit). Evaluation counts and shows them and never scores them; training counts them and keeps
them out of the update.
"""

from __future__ import annotations

from dataclasses import dataclass

GRADER_ERROR = "grader_error"
UNGRADED_VERDICTS = (GRADER_ERROR, "timeout")
# every verdict the graders give (scoring.math, scoring.code, scoring.klear, the embedded tasks' checkers); a
# user's ``reward_fn`` is held to them (scoring.rewards)
VERDICTS = ("pass", "wrong_answer", "no_answer", "runtime_error", "time_limit", "memory_limit", *UNGRADED_VERDICTS)


@dataclass(frozen=True)
class Verdict:
    correct: bool
    verdict: str            # one of VERDICTS
    answer: str | None = None   # the extracted answer (math) or None (code)
    detail: str = ""
    score: float | None = None   # the reward when it is not 1/0 from ``correct`` (scoring.klear); None otherwise
