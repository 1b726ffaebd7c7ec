"""Shared fixtures (the shared data folder, one supervised tiny policy reused by the end-to-end tests) and the
suite's two rules of conduct.

Tiers: a test marked ``slow`` (pyproject.toml's ``markers``) is left out of ``make test-fast``
(``pytest -m "not slow"``); ``make test`` runs everything. A test is slow when it starts a subprocess, torchrun
or a vLLM engine, trains more than a few steps, uses a fixture of ``SLOW_FIXTURES`` (marked here), or takes
over ~1.5 s on idle cores; every test under ``tests/e2e/`` is slow. The fast tier keeps itself honest here:
every test not marked slow that takes longer than ``FAST_TEST_S`` (setup, call and teardown) is named in the
terminal summary, to be marked slow or made fast (a report, not a timed assertion: a loaded machine must not fail a
test).

Threads: the session runs torch at ``TEST_THREADS`` threads on every machine (the count CI's 2 cores give, and
the one the pinned numbers of the end-to-end tests were measured at: a trained model's float reductions depend
on it). ``THINKING_SEEDS_TEST_THREADS=N`` runs the suite at another count; a test that passes at only one count
is a defect. A test module (its fixtures included) that leaves torch at another count fails at its last test's
teardown, and the count is restored, so one module's setting never leaks into the next one's numbers.

Workers: ``make test`` runs the suite on two pytest-xdist workers (``-n 2 --dist loadscope``): most tests are
single-threaded Python (tiny models, sandboxed programs, subprocesses), so one interpreter leaves a core idle. A
module's tests run on one worker (its module fixtures are built once), the longest modules are handed out first
(``LONGEST_FIRST``), and the session's trained policy is built once for both workers (a file lock in the session's
shared temporary folder). Without ``-n`` the suite runs in one process, in file order.
"""

import os
import signal
from pathlib import Path

import pytest

# Waiting OpenMP threads sleep instead of spinning (libgomp reads this when torch loads it, so it is set before the
# import, and subprocesses inherit it): two workers at two threads each share two cores, and spinning threads
# took the cores from each other (the fast tier ran 250 s on two workers, 92 s passive, 125 s in one process).
# It changes when a thread waits, not what it computes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from filelock import FileLock  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

TEST_THREADS = int(os.environ.get("THINKING_SEEDS_TEST_THREADS", "2"))
FAST_TEST_S = 5.0   # a non-slow test over this many seconds is reported (2 s on idle cores, with room for load)

torch.set_num_threads(TEST_THREADS)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# The sandbox refuses to run programs where it is not fully isolated (not root, no unshare) unless the user allows
# it; the suite allows it, as --allow-unisolated does, so the plumbing is tested on such machines too (the hostile
# tests skip there). The tests of the refusal take the switch away (scoring.sandbox.ALLOW_UNISOLATED_ENV).
os.environ.setdefault("THINKING_SEEDS_SANDBOX_ALLOW_UNISOLATED", "1")

# The embedded task and warm-up every trainer end-to-end test uses: 1-2 digit addition, short responses.
TASK_KWARGS = {"min_digits": 1, "max_digits": 2}


# The end-to-end runs (whole programs: the demo, torchrun training, hub ids) live in tests/e2e/: slow by folder.
E2E = Path(__file__).resolve().parent / "e2e"

# Fixtures that make every test using them slow (built once per session, minutes on 2 cores): such a test is
# marked slow here, whatever its own decorators say.
SLOW_FIXTURES = {"sft_policy_dir"}

# Under xdist (``--dist loadscope``: a module's tests run on one worker, so its module fixtures are built once) the
# modules are handed out in this order, the longest first (minutes each on 2 cores), so that no long module starts
# last and runs alone; the rest follow in file order. Without xdist the order is the files'.
LONGEST_FIRST = ("tests.inference.test_vllm", "tests.e2e.test_demo", "tests.e2e.test_hub_ids",
                 "tests.perf.test_benchmarks", "tests.e2e.test_multirank_train", "tests.trainer.test_code_rl",
                 "tests.inference.test_vllm_sync", "tests.eval.test_run", "tests.trainer.test_train",
                 "tests.perf.test_device_check", "tests.scoring.test_math_crosscheck")


