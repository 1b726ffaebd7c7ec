"""Stopping a run on a signal without losing it.

SIGTERM is what a cluster scheduler (Slurm, Kubernetes) sends before it kills a preempted job, and what torchrun
forwards to every rank: ``Preemption`` turns it into a request that the training loop honours at the end of the
current step, on every rank together (the flag is gathered, so the ranks agree on the step), by saving a resume
point and raising ``Preempted``; the entry point then exits with ``PREEMPTED_EXIT`` and one line saying how to
resume. Ctrl-C (SIGINT) stops at once, as a user expects; atomic writes leave the run at its last checkpoint,
and the entry point exits with ``INTERRUPTED_EXIT`` and the same line (``resume_hint``).
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from contracts.commands import EXIT_INTERRUPTED, EXIT_TERMINATED
from trainer.checkpoint import damaged, list_checkpoints
from trainer.fsdp import Dist, all_gather_objects

INTERRUPTED_EXIT = EXIT_INTERRUPTED   # 130, 128 + SIGINT: every command's code for a Ctrl-C (contracts.commands)
PREEMPTED_EXIT = EXIT_TERMINATED      # 143, 128 + SIGTERM: the run stopped early, with a resume point


class Preempted(Exception):
    """The run stopped at the end of ``step`` on SIGTERM, after saving a resume point."""

    def __init__(self, step: int):
        super().__init__(f"stopped on SIGTERM after step {step}")
        self.step = step


class Preemption:
    """Context manager: while inside, SIGTERM sets a flag instead of killing the process (the main thread only,
    where Python delivers signals; elsewhere it does nothing). ``requested(d)`` is true on every rank once any
    rank got the signal."""

    def __init__(self):
        self.flag = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        self.flag = True

    def __enter__(self) -> "Preemption":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def requested(self, d: Dist) -> bool:
        return any(all_gather_objects(self.flag, d)) if d.enabled else self.flag


def resume_hint(run_dir: Path) -> str:
    """Where a rerun of the same command continues: the run's newest checkpoint, or the start."""
    done = [(step, path) for step, path in list_checkpoints(Path(run_dir)) if damaged(path) is None]
    if not done:
        return f"no checkpoint in {run_dir} yet: the same command starts the run again from step 0"
    step, path = done[-1]
    return f"the same command resumes from {path} (step {step + 1})"
