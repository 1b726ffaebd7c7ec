"""Scaling fits of score against compute (ScaleRL, arXiv:2510.13786): ``scaling_tables(cfg)``, ``cfg`` a
``tsanalysis.config.ScalingConfig``, behind ``tsanalysis scaling``. Does a recipe move the asymptote A, or only the
efficiency (C_mid, B)? The curve, the fit and when A counts as identified: ``tsanalysis.core.scaling``.

Input, one of:

- runs and their scored checkpoints (``--run RUN_DIR,... --eval-dir DIR``): every model folder of the eval folder
  named ``<prefix>-step<N>`` (``<prefix>``: ``--models``, default the run's folder name) is the run's checkpoint
  after N optimizer steps, plus the ``--checkpoints NAME=STEP`` given (``warmup=0``: the warm-up, R0). Its compute
  is the run's ``metrics.jsonl`` summed over the steps before it (0 ≤ step < N, the steps its weights have seen):
  ``tokens/generated + tokens/prefilled`` (``--compute tokens``) or ``time/step_s`` (``--compute wall``). A run's
  method and seed are its folder name's ``<method>-seed<N>`` (else the whole name and seed 0). The problems are
  those every checkpoint of a benchmark scored (a note says when some are left out); pass@1 and pass@k per
  checkpoint are the unbiased estimators' means over them (``contracts.passk``);
- a table of scored checkpoints (``--points FILE.csv``): columns method, seed, step, pass@1 (pass@k and k
  optional; benchmark optional) and the compute columns ``tokens_generated`` + ``tokens_prefilled`` (tokens) or
  ``train_wall_s`` (wall), as ``demo.premise`` writes ``training_curve.csv``.

Fits: per benchmark, score (pass@1, pass@k), method and seed, and per method pooled over its seeds (one curve
through every seed's points) when it has two or more. R0 is fixed to the step-0 score (the mean over the fit's
step-0 points) when a step-0 point exists; otherwise it is fitted.

Intervals (95 % percentile bootstrap, refits): with per-problem scores, over problems (the same problems drawn
for every checkpoint of the fit, each checkpoint's pass@k recomputed with ``contracts.passk``); with a points table,
over seeds for pooled fits of three or more seeds, and none otherwise (the ``interval`` column says which).

Tables:

- ``points``: benchmark, method, seed, step, model, compute, metric, k, axis (tokens | wall), score (every point;
  step 0: compute 0);
- ``fits``: per fit its keys (and axis) (``fit``: seed | pooled; seed NA when pooled), points, r0 (and r0_fixed), A, C_mid, B
  with ``_low`` / ``_high``, rmse, bend_p (F-test against a straight line in ln C), c_max, status (ok | not
  identified | too few points | not converged), note, interval, boot_fits, boot_failed.

A fit that is refused (too few points, no convergence) or whose asymptote is not identified stays in ``fits`` with
its status and note; the command refuses (``UsageError``, exit 2) only when no fit of the selection is identified.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from contracts.jsonl import read_jsonl
from contracts.passk import pass_at_k

from .config import ScalingConfig, validate_scaling
from .core import scaling as SC
from .errors import UsageError

__all__ = ["COMPUTE_KEYS", "POINT_COLUMNS", "Series", "run_identity", "checkpoint_step", "run_compute",
           "read_points_csv", "scaling_tables"]

Log = Callable[[str], None]

# per --compute: the metrics.jsonl keys summed over steps, and the points table's columns (added)
COMPUTE_KEYS = {"tokens": ("tokens/generated", "tokens/prefilled"), "wall": ("time/step_s",)}
POINT_COLUMNS = {"tokens": ("tokens_generated", "tokens_prefilled"), "wall": ("train_wall_s",)}
COMPUTE_LABEL = {"tokens": "generated + prefilled tokens", "wall": "training wall seconds"}
NO_BENCHMARK = "-"   # a points table without a benchmark column
DO_MORE = "score checkpoints at more compute (a longer run) or more checkpoints along it"


@dataclass
class Series:
    """The points of one benchmark: per checkpoint its keys, compute and per-problem scores (None: table only)."""

    benchmark: str
    keys: list[dict] = field(default_factory=list)       # method, seed, step, model
    compute: list[float] = field(default_factory=list)
    scores: dict[str, list] = field(default_factory=dict)  # metric -> per point: a mean (table) or [P] vector
    k: int | None = None
    per_problem: bool = False
    problems: int = 0


# ---- runs, checkpoints and compute ----------------------------------------------------------------------------
def run_identity(run_dir: str | os.PathLike) -> tuple[str, int]:
    """(method, seed) of a run folder named ``<method>-seed<N>``; else (its name, 0)."""
    name = Path(run_dir).resolve().name
    m = re.fullmatch(r"(.+)-seed(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, 0)


def checkpoint_step(prefix: str, model: str) -> int | None:
    """N of a model folder ``<prefix>-step<N>`` (also ``<prefix>_stepN``, ``<prefix>stepN``, ``<prefix>-N``); None
    for any other name (``onpolicy-seed10`` is not a checkpoint of ``onpolicy-seed1``)."""
    m = re.fullmatch(re.escape(prefix) + r"(?:[-_]?step[-_]?|[-_])(\d+)", model)
    return int(m.group(1)) if m else None


def _metrics_by_step(run_dir: Path) -> dict[int, dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise UsageError(f"--run {run_dir}: no metrics.jsonl (the per-step compute comes from it); give a run folder "
                         f"written by trainer.train")
    try:
        rows = read_jsonl(path)
    except (ValueError, OSError) as e:
        raise UsageError(str(e)) from None
    return {int(r["step"]): r for r in rows if isinstance(r.get("step"), int) and r["step"] >= 0}   # last line wins


def run_compute(run_dir: str | os.PathLike, steps: Sequence[int], compute: str) -> dict[int, float]:
    """{N: compute spent before the checkpoint after N steps}: ``COMPUTE_KEYS[compute]`` summed over metrics.jsonl's
    steps 0 ≤ step < N. UsageError when a step is missing or lacks a key (compute columns missing)."""
    run_dir = Path(run_dir)
    by_step = _metrics_by_step(run_dir)
    keys = COMPUTE_KEYS[compute]
    need = max(steps, default=0)
    gone = [s for s in range(need) if s not in by_step]
    if gone:
        have = f"steps 0..{max(by_step)}" if by_step else "no steps"
        raise UsageError(f"--run {run_dir}: metrics.jsonl has {have} but a checkpoint is after {need} steps (step "
                         f"{gone[0]} is missing); give the run that trained the checkpoints")
    lacking = next((k for s in range(need) for k in keys if not isinstance(by_step[s].get(k), (int, float))), None)
    if lacking is not None:
        other = "wall" if compute == "tokens" else "tokens"
        raise UsageError(f"--run {run_dir}: compute columns missing: metrics.jsonl has no {lacking} (--compute "
                         f"{compute}); use --compute {other} or a run that logs it")
    per_step = np.array([sum(float(by_step[s][k]) for k in keys) for s in range(need)])
    cum = np.concatenate([[0.0], np.cumsum(per_step)])
    return {n: float(cum[n]) for n in steps}


def _checkpoints(cfg: ScalingConfig, found: list[str]) -> list[tuple[Path, str, dict[str, int]]]:
    """(run folder, prefix, {model folder: step}) per run."""
    runs = [Path(r) for r in cfg.run]
    prefixes = list(cfg.models) if cfg.models else [r.resolve().name for r in runs]
    extra = {name: int(step) for name, step in (cfg.checkpoints or {}).items()}
    out = []
    for run, prefix in zip(runs, prefixes):
        models = {m: s for m in found if (s := checkpoint_step(prefix, m)) is not None}
        for name, step in extra.items():
            owners = [p for p in prefixes if name == p or checkpoint_step(p, name) is not None]
            if not owners or prefix in owners:
                models[name] = step
        if not models:
            raise UsageError(f"--eval-dir {cfg.eval_dir}: no model folders named {prefix}-step<N> (it holds: "
                             f"{', '.join(found) or 'no model folders'}); give the prefix with --models or the "
                             f"folders with --checkpoints NAME=STEP")
        steps = sorted(models.values())
        twice = next((s for a, s in zip(steps, steps[1:]) if a == s), None)
        if twice is not None:
            names = [m for m, s in models.items() if s == twice]
            raise UsageError(f"--run {run}: two checkpoints at step {twice} ({', '.join(names)}); keep one")
        out.append((run, prefix, models))
    return out


def _eval_series(cfg: ScalingConfig, log: Log) -> list[Series]:
    """One Series per benchmark from the runs' checkpoints, per-problem pass@1 and pass@k on the shared problems."""
    from .support import read_eval_dir

    root = Path(cfg.eval_dir)
    if not root.is_dir():
        raise UsageError(f"--eval-dir {cfg.eval_dir}: no such folder; give the --out folder of python -m eval.run "
                         f"(it holds <model>/<benchmark>.jsonl)")
    found = sorted(d.name for d in root.iterdir() if d.is_dir())
    plan = _checkpoints(cfg, found)
    names = list(dict.fromkeys(m for _, _, models in plan for m in models))
    data = read_eval_dir(root, models=names, benchmarks=cfg.benchmarks)
    benches = sorted({b for m in names for b in data[m]})
    if not benches:
        raise UsageError(f"--eval-dir {cfg.eval_dir}: the checkpoints hold no results"
                         + (f" for --benchmarks {','.join(cfg.benchmarks)}" if cfg.benchmarks else ""))
    compute = {run: run_compute(run, sorted(models.values()), cfg.compute) for run, _, models in plan}
    return [_bench_series(b, plan, data, compute, cfg.k, log) for b in benches]