@pytest.hookimpl(tryfirst=True)   # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or E2E in Path(item.fspath).parents:
            item.add_marker(pytest.mark.slow)
    if os.environ.get("PYTEST_XDIST_WORKER"):   # every worker sorts alike: the schedulers' collections agree
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.module.__name__, len(rank)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


_SLOW_FAST_TESTS: dict[str, float] = {}   # nodeid -> seconds, for tests not marked slow
_SIGINT_AT_START = signal.getsignal(signal.SIGINT)   # restored after a module that changed it (reported at the end)
_SIGNAL_LEFT: list[str] = []


def pytest_runtest_logreport(report):
    if "slow" not in report.keywords and report.outcome != "skipped":
        _SLOW_FAST_TESTS[report.nodeid] = _SLOW_FAST_TESTS.get(report.nodeid, 0.0) + report.duration


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a module's last test (its module fixtures torn down): torch's thread count is the session's again."""
    result = yield
    if nextitem is None or nextitem.module is not item.module:
        if signal.getsignal(signal.SIGINT) is not _SIGINT_AT_START:   # a child started later would inherit it
            _SIGNAL_LEFT.append(f"{item.module.__name__} left SIGINT at {signal.getsignal(signal.SIGINT)!r}")
            signal.signal(signal.SIGINT, _SIGINT_AT_START)
        threads = torch.get_num_threads()
        if threads != TEST_THREADS:
            torch.set_num_threads(TEST_THREADS)
            pytest.fail(f"{item.module.__name__} left torch at {threads} threads (the session runs at "
                        f"{TEST_THREADS}): restore the count in the fixture or test that changed it", pytrace=False)
    return result


def pytest_terminal_summary(terminalreporter):
    if _SIGNAL_LEFT:
        terminalreporter.section("modules that left SIGINT changed (restored after them)")
        for line in _SIGNAL_LEFT:
            terminalreporter.write_line(line)
    over = sorted(((s, n) for n, s in _SLOW_FAST_TESTS.items() if s > FAST_TEST_S), reverse=True)
    if over:
        terminalreporter.section(f"tests not marked slow that took over {FAST_TEST_S:.0f} s (mark them slow, or "
                                 f"make them fast; a loaded machine inflates these)")
        for s, n in over:
            terminalreporter.write_line(f"{s:7.1f} s  {n}")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    assert SHARED_DATA.is_dir(), f"tests read benchmark data from {SHARED_DATA} (the repo sits next to shared/)"
    return SHARED_DATA


def _session_root(tmp_path_factory) -> Path:
    """The temporary folder every process of this pytest session sees: xdist's workers each get a subfolder of it."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def sft_policy_dir(tmp_path_factory) -> Path:
    """A 1m tiny model after a short supervised warm-up on addition: usable but imperfect (built once per session,
    by whichever worker asks first; build_warmup saves atomically and reads a finished folder)."""
    root = _session_root(tmp_path_factory)
    out = root / "shared-policy" / "sft-1m-addition"
    out.parent.mkdir(exist_ok=True)
    with FileLock(str(root / "shared-policy.lock")):
        return _build_sft_policy(out)


def _build_sft_policy(out: Path) -> Path:
    from scoring.tasks import get_task
    from trainer.warmup import build_warmup

    examples = get_task("addition").make_examples(2000, seed=123, **TASK_KWARGS)
    # Stop on the loss, not a step count: addition is learnt abruptly, and the loss stop lands the policy
    # reliably in the imperfect middle (about 70 % sampled accuracy), leaving RL room to improve. Two threads,
    # fixed: the count the tests' pinned accuracies were measured at (this file sets it for the session).
    build_warmup(out, size="1m", examples=examples, steps=600, stop_loss=0.04, seed=0, threads=2)
    return out
