"""``reward_fn=module:function``: a user's grader in place of the task's (``scoring.rewards``, config ``reward_fn``).

* It runs where the built-in graders run, in grading worker processes with a hard per-response limit: a call that
  raises is that row's ``grader_error``, one that hangs its ``timeout``, a return value that is not a verdict a
  ``grader_error`` naming it; counted, never a crash of the run.
* A bad spec (no colon, a module that does not import, a missing attribute, one that is not callable) is one line
  naming ``reward_fn``, exit 2, before any model is built.
* A tiny run's rewards are what the function returns for the responses the run wrote.

The user module is written to a temporary folder put on the Python path, as a user's file in the working directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.records import read_rollouts
from scoring.rewards import custom_item, grade_custom_batch, grade_task_batch, reward_of
from scoring.verdict import GRADER_ERROR
from tests.helpers.processes import dead
from trainer.config import ConfigError, load_config
from trainer.preflight import check_reward
from trainer.train import main

REPO = Path(__file__).resolve().parents[2]
MODULE = "r9_user_rewards"
SOURCE = '''
import time

from scoring.verdict import Verdict

NOT_CALLABLE = 3


def parity(response, example):
    """Correct when the response's character codes sum to an even number: about half of a fresh model's."""
    return sum(map(ord, response)) % 2 == 0


def flaky(response, example):
    if response == "raise":
        raise RuntimeError("boom")
    if response == "hang":
        time.sleep(60)
    if response == "half":
        return 0.5
    if response == "verdict":
        return Verdict(False, "no_answer", None, "mine")
    if response == "one":
        return 1
    return example["want"] in response


def picky(response, example):
    """Grades the task's own solution (the launch check's call) and raises on anything else."""
    if response == example["solution"]:
        return True
    raise ValueError("cannot grade " + repr(response))
'''
BROKEN = "raise ImportError('a dependency of the user module is missing')\n"


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("user")
    (folder / f"{MODULE}.py").write_text(SOURCE)
    (folder / "r9_broken_rewards.py").write_text(BROKEN)
    return folder


@pytest.fixture
def on_path(user_dir, monkeypatch) -> Path:
    monkeypatch.syspath_prepend(str(user_dir))
    return user_dir


def tiny(out: Path, **extra) -> list[str]:
    base = {"output_dir": str(out), "run_name": "run", "model": "tiny:1m", "task": "addition",
            "task_kwargs": json.dumps({"min_digits": 1, "max_digits": 1}), "num_train_examples": 64,
            "prompts_per_step": 4, "samples_per_prompt": 4, "max_response_tokens": 6, "lr": 1e-3,
            "total_steps": 3, "save_every": 0, "progress": False}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


# ------------------------------------------------------------------------------------------- grading workers
@pytest.mark.slow   # a worker pool, one response that hangs past its 1 s limit
def test_a_function_that_raises_hangs_or_returns_no_verdict_is_ungraded_never_a_crash(on_path):
    spec = f"{MODULE}:flaky"
    responses = ["xyz", "abc", "raise", "hang", "half", "verdict", "one"]
    got = grade_custom_batch(spec, responses, [{"want": "x"}] * len(responses), timeout_s=1.0)
    assert [v.verdict for v in got] == ["pass", "wrong_answer", GRADER_ERROR, "timeout", GRADER_ERROR, "no_answer",
                                        "pass"]
    assert "RuntimeError: boom" in got[2].detail
    assert got[3].detail == "exceeded 1 s"
    assert f"reward_fn '{spec}' returned float 0.5: return a bool (or 0/1) or a scoring.verdict.Verdict" in \
        got[4].detail
    assert got[5].detail == "mine"   # a Verdict is the function's own, as returned
    assert [reward_of(v) for v in got] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    # the trainer's entry point routes to it whatever the task
    routed = grade_task_batch("countdown", ["x", "y"], [{"want": "x"}] * 2, reward_fn=spec)
    assert [v.verdict for v in routed] == ["pass", "wrong_answer"]


# ------------------------------------------------------------------------------------------------ bad specs
@pytest.mark.parametrize("value, spec", [("parity", "parity"), (":parity", ":parity"), (f"'{MODULE}:'", f"{MODULE}:"),
                                         (f"{MODULE}.parity", f"{MODULE}.parity")])
def test_a_spec_that_is_not_module_colon_function_is_a_config_error(value, spec):
    with pytest.raises(ConfigError) as exc:
        load_config(None, [f"reward_fn={value}"])   # (unquoted, `mod:` alone is YAML for a mapping: a type error)
    assert str(exc.value) == (f"reward_fn='{spec}' is not module:function (e.g. reward_fn=my_rewards:score for def "
                              f"score(response, example) in my_rewards.py on the Python path); leave it empty for "
                              f"the task's own grader")


@pytest.mark.parametrize("spec, expected", [
    ("r9_no_such_module:parity", "reward_fn='r9_no_such_module:parity': no module 'r9_no_such_module' on the Python "
                                 "path (the working directory and PYTHONPATH)"),
    (f"{MODULE}:missing", f"reward_fn='{MODULE}:missing': module '{MODULE}' ("),
    (f"{MODULE}:NOT_CALLABLE", f"reward_fn='{MODULE}:NOT_CALLABLE': '{MODULE}.NOT_CALLABLE' is not callable (it is "
                               f"of type int)"),
    ("r9_broken_rewards:score", "reward_fn='r9_broken_rewards:score': importing 'r9_broken_rewards' raised "
                                "ImportError: a dependency of the user module is missing"),
], ids=["no-module", "no-attribute", "not-callable", "import-raises"])
def test_the_launch_check_names_reward_fn_for_a_spec_that_names_no_function(on_path, spec, expected):
    check = check_reward(load_config(None, [f"reward_fn={spec}"]))
    assert (check.name, check.status) == ("reward", "fail")
    assert check.detail.startswith(expected), check.detail
    assert "\n" not in check.detail
    if "missing" in spec:
        assert check.detail.endswith(f"({on_path / (MODULE + '.py')}) has no attribute 'missing'")


def _launch(args: list[str], user_dir: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{user_dir}", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "trainer.train", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow   # a launch in a subprocess each
@pytest.mark.parametrize("spec, expected", [
    ("parity", "error: config: reward_fn='parity' is not module:function"),
    ("r9_no_such_module:parity", "error: reward: reward_fn='r9_no_such_module:parity': no module 'r9_no_such_module'"),
    (f"{MODULE}:missing", f"error: reward: reward_fn='{MODULE}:missing': module '{MODULE}' ("),
    (f"{MODULE}:NOT_CALLABLE", f"error: reward: reward_fn='{MODULE}:NOT_CALLABLE': '{MODULE}.NOT_CALLABLE' is not "
                               f"callable"),
], ids=["no-colon", "no-module", "no-attribute", "not-callable"])
def test_a_launch_with_a_bad_spec_is_one_line_exit_2_and_nothing_written(tmp_path, user_dir, spec, expected):
    out = tmp_path / "runs"
    res = _launch(tiny(out, reward_fn=spec), user_dir, cwd=tmp_path)
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert res.returncode == 2, res.stderr
    assert len(lines) == 1 and lines[0].startswith(expected), res.stderr
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ tiny runs
@pytest.mark.slow   # three training steps
def test_a_runs_rewards_are_what_the_function_returns_for_the_responses_it_wrote(tmp_path, on_path, capsys):
    assert main(["--dry-run", *tiny(tmp_path / "runs", reward_fn=f"{MODULE}:parity")]) == 0
    err = capsys.readouterr().err
    assert (f"OK   reward: reward_fn={MODULE}:parity grades in grading workers, at most 10 s per response; the "
            f"'addition' task's first example (its solution) is ") in err
    assert main(tiny(tmp_path / "runs", reward_fn=f"{MODULE}:parity")) == 0
    run = tmp_path / "runs" / "run"
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = read_rollouts(run).to_pylist()
    assert [m["step"] for m in metrics] == [0, 1, 2] and len(rows) >= 3 * 16
    import r9_user_rewards as user
    for r in rows:
        ok = user.parity(r["response_text"], None)
        assert (r["reward"], r["correct"], r["verdict"]) == (float(ok), ok, "pass" if ok else "wrong_answer")
    for m in metrics:
        step = [r["reward"] for r in rows if r["step"] == m["step"]]
        assert m["reward/mean"] == pytest.approx(sum(step) / len(step), abs=1e-6)
        assert m["reward/correct_frac"] == pytest.approx(sum(step) / len(step), abs=1e-12)
        assert m["reward/ungraded"] == 0
    assert 0.2 < sum(r["reward"] for r in rows) / len(rows) < 0.8   # both verdicts occur: groups carry signal


@pytest.mark.slow   # one training step
def test_a_function_that_raises_on_every_response_is_counted_and_the_run_goes_on(tmp_path, on_path):
    """The launch check's call grades the task's solution; every sampled response then raises: every row is a
    grader_error, counted, its group left out, no update, exit 0."""
    assert main(tiny(tmp_path / "runs", reward_fn=f"{MODULE}:picky", total_steps=1, max_sampling_rounds=1,
                     oversample=1)) == 0   # one round of exactly prompts_per_step prompts
    run = tmp_path / "runs" / "run"
    [m] = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows = read_rollouts(run).to_pylist()
    assert len(rows) == 16 and {r["verdict"] for r in rows} == {GRADER_ERROR}
    assert m["reward/ungraded"] == 16 and m["sampling/groups_ungraded"] == 4 and m["sampling/skipped_update"] == 1
    assert "ppo/loss" not in m


# ------------------------------------------------------------------------------- what a function may return
# A return value becomes a reward (scoring.rewards.reward_of) and then the group's advantages: one NaN poisons the
# group, a string crashes the step. Each bad one is its row's grader_error with one line saying what came back and
# what is allowed; numpy's bools and floats are what numpy-based graders return, and are taken as Python's.
HOSTILE = "r9_hostile_rewards"
HOSTILE_SOURCE = '''
import os
import time

import numpy as np

from scoring.verdict import Verdict

RETURNS = {
    "nan": Verdict(True, "pass", None, "", float("nan")),
    "-inf": Verdict(False, "wrong_answer", None, "", float("-inf")),
    "high": Verdict(True, "pass", None, "", "high"),
    "huge": Verdict(False, "wrong_answer", None, "", 1e30),
    "unknown": Verdict(True, "passed"),
    "mismatch": Verdict(True, "wrong_answer"),
    "np_true": np.bool_(True),
    "np_false": np.bool_(False),
    "np_correct": Verdict(np.bool_(True), "pass"),
    "np_score": Verdict(False, "wrong_answer", None, "", np.float64(0.5)),
    "np32_score": Verdict(False, "no_answer", None, "", np.float32(-2.0)),
    "str_correct": Verdict("yes", "pass"),
}


def returns(response, example):
    return RETURNS[response]


def forks(response, example):
    """Leaves a detached grandchild (fork, setsid, fork again, the middle one exits) that would sleep 600 s, its
    pid in example['pid_file']; then returns True, or hangs past the limit when the response is 'hang'."""
    path = example["pid_file"]
    if os.fork() == 0:   # the child: a new session, then the grandchild, then gone
        os.setsid()
        if os.fork() == 0:
            with open(path + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(path + ".tmp", path)
            time.sleep(600)
        os._exit(0)
    deadline = time.monotonic() + 10
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    if response == "hang":
        time.sleep(60)
    return True
'''


@pytest.fixture
def hostile(tmp_path, monkeypatch) -> str:
    (tmp_path / f"{HOSTILE}.py").write_text(HOSTILE_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return HOSTILE


ALLOWED = ("return a bool (or 0/1) or a scoring.verdict.Verdict whose verdict is one of pass, wrong_answer, "
           "no_answer, runtime_error, time_limit, memory_limit, grader_error, timeout, whose correct is a bool, True "
           "exactly for pass, whose score is a finite number within +-1e+06 or None, answer a str or None and detail "
           "a str")


@pytest.mark.parametrize("response, what, why", [
    ("nan", "Verdict(correct=True, verdict='pass', answer=None, detail='', score=nan)",
     "score nan is not a finite number within +-1e+06"),
    ("-inf", "Verdict(correct=False, verdict='wrong_answer', answer=None, detail='', score=-inf)",
     "score -inf is not a finite number within +-1e+06"),
    ("high", "Verdict(correct=True, verdict='pass', answer=None, detail='', score='high')",
     "score 'high' is not a number"),
    ("huge", "Verdict(correct=False, verdict='wrong_answer', answer=None, detail='', score=1e+30)",
     "score 1e+30 is not a finite number within +-1e+06"),   # (float32 advantages: its square is inf)
    ("unknown", "Verdict(correct=True, verdict='passed', answer=None, detail='', score=None)",
     "verdict 'passed' is not a known verdict"),
    ("mismatch", "Verdict(correct=True, verdict='wrong_answer', answer=None, detail='', score=None)",
     "correct=True with verdict 'wrong_answer'"),
    ("str_correct", "Verdict(correct='yes', verdict='pass', answer=None, detail='', score=None)",
     "correct 'yes' is not a bool"),
])
def test_a_return_that_is_no_reward_is_its_rows_grader_error_in_one_line(hostile, response, what, why):
    spec = f"{hostile}:returns"
    v = custom_item(spec, None, response, {})
    assert (v.correct, v.verdict, v.score) == (False, GRADER_ERROR, None)
    assert v.detail == f"reward_fn '{spec}' returned {what}: {why}; {ALLOWED}"
    assert reward_of(v) == 0.0   # (ungraded: the trainer leaves the row's group out)


@pytest.mark.parametrize("response, verdict, reward", [
    ("np_true", "pass", 1.0), ("np_false", "wrong_answer", 0.0), ("np_correct", "pass", 1.0),
    ("np_score", "wrong_answer", 0.5), ("np32_score", "no_answer", -2.0)])
def test_numpy_bools_and_floats_are_taken_as_pythons(hostile, response, verdict, reward):
    v = custom_item(f"{hostile}:returns", None, response, {})
    assert (v.verdict, reward_of(v)) == (verdict, reward)
    assert type(v.correct) is bool and (v.score is None or type(v.score) is float)


def test_reward_of_refuses_a_score_that_is_not_a_finite_number():
    # every grader's verdict becomes a reward here: a built-in grader's NaN is a bug to see, not a reward to train on
    from scoring.verdict import Verdict
    for score in (float("nan"), float("inf"), 1e30, 10 ** 400, "high"):
        with pytest.raises(ValueError, match=r"is not a finite number within \+-1e\+06: the reward would poison"):
            reward_of(Verdict(True, "pass", None, "", score))


@pytest.mark.slow   # a worker pool; one response hangs past its 1 s limit
def test_a_grandchild_the_function_leaves_dies_with_its_item_and_on_a_timeout(hostile, tmp_path):
    import scoring.rewards as rewards
    spec = f"{hostile}:forks"
    pids = []
    try:
        for response, verdict in (("done", "pass"), ("hang", "timeout")):
            pid_file = tmp_path / f"{response}.pid"
            [v] = grade_custom_batch(spec, [response], [{"pid_file": str(pid_file)}], timeout_s=1.0)
            assert v.verdict == verdict, v.detail
            pids.append(int(pid_file.read_text()))
            assert dead(pids[-1]), f"the grandchild of the '{response}' item outlived it"
    finally:
        pool = rewards._CUSTOM_POOLS.pop((spec, 1.0), None)
        pool is not None and pool.close()
    for pid in pids:
        assert dead(pid)
