"""What every demo shares: the output-folder claim, one trainer run from a preset (configured, resumed or skipped),
stage timings, torch threads for the tiny models, the machine line, the relay table's rows.

The addition miniature (``demo.addition``), its multi-seed table (``demo.miniature``), the premise regime
(``demo.premise``, ``demo.premise_search``) and the main job (``demo.reduced``) all run their training through
``run_config`` / ``train_run`` and claim their output folder with ``claim_out``.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import resource
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import yaml

from contracts.commands import pct, points
from contracts.config import to_dict
from contracts.jsonl import read_jsonl
from contracts.settings import SettingsMismatch, check_settings, claim_folder
from trainer.checkpoint import checkpoint_dir, list_checkpoints
from trainer.config import load_config
from trainer.fsdp import Dist
from trainer.train import train

__all__ = ["REPO", "PRESETS", "Log", "DemoError", "RunSpec", "seeded", "run_name", "Timings", "claim_out",
           "run_config", "run_finished", "train_run", "read_metrics", "metric_mean", "relay_rows", "auto_threads",
           "machine"]

REPO = Path(__file__).resolve().parents[1]
PRESETS = REPO / "trainer" / "configs"

Log = Callable[[str], None]


class DemoError(RuntimeError):
    """The demo cannot run as asked; the message says what to do."""


# ------------------------------------------------------------------------------------------------------------
# one method: the preset it starts from and its budget-dependent overrides
# ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSpec:
    """One method: the preset it starts from, what it stands for, and overrides that depend on the budget."""

    name: str                                   # run folder and leaderboard row
    preset: str                                 # trainer/configs/<preset>.yaml
    paper: str                                  # the paper's row or figure it is the miniature of
    extra: Callable[[Any], dict] = field(default=lambda b: {}, compare=False)   # budget -> overrides


def seeded(rule: str, ratio: float, loss: str, interval: Callable[[Any], int]) -> Callable[[Any], dict]:
    """A seeded method's overrides: rule, ratio, loss and the refresh interval the budget gives it."""
    return lambda b: {"seed_rule": rule, "seed_ratio": ratio, "seed_loss": loss,
                      "seed_refresh_interval": interval(b)}


def run_name(spec: RunSpec, seed: int) -> str:
    return spec.name if seed == 0 else f"{spec.name}-seed{seed}"


# ------------------------------------------------------------------------------------------------------------
# bookkeeping: timings, the output folder
# ------------------------------------------------------------------------------------------------------------
def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


@dataclass
class Timings:
    """Wall-clock and CPU seconds per stage (CPU: this process and its children, all threads)."""

    stages: dict = field(default_factory=dict)   # name -> {"wall_s", "cpu_s", "note"}

    @contextlib.contextmanager
    def stage(self, name: str, log: Log):
        log(f"\n=== {name} ===")
        t0, c0 = time.perf_counter(), _cpu_s()
        entry = {"note": ""}
        self.stages[name] = entry
        try:
            yield entry
        finally:
            entry.update(wall_s=time.perf_counter() - t0, cpu_s=_cpu_s() - c0)

    def table(self) -> str:
        lines = ["| stage | wall s | CPU s | note |", "|---|---:|---:|---|"]
        for name, e in self.stages.items():
            lines.append(f"| {name} | {e.get('wall_s', 0):.1f} | {e.get('cpu_s', 0):.1f} | {e.get('note', '')} |")
        total_w = sum(e.get("wall_s", 0) for e in self.stages.values())
        total_c = sum(e.get("cpu_s", 0) for e in self.stages.values())
        lines.append(f"| **total** | {total_w:.1f} | {total_c:.1f} | |")
        return "\n".join(lines)