def _bench_series(bench: str, plan, data, compute, k: int | None, log: Log) -> Series:
    cks = [(run, m, step) for run, _, models in plan for m, step in sorted(models.items(), key=lambda x: x[1])
           if bench in data[m]]
    ids = sorted(set.intersection(*(set(data[m][bench].ids) for _, m, _ in cks)))
    if not ids:
        raise UsageError(f"{bench}: the checkpoints share no scored problem; score them on the same problems")
    left = sorted({m for _, m, _ in cks if len(data[m][bench].ids) > len(ids)})
    if left:
        log(f"note: {bench}: {len(ids)} problems every checkpoint scored; left out of {', '.join(left)}: the "
            f"problems the others did not score")
    n_min = min(int(data[m][bench].n[np.isin(data[m][bench].ids, ids)].min()) for _, m, _ in cks)
    kk = n_min if k is None else k
    if kk > n_min:
        raise UsageError(f"--k {kk}: {bench} has checkpoints with {n_min} samples per problem; pass@k needs k <= "
                         f"n: lower --k (default: the largest k the samples allow)")
    s = Series(bench, k=kk, per_problem=True, problems=len(ids))
    s.scores = {"pass@1": [], f"pass@{kk}": []} if kk > 1 else {"pass@1": []}
    for run, m, step in cks:
        ms = data[m][bench]
        pick = np.searchsorted(ms.ids, ids)   # ModelSamples keep ids sorted
        method, seed = run_identity(run)
        s.keys.append({"method": method, "seed": seed, "step": step, "model": m})
        s.compute.append(compute[run][step])
        for metric in s.scores:
            kk_ = 1 if metric == "pass@1" else kk
            s.scores[metric].append(pass_at_k(ms.n[pick], ms.c[pick], kk_))
    return s


