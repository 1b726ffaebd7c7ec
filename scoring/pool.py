"""Grade many items in worker processes with a hard per-item timeout that we enforce ourselves.

math-verify's own timeout uses SIGALRM (main thread only) and sympy can hang for minutes on hostile answers
(``9^{9^{9^{9}}}``). ``WorkerPool`` hands one item at a time to each worker process over a pipe; when an item
runs past ``timeout`` seconds (counted from when its worker is up: start-up is not the item's time) its worker is
killed (SIGKILL) and replaced, and the item's result is ``status="timeout"``. Other items keep grading. A worker that dies on its own gives ``status="error"``
(``scoring.grading.grade_batch`` turns both into the item's ungraded verdict, never a score).

Workers start from a ``forkserver`` (default) or ``spawn`` context — never ``fork``, which would copy a parent
holding CUDA state or threads. The function must be importable by reference (a module-level function).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

from scoring.math import grade_math
from scoring.qwen import grade_qwen
from scoring.verdict import Verdict

__all__ = ["PoolResult", "WorkerPool", "apply", "default_workers", "math_item", "qwen_item", "qwen_verdict"]


@dataclass(frozen=True)
class PoolResult:
    status: str          # ok | timeout | error
    value: Any = None    # fn's return value when ok
    detail: str = ""     # the traceback (error) or the time limit (timeout)


# imported once by the fork server, so a replacement worker starts in milliseconds instead of ~1 s
_PRELOAD = ("scoring.math", "scoring.qwen", "math_verify", "latex2sympy2_extended", "sympy")
# A worker's start-up (a fork from the fork server, or a fresh interpreter, importing the item function's module)
# never counts against an item's timeout: on a loaded machine it can take longer than the item limit itself, and an
# instant reward function then came back "timeout". A worker not up after this many seconds fails its item.
STARTUP_S = 300.0


def default_workers() -> int:
    """One worker per usable core."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not Linux
        return max(1, os.cpu_count() or 1)


def _worker_main(fn, conn) -> None:
    conn.send(("ready",))   # started, fn's module imported: the items' clocks start from here
    while True:
        msg = conn.recv()
        if msg is None:
            return
        idx, args = msg
        try:
            conn.send((idx, "ok", fn(*args), ""))
        except Exception:   # the item's own failure, reported back; the worker lives on
            conn.send((idx, "error", None, traceback.format_exc(limit=5)))


class _MainWithoutFile:
    """While starting a worker: hide ``__main__.__file__`` when it names no file (``python - <<EOF``, stdin:
    ``<stdin>``). multiprocessing's spawn/forkserver children re-run the main module from that path, fail, and die
    before their first item (every item then came back ``error``); without a path they skip it."""

    def __enter__(self):
        self.main = sys.modules.get("__main__")
        self.file = getattr(self.main, "__file__", None)
        if self.file is not None and not os.path.isfile(self.file):
            del self.main.__file__
        else:
            self.file = None
        return self

    def __exit__(self, *exc):
        if self.file is not None:
            self.main.__file__ = self.file


class _Worker:
    def __init__(self, ctx, fn):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(fn, child), daemon=True)
        with _MainWithoutFile():
            self.proc.start()
        child.close()
        self.item: int | None = None      # index of the item in flight
        self.started = 0.0                # when the item in flight started to count against the timeout
        self.spawned = time.monotonic()
        self.ready = False                # the worker said it is up (imports done): before that no item's clock runs

    def deadline(self, timeout: float) -> float:
        """When the item in flight fails: ``timeout`` after it started on a ready worker, else the start-up limit."""
        return self.started + timeout if self.ready else self.spawned + STARTUP_S

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


