"""The result of grading one response: shared by the math and code graders, the trainer's rewards and ``eval``.

``verdict`` names what happened (``pass``, ``wrong_answer``, ``no_answer``, ``runtime_error``, ``time_limit``,
``memory_limit``, ``timeout``); ``correct`` is True only for ``pass``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    correct: bool
    verdict: str            # pass | wrong_answer | runtime_error | time_limit | memory_limit | timeout | no_answer
    answer: str | None = None   # the extracted answer (math) or None (code)
    detail: str = ""
