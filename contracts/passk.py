"""pass@k, avg@n and bootstrap intervals (pure numpy): the one k-grid (`k_grid`), per-problem pass@k matrix
(`passk_matrix`), pass@k curve with intervals (`passk_curve`) and pass@k table (`summarize`).

pass@k uses the unbiased estimator of Chen et al. (2021), ``1 - C(n-c, k) / C(n, k)``, in its numerically
stable product form ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``. Intervals are percentile bootstraps over problems
with a fixed seed, so the same inputs always give the same interval. An average over benchmarks (the paper's Table 1
"average" column: the unweighted mean of each benchmark's avg@n) resamples problems within each benchmark
(``stratified_bootstrap_ci``, ``paired_stratified_bootstrap``): the benchmarks are fixed, their problems are the
sample.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["k_grid", "pass_at_k", "avg_at_n", "bootstrap_ci", "paired_bootstrap", "stratified_bootstrap_ci",
           "paired_stratified_bootstrap", "passk_matrix", "passk_curve", "summarize", "N_BOOT", "SEED"]

N_BOOT = 2000   # bootstrap resamples
SEED = 0        # bootstrap seed (fixed: intervals are reproducible)


def k_grid(n: int, *, with_n: bool = True) -> list[int]:
    """The k of every pass@k table: 1, 2, 4, ... up to ``n``, and ``n`` itself when it is not a power of two
    (``with_n``: pass@n is reported; the estimator is undefined beyond n)."""
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if with_n and n >= 1 and ks[-1] != n:
        ks.append(n)
    return ks


def pass_at_k(n, c, k: int) -> np.ndarray:
    """Unbiased pass@k per problem: ``1 - C(n-c, k)/C(n, k)``, vectorised over problems.

    n, c: samples and correct samples per problem (scalars or arrays of the same shape); k: an int.
    Raises ValueError when k > n for any problem (the estimator is undefined there) or when c > n.
    """
    n = np.asarray(n, dtype=np.int64)
    c = np.asarray(c, dtype=np.int64)
    n, c = np.broadcast_arrays(n, c)
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got k={k}")
    if np.any(n < k):
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, but some problem has only "
                         f"n={int(n.min())}; sample more (--n) or lower k")
    if np.any((c < 0) | (c > n)):
        raise ValueError("correct counts must lie in [0, n]")
    out = np.ones(n.shape, dtype=np.float64)
    flat_n, flat_c, flat_out = n.ravel(), c.ravel(), out.reshape(-1)
    for idx in range(flat_n.size):  # each problem: a product of at most c terms
        ni, ci = int(flat_n[idx]), int(flat_c[idx])
        if ni - ci < k:
            continue  # every k-subset holds a correct sample
        i = np.arange(ni - ci + 1, ni + 1, dtype=np.float64)
        flat_out[idx] = 1.0 - np.prod(1.0 - k / i)
    return out


def avg_at_n(n, c) -> np.ndarray:
    """avg@n per problem: the mean pass@1 over n samples, ``c / n``."""
    n = np.asarray(n, dtype=np.float64)
    return np.asarray(c, dtype=np.float64) / n


def bootstrap_ci(values, *, stat: Callable[[np.ndarray], float] = np.mean, n_boot: int = 2000,
                 alpha: float = 0.05, seed: int = 0) -> tuple[float, float, float]:
    """Point estimate and percentile bootstrap interval over problems (rows of ``values``).

    ``values``: per-problem scores, shape [P] (or [P, ...] with ``stat`` reducing axis 0). Returns
    ``(estimate, low, high)``; a single problem gives a zero-width interval.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.shape[0] == 0:
        raise ValueError("bootstrap_ci needs at least one problem")
    est = float(stat(values))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.shape[0], size=(n_boot, values.shape[0]))
    boots = np.array([stat(values[row]) for row in idx]) if stat is not np.mean else values[idx].mean(axis=1)
    low, high = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    return est, float(low), float(high)