class WorkerPool:
    """``map`` ``fn`` over argument tuples in ``workers`` processes; each item gets at most ``timeout`` seconds.

    Use as a context manager (or call ``close``); the pool is reused across ``map`` calls so worker start-up
    (importing sympy, ~1 s) is paid once.
    """

    def __init__(self, fn: Callable, *, workers: int | None = None, timeout: float = 10.0,
                 context: str = "forkserver", preload: Sequence[str] = _PRELOAD):
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout}")
        if context not in ("forkserver", "spawn"):
            raise ValueError(f"context must be 'forkserver' or 'spawn' (never 'fork'), got {context!r}")
        self.fn, self.timeout = fn, float(timeout)
        self.n_workers = workers or default_workers()
        self.ctx = mp.get_context(context)
        if context == "forkserver":   # the fork server imports fn's module once; forked workers start warm
            self.ctx.set_forkserver_preload([fn.__module__, *preload])
        self.workers: list[_Worker] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for w in self.workers:
            try:
                w.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for w in self.workers:
            w.proc.join(timeout=2)
            if w.proc.is_alive():
                w.kill()
        self.workers = []

    def _spawn(self) -> _Worker:
        return _Worker(self.ctx, self.fn)

    def map(self, items: Sequence[tuple], *, progress: bool = False, desc: str = "grading") -> list[PoolResult]:
        """Results in the order of ``items``; never raises for an item's failure or timeout."""
        results: list[PoolResult | None] = [None] * len(items)
        if not items:
            return []
        while len(self.workers) < min(self.n_workers, len(items)):
            self.workers.append(self._spawn())
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(items), desc=desc, leave=False)
        todo, done = iter(range(len(items))), 0

        def dispatch(i: int) -> None:
            idx = next(todo, None)
            if idx is None:
                return
            w = self.workers[i]
            if not w.proc.is_alive():   # died while idle (killed from outside): replace before use
                w.kill()
                w = self.workers[i] = self._spawn()
            w.conn.send((idx, items[idx]))
            w.item, w.started = idx, time.monotonic()   # (restarted when a worker still starting says it is up)

        def finish(idx: int, res: PoolResult) -> None:
            nonlocal done
            results[idx] = res
            done += 1
            if bar is not None:
                bar.update(1)

        for i in range(len(self.workers)):
            dispatch(i)
        while done < len(items):
            busy = [w for w in self.workers if w.item is not None]
            now = time.monotonic()
            wait_s = max(0.0, min(w.deadline(self.timeout) for w in busy) - now)
            ready = wait([w.conn for w in busy], timeout=wait_s)
            for i, w in enumerate(self.workers):
                if w.item is None:
                    continue
                if w.conn in ready:
                    try:
                        msg = w.conn.recv()
                        if msg == ("ready",):   # up: its item's time counts from now, not from a loaded start-up
                            w.ready, w.started = True, time.monotonic()
                            continue
                        idx, status, value, detail = msg
                    except (EOFError, OSError):   # the worker died (segfault, OOM kill): replace it
                        w.proc.join(timeout=1)
                        code = w.proc.exitcode
                        finish(w.item, PoolResult("error", None, f"worker died (exit code {code})"))
                        w.kill()
                        self.workers[i] = self._spawn()
                        dispatch(i)
                        continue
                    assert idx == w.item, f"worker answered item {idx} while {w.item} was in flight"
                    finish(idx, PoolResult(status, value, detail))
                    w.item = None
                    dispatch(i)
                elif not w.ready and time.monotonic() >= w.deadline(self.timeout):
                    finish(w.item, PoolResult("error", None, f"the worker did not start within {STARTUP_S:g} s"))
                    w.kill()
                    self.workers[i] = self._spawn()
                    dispatch(i)
                elif w.ready and time.monotonic() - w.started >= self.timeout:
                    finish(w.item, PoolResult("timeout", None, f"exceeded {self.timeout:g} s"))
                    w.kill()
                    self.workers[i] = self._spawn()
                    dispatch(i)
        if bar is not None:
            bar.close()
        return results   # type: ignore[return-value]


# ---- item functions (module level, so workers can import them by reference) ----

def apply(fn: Callable, *args):
    """Pool function for mixed work: items are ``(fn, *args)`` with ``fn`` a module-level function."""
    return fn(*args)


def math_item(response: str, gold, multiple_answer: bool = False, unit: str | None = None) -> Verdict:
    """math-verify grading of one response, with math-verify's SIGALRM timeout off (the pool bounds time)."""
    return grade_math(response, gold, multiple_answer=multiple_answer, unit=unit, timeout=None)


def qwen_item(response: str, gold, multiple_answer: bool = False, unit: str | None = None,
              benchmark: str | None = None) -> bool:
    """The Qwen-style cross-check of one response (``scoring.qwen.grade_qwen``). ``multiple_answer`` is accepted
    for symmetry with ``math_item`` and ignored (Qwen compares lists in order); ``benchmark="minerva"`` keeps unit
    words, as Qwen's harness does for Minerva."""
    return grade_qwen(response, gold, unit=unit, skip_unit=benchmark == "minerva")


def qwen_verdict(response: str, gold, multiple_answer: bool = False, unit: str | None = None,
                 benchmark: str | None = None) -> Verdict:
    """``qwen_item`` as a verdict (``pass`` / ``wrong_answer``), for ``scoring.grading.grade_batch``: eval's
    cross-check runs beside math-verify in one pool, and a failed cross-check comes back ungraded."""
    ok = qwen_item(response, gold, multiple_answer, unit, benchmark)
    return Verdict(bool(ok), "pass" if ok else "wrong_answer")
