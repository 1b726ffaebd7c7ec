"""Batch grading, the one home: ``grade_batch`` runs a grader over many items and turns every failure of the grader
itself into that item's ungraded verdict, never into a wrong answer.

Contract (what the trainer's rewards and ``eval`` rely on)::

    grade_batch(grade, items, *, mode, pool=None, timeout_s=None, workers=None, answer_of=None,
                progress=False, desc="grading") -> list[Verdict]

- ``items`` is a sequence of argument tuples; item ``i`` is graded as ``grade(*items[i])``. The result has one
  entry per item, in the order of ``items``: ``grade``'s own return value (a ``Verdict``) when it returned.
- ``mode`` says where ``grade`` runs:
  ``"inline"``  in this process, one item after another (instant graders: the embedded tasks' checkers);
  ``"thread"``  on ``workers`` threads (default ``workers_per_rank()``), for graders that wait on their own
                isolated subprocess (the code sandbox, which enforces its own limits);
  ``"process"`` in a ``scoring.pool.WorkerPool`` with a hard per-item timeout (math-verify: sympy can hang for
                minutes). ``pool`` is reused when given (its ``fn`` must be ``grade``; for mixed work make the pool
                with ``scoring.pool.apply`` and pass ``grade=apply``, items ``(fn, *args)``); otherwise a pool of
                ``workers`` processes with ``timeout_s`` (default ``GRADE_TIMEOUT_S``) is made and closed here. A
                given pool has its own timeout: ``timeout_s`` must then be left out or equal it.
- Failures, in this one place: an exception of ``grade`` (any mode), or an item whose worker died, is
  ``Verdict(False, "grader_error", answer, detail)``; an item past the pool's hard timeout is
  ``Verdict(False, "timeout", answer, detail)``. ``answer`` is ``answer_of(item)`` (e.g. the extracted math
  answer, so the file still shows what the response said) or None; ``detail`` says what failed (at most 2,000
  characters). Both verdicts are ``UNGRADED_VERDICTS``: evaluation never scores them, training drops them.
  ``inline`` and ``thread`` have no hard timeout (a thread cannot be killed): use them only for graders that bound
  their own time.

``GRADE_TIMEOUT_S`` is the one default hard per-item limit of math grading (math-verify takes ~2 ms on a normal
answer); eval's ``--grade-timeout`` defaults to it. ``grade_math_many`` / ``grade_math_batch`` are math-verify
over ``grade_batch`` (the latter on a pool kept between calls: the trainer's math reward); the pools they make give
each worker ``memory_mb`` of address space (default ``scoring.math.MATH_MEMORY_MB``): an item past it gets a
MemoryError, which is its ``grader_error`` like any exception when it leaves the grader, and math-verify's own
"cannot parse" when math-verify catches it (it catches every exception of its parser and comparison: the
answer is then not read, wrong or ``no_answer``, as any answer it fails on). Never an out-of-memory kill of the
process that grades.
"""

from __future__ import annotations

import atexit
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Literal, Sequence

from scoring.math import MATH_MEMORY_MB, extract_answer
from scoring.pool import WorkerPool, math_item, workers_per_rank
from scoring.verdict import GRADER_ERROR, Verdict

__all__ = ["GRADE_TIMEOUT_S", "GradeMode", "grade_batch", "grade_math_batch", "grade_math_many"]

GRADE_TIMEOUT_S = 10.0   # hard per-item limit for math grading (math-verify takes ~2 ms on normal answers)

GradeMode = Literal["inline", "thread", "process"]

_DETAIL_CHARS = 2000


def _raised(exc: BaseException, answer: str | None) -> Verdict:
    return Verdict(False, GRADER_ERROR, answer, f"{type(exc).__name__}: {exc}"[:_DETAIL_CHARS])


def _guarded(grade: Callable[..., Verdict], item: tuple, answer_of) -> Verdict:
    try:
        return grade(*item)
    except Exception as exc:   # a grader's crash is not the response's fault
        return _raised(exc, answer_of(item) if answer_of else None)


def grade_batch(grade: Callable[..., Any], items: Sequence[tuple], *, mode: GradeMode,
                pool: WorkerPool | None = None, timeout_s: float | None = None, workers: int | None = None,
                answer_of: Callable[[tuple], str | None] | None = None, progress: bool = False,
                desc: str = "grading") -> list[Verdict]:
    """``grade(*item)`` for every item, in order; a grader failure is the item's ``grader_error`` or ``timeout``
    verdict (module docstring: the contract)."""
    items = [tuple(it) for it in items]
    if mode == "process":
        return _in_processes(grade, items, pool=pool, timeout_s=timeout_s, workers=workers, answer_of=answer_of,
                             progress=progress, desc=desc)
    if pool is not None or timeout_s is not None:
        raise ValueError(f"grade_batch: pool and timeout_s apply to mode='process' only, not mode={mode!r}")
    bar = _bar(progress, len(items), desc)
    if mode == "inline":
        out = []
        for it in items:
            out.append(_guarded(grade, it, answer_of))
            bar and bar.update(1)
    elif mode == "thread":
        with ThreadPoolExecutor(max_workers=workers or workers_per_rank()) as ex:
            futures = [ex.submit(_guarded, grade, it, answer_of) for it in items]
            out = []
            for f in futures:
                out.append(f.result())
                bar and bar.update(1)
    else:
        raise ValueError(f"grade_batch: mode must be 'inline', 'thread' or 'process', got {mode!r}")
    bar and bar.close()
    return out


