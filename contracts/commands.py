"""The grammar every command shares (docs/commands.md): exit codes, the one-line error, percentages.

Every entry point (``trainer.train``, ``eval.run``, ``eval.leaderboard``, ``tsanalysis``, ``demo``,
``demo.miniature``, ``demo.premise``) ends the same way:

* 0: done.
* 2 (``EXIT_USAGE``): bad input (a flag, a config value, a file, a model, an output folder, a resume with other
  settings): one line ``error: <what is wrong>; <what to do>`` on stderr (argparse's own usage errors put the
  usage line before theirs), no traceback, found before anything expensive starts and before anything is written.
* 1 (``EXIT_FAILURE``): a failure inside the run (a model that fails to load, an engine that dies, a full disk):
  one line ``error: <type>: <message>`` and what the command keeps, with the hint to rerun with
  ``THINKING_SEEDS_DEBUG=1`` for the traceback (``DEBUG_ENV``: the one switch; the same command then prints the
  traceback and still exits 1).
* 130 (``EXIT_INTERRUPTED``, 128 + SIGINT): Ctrl-C, one line saying where the same command resumes.
* 143 (``EXIT_TERMINATED``, 128 + SIGTERM): SIGTERM (what Slurm or Kubernetes send before they kill a job), the
  same line. The trainer finishes its step and saves a resume point first (``trainer.signals``); commands that
  append results as they go (``eval.run``, the relay) stop at once: their files resume where they stopped.
* ``eval.run`` alone has 3: everything ran but some samples could not be graded (``--allow-ungraded``).

Rates a person reads (report lines, printed tables, the leaderboard) are percentages with one decimal (``pct``:
``43.1%``; differences in points, ``points``: ``+2.5``); files (JSONL, CSV, Parquet, JSON) keep fractions.

``run_command`` is the shell every command's ``main`` wraps its body in; this module imports nothing but the
standard library, so a command's ``--help`` and its input errors stay cheap.
"""

from __future__ import annotations

import errno
import math
import os
import signal
import sys
import threading
import traceback
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_INTERRUPTED", "EXIT_TERMINATED", "DEBUG_ENV",
           "EXIT_CODES_HELP", "Terminated", "pct", "points", "debug", "one_line", "failure_line", "stopped_line",
           "sigterm_raises", "run_command"]

EXIT_OK = 0
EXIT_FAILURE = 1        # a failure inside the run: one line, the traceback with THINKING_SEEDS_DEBUG=1
EXIT_USAGE = 2          # usage or input error: one line, nothing written (argparse's own code for usage errors)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, the shell's code for a Ctrl-C (trainer.signals.INTERRUPTED_EXIT)
EXIT_TERMINATED = 143   # 128 + SIGTERM (trainer.signals.PREEMPTED_EXIT)
DEBUG_ENV = "THINKING_SEEDS_DEBUG"

# the lines every command's --help ends with (after its own, e.g. eval.run's 3)
EXIT_CODES_HELP = (f"exit status: 0 done; 2 bad input (one 'error:' line, nothing written);\n"
                   f"1 a failure inside the run (one line; {DEBUG_ENV}=1 prints the traceback);\n"
                   f"130 Ctrl-C, 143 SIGTERM (one line: where the same command resumes)")


class Terminated(BaseException):
    """SIGTERM arrived inside ``sigterm_raises`` (a BaseException, like KeyboardInterrupt: ``except Exception``
    in library code does not swallow it)."""


def pct(x: float | None, *, digits: int = 1, unit: str = "%", missing: str = "n/a") -> str:
    """A fraction as a percentage: ``pct(0.43125) == "43.1%"``; None or NaN is ``missing`` (``"n/a"``). ``unit=""``
    for table cells whose header says %; ``missing=""`` for a table's empty cell."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return missing
    return f"{100 * x:.{digits}f}{unit}"


def points(x: float | None, *, digits: int = 1, missing: str = "n/a") -> str:
    """A difference of two fractions in percentage points, signed: ``points(-0.025) == "-2.5"``; None or NaN is
    ``missing``."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return missing
    return f"{100 * x:+.{digits}f}"


