"""The premise regime's estimators, pure functions of eval rows and pass@k matrices (no files, no models):
solution identity of a countdown response, per-problem pass@k of a model's eval rows, the crossover k with its
bootstrap interval, the pass@k curves with intervals, distinct correct solutions per problem, a run's pass@k at a
matched pass@1 or compute, and Holm's step-down over a family of comparisons. The pass@k matrix and curve are ``contracts.passk``'s (``passk_matrix``,
``passk_curve``); ``canonical_solution``, ``crossover_k`` and ``crossover_table`` are ``tsanalysis.core.support``'s
(re-exported here), shared with ``tsanalysis support``."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from contracts.passk import N_BOOT, passk_curve, passk_matrix
# the crossover and the countdown solution identity are shared with `tsanalysis support`: their one home is there
from tsanalysis.core.support import canonical_solution, crossover_k, crossover_table

__all__ = ["N_BOOT", "canonical_solution", "crossover_k", "crossover_table", "curve_table", "per_problem",
           "distinct_correct", "at_first_reach", "holm"]


def curve_table(per_problem: dict[str, np.ndarray], ks: Sequence[int], *, seed: int = 0) -> list[dict]:
    """Rows {model, k, pass, low, high}: mean pass@k over problems with a 95 % percentile bootstrap interval
    (``contracts.passk.passk_curve`` of each model's pass@k matrix)."""
    rows = []
    for name, m in per_problem.items():
        for k, (est, lo, hi) in passk_curve(m, ks, n_boot=N_BOOT, seed=seed).items():
            rows.append({"model": name, "k": k, "pass": est, "low": lo, "high": hi})
    return rows


def per_problem(rows: list[dict], ks: Sequence[int]) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """(ids order, n, c, pass@k matrix [P, K]) of one model's eval rows, problems sorted by id."""
    rows = sorted(rows, key=lambda r: r["problem_id"])
    n = np.array([len(r["correct"]) for r in rows])
    c = np.array([sum(map(bool, r["correct"])) for r in rows])
    return n, c, [r["problem_id"] for r in rows], passk_matrix(n, c, ks)


def distinct_correct(rows: list[dict]) -> np.ndarray:
    """Per problem (sorted by id): distinct correct solutions (``canonical_solution``) among its samples."""
    out = []
    for r in sorted(rows, key=lambda r: r["problem_id"]):
        sols = {canonical_solution(t) for t, ok in zip(r["responses"], r["correct"]) if ok}
        sols.discard(None)
        out.append(len(sols))
    return np.array(out)


def at_first_reach(steps: Sequence[float], x: Sequence[float], y: Sequence[float], target: float) -> dict:
    """Where ``x`` first reaches ``target`` along a run's checkpoints (``steps`` increasing, the warm-up as step 0):
    the step and ``y`` there, linear in ``x`` between the two checkpoints that bracket the crossing (the first
    point itself when it already reaches the target). With x = pass@1 and y = pass@k: pass@k at a matched pass@1;
    with x = cumulative generated tokens: pass@k at matched compute. Not reached: ``reached`` False, NaN values."""
    steps, x, y = (np.asarray(v, dtype=float) for v in (steps, x, y))
    hit = np.flatnonzero(x >= target)
    if hit.size == 0:
        return {"reached": False, "step": np.nan, "x": np.nan, "y": np.nan}
    i = int(hit[0])
    if i == 0:
        return {"reached": True, "step": float(steps[0]), "x": float(x[0]), "y": float(y[0])}
    w = (target - x[i - 1]) / (x[i] - x[i - 1])   # x[i - 1] < target <= x[i]: 0 < w <= 1
    return {"reached": True, "step": float(steps[i - 1] + w * (steps[i] - steps[i - 1])), "x": float(target),
            "y": float(y[i - 1] + w * (y[i] - y[i - 1]))}


def holm(p: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979): sorted ascending, p_(i) * (m − i + 1), running maximum,
    capped at 1."""
    p = np.asarray(p, float)
    m = len(p)
    order = np.argsort(p, kind="stable")
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out