# ---- a points table --------------------------------------------------------------------------------------------
def read_points_csv(path: str | os.PathLike, compute: str, k: int | None) -> list[Series]:
    """One Series per benchmark of a points table (no per-problem scores). UsageError naming what is missing."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--points {path}: no such file; give a CSV of scored checkpoints (demo.premise's "
                         f"tables/training_curve.csv)")
    try:
        df = pd.read_csv(path)
    except (ValueError, OSError) as e:
        raise UsageError(f"--points {path}: not a readable CSV ({e})") from None
    need = ["method", "seed", "step", "pass@1"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise UsageError(f"--points {path}: no column {', '.join(missing)}; a points table has method, seed, step, "
                         f"pass@1 (pass@k and k optional) and its compute columns")
    cols = POINT_COLUMNS[compute]
    lacking = [c for c in cols if c not in df.columns]
    if lacking:
        other = "wall" if compute == "tokens" else "tokens"
        raise UsageError(f"--points {path}: compute columns missing: no {', '.join(lacking)} (--compute {compute}); "
                         f"use --compute {other} or a table with {' and '.join(cols)}")
    bench_col = df["benchmark"].astype(str) if "benchmark" in df.columns else pd.Series(NO_BENCHMARK, index=df.index)
    out = []
    for bench, d in df.groupby(bench_col, sort=True):
        s = Series(str(bench))
        s.scores = {"pass@1": list(d["pass@1"].astype(float))}
        if "pass@k" in d.columns and "k" in d.columns and d["pass@k"].notna().all():
            ks = sorted(set(int(x) for x in d["k"]))
            if len(ks) > 1:
                raise UsageError(f"--points {path}: {bench}: pass@k at several k ({ks}); one k per benchmark")
            if k is not None and k != ks[0]:
                raise UsageError(f"--k {k}: --points {path} holds pass@{ks[0]} only; drop --k or give k = {ks[0]}")
            s.k = ks[0]
            if s.k > 1:
                s.scores[f"pass@{s.k}"] = list(d["pass@k"].astype(float))
        elif k is not None and k > 1:
            raise UsageError(f"--k {k}: --points {path} has no pass@k and k columns")
        s.keys = [{"method": str(r["method"]), "seed": int(r["seed"]), "step": int(r["step"]), "model": ""}
                  for _, r in d.iterrows()]
        s.compute = list(d[list(cols)].astype(float).sum(axis=1))
        out.append(s)
    return out


# ---- fitting -----------------------------------------------------------------------------------------------------
def _groups(s: Series) -> list[tuple[str, int | None, np.ndarray]]:
    """(method, seed or None for pooled, point indices) of every fit of a benchmark."""
    keys = pd.DataFrame(s.keys)
    out = []
    for method, d in keys.groupby("method", sort=False):
        seeds = sorted(d["seed"].unique())
        for seed in seeds:
            out.append((str(method), int(seed), d.index[d["seed"] == seed].to_numpy()))
        if len(seeds) > 1:
            out.append((str(method), None, d.index.to_numpy()))
    return out


def _compute_checks(s: Series, idx: np.ndarray) -> None:
    c = np.asarray(s.compute)[idx]
    steps = np.array([s.keys[i]["step"] for i in idx])
    bad = np.flatnonzero((steps > 0) & ~(c > 0))
    if bad.size:
        k = s.keys[idx[bad[0]]]
        raise UsageError(f"{s.benchmark}: {k['method']} seed {k['seed']} step {k['step']} has compute "
                         f"{c[bad[0]]:g}; a trained checkpoint needs compute > 0 (check the compute columns)")


def _draw_problems(vals: np.ndarray, c: np.ndarray, zero: np.ndarray):
    """A bootstrap draw over problems: every point's mean over the same resampled problems."""
    def draw(rng: np.random.Generator):
        idx = rng.integers(0, vals.shape[1], size=vals.shape[1])
        y = vals[:, idx].mean(axis=1)
        return c[~zero], y[~zero], (float(y[zero].mean()) if zero.any() else None)
    return draw


