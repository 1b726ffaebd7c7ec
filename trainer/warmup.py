"""Where the policy starts: the tiny supervised warm-up (the one home of it) and a hub id's local snapshot.

``build_warmup`` builds a fresh ``inference.tiny`` model, trains it with ``trainer.sft.sft`` on a task's solver
traces and saves it atomically with ``warmup_summary.json`` inside; a folder that already holds the summary is read,
not rebuilt. It runs at a fixed torch thread count (``threads``, restored afterwards): CPU matmul reductions depend
on the thread count, and addition or countdown are learnt in a sharp transition, so the same preset's warm-up at 1
and at 2 threads landed at 51.8 % and 33.3 % held-out (issue 22). The trainer (``warm_start``), the demos and the
tests' ``sft_policy_dir`` fixture all build their warm-up here.

A warm-up is saved only once it has finished (``trainer.sft.sft`` keeps no part-way state to resume from), so one a
signal stops leaves nothing a later launch could read as finished: the trainer says where it stopped
(``WarmupStopped``) and the same command builds it again from step 0.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from contracts.commands import Terminated
from inference.hub import ModelSourceError, resolve_model
from inference.tiny import build_model, build_tokenizer, num_parameters, save_pretrained_atomic
from scoring.tasks import WARMUP_SEED, get_task
from trainer.config import Config
from trainer.fsdp import Dist, all_gather_objects_patiently, barrier
from trainer.sft import sft

SUMMARY = "warmup_summary.json"
TRAINER_POOL = 4000        # solver traces the trainer's tiny warm-up draws from the task


class WarmupStopped(BaseException):
    """A signal stopped the supervised warm-up before it was saved, at ``step`` (the sft step under way, from 1; 0:
    before the first) of at most ``steps``. Nothing of it is kept, so the same command builds it again from step 0.
    Raised as ``WarmupInterrupted`` (a KeyboardInterrupt) or ``WarmupTerminated`` (a ``contracts.commands.Terminated``),
    so code that handles those still does; the trainer's entry point catches this class to say where it stopped."""

    def __init__(self, step: int, steps: int, path: str | os.PathLike):
        super().__init__(step, steps, str(path))
        self.step, self.steps, self.path = step, steps, Path(path)

    def where(self) -> str:
        """``during the supervised warm-up, at step 37 of at most 400``."""
        at = f"at step {self.step} of at most {self.steps}" if self.step else "before its first step"
        return f"during the supervised warm-up, {at}"


class WarmupInterrupted(WarmupStopped, KeyboardInterrupt):
    """Ctrl-C during the supervised warm-up."""


class WarmupTerminated(WarmupStopped, Terminated):
    """SIGTERM during the supervised warm-up (raised where ``contracts.commands.sigterm_raises`` is in force)."""


def read_warmup(path: str | os.PathLike) -> dict | None:
    """The summary of a finished warm-up folder, None when ``path`` holds none (missing or never finished)."""
    summary = Path(path) / SUMMARY
    return json.loads(summary.read_text()) if summary.is_file() else None


def build_warmup(path: str | os.PathLike, *, size: str, examples: Sequence[dict], steps: int,
                 stop_loss: float | None = None, lr: float = 3e-3, batch_size: int = 64, seed: int = 0,
                 threads: int = 1, log: Callable[[str], None] | None = None, log_every: int = 0,
                 summary_extra: dict | None = None, on_step: Callable[[int], None] | None = None) -> dict:
    """The supervised warm-up checkpoint at ``path``: a ``tiny:<size>`` model (initialised with ``seed``) trained by
    ``trainer.sft.sft`` on ``examples`` (rows with ``prompt`` and ``solution``) for at most ``steps`` steps of
    ``batch_size`` (stopping once the mean loss of the last 20 steps is <= ``stop_loss``; None or 0: never), batch
    order from ``seed``, at ``threads`` torch threads. Saved atomically (``inference.tiny.save_pretrained_atomic``)
    with ``warmup_summary.json``; a finished folder is read instead. Returns the summary: size, pool, steps taken,
    max_steps, stop_loss, stopped_early, loss_first, loss_last, time_s, lr, batch_size, seed, threads, and
    ``summary_extra``. ``log`` gets a header, sft's progress every ``log_every`` steps (0: none) and a last line;
    ``on_step(k)`` is called as sft step k (from 1) starts, so a caller stopped by a signal can say where."""
    path = Path(path)
    done = read_warmup(path)
    if done is not None:
        if log:
            log(f"warm-up checkpoint exists: {path}")
        return done
    stop_loss = stop_loss or None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    counter = None
    try:
        tokenizer = build_tokenizer()
        model = build_model(size, tokenizer, seed=seed)
        counter = count_steps(model, on_step) if on_step is not None else None
        if log:
            log(f"supervised warm-up: tiny:{size} ({num_parameters(model) / 1e6:.2f}M parameters) on {len(examples)} "
                f"solver traces, at most {steps} steps of {batch_size}, lr {lr:g}"
                + (f", stop at mean loss <= {stop_loss:g}" if stop_loss else "") + f", {threads} thread(s) -> {path}")
        stats = sft(model, tokenizer, examples, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                    stop_loss=stop_loss, log_every=log_every or steps,
                    log=(lambda m: log(f"  {m}")) if log and log_every else None)
    finally:
        torch.set_num_threads(before)
        if counter is not None:
            counter.remove()   # no part of the saved model
    summary = {"size": size, "pool": len(examples), "steps": stats["steps"], "max_steps": steps,
               "stop_loss": stop_loss or 0.0, "stopped_early": stats["stopped_early"],
               "loss_first": stats["loss_first"], "loss_last": stats["loss_last"], "time_s": stats["time_s"],
               "lr": lr, "batch_size": batch_size, "seed": seed, "threads": threads, **(summary_extra or {})}
    save_pretrained_atomic(model, tokenizer, path, extra_files={SUMMARY: summary})
    if log:
        log(f"supervised warm-up: {stats['steps']} steps, loss {stats['loss_first']:.3f} -> "
            f"{stats['loss_last']:.3f}, {stats['time_s']:.0f} s -> {path}")
    return summary


