"""scoring.pool's limits on a worker: what an item leaves running (a detached grandchild: fork, setsid, fork again)
dies with the item, and with the worker on a timeout; a worker given ``memory_mb`` has that address space
(RLIMIT_AS), so an item that allocates past it is that item's grader_error, not an out-of-memory kill of the
process that grades. The math pools (the trainer's math reward, ``grade_math_many``) are given
``scoring.math.MATH_MEMORY_MB``."""

import resource

import pytest

from scoring.grading import grade_batch
from scoring.math import MATH_MEMORY_MB
from scoring.pool import WorkerPool, apply
from scoring.verdict import GRADER_ERROR
from tests.helpers.processes import dead

LEAVER = '''
import os
import time


def leave(pid_file, hang):
    """A detached grandchild that would sleep 600 s, its pid in pid_file; then 'done', or a hang past the limit."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(pid_file + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(pid_file + ".tmp", pid_file)
            time.sleep(600)
        os._exit(0)
    deadline = time.monotonic() + 10
    while not os.path.exists(pid_file) and time.monotonic() < deadline:
        time.sleep(0.01)
    if hang:
        time.sleep(60)
    return "done"
'''


@pytest.mark.slow   # over 1.5 s of sandboxed processes or a subprocess
def test_a_detached_grandchild_dies_with_its_item_and_with_a_timed_out_worker(tmp_path, monkeypatch):
    import importlib
    (tmp_path / "leaver_mod.py").write_text(LEAVER)
    monkeypatch.syspath_prepend(str(tmp_path))
    leave = importlib.import_module("leaver_mod").leave
    done, hung = str(tmp_path / "done.pid"), str(tmp_path / "hung.pid")
    with WorkerPool(leave, workers=1, timeout=1.0, context="spawn") as pool:
        first = pool.map([(done, False)])
        worker = pool.workers[0].proc.pid
        assert dead(int(open(done).read())), "the grandchild outlived its item"
        second = pool.map([(hung, True), (done, False)])
        assert dead(int(open(hung).read())), "the grandchild outlived its timed-out worker"
        assert pool.workers[0].proc.pid != worker   # (replaced after the timeout)
    assert [(r.status, r.value) for r in first + second] == [("ok", "done"), ("timeout", None), ("ok", "done")]
    assert dead(int(open(done).read()))


def test_a_workers_address_space_is_bounded_and_an_item_past_it_is_its_grader_error():
    with WorkerPool(apply, workers=1, timeout=10.0, context="spawn", memory_mb=512) as pool:
        [limit] = pool.map([(resource.getrlimit, resource.RLIMIT_AS)])
        worker = pool.workers[0].proc.pid
        got = grade_batch(apply, [(bytearray, 1 << 30), (len, "abc")], mode="process", pool=pool)
        assert pool.workers[0].proc.pid == worker   # the worker lives on
    assert limit.value == (512 << 20, 512 << 20)
    assert got[0].verdict == GRADER_ERROR and "MemoryError" in got[0].detail and got[1] == 3
    with WorkerPool(apply, workers=1, timeout=10.0, context="spawn") as pool:   # no memory_mb: no limit
        [limit] = pool.map([(resource.getrlimit, resource.RLIMIT_AS)])
    assert limit.value == resource.getrlimit(resource.RLIMIT_AS)


def test_the_math_pools_are_given_the_math_memory_limit(monkeypatch):
    import scoring.grading as grading
    assert MATH_MEMORY_MB >= 2048   # math-verify's worker uses ~0.2 GB; the limit is for answers that explode
    before = grading._SHARED
    try:
        assert grading._shared_pool(10.0, 1).memory_mb == MATH_MEMORY_MB   # the trainer's math reward's pool
    finally:
        grading._SHARED.close()
        grading._SHARED = before
    made = []
    monkeypatch.setattr(grading, "WorkerPool", lambda *a, **kw: made.append(kw) or WorkerPool(*a, **kw))
    assert grading.grade_math_many([], workers=1)[0] == [] and made[0]["memory_mb"] == MATH_MEMORY_MB


def test_the_math_rewards_worker_runs_under_the_limit():   # (math-verify's fork server starts in ~0.8 s)
    import scoring.grading as grading
    before = grading._SHARED
    try:
        [v] = grading.grade_math_batch([r"so \boxed{5}"], ["5"], workers=1)
        with open(f"/proc/{grading._SHARED.workers[0].proc.pid}/limits") as f:
            [line] = [x for x in f if x.startswith("Max address space")]
    finally:
        grading._SHARED.close()
        grading._SHARED = before
    assert v.verdict == "pass" and line.split()[3:5] == [str(MATH_MEMORY_MB << 20)] * 2