def claim_out(out: Path, marker: str, settings: dict, *, owner: str, fresh: bool, log: Log,
              defaults: dict | None = None) -> None:
    """Create ``out`` with ``marker`` recording ``settings`` (``fresh``: wipe it first), or check the marker it has
    (``contracts.settings.claim_folder``; ``defaults``: what a setting the marker lacks stood for, a field added to
    the budget after the folder was written); refuse a folder made with other settings, or not by ``owner``."""
    out = Path(out)
    if fresh and out.exists():
        if any(out.iterdir()) and not (out / marker).is_file():
            raise DemoError(f"--fresh would delete '{out}', which was not written by {owner} (no {marker}); "
                            f"delete it yourself or choose another --out")
        log(f"--fresh: deleting {out}")
        shutil.rmtree(out)
    try:
        claim_folder(out, marker, settings, owner=owner, fix="rerun with --fresh to redo it, or choose another --out",
                     defaults=defaults)
    except SettingsMismatch as e:
        raise DemoError(str(e)) from None


# ------------------------------------------------------------------------------------------------------------
# one training run
# --- a measured page and its tables (docs/<page>.md beside docs/<page>/tables/) -------------------------------
PAGE_JSON = "page.json"     # in a page's tables folder: its command, budget and provenance (machine, commit, when)
MEASURED = "measured.json"  # in an output folder: the machine and commit that measured it


def figure_dir(doc: Path) -> Path:
    """Where a page's figures and tables are copied: a folder named after the page beside it (``docs/premise.md``
    -> ``docs/premise/``), so two pages written from two output folders never overwrite each other's files."""
    return Path(doc).parent / Path(doc).stem


# ------------------------------------------------------------------------------------------------------------
def run_config(spec: RunSpec, budget, *, out: Path, seed: int, model: Path, train_file: Path,
               progress: bool = False):
    """The validated trainer Config of one run: the preset, then the budget (a ``demo.addition.Budget`` or a
    ``demo.premise_budget.PremiseBudget``: task, steps, batch, response budget, lr), then the method's extras."""
    over = {"run_name": run_name(spec, seed), "output_dir": str(out / "runs"), "seed": seed,
            "model": str(model), "sft_steps": 0, "sft_stop_loss": 0.0, "task": budget.task, "task_kwargs": {},
            "train_file": str(train_file), "total_steps": budget.total_steps,
            "prompts_per_step": budget.prompts_per_step, "samples_per_prompt": budget.samples_per_prompt,
            "max_response_tokens": budget.max_response_tokens, "lr": budget.lr, "save_every": 0,
            "progress": progress, **spec.extra(budget)}
    return load_config(PRESETS / f"{spec.preset}.yaml", over)


_IGNORED = {"progress", "resume"}   # config fields that may differ between a run and its resumption
_PATHS = ("output_dir", "model", "train_file")   # compared as the folders they resolve to


def run_finished(cfg) -> bool:
    """True when the run folder holds this exact config, every step's metrics and the final checkpoint."""
    run_dir = cfg.run_dir
    cfg_file = run_dir / "config.yaml"
    if not cfg_file.is_file():
        return False
    have = yaml.safe_load(cfg_file.read_text()) or {}
    want = to_dict(cfg)
    for k in _PATHS:   # the same folder reached by another path (a link to a shared warm-up or runs folder)
        if isinstance(have.get(k), str) and isinstance(want.get(k), str) and have[k] != want[k] \
                and Path(have[k]).exists() and Path(have[k]).resolve() == Path(want[k]).resolve():
            have[k] = want[k]
    # a field added after the run was written counts as its default (the behaviour the run had)
    defaults = to_dict(type(cfg)())    # default_factory fields (lora_targets) included
    try:
        check_settings(have, want, [k for k in want if k not in _IGNORED], where=f"'{run_dir}'",
                       fix="rerun with --fresh or choose another --out", defaults=defaults)
    except SettingsMismatch as e:
        raise DemoError(str(e)) from None
    metrics = run_dir / "metrics.jsonl"
    steps = sum(1 for line in metrics.read_text().splitlines() if line.strip()) if metrics.is_file() else 0
    return steps == cfg.total_steps and checkpoint_dir(run_dir, cfg.total_steps - 1).is_dir()


