"""Support dynamics between checkpoints, pure estimators over per-problem pass@k and answer labels (no file IO).

Does RL narrow what a model can solve? Three readings of one question, each with its paper:

- **pass@k crossover** (Yue et al. 2025, arXiv:2504.13837): RL checkpoints lead at small k, the base model
  catches up and passes them at large k. ``crossover_k`` is the k (interpolated in log2 k on the grid) at which
  ``to − from`` pass@k first turns non-positive; ``crossover_table`` adds a bootstrap interval over problems.
- **support gained / lost / kept** (Wu et al., "The Invisible Leash", arXiv:2507.14843: preservation, expansion,
  shrinkage of the empirical support). At the problem level and budget k, with ``a = pass@k_from(p)`` and
  ``b = pass@k_to(p)`` the unbiased per-problem estimates (``contracts.passk.pass_at_k``) and the two models'
  draws independent, problem p is

      gained  (to solves it in k draws, from does not)   b · (1 − a)
      lost    (from solves it, to does not)             a · (1 − b)
      kept    (both do)                                 a · b
      neither                                           (1 − a) · (1 − b)

  summed over problems: expected counts, which add up to the number of problems; ``gained − lost`` is
  ``Σ_p (b − a)``, the pass@k difference times the number of problems. ``retention = kept / (kept + lost)`` is the
  share of from's solvable problems that to still solves (the paper's support retention rate, per problem rather
  than per solution); ``discovery = gained / (gained + kept)`` the share of to's solvable problems that from could
  not solve (its net discovery rate, likewise).
- **distinct correct answers and answer entropy** (Matsutani et al., "RL Squeezes, SFT Expands", arXiv:2509.21128,
  counts unique correct and incorrect trajectories; arXiv:2507.14843 reports answer-level entropy falling while
  token entropy rises). ``cluster_labels`` groups one problem's extracted answers with an equivalence the caller
  gives (math: the grader's; tasks: a canonical form; code: a normalised program); ``distinct`` counts clusters
  (among correct samples: distinct correct answers) and ``answer_entropy`` is the Shannon entropy, in nats, of the
  cluster frequencies over the samples that gave an answer.

Every interval is a 95 % percentile bootstrap over problems with the fixed seed of ``contracts.passk``: the same
problems are resampled for both models (``paired_bootstrap``, and ``bootstrap_ci`` on per-problem quantities that
already hold both models), and with equal problem counts and seed every table draws the same resamples.

``canonical_solution`` (a countdown response's final expression as a canonical tree) lives here because both this
analysis and ``demo.premise`` count distinct countdown solutions with it; ``scoring.tasks.countdown`` is its
natural home, should the task module want it.
"""

from __future__ import annotations

import math
import re
from typing import Callable, Hashable, Sequence

import numpy as np

from contracts.passk import N_BOOT, SEED, bootstrap_ci, paired_bootstrap

__all__ = ["SPLITS", "support_split", "support_rows", "crossover_k", "crossover_table", "cluster_labels",
           "distinct", "answer_entropy", "canonical_solution"]

SPLITS = ("gained", "lost", "kept", "neither")


# ---- gained / lost / kept ------------------------------------------------------------------------------------
def support_split(pass_from, pass_to) -> dict[str, np.ndarray]:
    """Per problem, the probabilities of the four outcomes at one k (module docstring), shape [P] each."""
    a = np.asarray(pass_from, dtype=np.float64)
    b = np.asarray(pass_to, dtype=np.float64)
    assert a.shape == b.shape, f"support needs both models on the same problems, got shapes {a.shape} and {b.shape}"
    return {"gained": b * (1 - a), "lost": a * (1 - b), "kept": a * b, "neither": (1 - a) * (1 - b)}


def _ratio(num: int, den: int) -> Callable[[np.ndarray], float]:
    """A bootstrap statistic: column ``num``'s sum over the sum of columns ``num`` and ``den`` (NaN when 0)."""
    def stat(v: np.ndarray) -> float:
        top = v[:, num].sum()
        bottom = top + v[:, den].sum()
        return float(top / bottom) if bottom > 0 else math.nan
    return stat


