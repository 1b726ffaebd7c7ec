"""Where a step's metrics go besides ``metrics.jsonl``: TensorBoard, Weights & Biases, the progress bar or one
plain line per step, a callback.

One ``Tracker`` interface with a null implementation (``Tracker`` itself does nothing), so the training loop calls
``tracker.log(metrics, step)`` and ``tracker.close()`` on every rank without an ``if tracker:`` branch: ranks other
than 0 and runs without a tracker get the null one (nanochat's ``DummyWandb``). TensorBoard and W&B are optional
packages, imported when chosen. ``progress=true`` shows a tqdm bar when stderr is a terminal and prints one plain
line per step (``step_line``) when it is not (a log file, a batch job's output), where a bar's carriage returns
would leave one unreadable line.
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from tqdm import tqdm

from contracts.commands import pct

TrackerName = Literal["none", "tensorboard", "wandb"]   # the config's `tracker`
TRACKERS = typing.get_args(TrackerName)


class Tracker:
    """Receives each step's metrics; this base class is the null tracker."""

    def log(self, metrics: dict, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoard(Tracker):
    def __init__(self, folder: Path):
        from torch.utils.tensorboard import SummaryWriter   # optional package (tensorboard)
        self.writer = SummaryWriter(str(folder))

    def log(self, metrics: dict, step: int) -> None:
        for k, v in metrics.items():
            if isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


class Wandb(Tracker):
    def __init__(self, *, run_name: str, config: dict, folder: Path):
        import wandb   # optional package
        self.wandb = wandb
        wandb.init(project="thinking-seeds", name=run_name, config=config, dir=str(folder))

    def log(self, metrics: dict, step: int) -> None:
        # W&B steps never go below 0: the validation before training (step -1) joins step 0's row
        self.wandb.log(metrics, step=max(step, 0))

    def close(self) -> None:
        self.wandb.finish()


class ProgressBar(Tracker):
    """A tqdm bar over the run's steps: the reward, the loss and entropy of the update, how many steps of this
    launch skipped their update (every group's verdicts equal: nothing to learn from), and the step time."""

    def __init__(self, *, total: int, initial: int, desc: str):
        self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)
        self.skipped = 0

    def log(self, metrics: dict, step: int) -> None:
        if "reward/mean" not in metrics:   # the validation before training: a line of its own, no step
            self.bar.write(validation_line(metrics))
            return
        self.skipped += int(metrics.get("sampling/skipped_update", 0))
        post = {"reward": f"{metrics['reward/mean']:.3f}"}
        for key, name in (("ppo/loss", "loss"), ("ppo/entropy", "entropy"), ("actor/kl", "kl")):
            if key in metrics:
                post[name] = f"{metrics[key]:.3g}"
        if self.skipped:
            post["skipped"] = self.skipped
        post["step_s"] = f"{metrics['time/step_s']:.2f}"
        if "val/select" in metrics:
            post["val"] = f"{metrics['val/select']:.3f}"
            self.bar.write(validation_line(metrics))
        self.bar.set_postfix(post)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def validation_line(metrics: dict) -> str:
    """A validation's console line, e.g. ``validation after step 20: aime24/avg@32 43.1%  aime25/avg@32 30.2%
    select 36.7%  (95.2 s)`` (``step -1``: ``before training``)."""
    when = "before training" if metrics["step"] < 0 else f"after step {metrics['step'] + 1}"
    parts = [f"{k.removeprefix('val/')} {pct(v)}" for k, v in metrics.items() if k.startswith("val/") and "/avg@" in k]
    if "val/select" in metrics:
        parts.append(f"select {pct(metrics['val/select'])}")
    return f"validation {when}: " + "  ".join(parts) + f"  ({metrics.get('val/seconds', 0.0):.1f} s)"


def step_line(metrics: dict, total: int) -> str:
    """The step's console line, e.g. ``step 12/100  loss 0.0123  reward 0.410  entropy 1.23  kl 0.0004  dropped
    2/16  5.10 s/step``: the step (counted from 1, as the bar counts: metrics.jsonl's ``step`` + 1) of
    ``total_steps``; the update's loss (``ppo/loss``; ``-`` and ``no update`` at the end when the step had no group
    to learn from); the mean reward of every row sampled; the entropy of the trained tokens (``ppo/entropy``); the
    KL penalty's estimate (``actor/kl``, with ``kl_coef`` > 0); the groups left out of the update (dynamic
    sampling's equal-verdict groups and groups with an ungraded row) of those sampled; the step's wall time."""
    updated = "ppo/loss" in metrics
    parts = [f"step {metrics['step'] + 1}/{total}", f"loss {metrics['ppo/loss']:.4g}" if updated else "loss -",
             f"reward {metrics['reward/mean']:.3f}"]
    if updated:
        parts.append(f"entropy {metrics['ppo/entropy']:.3g}")
    if "actor/kl" in metrics:
        parts.append(f"kl {metrics['actor/kl']:.3g}")
    left = metrics["sampling/groups_dropped"] + metrics["sampling/groups_ungraded"]
    parts.append(f"dropped {left}/{left + metrics['sampling/groups_kept']}")
    parts.append(f"{metrics['time/step_s']:.2f} s/step")
    if not updated:
        parts.append("no update")
    return "  ".join(parts)


class StepLine(Tracker):
    """``step_line`` on ``stream`` (stderr) after every step: the progress report of output that is not a terminal."""

    def __init__(self, *, total: int, stream=None):
        self.total, self.stream = total, stream

    def log(self, metrics: dict, step: int) -> None:
        stream = self.stream or sys.stderr
        if "reward/mean" in metrics:   # not the validation before training, which has no training step
            print(step_line(metrics, self.total), file=stream, flush=True)
        if "val/seconds" in metrics:
            print(validation_line(metrics), file=stream, flush=True)


class Callback(Tracker):
    def __init__(self, fn: Callable[[dict], None]):
        self.fn = fn

    def log(self, metrics: dict, step: int) -> None:
        self.fn(metrics)


class Trackers(Tracker):
    """Several trackers, each called in turn."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    def log(self, metrics: dict, step: int) -> None:
        for t in self.trackers:
            t.log(metrics, step)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def make_tracker(kind: TrackerName, *, main: bool, run_dir: Path, run_name: str, config: dict, progress: bool,
                 total_steps: int, start: int, on_step: Callable[[dict], None] | None = None,
                 tty: bool | None = None) -> Tracker:
    """Rank 0's trackers (``on_step``, then ``kind``, then, where asked, the progress bar on a terminal or a line
    per step elsewhere: ``tty``, None = whether stderr is a terminal); the null one elsewhere."""
    if not main:
        return Tracker()
    out: list[Tracker] = [Callback(on_step)] if on_step is not None else []
    if kind == "tensorboard":
        out.append(TensorBoard(run_dir / "tensorboard"))
    elif kind == "wandb":
        out.append(Wandb(run_name=run_name, config=config, folder=run_dir))
    if progress:
        tty = sys.stderr.isatty() if tty is None else tty
        out.append(ProgressBar(total=total_steps, initial=start, desc=run_name) if tty else StepLine(total=total_steps))
    return Trackers(out)