def train_run(cfg, *, log: Log) -> dict:
    """Train one run (or resume it from its latest checkpoint); returns {"run_dir", "wall_s", "cpu_s", "skipped"}."""
    run_dir = cfg.run_dir
    if run_finished(cfg):
        log(f"{cfg.run_name}: finished run exists, skipped ({run_dir})")
        return {"run_dir": run_dir, "wall_s": 0.0, "cpu_s": 0.0, "skipped": True}
    if run_dir.exists() and not list_checkpoints(run_dir):
        shutil.rmtree(run_dir)   # interrupted before its first checkpoint: start over (metrics would repeat)
    t0, c0 = time.perf_counter(), _cpu_s()
    log(f"{cfg.run_name}: {cfg.algorithm}, {cfg.total_steps} steps x {cfg.prompts_per_step} prompts x "
        f"{cfg.samples_per_prompt} samples, <= {cfg.max_response_tokens} tokens")
    train(cfg, Dist())
    res = {"run_dir": run_dir, "wall_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - c0, "skipped": False}
    m = read_metrics(run_dir)
    log(f"{cfg.run_name}: done in {res['wall_s']:.1f} s; train reward {metric_mean(m, 'reward/mean', first=True):.3f} "
        f"(first steps) -> {metric_mean(m, 'reward/mean'):.3f} (last steps)")
    return res


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return read_jsonl(path) if path.is_file() else []


def metric_mean(metrics: list[dict], key: str, *, first: bool = False, k: int = 5) -> float:
    """Mean of ``key`` over the last ``k`` steps that log it (``first``: the first ``k``); NaN when none does."""
    vals = [m[key] for m in metrics if key in m]
    vals = vals[:k] if first else vals[-k:]
    return sum(vals) / len(vals) if vals else math.nan


# ------------------------------------------------------------------------------------------------------------
# the pages
# ------------------------------------------------------------------------------------------------------------
def relay_rows(passk) -> list[str]:
    """The rows of a relay pass@k table (``tsanalysis.relay``'s ``relay_passk``) under a header of five columns,
    k | early % | relay % | final % | relay − final, points [95% CI]; an empty cell for a missing rate."""
    return [f"| {int(r['k'])} | {pct(r['early'], unit='', missing='')} | {pct(r['relay'], unit='', missing='')} | "
            f"{pct(r['final'], unit='', missing='')} | {points(r['diff'])} [{points(r['diff_low'])}, "
            f"{points(r['diff_high'])}] |" for _, r in passk.iterrows()]


# ------------------------------------------------------------------------------------------------------------
# the machine
# ------------------------------------------------------------------------------------------------------------
def _busy_cores(interval: float = 0.3) -> float | None:
    """Cores busy right now (from two /proc/stat samples ``interval`` s apart); None where /proc/stat is absent."""
    def sample():
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
        return sum(vals), vals[3] + (vals[4] if len(vals) > 4 else 0)   # total, idle + iowait
    try:
        t0, i0 = sample()
        time.sleep(interval)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return (os.cpu_count() or 1) * (1.0 - (i1 - i0) / max(t1 - t0, 1))


def auto_threads() -> tuple[int, str]:
    """Torch threads for the tiny models, and why. Measured on 2 cores: with the cores idle, 2 threads ran the
    warm-up and RL steps 1.5-1.65x faster than 1; with other jobs on the cores, 2 threads spin-waiting on each
    other ran several times SLOWER than 1. So: 2 threads when the cores are free right now (under half a core
    busy over 0.3 s; the load average lags by minutes), else 1 (the time budgets hold with 1 thread)."""
    cores = os.cpu_count() or 1
    if cores < 2:
        return 1, "1 core"
    busy = _busy_cores()
    if busy is None:
        busy = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if busy < 0.5:
        return 2, f"{busy:.1f} of {cores} cores busy"
    return 1, f"{busy:.1f} of {cores} cores busy with other jobs"


def code_commit() -> str | None:
    """The short commit of the code this process runs, with ``+changes`` when tracked files differ from it; None
    outside a git checkout (a page names the commit that measured it)."""
    import subprocess
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def machine(*, threads: bool = True) -> str:
    """The machine in one line (CPU, cores, torch, threads of this process, load average now)."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{platform.machine()} ({cpu or 'cpu'}), {os.cpu_count()} CPU cores, torch "
            f"{torch.__version__}" + (f" with {torch.get_num_threads()} threads" if threads else "")
            + f", load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} (1/5/15 min) when written")