def support_rows(pass_from: np.ndarray, pass_to: np.ndarray, ks: Sequence[int], *, n_boot: int = N_BOOT,
                 seed: int = SEED) -> list[dict]:
    """One row per k: expected ``gained``, ``lost``, ``kept``, ``neither`` counts over the P problems, each with
    ``_low``/``_high`` (bootstrap over problems), ``net = gained − lost`` with its paired interval and p-value,
    ``retention`` and ``discovery`` with intervals, and both models' mean pass@k (``pass_from``, ``pass_to``).

    pass_from, pass_to: per-problem pass@k, shape [P, len(ks)], rows on the same problems.
    """
    a = np.asarray(pass_from, dtype=np.float64)
    b = np.asarray(pass_to, dtype=np.float64)
    assert a.shape == b.shape and a.ndim == 2 and a.shape[1] == len(ks), \
        f"pass@k matrices must be [P, {len(ks)}] on the same problems, got {a.shape} and {b.shape}"
    P = a.shape[0]
    rows = []
    for j, k in enumerate(ks):
        s = support_split(a[:, j], b[:, j])
        row: dict = {"k": int(k), "problems": P, "pass_from": float(a[:, j].mean()), "pass_to": float(b[:, j].mean())}
        for name in SPLITS:   # a count is P times a mean over problems: its interval scales the same way
            est, lo, hi = bootstrap_ci(s[name], n_boot=n_boot, seed=seed)
            row.update({name: P * est, f"{name}_low": P * lo, f"{name}_high": P * hi})
        d = paired_bootstrap(s["gained"], s["lost"], n_boot=n_boot, seed=seed)   # = pass@k_to − pass@k_from
        row.update(net=P * d["diff"], net_low=P * d["low"], net_high=P * d["high"], net_p_value=d["p_value"])
        gkl = np.stack([s["gained"], s["kept"], s["lost"]], axis=1)   # [P, 3]
        for name, stat in (("retention", _ratio(1, 2)), ("discovery", _ratio(0, 1))):
            est, lo, hi = bootstrap_ci(gkl, stat=stat, n_boot=n_boot, seed=seed)
            row.update({name: est, f"{name}_low": lo, f"{name}_high": hi})
        rows.append(row)
    return rows


# ---- crossover (Yue et al. 2025) -------------------------------------------------------------------------------
def crossover_k(ks: Sequence[int], diff: Sequence[float]) -> float:
    """The k at which ``diff`` (to − from pass@k on the grid ``ks``, e.g. final − warm-up) first turns
    non-positive after being positive, interpolated linearly in log2 k between the two grid points around the
    sign change.

    Returns ``ks[0]`` when diff is already <= 0 at the first k (the later model never leads), ``inf`` when it
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


def crossover_table(a: np.ndarray, b: np.ndarray, ks: Sequence[int], *, seed: int = SEED,
                    n_boot: int = N_BOOT) -> dict:
    """Crossover of ``b`` against ``a`` (per-problem pass@k matrices [P, K] on the same problems): the point
    estimate, a 95 % bootstrap interval over problems (percentiles without interpolation; ``inf`` = beyond the
    grid), the fraction of resamples with a crossover inside the grid, the fraction in which ``b`` never leads
    (``frac_final_never_leads``: the name ``demo.premise``'s files carry), and per k the paired difference."""
    assert a.shape == b.shape, "crossover needs the two models on the same problems"
    est = crossover_k(ks, (b - a).mean(axis=0))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.shape[0], size=(n_boot, a.shape[0]))
    d = (b - a)
    boots = np.array([crossover_k(ks, d[row].mean(axis=0)) for row in idx])
    lo, hi = (float(np.percentile(boots, q, method="inverted_cdf")) for q in (2.5, 97.5))
    per_k = []
    for j, k in enumerate(ks):
        p = paired_bootstrap(b[:, j], a[:, j], n_boot=n_boot, seed=seed)
        per_k.append({"k": int(k), "diff": p["diff"], "low": p["low"], "high": p["high"], "p_value": p["p_value"]})
    return {"crossover_k": est, "low": lo, "high": hi, "frac_within_grid": float(np.mean(np.isfinite(boots) &
                                                                                       (boots > ks[0]))),
            "frac_final_never_leads": float(np.mean(boots <= ks[0])), "per_k": per_k}


# ---- distinct answers and answer entropy -----------------------------------------------------------------------
def cluster_labels(answers: Sequence[Hashable | None],
                   equivalent: Callable[[Hashable, Hashable], bool] | None = None) -> list[int | None]:
    """A cluster label per answer (None stays None: no answer). Equal answers share a label without a check; a new
    answer joins the first cluster whose representative (its first member) it is ``equivalent`` to, called
    ``equivalent(representative, answer)`` (a grader's gold-first order), else starts a cluster. Without
    ``equivalent`` the labels are the distinct values. Greedy against representatives: with an equivalence that is
    not transitive (numeric tolerance) the clusters depend on the order, as any single-pass clustering does."""
    reps: list[Hashable] = []
    seen: dict[Hashable, int] = {}
    out: list[int | None] = []
    for x in answers:
        if x is None:
            out.append(None)
            continue
        if x not in seen:
            hit = None
            if equivalent is not None:
                hit = next((i for i, r in enumerate(reps) if equivalent(r, x)), None)
            if hit is None:
                reps.append(x)
                hit = len(reps) - 1
            seen[x] = hit
        out.append(seen[x])
    return out


def distinct(labels: Sequence[int | None], mask: Sequence[bool] | None = None) -> int:
    """The number of clusters among the labels (restricted to ``mask``, e.g. the correct samples)."""
    keep = labels if mask is None else [x for x, m in zip(labels, mask) if m]
    return len({x for x in keep if x is not None})


def answer_entropy(labels: Sequence[int | None]) -> float:
    """Shannon entropy (nats) of the cluster frequencies of the samples that gave an answer; NaN when none did.
    One answer everywhere is 0; m equally frequent answers give log m."""
    counts = np.unique(np.array([x for x in labels if x is not None], dtype=np.int64), return_counts=True)[1]
    if counts.size == 0:
        return math.nan
    p = counts / counts.sum()
    return float(-(p * np.log(p)).sum())


# ---- countdown solutions ---------------------------------------------------------------------------------------
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