def _in_processes(grade, items, *, pool, timeout_s, workers, answer_of, progress, desc) -> list[Verdict]:
    if pool is not None:
        fn = getattr(pool, "fn", grade)   # a stand-in pool (tests) may have none
        if fn is not grade:
            raise ValueError(f"grade_batch: the pool runs {getattr(fn, '__name__', fn)}, not "
                             f"{getattr(grade, '__name__', grade)}; pass grade=pool.fn (scoring.pool.apply: items "
                             f"(fn, *args))")
        if timeout_s is not None and float(timeout_s) != pool.timeout:
            raise ValueError(f"grade_batch: timeout_s={timeout_s:g} but the given pool's timeout is "
                             f"{pool.timeout:g} s; leave timeout_s out or make the pool with it")
    own = pool is None
    if own:
        pool = WorkerPool(grade, workers=workers, timeout=GRADE_TIMEOUT_S if timeout_s is None else timeout_s)
    try:
        results = pool.map(items, progress=progress, desc=desc)
    finally:
        if own:
            pool.close()
    out = []
    for it, r in zip(items, results):
        if r.status == "ok":
            out.append(r.value)
        else:   # the grader's own time limit, or its worker crashed / raised: not graded, never a wrong answer
            name = "timeout" if r.status == "timeout" else GRADER_ERROR
            out.append(Verdict(False, name, answer_of(it) if answer_of else None, r.detail[-_DETAIL_CHARS:]))
    return out


def _bar(progress: bool, total: int, desc: str):
    if not progress:
        return None
    from tqdm.auto import tqdm   # optional: only a progress bar needs it
    return tqdm(total=total, desc=desc, leave=False)


# ---- math-verify over grade_batch ------------------------------------------------------------------------------

def _math_answer(item: tuple) -> str | None:
    return extract_answer(item[0])


def grade_math_many(items: Sequence[tuple], *, pool: WorkerPool | None = None, workers: int | None = None,
                    timeout: float = GRADE_TIMEOUT_S, memory_mb: int | None = MATH_MEMORY_MB,
                    progress: bool = False) -> tuple[list[Verdict], dict]:
    """Grade ``(response, gold, multiple_answer, unit)`` tuples with math-verify (``scoring.pool.math_item``) in a
    pool (``pool``, else one of ``workers`` processes with ``timeout`` seconds per item and ``memory_mb`` of address
    space each, closed after).

    Returns (verdicts, counts) where counts = {"timeout": k, "error": m}: the items that timed out and those whose
    grading raised or whose worker died. Both carry the extracted answer (``grade_batch``'s failure verdicts).
    """
    own = pool is None
    if own:
        pool = WorkerPool(math_item, workers=workers, timeout=timeout, memory_mb=memory_mb)
    try:
        verdicts = grade_batch(math_item, items, mode="process", pool=pool, answer_of=_math_answer,
                               progress=progress, desc="math-verify")
    finally:
        if own:
            pool.close()
    counts = {"timeout": sum(v.verdict == "timeout" for v in verdicts),
              "error": sum(v.verdict == GRADER_ERROR for v in verdicts)}
    return verdicts, counts


_SHARED: WorkerPool | None = None


def _shared_pool(timeout: float, workers: int | None, memory_mb: int | None = MATH_MEMORY_MB) -> WorkerPool:
    """A module-level math pool reused across calls (the trainer grades every step); closed at exit."""
    global _SHARED
    if _SHARED is None or _SHARED.timeout != float(timeout) or (workers and _SHARED.n_workers != workers) or \
            _SHARED.memory_mb != memory_mb:
        if _SHARED is not None:
            _SHARED.close()
        _SHARED = WorkerPool(math_item, workers=workers, timeout=timeout, memory_mb=memory_mb)
        atexit.register(_SHARED.close)
    return _SHARED


def grade_math_batch(responses: Sequence[str], golds: Sequence, *, timeout: float = GRADE_TIMEOUT_S,
                     workers: int | None = None, memory_mb: int | None = MATH_MEMORY_MB) -> list[Verdict]:
    """math-verify verdicts for parallel lists of responses and gold answers (the trainer's math reward).

    Uses a pool kept alive between calls, so worker start-up is paid once per process; each worker has
    ``memory_mb`` of address space."""
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} golds")
    verdicts, _ = grade_math_many([(r, g, False, None) for r, g in zip(responses, golds)],
                                  pool=_shared_pool(timeout, workers, memory_mb))
    return verdicts
