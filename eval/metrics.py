"""Scores of sample files: avg@n, pass@k and bootstrap intervals over problems (estimators: contracts.passk).

avg@n is the mean over problems of c_i / n_i (c correct of n samples); pass@k the mean over problems of the
unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), for k = 1, 2, 4, ... up to the smallest n (k > n is
refused with an error). Intervals are 95 % percentile bootstraps over problems with a fixed seed, so the same
samples always give the same interval; comparisons of two models use a paired bootstrap over shared problems.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from contracts.passk import avg_at_n, bootstrap_ci, paired_bootstrap, pass_at_k

__all__ = ["counts", "default_ks", "summarize", "compare", "N_BOOT", "SEED"]

N_BOOT = 2000   # bootstrap resamples
SEED = 0        # bootstrap seed (fixed: intervals are reproducible)


def counts(rows: Sequence[dict]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(problem ids, n per problem, correct per problem) of sample-file rows (each with ``correct``: list[bool])."""
    ids = [str(r["problem_id"]) for r in rows]
    n = np.array([len(r["correct"]) for r in rows], dtype=np.int64)
    c = np.array([sum(bool(x) for x in r["correct"]) for r in rows], dtype=np.int64)
    return ids, n, c


def default_ks(n_min: int) -> list[int]:
    """1, 2, 4, ... up to ``n_min``, plus ``n_min`` itself when it is not a power of two (pass@n is reported)."""
    ks, k = [], 1
    while k <= n_min:
        ks.append(k)
        k *= 2
    if n_min >= 1 and ks[-1] != n_min:
        ks.append(n_min)
    return ks


def summarize(n, c, *, ks: Sequence[int] | None = None, n_boot: int = N_BOOT, seed: int = SEED) -> dict:
    """avg@n and pass@k with 95 % bootstrap intervals over problems.

    n, c: per-problem sample and correct counts, shape [P]. Returns ``{"problems", "n_min", "n_max", "avg",
    "avg_ci": (lo, hi), "pass": {k: (est, lo, hi)}}``. ks default to ``default_ks(min(n))``; any k > min(n)
    raises ValueError (pass@k needs k samples of every problem).
    """
    n = np.asarray(n, dtype=np.int64)
    c = np.asarray(c, dtype=np.int64)
    if n.size == 0:
        raise ValueError("no problems to score")
    ks = default_ks(int(n.min())) if ks is None else list(ks)
    avg, lo, hi = bootstrap_ci(avg_at_n(n, c), n_boot=n_boot, seed=seed)
    passes = {}
    for k in ks:
        est, plo, phi = bootstrap_ci(pass_at_k(n, c, int(k)), n_boot=n_boot, seed=seed)
        passes[int(k)] = (est, plo, phi)
    return {"problems": int(n.size), "n_min": int(n.min()), "n_max": int(n.max()), "avg": avg, "avg_ci": (lo, hi),
            "pass": passes}


def compare(rows_a: Sequence[dict], rows_b: Sequence[dict], *, k: int | None = None, n_boot: int = N_BOOT,
            seed: int = SEED) -> dict:
    """Paired bootstrap of model A minus model B on the problems both have scored.

    Score per problem: avg@n (``k=None``) or pass@k. Returns ``paired_bootstrap``'s ``{"diff", "low", "high",
    "p_value"}`` plus ``"problems"`` (the number of shared problems)."""
    ids_a, n_a, c_a = counts(rows_a)
    ids_b, n_b, c_b = counts(rows_b)
    shared = sorted(set(ids_a) & set(ids_b))
    if not shared:
        raise ValueError("the two models share no problems; a paired comparison needs the same problems")
    ia = {p: i for i, p in enumerate(ids_a)}
    ib = {p: i for i, p in enumerate(ids_b)}
    sa = [ia[p] for p in shared]
    sb = [ib[p] for p in shared]

    def score(n, c):
        return avg_at_n(n, c) if k is None else pass_at_k(n, c, k)

    out = paired_bootstrap(score(n_a[sa], c_a[sa]), score(n_b[sb], c_b[sb]), n_boot=n_boot, seed=seed)
    out["problems"] = len(shared)
    return out