def _draw_seeds(y: np.ndarray, c: np.ndarray, zero: np.ndarray, seeds: np.ndarray):
    """A bootstrap draw over seeds: whole seeds resampled with replacement, their points pooled."""
    uniq = np.unique(seeds)

    def draw(rng: np.random.Generator):
        pick = np.concatenate([np.flatnonzero(seeds == u) for u in rng.choice(uniq, size=uniq.size)])
        z = zero[pick]
        return c[pick][~z], y[pick][~z], (float(y[pick][z].mean()) if z.any() else None)
    return draw


def _fit_row(s: Series, metric: str, method: str, seed: int | None, idx: np.ndarray, *, n_boot: int,
             boot_seed: int) -> dict:
    _compute_checks(s, idx)
    c = np.asarray(s.compute, dtype=np.float64)[idx]
    zero = np.array([s.keys[i]["step"] == 0 for i in idx])
    seeds = np.array([s.keys[i]["seed"] for i in idx])
    raw = [s.scores[metric][i] for i in idx]
    if s.per_problem:
        vals = np.stack(raw)                       # [points, P]
        y = vals.mean(axis=1)
        draw, interval = _draw_problems(vals, c, zero), f"problems ({n_boot} resamples)"
    else:
        y = np.asarray(raw, dtype=np.float64)
        vals = None
        pooled_seeds = seed is None and np.unique(seeds).size >= 3
        draw = _draw_seeds(y, c, zero, seeds) if pooled_seeds else None
        interval = (f"seeds ({n_boot} resamples)" if pooled_seeds else
                    "unavailable (a points table has no per-problem scores; pooled fits of >= 3 seeds resample seeds)")
    r0 = float(y[zero].mean()) if zero.any() else None
    row = {"benchmark": s.benchmark, "method": method, "seed": seed, "fit": "pooled" if seed is None else "seed",
           "metric": metric, "k": 1 if metric == "pass@1" else s.k, "points": int((~zero).sum()),
           "seeds": int(np.unique(seeds).size), "r0": r0 if r0 is not None else math.nan, "r0_fixed": r0 is not None,
           "c_max": float(c[~zero].max()) if (~zero).any() else math.nan, "interval": interval}
    try:
        fit = SC.fit_curve(c[~zero], y[~zero], r0=r0)
    except SC.FitRefused as e:
        status = "too few points" if "points with compute" in str(e) else "not converged"
        return {**row, **_empty_params(), "status": status, "note": f"{e}: {DO_MORE}"}
    row.update({"r0": fit.R0, "A": fit.A, "C_mid": fit.C_mid, "B": fit.B, "rmse": fit.rmse, "bend_p": fit.bend_p})
    A_ci = None
    if draw is not None:
        boots, failed = SC.bootstrap(SC.resamples(draw, n_boot, boot_seed))
        for j, name in enumerate(("A", "C_mid", "B")):
            row[f"{name}_low"], row[f"{name}_high"] = SC.percentile(boots[:, j])
        row["boot_fits"], row["boot_failed"] = int(len(boots)), int(failed)
        A_ci = (row["A_low"], row["A_high"]) if len(boots) else None
    else:
        row.update({f"{n}_{e}": math.nan for n in ("A", "C_mid", "B") for e in ("low", "high")})
        row["boot_fits"], row["boot_failed"] = 0, 0
    fit = SC.assess(fit, A_ci)
    notes = [] if r0 is None else [f"R0 fixed to the step-0 score {r0:.4g}"]
    if row["boot_failed"]:
        notes.append(f"{row['boot_failed']} of {n_boot} resamples did not fit")
    if not fit.identified:
        notes.insert(0, f"{fit.reason}: {DO_MORE}")
    return {**row, "status": "ok" if fit.identified else "not identified", "note": "; ".join(notes)}