def debug() -> bool:
    """Whether ``THINKING_SEEDS_DEBUG`` asks for tracebacks (set, and not 0/false/no/empty)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def one_line(text: str, *, limit: int = 400) -> str:
    """``text`` on one line (whitespace runs, newlines included, become one space), cut at ``limit`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or one of its causes) is the disk filling up: OSError ENOSPC, or what torch's serializer
    raises in its place (``[enforce fail at inline_container.cc] ... unexpected pos``, ``PytorchStreamWriter failed
    writing file``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        text = str(exc)
        if "unexpected pos" in text or "PytorchStreamWriter failed writing file" in text or "No space left" in text:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def failure_line(exc: BaseException, *, kept: str | None = None, writing: str | None = None) -> str:
    """The line a failure inside the run prints: its type and message, what is kept, how to see the traceback.
    ``writing``: the folder the command writes, named when the failure is the disk filling up."""
    if writing is not None and disk_full(exc):
        kept = f"; {kept}" if kept else ""
        return (f"error: no space left on device while writing {writing}: free space there or set another output "
                f"folder{kept} ({type(exc).__name__}: {one_line(str(exc))})")
    msg = one_line(str(exc)) or "(no message)"
    kept = f"; {kept}" if kept else ""
    return (f"error: {type(exc).__name__}: {msg}{kept} (a failure inside the run, not bad input; rerun with "
            f"{DEBUG_ENV}=1 for the traceback)")


def stopped_line(interrupted: bool, resume: str) -> str:
    """The one line of a command a signal stopped: ``interrupted (Ctrl-C): <resume>`` (after a newline: the
    terminal's ``^C`` is still on the line) or ``stopped (SIGTERM): <resume>``, ``resume`` saying where the same
    command resumes. One function, so every command (and each phase of the trainer) says it alike; the exit status
    goes with it: ``EXIT_INTERRUPTED`` or ``EXIT_TERMINATED``."""
    return f"\ninterrupted (Ctrl-C): {resume}" if interrupted else f"stopped (SIGTERM): {resume}"


_SIGINT_SEEN: list[bool] = []   # a Ctrl-C arrived inside ``sigterm_raises`` (cleared on entry)


def sigint_arrived() -> bool:
    """Whether a Ctrl-C arrived while the command ran: a failure after it is the interrupt's doing, even when a
    library turned the KeyboardInterrupt into an error of its own that no longer carries it (torch's checkpoint
    writer, stopped mid-file, raises ``unexpected pos``, which reads like a full disk)."""
    return bool(_SIGINT_SEEN)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While inside, SIGTERM raises ``Terminated`` in the main thread (elsewhere: nothing changes), so the
    command's ``finally`` blocks run (engines and process pools close) and it exits 143 with its line. Ctrl-C
    raises KeyboardInterrupt as Python's default handler does, and is recorded (``sigint_arrived``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise Terminated()

    def _interrupt(signum, frame):
        _SIGINT_SEEN.append(True)
        raise KeyboardInterrupt

    _SIGINT_SEEN.clear()
    previous = signal.signal(signal.SIGTERM, _raise)
    keep_int = signal.getsignal(signal.SIGINT) is not signal.default_int_handler   # someone else's handler stays
    previous_int = None if keep_int else signal.signal(signal.SIGINT, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)


def run_command(body: Callable[[], int | None], *, input_errors: tuple[type[BaseException], ...] = (),
                resume: Callable[[], str] | None = None, kept: Callable[[], str | None] | None = None) -> int:
    """Run a command's ``body`` under the grammar above and return its exit status.

    ``input_errors``: the exception types that are bad input (printed as ``error: <message>``, exit 2; a message
    that starts with ``error:`` already is printed as it is). ``resume()``: the sentence after ``interrupted
    (Ctrl-C):`` / ``stopped (SIGTERM):`` (where the same command resumes); ``kept()``: what a failure leaves usable
    (e.g. the results written so far), or None. ``SystemExit`` (argparse, a body's own exit) passes through.
    """
    def _say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def _resume() -> str:
        return resume() if resume is not None else "nothing is lost that the same command cannot redo"

    try:
        with sigterm_raises():
            status = body()
        return EXIT_OK if status is None else int(status)
    except SystemExit:   # argparse's usage errors, a body's own exit (also one that is a ValueError too)
        raise
    except KeyboardInterrupt:
        _say(stopped_line(True, _resume()))
        return EXIT_INTERRUPTED
    except Terminated:
        _say(stopped_line(False, _resume()))
        return EXIT_TERMINATED
    except input_errors as exc:
        msg = str(exc).strip()
        msg = one_line(msg, limit=10_000) if "\n" in msg else msg   # messages are one line; a stray newline too
        _say(msg if msg.startswith("error:") else f"error: {msg}")
        return EXIT_USAGE
    except Exception as exc:   # a failure inside the run: one line (the traceback on request)
        if sigint_arrived():   # a Ctrl-C that a library turned into its own error on the way out
            _say(stopped_line(True, _resume()))
            return EXIT_INTERRUPTED
        if debug():
            traceback.print_exc()
        try:
            left = kept() if kept is not None else None
        except Exception:   # the failure may have taken what kept() reads with it: say nothing rather than fail
            left = None
        _say(failure_line(exc, kept=left))
        return EXIT_FAILURE