def count_steps(model: torch.nn.Module, on_step: Callable[[int], None]):
    """Call ``on_step(k)`` at the k-th forward of ``model`` (from 1): ``trainer.sft.sft`` runs one forward per step,
    and has no callback of its own. Returns the hook's handle (``.remove()``)."""
    started = 0

    def _hook(module, args):
        nonlocal started
        started += 1
        on_step(started)

    return model.register_forward_pre_hook(_hook)


# ----------------------------------------------------------------------------------------------------------
# the trainer's start: a tiny warm-up (cached) or a hub id's snapshot
# ----------------------------------------------------------------------------------------------------------
def sft_cache_dir(cfg: Config) -> Path:
    """Where the supervised warm-up of a ``tiny:<size>`` config is cached: one folder per size, task, task
    arguments, step budget, stop loss and seed."""
    size = cfg.model.split(":", 1)[1]
    kw = "-".join(f"{k}{v}" for k, v in sorted(cfg.task_kwargs.items()))
    stop = f"-stop{cfg.sft_stop_loss:g}" if cfg.sft_stop_loss else ""
    name = f"{size}-{cfg.task}{kw and '-' + kw}-{cfg.sft_steps}steps{stop}-seed{cfg.seed}"
    return Path(cfg.output_dir) / "_sft_cache" / name


def warm_start(cfg: Config, d: Dist) -> str:
    """The directory the policy loads from: a hub id's local snapshot (``hub_snapshot``); for ``tiny:<size>`` with
    ``sft_steps``, the supervised warm-up checkpoint (built once by rank 0 at one thread, then cached)."""
    if not (cfg.model.startswith("tiny:") and cfg.sft_steps):
        return hub_snapshot(cfg.model, d)
    path = sft_cache_dir(cfg)
    if d.is_main:
        reached = [0]   # the sft step under way, for the line a signal's stop prints (WarmupStopped)
        try:
            examples = get_task(cfg.task).make_examples(TRAINER_POOL, seed=cfg.seed + WARMUP_SEED,
                                                        **cfg.task_kwargs)
            build_warmup(path, size=cfg.model.split(":", 1)[1], examples=examples, steps=cfg.sft_steps,
                         stop_loss=cfg.sft_stop_loss, seed=cfg.seed, log=lambda m: print(m, file=sys.stderr),
                         log_every=max(1, min(50, cfg.sft_steps // 10)),   # a line every 50 steps: not silence
                         on_step=lambda k: reached.__setitem__(0, k))
        except KeyboardInterrupt:
            raise WarmupInterrupted(reached[0], cfg.sft_steps, path) from None
        except Terminated:
            raise WarmupTerminated(reached[0], cfg.sft_steps, path) from None
    barrier(d)
    return str(path)


def hub_snapshot(name: str, d: Dist) -> str:
    """A hub id becomes the local directory of its snapshot in the Hugging Face cache (``inference.hub``), fetched
    once per node: local rank 0 downloads what is missing while every other rank waits on a group of its own whose
    timeout is hours (``all_gather_objects_patiently``), never in a collective of the process group (30 minutes: a
    15 GB download on a slow link would end the job). A failure (not cached and no network, an unknown id) is the
    same one-line ``ModelSourceError`` on every rank. Local paths and ``tiny:`` names are returned unchanged."""
    if name.startswith("tiny:") or os.path.exists(name):
        return name
    error = None
    if d.local_rank == 0:
        try:
            resolve_model(name, what="model=")
        except Exception as exc:   # reported on every rank below, instead of leaving the others waiting
            error = str(exc) if isinstance(exc, ModelSourceError) else f"model={name}: {type(exc).__name__}: {exc}"
    errors = [e for e in all_gather_objects_patiently(error, d) if e]
    if errors:
        raise ModelSourceError(errors[0])
    return resolve_model(name, what="model=", download=False).path
