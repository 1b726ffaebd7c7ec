"""The premise regime's estimators, pure functions of eval rows and pass@k matrices (no files, no models):
solution identity of a countdown response, per-problem pass@k, the crossover k with its bootstrap interval, the
pass@k curves with intervals, distinct correct solutions per problem."""

from __future__ import annotations

import math
import re
from typing import Sequence

import numpy as np

from contracts.passk import N_BOOT, bootstrap_ci, paired_bootstrap, pass_at_k


_TOK = re.compile(r"\d+|[-+*/()]")


def canonical_solution(response: str) -> str | None:
    """The final ``= EXPR`` line of a countdown response as a canonical expression tree (operands of + and *
    sorted, so ``(4*3)+8`` and ``8+(3*4)`` are one solution, as the task's solver counts them; ``(a+b)+c`` and
    ``a+(b+c)`` stay two, as there). None when the last non-blank line is not ``= EXPR`` or does not parse."""
    lines = [ln.replace(" ", "") for ln in response.splitlines() if ln.strip()]
    if not lines or not lines[-1].startswith("="):
        return None
    toks = _TOK.findall(lines[-1][1:])
    if "".join(toks) != lines[-1][1:] or not toks:
        return None
    pos = 0

    def factor():
        nonlocal pos
        if pos >= len(toks):
            raise ValueError
        t = toks[pos]
        pos += 1
        if t == "(":
            v = expr()
            if pos >= len(toks) or toks[pos] != ")":
                raise ValueError
            pos += 1
            return v
        if t.isdigit():
            return str(int(t))
        raise ValueError

    def chain(sub, ops):
        nonlocal pos
        v = sub()
        while pos < len(toks) and toks[pos] in ops:
            op = toks[pos]
            pos += 1
            w = sub()
            a, b = (sorted([v, w]) if op in "+*" else (v, w))
            v = f"({a}{op}{b})"
        return v

    def term():
        return chain(factor, "*/")

    def expr():
        return chain(term, "+-")

    try:
        out = expr()
    except (ValueError, RecursionError):
        return None
    return out if pos == len(toks) else None


def passk_matrix(n: np.ndarray, c: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """Per-problem unbiased pass@k, shape [P, len(ks)] (``contracts.passk.pass_at_k``)."""
    return np.stack([pass_at_k(n, c, int(k)) for k in ks], axis=1)


def crossover_k(ks: Sequence[int], diff: Sequence[float]) -> float:
    """The k at which ``diff`` (final − warm-up pass@k on the grid ``ks``) first turns non-positive after being
    positive, interpolated linearly in log2 k between the two grid points around the sign change.

    Returns ``ks[0]`` when diff is already <= 0 at the first k (the final model never leads), ``inf`` when it
    stays > 0 at every k (no crossover within the grid)."""
    ks = np.asarray(ks, dtype=float)
    d = np.asarray(diff, dtype=float)
    assert ks.shape == d.shape and ks.size >= 1, "ks and diff must have the same, non-empty shape"
    if d[0] <= 0:
        return float(ks[0])
    for i in range(1, len(d)):
        if d[i] <= 0:
            lo, hi = math.log2(ks[i - 1]), math.log2(ks[i])
            frac = d[i - 1] / (d[i - 1] - d[i])
            return float(2 ** (lo + frac * (hi - lo)))
    return math.inf


def curve_table(per_problem: dict[str, np.ndarray], ks: Sequence[int], *, seed: int = 0) -> list[dict]:
    """Rows {model, k, pass, low, high}: mean pass@k over problems with a 95 % percentile bootstrap interval."""
    rows = []
    for name, m in per_problem.items():
        for j, k in enumerate(ks):
            est, lo, hi = bootstrap_ci(m[:, j], n_boot=N_BOOT, seed=seed)
            rows.append({"model": name, "k": int(k), "pass": est, "low": lo, "high": hi})
    return rows


def crossover_table(a: np.ndarray, b: np.ndarray, ks: Sequence[int], *, seed: int = 0) -> dict:
    """Crossover of ``b`` against ``a`` (per-problem pass@k matrices [P, K] on the same problems): the point
    estimate, a 95 % bootstrap interval over problems (percentiles without interpolation; ``inf`` = beyond the
    grid), the fraction of resamples with a crossover inside the grid, and per k the paired difference."""
    assert a.shape == b.shape, "crossover needs the two models on the same problems"
    est = crossover_k(ks, (b - a).mean(axis=0))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.shape[0], size=(N_BOOT, a.shape[0]))
    d = (b - a)
    boots = np.array([crossover_k(ks, d[row].mean(axis=0)) for row in idx])
    lo, hi = (float(np.percentile(boots, q, method="inverted_cdf")) for q in (2.5, 97.5))
    per_k = []
    for j, k in enumerate(ks):
        p = paired_bootstrap(b[:, j], a[:, j], n_boot=N_BOOT, seed=seed)
        per_k.append({"k": int(k), "diff": p["diff"], "low": p["low"], "high": p["high"], "p_value": p["p_value"]})
    return {"crossover_k": est, "low": lo, "high": hi, "frac_within_grid": float(np.mean(np.isfinite(boots) &
                                                                                       (boots > ks[0]))),
            "frac_final_never_leads": float(np.mean(boots <= ks[0])), "per_k": per_k}


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