def _empty_params() -> dict:
    out = {n: math.nan for n in ("A", "C_mid", "B", "rmse", "bend_p")}
    out.update({f"{n}_{e}": math.nan for n in ("A", "C_mid", "B") for e in ("low", "high")})
    return {**out, "boot_fits": 0, "boot_failed": 0}


FIT_COLUMNS = ["benchmark", "method", "seed", "fit", "metric", "k", "points", "seeds", "r0", "r0_fixed", "A",
               "A_low", "A_high", "C_mid", "C_mid_low", "C_mid_high", "B", "B_low", "B_high", "rmse", "bend_p",
               "c_max", "status", "note", "interval", "boot_fits", "boot_failed"]


def _points_table(series: list[Series]) -> pd.DataFrame:
    rows = []
    for s in series:
        for metric, vals in s.scores.items():
            for key, c, v in zip(s.keys, s.compute, vals):
                rows.append({"benchmark": s.benchmark, **key, "compute": 0.0 if key["step"] == 0 else float(c),
                             "metric": metric, "k": 1 if metric == "pass@1" else s.k,
                             "score": float(np.mean(v))})
    return pd.DataFrame(rows, columns=["benchmark", "method", "seed", "step", "model", "compute", "metric", "k",
                                       "score"])


def scaling_tables(cfg: ScalingConfig, *, log: Log = print) -> dict[str, pd.DataFrame]:
    """{"points", "fits"} (module docstring); UsageError for bad input and when no fit is identified."""
    validate_scaling(cfg)
    series = (read_points_csv(cfg.points, cfg.compute, cfg.k) if cfg.points is not None
              else _eval_series(cfg, log))
    if cfg.benchmarks:
        series = [s for s in series if s.benchmark in cfg.benchmarks]
        if not series:
            raise UsageError(f"--benchmarks {','.join(cfg.benchmarks)}: no points of these benchmarks")
    rows = []
    for s in series:
        for metric in s.scores:
            for method, seed, idx in _groups(s):
                rows.append(_fit_row(s, metric, method, seed, idx, n_boot=cfg.n_boot, boot_seed=cfg.seed))
    fits = pd.DataFrame(rows, columns=FIT_COLUMNS)
    fits["seed"] = fits["seed"].astype("Int64")
    if not (fits["status"] == "ok").any():
        raise UsageError(_refusal(fits))
    points = _points_table(series)
    for t in (fits, points):
        t.insert(t.columns.get_loc("k") + 1, "axis", cfg.compute)   # the compute axis: tokens | wall
    return {"points": points, "fits": fits}


def _refusal(fits: pd.DataFrame) -> str:
    """The one line of a selection without an identified fit: the first fit's reason, and how many share it."""
    r = fits.iloc[0]
    who = f"{r['method']} {'pooled' if pd.isna(r['seed']) else 'seed ' + str(r['seed'])} {r['metric']}"
    where = "" if r["benchmark"] == NO_BENCHMARK else f"{r['benchmark']} "
    more = f" (and {len(fits) - 1} more fits, none identified)" if len(fits) > 1 else ""
    return f"scaling: no usable fit: {where}{who}: {r['note']}{more}"
