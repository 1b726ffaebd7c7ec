"""Scores of sample files: avg@n, pass@k and bootstrap intervals over problems (estimators: contracts.passk).

avg@n is the mean over problems of c_i / n_i (c correct of n samples); pass@k the mean over problems of the
unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), for k = 1, 2, 4, ... up to the smallest n (k > n is
refused with an error). Intervals are 95 % percentile bootstraps over problems with a fixed seed, so the same
samples always give the same interval; comparisons of two models use a paired bootstrap over shared problems.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from contracts.passk import N_BOOT, SEED, avg_at_n, k_grid, paired_bootstrap, pass_at_k, summarize

__all__ = ["counts", "k_grid", "summarize", "compare", "N_BOOT", "SEED"]   # k_grid, summarize: contracts.passk


def counts(rows: Sequence[dict]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(problem ids, n per problem, correct per problem) of sample-file rows (each with ``correct``: list[bool])."""
    ids = [str(r["problem_id"]) for r in rows]
    n = np.array([len(r["correct"]) for r in rows], dtype=np.int64)
    c = np.array([sum(bool(x) for x in r["correct"]) for r in rows], dtype=np.int64)
    return ids, n, c


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
