"""The premise regime's estimators, pure functions of eval rows and pass@k matrices (no files, no models):
solution identity of a countdown response, per-problem pass@k, the crossover k with its bootstrap interval, the
pass@k curves with intervals, distinct correct solutions per problem. ``canonical_solution``, ``crossover_k`` and
``crossover_table`` are ``tsanalysis.core.support``'s (re-exported here), shared with ``tsanalysis support``."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from contracts.passk import N_BOOT, bootstrap_ci, pass_at_k
# the crossover and the countdown solution identity are shared with `tsanalysis support`: their one home is there
from tsanalysis.core.support import canonical_solution, crossover_k, crossover_table

__all__ = ["N_BOOT", "canonical_solution", "crossover_k", "crossover_table", "passk_matrix", "curve_table",
           "per_problem", "distinct_correct"]


def passk_matrix(n: np.ndarray, c: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """Per-problem unbiased pass@k, shape [P, len(ks)] (``contracts.passk.pass_at_k``)."""
    return np.stack([pass_at_k(n, c, int(k)) for k in ks], axis=1)


def curve_table(per_problem: dict[str, np.ndarray], ks: Sequence[int], *, seed: int = 0) -> list[dict]:
    """Rows {model, k, pass, low, high}: mean pass@k over problems with a 95 % percentile bootstrap interval."""
    rows = []
    for name, m in per_problem.items():
        for j, k in enumerate(ks):
            est, lo, hi = bootstrap_ci(m[:, j], n_boot=N_BOOT, seed=seed)
            rows.append({"model": name, "k": int(k), "pass": est, "low": lo, "high": hi})
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
