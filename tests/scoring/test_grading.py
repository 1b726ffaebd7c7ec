"""scoring.grading.grade_batch, the one batch grader: every failure of a grader (an exception, a dead worker, the
pool's hard timeout) becomes that item's ungraded verdict, in the order of the items, in every mode."""

import os
import time

import pytest

from scoring.grading import grade_batch
from scoring.pool import WorkerPool, apply, math_item
from scoring.verdict import GRADER_ERROR, Verdict


def _check(response: str, gold: str) -> Verdict:
    if gold == "crash":
        raise RuntimeError("grader lost")
    ok = response == gold
    return Verdict(ok, "pass" if ok else "wrong_answer", response)


ITEMS = [("3", "3"), ("4", "5"), ("x", "crash"), ("7", "7")]


@pytest.mark.parametrize("mode", ["inline", "thread"])
def test_in_process_modes_turn_a_crash_into_grader_error(mode):
    got = grade_batch(_check, ITEMS, mode=mode, workers=3, answer_of=lambda it: f"<{it[0]}>")
    assert [v.verdict for v in got] == ["pass", "wrong_answer", GRADER_ERROR, "pass"]
    assert (got[2].answer, got[2].detail) == ("<x>", "RuntimeError: grader lost")
    assert [v.answer for v in got] == ["3", "4", "<x>", "7"]


@pytest.mark.slow
def test_process_mode_keeps_order_and_names_each_failure():
    items = [(math_item, r"so \boxed{5}", "5", False, None),   # graded: pass
             (int, "x"),                                       # the grader raises: grader_error
             (os._exit, 3),                                    # the worker dies: grader_error
             (time.sleep, 60),                                 # past the hard limit: timeout
             (math_item, r"\boxed{4}", "5", False, None)]      # graded: wrong
    with WorkerPool(apply, workers=2, timeout=3.0, context="spawn") as pool:
        got = grade_batch(apply, items, mode="process", pool=pool, answer_of=lambda it: "ans")
    assert [v.verdict for v in got] == ["pass", GRADER_ERROR, GRADER_ERROR, "timeout", "wrong_answer"]
    assert [v.correct for v in got] == [True, False, False, False, False]
    assert "ValueError" in got[1].detail and "worker died (exit code 3)" in got[2].detail
    assert got[3].detail == "exceeded 3 s" and {got[1].answer, got[2].answer, got[3].answer} == {"ans"}


def test_misuse_is_refused_before_grading():
    pool = WorkerPool(apply, workers=1, timeout=5.0)   # no worker starts until map
    with pytest.raises(ValueError, match="the pool runs apply, not _check"):
        grade_batch(_check, ITEMS, mode="process", pool=pool)
    with pytest.raises(ValueError, match="timeout_s=2 but the given pool's timeout is 5 s"):
        grade_batch(apply, [], mode="process", pool=pool, timeout_s=2.0)
    with pytest.raises(ValueError, match="apply to mode='process' only"):
        grade_batch(_check, ITEMS, mode="inline", pool=pool)
    with pytest.raises(ValueError, match="mode must be"):
        grade_batch(_check, ITEMS, mode="fork")


SLOW_IMPORT = "import time\ntime.sleep(1.5)   # a module that takes longer to import than an item may run\n\n\n" \
              "def double(x):\n    return 2 * x\n"


@pytest.mark.slow   # over 1.5 s of sandboxed processes or a subprocess
def test_a_workers_start_up_is_not_an_items_time(tmp_path, monkeypatch):
    # on a loaded machine a worker's imports can outlast the item limit: an instant function then came back
    # "timeout" (a reward call in a two-rank KL test did); the clock starts when the worker says it is up
    import importlib
    (tmp_path / "slow_import_mod.py").write_text(SLOW_IMPORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("slow_import_mod")
    with WorkerPool(mod.double, workers=2, timeout=0.5, context="spawn") as pool:
        got = pool.map([(1,), (2,), (3,)])
    assert [(r.status, r.value) for r in got] == [("ok", 2), ("ok", 4), ("ok", 6)]
    # ... while an item that really runs past the limit still times out, on a worker that was up
    with WorkerPool(time.sleep, workers=1, timeout=0.5, context="spawn") as pool:
        [r] = pool.map([(3,)])
    assert r.status == "timeout" and "exceeded 0.5 s" in r.detail


@pytest.fixture
def node_of_16_cores_8_ranks(monkeypatch):
    """This process sees 16 usable cores and is one of 8 ranks on its node (torchrun's LOCAL_WORLD_SIZE) of 16."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setenv("WORLD_SIZE", "16")
    for name in ("THINKING_SEEDS_GRADE_WORKERS", "THINKING_SEEDS_CODE_WORKERS"):
        monkeypatch.delenv(name, raising=False)


def test_every_grading_pool_takes_its_ranks_share_of_the_node(node_of_16_cores_8_ranks):
    # one rule, usable cores // LOCAL_WORLD_SIZE = 16 // 8: the trainer's math pool once spawned all 16 cores on
    # every rank (128 processes on the node), validation divided by the global world size (16 // 16 = 1)
    import scoring.grading as grading
    from scoring.pool import workers_per_rank
    from scoring.rewards import code_workers
    from trainer.validate import Validator
    assert workers_per_rank() == code_workers() == 2
    assert WorkerPool(math_item).n_workers == 2                  # no worker starts until map
    before = grading._SHARED
    try:
        assert grading._shared_pool(10.0, None).n_workers == 2   # grade_math_batch's pool, the trainer's math reward
    finally:
        grading._SHARED.close()
        grading._SHARED = before
    v = object.__new__(Validator)                                # only the pool: no engine, no plan
    v._pool = None
    assert v.pool.n_workers == 2
    v.close()


def test_workers_per_rank_env_overrides(node_of_16_cores_8_ranks, monkeypatch):
    from scoring.pool import workers_per_rank
    monkeypatch.setenv("THINKING_SEEDS_CODE_WORKERS", "5")       # the older name still works
    assert workers_per_rank() == 5
    monkeypatch.setenv("THINKING_SEEDS_GRADE_WORKERS", "3")      # ... and the newer one wins
    assert workers_per_rank() == 3
    monkeypatch.setenv("THINKING_SEEDS_GRADE_WORKERS", "0")
    with pytest.raises(ValueError, match="THINKING_SEEDS_GRADE_WORKERS='0': set it to a positive whole number"):
        workers_per_rank()
    monkeypatch.delenv("THINKING_SEEDS_GRADE_WORKERS")
    monkeypatch.delenv("THINKING_SEEDS_CODE_WORKERS")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")                 # more ranks than cores: still one worker each
    assert workers_per_rank() == 1