def paired_bootstrap(a, b, *, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0) -> dict:
    """Compare two models on the same problems: mean(a - b) with a paired percentile interval.

    Returns ``{"diff", "low", "high", "p_value"}`` where p_value is the two-sided bootstrap probability of a
    difference of the opposite sign (resampling the same problems for both models keeps the pairing).
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"paired bootstrap needs scores on the same problems; got shapes {a.shape} and {b.shape}")
    d = a - b
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, d.shape[0], size=(n_boot, d.shape[0]))
    boots = d[idx].mean(axis=1)
    low, high = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    diff = float(d.mean())
    p = 2 * min(np.mean(boots <= 0), np.mean(boots >= 0))
    return {"diff": diff, "low": float(low), "high": float(high), "p_value": float(min(1.0, p))}


def _mean_of_means_boots(groups, n_boot: int, seed: int) -> tuple[float, np.ndarray]:
    """(mean over groups of each group's mean, the same statistic on ``n_boot`` resamples): each resample draws every
    group's problems with replacement from that group alone, groups in the order given, from one seeded stream."""
    groups = [np.asarray(g, dtype=np.float64) for g in groups]
    if not groups or any(g.ndim != 1 or g.size == 0 for g in groups):
        raise ValueError("a stratified bootstrap needs at least one group, each a non-empty 1-D array of scores")
    rng = np.random.default_rng(seed)
    boots = np.zeros(n_boot)   # [n_boot]
    for g in groups:
        idx = rng.integers(0, g.size, size=(n_boot, g.size))
        boots += g[idx].mean(axis=1)
    return float(np.mean([g.mean() for g in groups])), boots / len(groups)


def stratified_bootstrap_ci(groups, *, n_boot: int = N_BOOT, alpha: float = 0.05,
                            seed: int = SEED) -> tuple[float, float, float]:
    """The unweighted mean over groups (benchmarks) of each group's mean score, with a percentile bootstrap
    interval that resamples problems within each group: ``(estimate, low, high)``.

    ``groups``: one array of per-problem scores per benchmark, shape [P_b] each. Each benchmark counts once
    whatever its size (Table 1's average of six benchmarks); a group of one problem contributes no spread."""
    est, boots = _mean_of_means_boots(groups, n_boot, seed)
    low, high = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    return est, float(low), float(high)


def paired_stratified_bootstrap(groups_a, groups_b, *, n_boot: int = N_BOOT, alpha: float = 0.05,
                                seed: int = SEED) -> dict:
    """Model A minus model B on an average over benchmarks: ``paired_bootstrap`` with the problems resampled within
    each benchmark. ``groups_a[j]``, ``groups_b[j]``: the two models' scores on benchmark j's shared problems, in the
    same problem order. Returns ``{"diff", "low", "high", "p_value"}`` (p: two-sided, as ``paired_bootstrap``)."""
    if len(groups_a) != len(groups_b):
        raise ValueError(f"paired stratified bootstrap: {len(groups_a)} benchmarks for A, {len(groups_b)} for B")
    diffs = []
    for j, (a, b) in enumerate(zip(groups_a, groups_b)):
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        if a.shape != b.shape:
            raise ValueError(f"paired stratified bootstrap: benchmark {j} has shapes {a.shape} and {b.shape}; pair "
                             f"the scores by problem first")
        diffs.append(a - b)
    diff, boots = _mean_of_means_boots(diffs, n_boot, seed)
    low, high = np.quantile(boots, [alpha / 2, 1 - alpha / 2])
    p = 2 * min(np.mean(boots <= 0), np.mean(boots >= 0))
    return {"diff": diff, "low": float(low), "high": float(high), "p_value": float(min(1.0, p))}


def passk_matrix(n, c, ks=None) -> np.ndarray:
    """Per-problem unbiased pass@k, one column per k: shape [P, len(ks)]. ks default to ``k_grid(min(n))``; any
    k > min(n) raises ``pass_at_k``'s ValueError."""
    n = np.asarray(n, dtype=np.int64)
    ks = k_grid(int(n.min())) if ks is None else list(ks)
    if not ks:
        return np.zeros((n.size, 0))
    return np.stack([pass_at_k(n, c, int(k)) for k in ks], axis=1)   # [P, K]


def passk_curve(matrix, ks, *, n_boot: int = N_BOOT, seed: int = SEED) -> dict[int, tuple[float, float, float]]:
    """Mean pass@k over problems with a 95 % percentile bootstrap interval, for each column of a ``passk_matrix``
    ([P, len(ks)]): ``{k: (estimate, low, high)}`` in the order of ``ks`` (every column resampled with ``seed``)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[1] != len(ks):
        raise ValueError(f"passk_curve needs a [problems, {len(ks)}] matrix for ks={list(ks)}; got shape "
                         f"{matrix.shape}")
    return {int(k): bootstrap_ci(matrix[:, j], n_boot=n_boot, seed=seed) for j, k in enumerate(ks)}


def summarize(n, c, *, ks=None, n_boot: int = N_BOOT, seed: int = SEED) -> dict:
    """The pass@k table of one model: avg@n and pass@k with 95 % bootstrap intervals over problems.

    n, c: per-problem sample and correct counts, shape [P]. Returns ``{"problems", "n_min", "n_max", "avg",
    "avg_ci": (lo, hi), "pass": {k: (est, lo, hi)}}``. ks default to ``k_grid(min(n))``; any k > min(n)
    raises ValueError (pass@k needs k samples of every problem).
    """
    n = np.asarray(n, dtype=np.int64)
    c = np.asarray(c, dtype=np.int64)
    if n.size == 0:
        raise ValueError("no problems to score")
    ks = k_grid(int(n.min())) if ks is None else list(ks)
    avg, lo, hi = bootstrap_ci(avg_at_n(n, c), n_boot=n_boot, seed=seed)
    passes = passk_curve(passk_matrix(n, c, ks), ks, n_boot=n_boot, seed=seed)
    return {"problems": int(n.size), "n_min": int(n.min()), "n_max": int(n.max()), "avg": avg, "avg_ci": (lo, hi),
            "pass": passes}
