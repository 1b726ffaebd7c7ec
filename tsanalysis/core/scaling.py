"""Scaling fits of a run's score against compute: the sigmoid of ScaleRL (Khatri et al. 2025, arXiv:2510.13786)

    R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)

with R0 the score before training (C = 0), A the asymptote, C_mid the compute at which half the rise A − R0 is
reached, and B the steepness. ScaleRL's reading: most recipe choices move the efficiency (C_mid, B), few the
asymptote A; this module says which one a comparison moves, and whether the data can tell A at all.

The curve is fitted in x = ln C, where it is a logistic: R = R0 + (A − R0) expit(B (x − ln C_mid)), so compute of
any size (10⁶–10¹⁰ tokens, seconds) is one well-scaled problem. The fit (``fit_curve``): a grid over (ln C_mid, B)
with the amplitude solved in closed form at every node (the model is linear in A, and in R0 when R0 is free), then
``scipy.optimize.curve_fit`` (trust-region reflective, bounds 0 ≤ A, R0 ≤ 1, B > 0) from the best node: a start
near the global minimum whatever the data, so a noise-free curve is recovered to the optimizer's tolerance.

R0 is fixed to the step-0 (warm-up) score when there is one (``r0=``); that point has C = 0 and is not one of the
fitted points. Otherwise R0 is a fourth free parameter.

Identifiability (``assess``): A is an extrapolation unless the data show the bend. A fit says "asymptote not
identified" when the fitted rise |A − R0| is within twice the fit's RMSE (a flat curve: C_mid and B mean nothing);
when a straight line in ln C fits the points as well (an F-test of the sigmoid's residuals against the line's,
p ≥ 0.05: the points lie on the curve's straight middle, and any A above them fits); when the fitted C_mid lies
beyond the largest observed compute (the midpoint was never reached); when A sits on its bound (0 or 1: the data
want more rise than a score can have); or when A's bootstrap interval reaches a bound.

Intervals (``bootstrap``): percentile intervals of refits to resampled data, the resampling given by the caller
(problems re-drawn and each checkpoint's pass@k recomputed, or whole seeds re-drawn); each refit starts from the
point estimate's grid node search again, so a resample that moves the minimum is followed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable

import numpy as np
from scipy.optimize import curve_fit
from scipy.special import expit
from scipy.stats import f as f_dist

__all__ = ["MIN_POINTS", "B_MAX", "Fit", "FitRefused", "NOT_IDENTIFIED", "curve", "fit_curve", "assess",
           "bootstrap", "percentile"]

MIN_POINTS = 5            # fitted points (C > 0) a fit needs: three or four parameters and a check of the bend
B_MAX = 50.0              # steepness cap: B = 50 rises from 12 % to 88 % of A − R0 within 8 % more compute (a step)
B_MIN = 1e-3
BOUND_TOL = 1e-4          # A within this of 0 or 1 sits on its bound
X_MARGIN = 25.0           # ln C_mid searched within the data's ln C range widened by this (e^25 ≈ 7·10¹⁰ times)
NOT_IDENTIFIED = "asymptote not identified: the run has not bent yet"
FLAT = "asymptote not identified: the score does not move with compute (a flat curve)"
BEND_P = 0.05            # the sigmoid must beat a straight line in ln C at this level (``bend_p``)
TOL = 1e-12               # curve_fit's ftol, xtol, gtol: a noise-free curve comes back to ~1e-9


class FitRefused(ValueError):
    """A curve that cannot be fitted: too few points, or the optimizer did not converge."""


@dataclass(frozen=True)
class Fit:
    """One fitted curve: parameters, fit quality and whether the asymptote is identified (``reason`` says why not)."""

    A: float
    C_mid: float
    B: float
    R0: float
    r0_fixed: bool
    rmse: float
    points: int            # fitted points (C > 0)
    c_min: float
    c_max: float
    bend_p: float = 0.0    # F-test p of "a straight line in ln C fits as well" (small: the data show the bend)
    identified: bool = True
    reason: str = ""


def curve(compute, A: float, C_mid: float, B: float, R0: float) -> np.ndarray:
    """R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B); R(0) = R0."""
    c = np.asarray(compute, dtype=np.float64)
    with np.errstate(divide="ignore"):
        x = np.log(c)
    return R0 + (A - R0) * expit(B * (x - np.log(C_mid)))


def _check(compute, score) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(compute, dtype=np.float64)
    r = np.asarray(score, dtype=np.float64)
    if c.shape != r.shape or c.ndim != 1:
        raise ValueError(f"compute and score must be 1-D of one length; got shapes {c.shape} and {r.shape}")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(r))):
        raise ValueError("compute and score must be finite")
    if np.any(c <= 0):
        raise ValueError("fitted points need compute > 0 (a step-0 point is passed as r0=)")
    return c, r


def _grid_start(x: np.ndarray, r: np.ndarray, r0: float | None) -> tuple[float, ...]:
    """The best node of a (ln C_mid, B) grid, the amplitude (and R0 when free) solved by least squares at each node,
    clipped to [0, 1]: (A, m, B) or (A, m, B, R0)."""
    lo, hi = x.min(), x.max()
    span = max(hi - lo, 1e-3)
    m = np.concatenate([np.linspace(lo - 2 * span, hi + 4 * span, 61), [hi + 10 * span]])   # [M]
    b = np.geomspace(0.05 / span, min(B_MAX, 200.0 / span), 40)                          # [K]
    s = expit(b[:, None, None] * (x[None, None, :] - m[None, :, None]))                  # [K, M, N]
    if r0 is not None:
        y = r - r0
        amp = (s * y).sum(-1) / np.maximum((s * s).sum(-1), 1e-300)
        A = np.clip(r0 + amp, 0.0, 1.0)
        R0 = np.full_like(A, r0)
    else:   # r = R0 (1 − s) + A s: a 2 × 2 normal system per node
        u = 1.0 - s
        suu, sss, sus = (u * u).sum(-1), (s * s).sum(-1), (u * s).sum(-1)
        suy, ssy = (u * r).sum(-1), (s * r).sum(-1)
        det = suu * sss - sus ** 2
        ok = np.abs(det) > 1e-12 * np.maximum(suu * sss, 1e-300)
        safe = np.where(ok, det, 1.0)
        R0 = np.clip(np.where(ok, (sss * suy - sus * ssy) / safe, r.mean()), 0.0, 1.0)
        A = np.clip(np.where(ok, (suu * ssy - sus * suy) / safe, r.mean()), 0.0, 1.0)
    pred = R0[..., None] + (A - R0)[..., None] * s
    sse = ((pred - r) ** 2).sum(-1)
    i, j = np.unravel_index(np.argmin(sse), sse.shape)
    start = (float(A[i, j]), float(m[j]), float(b[i]))
    return start if r0 is not None else (*start, float(R0[i, j]))


def _polish(x: np.ndarray, r: np.ndarray, r0: float | None, start: tuple[float, ...]) -> np.ndarray:
    """curve_fit from ``start`` within the bounds; FitRefused when it does not converge."""
    lo, hi = x.min() - X_MARGIN, x.max() + X_MARGIN
    if r0 is not None:
        f = lambda x_, A, m, B: r0 + (A - r0) * expit(B * (x_ - m))          # noqa: E731
        bounds = ([0.0, lo, B_MIN], [1.0, hi, B_MAX])
    else:
        f = lambda x_, A, m, B, R0: R0 + (A - R0) * expit(B * (x_ - m))      # noqa: E731
        bounds = ([0.0, lo, B_MIN, 0.0], [1.0, hi, B_MAX, 1.0])
    p0 = np.clip(np.asarray(start, dtype=np.float64), np.asarray(bounds[0]) + 1e-12, np.asarray(bounds[1]) - 1e-12)
    try:
        p, _ = curve_fit(f, x, r, p0=p0, bounds=bounds, method="trf", ftol=TOL, xtol=TOL, gtol=TOL,
                         max_nfev=2000)
    except (RuntimeError, ValueError) as e:
        raise FitRefused(f"the fit did not converge ({e})") from None
    if not np.all(np.isfinite(p)):
        raise FitRefused("the fit did not converge (non-finite parameters)")
    return p


def fit_curve(compute, score, *, r0: float | None = None) -> Fit:
    """Fit R(C) to points (compute > 0, score in [0, 1]); ``r0``: the step-0 score (R0 fixed), None: R0 free.
    FitRefused for fewer than ``MIN_POINTS`` points or a fit that does not converge; the asymptote's
    identifiability from the point estimate is in ``identified`` / ``reason`` (``assess``)."""
    c, r = _check(compute, score)
    if c.size < MIN_POINTS:
        raise FitRefused(f"{c.size} points with compute > 0; a fit needs at least {MIN_POINTS}")
    x = np.log(c)
    p = _polish(x, r, r0, _grid_start(x, r, r0))
    A, m, B = (float(v) for v in p[:3])
    R0 = float(r0) if r0 is not None else float(p[3])
    sse = float(np.sum((R0 + (A - R0) * expit(B * (x - m)) - r) ** 2))
    fit = Fit(A=A, C_mid=float(np.exp(m)), B=B, R0=R0, r0_fixed=r0 is not None, rmse=float(np.sqrt(sse / c.size)),
              points=int(c.size), c_min=float(c.min()), c_max=float(c.max()),
              bend_p=_bend_p(x, r, sse, params=len(p)))
    return assess(fit)


def _bend_p(x: np.ndarray, r: np.ndarray, sse: float, *, params: int) -> float:
    """p of the F-test "a straight line in ln C fits as well as the sigmoid": (SSE_line − SSE) / df1 over
    SSE / (n − params), df1 = params − 2 (at least 1); 1 when the line fits at least as well."""
    coef = np.polyfit(x, r, 1)
    sse_line = float(np.sum((np.polyval(coef, x) - r) ** 2))
    gain, df1, df2 = sse_line - sse, max(params - 2, 1), max(x.size - params, 1)
    scale = max(sse_line, float(np.sum((r - r.mean()) ** 2)), 1e-300)
    if gain <= 1e-12 * scale:
        return 1.0
    if sse <= 1e-24 * scale:   # a noise-free curve: the line's excess is all bend
        return 0.0
    return float(f_dist.sf((gain / df1) / (sse / df2), df1, df2))


def assess(fit: Fit, A_interval: tuple[float, float] | None = None) -> Fit:
    """``fit`` with ``identified`` and ``reason`` set: is A read from the data or extrapolated (module docstring)?"""
    why = ""
    if abs(fit.A - fit.R0) <= max(2 * fit.rmse, 1e-9):
        why = FLAT
    elif fit.bend_p >= BEND_P:
        why = (f"{NOT_IDENTIFIED} (a straight line in log compute fits as well: F-test p = {fit.bend_p:.2g})")
    elif fit.C_mid > fit.c_max:
        why = (f"{NOT_IDENTIFIED} (C_mid {fit.C_mid:.3g} lies beyond the largest compute {fit.c_max:.3g})")
    elif fit.A <= BOUND_TOL or fit.A >= 1 - BOUND_TOL:
        why = f"{NOT_IDENTIFIED} (A sits on its bound {fit.A:.3g})"
    elif A_interval is not None and (A_interval[0] <= BOUND_TOL or A_interval[1] >= 1 - BOUND_TOL):
        why = (f"{NOT_IDENTIFIED} (A's 95 % interval [{A_interval[0]:.3g}, {A_interval[1]:.3g}] reaches a bound)")
    return replace(fit, identified=not why, reason=why)


def bootstrap(draws: Iterable[tuple[np.ndarray, np.ndarray, float | None]]) -> tuple[np.ndarray, int]:
    """Refit every resample (compute, score, r0) of ``draws``: ([fits, 4] of A, C_mid, B, R0 of the resamples that
    fitted, number that did not). A resample that cannot be fitted (too few distinct points, no convergence) is
    counted, not dropped silently."""
    rows, failed = [], 0
    for c, r, r0 in draws:
        try:
            f = fit_curve(c, r, r0=r0)
        except FitRefused:
            failed += 1
            continue
        rows.append((f.A, f.C_mid, f.B, f.R0))
    return np.asarray(rows, dtype=np.float64).reshape(-1, 4), failed


def percentile(values: np.ndarray, *, alpha: float = 0.05) -> tuple[float, float]:
    """The (alpha/2, 1 − alpha/2) percentile interval; (nan, nan) for no values."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(v, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


Resampler = Callable[[np.random.Generator], tuple[np.ndarray, np.ndarray, float | None]]


def resamples(draw: Resampler, n_boot: int, seed: int) -> Iterable[tuple[np.ndarray, np.ndarray, float | None]]:
    """``n_boot`` draws of ``draw(rng)`` from one seeded stream (the same inputs give the same intervals)."""
    rng = np.random.default_rng(seed)
    for _ in range(n_boot):
        yield draw(rng)
