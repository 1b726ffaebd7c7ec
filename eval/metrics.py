"""Scores of sample files: avg@n, pass@k and bootstrap intervals over problems (estimators: contracts.passk).

avg@n is the mean over problems of c_i / n_i (c correct of n samples); pass@k the mean over problems of the
unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), for k = 1, 2, 4, ... up to the smallest n (k > n is
refused with an error). Intervals are 95 % percentile bootstraps over problems with a fixed seed, so the same
samples always give the same interval; comparisons of two models use a paired bootstrap over shared problems.
``average`` and ``compare_average`` are the same over a list of benchmarks (the paper's Table 1 "average": the
unweighted mean of the benchmarks' avg@n), problems resampled within each benchmark.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from contracts.passk import (N_BOOT, SEED, avg_at_n, k_grid, paired_bootstrap, paired_stratified_bootstrap, pass_at_k,
                             stratified_bootstrap_ci, summarize)

__all__ = ["counts", "k_grid", "summarize", "compare", "average", "compare_average", "N_BOOT",
           "SEED"]   # k_grid, summarize: contracts.passk


def counts(rows: Sequence[dict]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(problem ids, n per problem, correct per problem) of sample-file rows (each with ``correct``: list[bool]).
    ValueError for a problem that has two rows: every score here resamples problems, so one counted twice would be
    weighed twice (``contracts.samples.read_samples`` keeps each problem's first row)."""
    ids = [str(r["problem_id"]) for r in rows]
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        twice = next(p for p in ids if p in seen or seen.add(p))
        raise ValueError(f"problem {twice!r} has two rows; read sample files with contracts.samples.read_samples, "
                         f"which keeps each problem's first row")
    n = np.array([len(r["correct"]) for r in rows], dtype=np.int64)
    c = np.array([sum(bool(x) for x in r["correct"]) for r in rows], dtype=np.int64)
    return ids, n, c


def _shared(rows_a: Sequence[dict], rows_b: Sequence[dict], *, k: int | None = None):
    """Per-problem scores of A and of B (avg@n, or pass@k) on the problems both have scored, in one order (sorted
    ids), and their number: ``(np.ndarray [S], np.ndarray [S], S)``."""
    ids_a, n_a, c_a = counts(rows_a)
    ids_b, n_b, c_b = counts(rows_b)
    shared = sorted(set(ids_a) & set(ids_b))
    ia = {p: i for i, p in enumerate(ids_a)}
    ib = {p: i for i, p in enumerate(ids_b)}
    sa = [ia[p] for p in shared]
    sb = [ib[p] for p in shared]

    def score(n, c):
        return avg_at_n(n, c) if k is None else pass_at_k(n, c, k)

    return score(n_a[sa], c_a[sa]), score(n_b[sb], c_b[sb]), len(shared)


def average(rows_by_bench: Sequence[Sequence[dict]], *, n_boot: int = N_BOOT, seed: int = SEED) -> dict:
    """The unweighted mean over benchmarks of each one's avg@n, with a 95 % bootstrap interval resampling problems
    within each benchmark (``contracts.passk.stratified_bootstrap_ci``). ``rows_by_bench``: one list of sample-file
    rows per benchmark, in the order of the benchmark list. Returns ``{"avg", "low", "high", "problems"}``
    (``problems``: per benchmark)."""
    scores = []
    for rows in rows_by_bench:
        _, n, c = counts(rows)
        scores.append(avg_at_n(n, c))
    est, low, high = stratified_bootstrap_ci(scores, n_boot=n_boot, seed=seed)
    return {"avg": est, "low": low, "high": high, "problems": [len(s) for s in scores]}


def compare_average(rows_a_by_bench: Sequence[Sequence[dict]], rows_b_by_bench: Sequence[Sequence[dict]], *,
                    n_boot: int = N_BOOT, seed: int = SEED) -> dict:
    """Model A's average over benchmarks minus model B's, paired by problem id within each benchmark (the problems
    both have scored), with ``contracts.passk.paired_stratified_bootstrap``'s interval and p. Returns its
    ``{"diff", "low", "high", "p_value"}`` plus ``"problems"``: the shared problems per benchmark. ValueError when
    a benchmark has no shared problem."""
    ga, gb, shared = [], [], []
    for j, (ra, rb) in enumerate(zip(rows_a_by_bench, rows_b_by_bench, strict=True)):
        a, b, k = _shared(ra, rb)
        if not k:
            raise ValueError(f"benchmark {j} of the average: the two models share no problems")
        ga.append(a)
        gb.append(b)
        shared.append(k)
    out = paired_stratified_bootstrap(ga, gb, n_boot=n_boot, seed=seed)
    out["problems"] = shared
    return out


def compare(rows_a: Sequence[dict], rows_b: Sequence[dict], *, k: int | None = None, n_boot: int = N_BOOT,
            seed: int = SEED) -> dict:
    """Paired bootstrap of model A minus model B on the problems both have scored.

    Score per problem: avg@n (``k=None``) or pass@k. Returns ``paired_bootstrap``'s ``{"diff", "low", "high",
    "p_value"}`` plus ``"problems"`` (the number of shared problems)."""
    a, b, shared = _shared(rows_a, rows_b, k=k)
    if not shared:
        raise ValueError("the two models share no problems; a paired comparison needs the same problems")
    out = paired_bootstrap(a, b, n_boot=n_boot, seed=seed)
    out["problems"] = shared
    return out
