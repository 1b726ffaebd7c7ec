"""Grade many items in worker processes with a hard per-item timeout that we enforce ourselves.

math-verify's own timeout uses SIGALRM (main thread only) and sympy can hang for minutes on hostile answers
(``9^{9^{9^{9}}}``). ``WorkerPool`` hands one item at a time to each worker process over a pipe; when an item
runs past ``timeout`` seconds (counted from when its worker is up: start-up is not the item's time) its worker is
killed (SIGKILL) and replaced, and the item's result is ``status="timeout"``. Other items keep grading. A worker that dies on its own gives ``status="error"``
(``scoring.grading.grade_batch`` turns both into the item's ungraded verdict, never a score). What an item starts
(a forked process, however detached) is killed when the item ends, and with its worker on a timeout; ``memory_mb``
bounds a worker's address space (the math pools' ``scoring.math.MATH_MEMORY_MB``): an answer whose parse explodes
is that item's failure, not an out-of-memory kill of the trainer.

Workers start from a ``forkserver`` (default) or ``spawn`` context — never ``fork``, which would copy a parent
holding CUDA state or threads. The function must be importable by reference (a module-level function).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Sequence

from scoring.math import grade_math
from scoring.qwen import grade_qwen
from scoring.verdict import Verdict

__all__ = ["PoolResult", "WorkerPool", "apply", "default_workers", "math_item", "qwen_item", "qwen_verdict",
           "workers_per_rank"]


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
    """The usable cores of this process (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:   # not Linux
        return max(1, os.cpu_count() or 1)


# the environment variables that set the grading workers per rank, first found wins (the second is the older name)
WORKERS_ENV = ("THINKING_SEEDS_GRADE_WORKERS", "THINKING_SEEDS_CODE_WORKERS")


def workers_per_rank() -> int:
    """Grading processes (or threads) per process: the usable cores shared among the ranks of this node
    (``LOCAL_WORLD_SIZE``, set by torchrun; 1 outside it), at least 1. ``THINKING_SEEDS_GRADE_WORKERS`` (or the
    older ``THINKING_SEEDS_CODE_WORKERS``) overrides. The one rule every grading pool is sized by: math, code and
    custom rewards, validation, ``eval.run`` (``workers`` unset)."""
    for name in WORKERS_ENV:
        env = os.environ.get(name, "").strip()
        if env:
            if not env.isdigit() or int(env) < 1:
                raise ValueError(f"{name}={env!r}: set it to a positive whole number of grading workers per rank, "
                                 f"or unset it for the usable cores // LOCAL_WORLD_SIZE")
            return int(env)
    return max(1, default_workers() // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)))


# ---- what an item leaves behind, and how much memory it may take ----
# A worker is the root of everything its items start: it leads its own session (os.setsid) and is a child subreaper
# (prctl PR_SET_CHILD_SUBREAPER, Linux 3.4+, no privilege needed), so a process orphaned below it, a double-forked
# grandchild that called setsid included, is re-parented to the worker, not to init, and stays in its tree
# (/proc/<pid>/task/*/children). After each item the worker kills its whole tree (``_kill_tree``); on a timeout or a
# close the parent stops and kills the worker with its tree. Not covered: a process that is no descendant (one an
# item asked a daemon, cron or ssh to start), and, when a worker dies on its own (a segfault, the OOM killer), the
# descendants that also left its process group (their new parent is then init; the group itself is killed).
PR_SET_CHILD_SUBREAPER = 36


def _own_tree() -> None:
    """Make this worker the root of what its items start (the comment above); where Linux is not, only its session."""
    try:
        os.setsid()
    except OSError:   # already a group leader: keep its group
        pass
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _children(pid: int) -> list[int]:
    """The children of ``pid`` (of each of its threads), from /proc; [] when it is gone or /proc has no such file."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def _descendants(pid: int) -> list[int]:
    seen: list[int] = []
    todo = [pid]
    while todo:
        for c in _children(todo.pop()):
            if c not in seen:
                seen.append(c)
                todo.append(c)
    return seen


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _kill_tree(pid: int, *, itself: bool) -> None:
    """SIGKILL every descendant of ``pid`` (and ``pid`` with its process group when ``itself``: a worker leads
    its session). Each is stopped (SIGSTOP) as it is found, parents first, until a walk of the tree finds no new one
    (at most 100 walks), so that none forks a process the kill misses; then all are killed."""
    stopped = [pid] if itself else []
    for p in stopped:
        _signal(p, signal.SIGSTOP)
    for _ in range(100):
        new = [p for p in _descendants(pid) if p not in stopped]
        if not new:
            break
        for p in new:
            _signal(p, signal.SIGSTOP)
        stopped += new
    for p in stopped:
        _signal(p, signal.SIGKILL)
    if itself:
        _kill_group(pid)


def _end_descendants() -> None:
    """In a worker after an item: kill what the item left running and collect it (as the subreaper, the worker is
    the parent of every orphan), so none outlives the item nor stays a zombie. Bounded: a tree that keeps coming
    back past a few seconds is left to the item's timeout, which kills the worker with it."""
    me, deadline = os.getpid(), time.monotonic() + 5.0
    while _children(me) and time.monotonic() < deadline:
        _kill_tree(me, itself=False)
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.001)


def _worker_main(fn, conn, memory_mb: int | None = None) -> None:
    _own_tree()
    if memory_mb is not None:   # soft and hard: an item cannot raise it
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    conn.send(("ready",))   # started, fn's module imported: the items' clocks start from here
    while True:
        msg = conn.recv()
        if msg is None:
            return
        idx, args = msg
        try:
            out = (idx, "ok", fn(*args), "")
        except Exception:   # the item's own failure (MemoryError past ``memory_mb`` too); the worker lives on
            out = (idx, "error", None, traceback.format_exc(limit=5))
        _end_descendants()   # before the result: the clean-up is the item's time, under its timeout
        conn.send(out)


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
    def __init__(self, ctx, fn, memory_mb: int | None = None):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(fn, child, memory_mb), daemon=True)
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
        """SIGKILL the worker with everything it started (``_kill_tree``); of one that died on its own, what is
        left of its process group."""
        if self.proc.exitcode is None:
            _kill_tree(self.proc.pid, itself=True)
        else:
            _kill_group(self.proc.pid)
        self.proc.join()
        self.conn.close()


class WorkerPool:
    """``map`` ``fn`` over argument tuples in ``workers`` processes; each item gets at most ``timeout`` seconds.

    Use as a context manager (or call ``close``); the pool is reused across ``map`` calls so worker start-up
    (importing sympy, ~1 s) is paid once. Whatever an item starts is killed when it ends (``_kill_tree``).
    ``memory_mb``: each worker's address space (RLIMIT_AS, soft and hard); an item that allocates past it gets a
    MemoryError, its ``status="error"``; None: no limit (a reward function may load a model).
    """

    def __init__(self, fn: Callable, *, workers: int | None = None, timeout: float = 10.0,
                 context: str = "forkserver", preload: Sequence[str] = _PRELOAD, memory_mb: int | None = None):
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout}")
        if memory_mb is not None and memory_mb <= 0:
            raise ValueError(f"memory_mb must be positive (MiB) or None, got {memory_mb}")
        if context not in ("forkserver", "spawn"):
            raise ValueError(f"context must be 'forkserver' or 'spawn' (never 'fork'), got {context!r}")
        self.fn, self.timeout, self.memory_mb = fn, float(timeout), memory_mb
        self.n_workers = workers or workers_per_rank()
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
        return _Worker(self.ctx, self.fn, self.memory_mb)

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
