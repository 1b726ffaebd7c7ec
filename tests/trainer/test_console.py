"""What a run reports besides ``metrics.jsonl``: one plain line per step where stderr is not a terminal (a log file),
the progress bar where it is, TensorBoard's event files (``make install`` brings tensorboard), and a one-line
refusal of ``tracker=wandb`` where wandb is not installed."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.tracking import ProgressBar, StepLine, TensorBoard, Trackers, make_tracker, step_line

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^step (\d+)/(\d+)  loss (\S+)  reward (\S+)  entropy (\S+)  kl (\S+)  dropped (\d+)/(\d+)  "
                  r"(\S+) s/step$")


def test_the_step_line_says_loss_reward_entropy_kl_dropped_groups_and_time():
    m = {"step": 11, "ppo/loss": 0.012345, "reward/mean": 0.40625, "ppo/entropy": 1.2345, "actor/kl": 0.00041234,
         "sampling/groups_kept": 14, "sampling/groups_dropped": 1, "sampling/groups_ungraded": 1, "time/step_s": 5.104}
    assert step_line(m, 100) == ("step 12/100  loss 0.01235  reward 0.406  entropy 1.23  kl 0.000412  dropped 2/16  "
                                 "5.10 s/step")
    no_update = {"step": 0, "reward/mean": 0.0, "ppo/entropy": 0.0, "sampling/groups_kept": 0,
                 "sampling/groups_dropped": 16, "sampling/groups_ungraded": 0, "time/step_s": 0.25,
                 "sampling/skipped_update": 1}
    assert step_line(no_update, 3) == "step 1/3  loss -  reward 0.000  dropped 16/16  0.25 s/step  no update"


def test_a_terminal_gets_the_bar_and_anything_else_the_line(tmp_path):
    def kinds(tty):
        t = make_tracker("none", main=True, run_dir=tmp_path, run_name="r", config={}, progress=True, total_steps=2,
                         start=0, tty=tty)
        out = [type(x) for x in t.trackers]
        t.close()
        return out
    assert kinds(True) == [ProgressBar] and kinds(False) == [StepLine]
    quiet = make_tracker("none", main=True, run_dir=tmp_path, run_name="r", config={}, progress=False,
                         total_steps=2, start=0)
    assert isinstance(quiet, Trackers) and quiet.trackers == []


def test_tensorboard_writes_every_numeric_metric_as_a_scalar(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tb = TensorBoard(tmp_path / "tb")
    tb.log({"reward/mean": 0.25, "actor/kl": 1e-3, "step": 0, "note": "text is skipped"}, 0)
    tb.log({"reward/mean": 0.5, "actor/kl": 2e-3, "step": 1}, 1)
    tb.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"reward/mean", "actor/kl", "step"}
    assert [(e.step, e.value) for e in acc.Scalars("reward/mean")] == [(0, 0.25), (1, 0.5)]
    assert [e.value for e in acc.Scalars("actor/kl")] == pytest.approx([1e-3, 2e-3])


def _launch(args: list[str], cwd: Path, extra_path: Path | None = None) -> subprocess.CompletedProcess:
    path = f"{REPO}{os.pathsep}{extra_path}" if extra_path else str(REPO)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "trainer.train", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _tiny(out: Path, **extra) -> list[str]:
    base = {"output_dir": str(out), "run_name": "run", "model": "tiny:1m", "task": "addition",
            "task_kwargs": json.dumps({"min_digits": 1, "max_digits": 1}), "num_train_examples": 64,
            "prompts_per_step": 4, "samples_per_prompt": 4, "max_response_tokens": 6, "lr": 1e-3,
            "total_steps": 3, "save_every": 0, "log_rollouts": False}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


@pytest.mark.slow   # a launch in a subprocess
def test_a_run_whose_stderr_is_a_file_prints_one_line_per_step_matching_metrics(tmp_path):
    (tmp_path / "r9_console_rewards.py").write_text(
        "def parity(response, example):\n    return sum(map(ord, response)) % 2 == 0\n")
    out = tmp_path / "runs"
    res = _launch(_tiny(out, reward_fn="r9_console_rewards:parity", kl_coef=0.05), cwd=tmp_path,
                  extra_path=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "\r" not in res.stderr   # no bar redraws in a file
    lines = [x for x in res.stderr.splitlines() if x.startswith("step ")]
    metrics = [json.loads(x) for x in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == len(metrics) == 3, res.stderr
    for line, m in zip(lines, metrics):
        got = LINE.match(line)
        assert got, line
        step, total, loss, reward, entropy, kl, dropped, groups, secs = got.groups()
        assert (int(step), int(total)) == (m["step"] + 1, 3)
        for text, key in ((loss, "ppo/loss"), (reward, "reward/mean"), (entropy, "ppo/entropy"), (kl, "actor/kl"),
                          (secs, "time/step_s")):
            assert math.isclose(float(text), m[key], rel_tol=5e-3, abs_tol=5e-3), (key, text, m[key])
        left = m["sampling/groups_dropped"] + m["sampling/groups_ungraded"]
        assert (int(dropped), int(groups)) == (left, left + m["sampling/groups_kept"])
    assert float(LINE.match(lines[0]).group(6)) == 0.0 and float(LINE.match(lines[2]).group(6)) > 0


@pytest.mark.slow   # a launch in a subprocess
@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_tracker_wandb_without_wandb_is_one_line_saying_pip_install_wandb(tmp_path):
    out = tmp_path / "runs"
    res = _launch(_tiny(out, tracker="wandb"), cwd=tmp_path)
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert res.returncode == 2, res.stderr
    assert lines == ["error: packages: 'wandb' is not installed (needed by tracker=wandb): pip install wandb (or pip "
                     "install -e '.[tracking]')"]
    assert not out.exists()
