"""Where a step's metrics go besides ``metrics.jsonl``: TensorBoard, Weights & Biases, the progress bar, a callback.

One ``Tracker`` interface with a null implementation (``Tracker`` itself does nothing), so the training loop calls
``tracker.log(metrics, step)`` and ``tracker.close()`` on every rank without an ``if tracker:`` branch: ranks other
than 0 and runs without a tracker get the null one (nanochat's ``DummyWandb``). TensorBoard and W&B are optional
packages, imported when chosen.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from tqdm import tqdm

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
        self.wandb.log(metrics, step=step)

    def close(self) -> None:
        self.wandb.finish()


class ProgressBar(Tracker):
    """A tqdm bar over the run's steps: the reward, the loss and entropy of the update, how many steps of this
    launch skipped their update (every group's verdicts equal: nothing to learn from), and the step time."""

    def __init__(self, *, total: int, initial: int, desc: str):
        self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True)
        self.skipped = 0

    def log(self, metrics: dict, step: int) -> None:
        self.skipped += int(metrics.get("sampling/skipped_update", 0))
        post = {"reward": f"{metrics['reward/mean']:.3f}"}
        for key, name in (("ppo/loss", "loss"), ("ppo/entropy", "entropy")):
            if key in metrics:
                post[name] = f"{metrics[key]:.3g}"
        if self.skipped:
            post["skipped"] = self.skipped
        post["step_s"] = f"{metrics['time/step_s']:.2f}"
        self.bar.set_postfix(post)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


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
                 total_steps: int, start: int, on_step: Callable[[dict], None] | None = None) -> Tracker:
    """Rank 0's trackers (``on_step``, then ``kind``, then the progress bar, where asked); the null one elsewhere."""
    if not main:
        return Tracker()
    out: list[Tracker] = [Callback(on_step)] if on_step is not None else []
    if kind == "tensorboard":
        out.append(TensorBoard(run_dir / "tensorboard"))
    elif kind == "wandb":
        out.append(Wandb(run_name=run_name, config=config, folder=run_dir))
    if progress:
        out.append(ProgressBar(total=total_steps, initial=start, desc=run_name))
    return Trackers(out)
