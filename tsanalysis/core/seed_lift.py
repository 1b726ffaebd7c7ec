"""Restart values of a Thinking Seeds run, per seed (``tsanalysis seeds``; the trainer logs the per-step summary).

The definitions are ``contracts.seed_lift``'s (one home, shared with the trainer's ``seeds/lift_*``): per prompt
q of a seeded step, V_seeded(q) = mean_i y_i over its G continuations, V_fresh(q) = mean_i s_i over the G cached
responses the seeds were cut from (the fresh group π_b sampled at the refresh step), lift(q) = V_seeded - V_fresh,
and one seed's lift y_i - V_fresh(q). Here the seeds are binned by

- cut depth: seed_len / source_len (``n_bins`` bins, ``floor(n_bins * seed_len / source_len)``, as the takeover
  histogram of ``tsanalysis positions``) and seed_len in tokens (bins of ``width``);
- seed age: step - seed_step (updates between the policy that wrote the seed and the one continuing it);
- source age (``lift_by_source``): the refresh step of the row's cycle minus seed_step, how much older the seed's
  writer was than the cycle's own policy: 0 for Thinking Seeds, 0, T, 2T, ... (and the base's) under
  ``seed_source=mixture``, whose seeds come from a mixture of past policies;
- token type at the cut: ``tsanalysis.core.truncation.categorize_token`` of trunc_token_text, per rule;
- the source's own verdict (a seed cut from a correct vs a wrong response).

Intervals are percentile bootstraps (``cluster_bootstrap``, fixed seed) over the seeded groups
(step, prompt) of a bin, not over seeds: the G seeds of one prompt share its V_fresh and are not independent.

Zero advantage (paper Lemma 4). Observed: the share of seeded groups, and of their fresh groups, whose graded
verdicts are all equal. Predicted for independent seeds: Lemma 4's D(p) from the prompt's OTHER groups of the same
kind in the selected steps (``lemma4.leave_group_out``: the unbiased estimator, and its plug-in), so a prompt needs
G other samples of its kind (it recurs in later epochs). Shared seeds: Lemma 4's remark, E_h[D(p_h)], needs the
spread of p_h over seeds, which one continuation per seed cannot give; the source outcome s_i is a second draw
through the same prefix (by π_b, not π_θ, and with a cut that depends on the response's length), so the
within-prompt correlation of (s_i, y_i) estimates the intra-seed correlation rho = Var_h(p_h) / (p (1 - p)) when
π_θ ≈ π_b, and ``lemma4.shared_seed_zero_adv_prob`` (beta-binomial at rho) turns it into the shared-seed
prediction at the same plug-in p. A model, said as one: rho is an approximation, the gap shared - independent is
what sharing seeds would cost.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from contracts.passk import bootstrap_ci
from contracts.seed_lift import prompt_values

from . import lemma4 as L4
from . import truncation as TR

__all__ = ["seed_table", "lift_bins", "depth_bin", "source_age", "lift_by_source", "pair_correlation", "lift_summary",
           "zero_adv_comparison"]

SEED_COLUMNS = ("step", "prompt_id", "sample_idx", "seed_step", "seed_len", "source_len", "trunc_rule",
                "trunc_token_text", "correct", "source_correct")


def seed_table(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per seeded row of the records (``variant == 'seed'``), with its group and lift.

    rows: columns ``SEED_COLUMNS``; ``correct`` and ``source_correct`` 1/0 or NaN (ungraded), rows of one step in
    file order. A group is (step, prompt_id, rep) with rep = the occurrence of the row's sample_idx within the step and
    prompt (``lemma4.group_table``'s rule: a prompt drawn twice in one step is two groups). Adds: rep, group (an
    integer id), age (step - seed_step; missing for a reference trace), cut_frac (seed_len / source_len), category (the cut token's type),
    value_fresh (V_fresh of the prompt), lift (y - V_fresh).
    """
    missing = set(SEED_COLUMNS) - set(rows.columns)
    assert not missing, f"seed rows lack columns {sorted(missing)}"
    d = rows.reset_index(drop=True).copy()
    d["rep"] = d.groupby(["step", "prompt_id", "sample_idx"]).cumcount().astype(np.int64)
    d["group"] = d.groupby(["step", "prompt_id", "rep"], sort=False).ngroup().astype(np.int64)
    # a reference trace (seed_source=external) was written by no policy: no age (pandas' missing integer)
    d["age"] = (d["step"] - d["seed_step"]).astype("Int64")
    d["cut_frac"] = d["seed_len"] / d["source_len"].where(d["source_len"] > 0)
    d["category"] = [TR.categorize_token(t if isinstance(t, str) else None) for t in d["trunc_token_text"]]
    v = prompt_values(d["group"].to_numpy(), d["correct"].to_numpy(float), d["source_correct"].to_numpy(float))
    fresh = pd.Series(v["value_fresh"], index=v["group"])
    d["value_fresh"] = fresh.reindex(d["group"].to_numpy()).to_numpy()
    d["lift"] = d["correct"].to_numpy(float) - d["value_fresh"].to_numpy()
    return d


def depth_bin(seed_len, source_len, n_bins: int) -> np.ndarray:
    """floor(n_bins * seed_len / source_len), in [0, n_bins - 1] (a seed never holds the whole response's EOS)."""
    seed_len, source_len = np.asarray(seed_len, dtype=np.int64), np.asarray(source_len, dtype=np.int64)
    return np.minimum((n_bins * seed_len) // np.maximum(source_len, 1), n_bins - 1)


def source_age(step, seed_step, *, refresh_interval: int) -> np.ndarray:
    """(step - step mod T) - seed_step: the refresh step of the row's cycle (the cycle's own policy wrote batch 1)
    minus the step of the policy that wrote its seed. 0 for Thinking Seeds; under ``seed_source=mixture`` the lag
    of the drawn past policy (a multiple of T, or the initial policy's age)."""
    assert refresh_interval >= 1, f"refresh_interval must be >= 1, got {refresh_interval}"
    step = np.asarray(step, dtype=np.int64)
    return step - step % refresh_interval - np.asarray(seed_step, dtype=np.int64)


def lift_by_source(seeds: pd.DataFrame, *, refresh_interval: int, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Lift per source age (``source_age``) over the seeds of ``seed_table`` that have a writer (a reference trace
    has none): ``lift_bins``' columns by source_age, plus writers (the distinct seed_steps in the bin) and age_mean
    (the mean step - seed_step of its seeds, the updates between writer and continuer)."""
    d = seeds[seeds["age"].notna()].copy()
    d["source_age"] = source_age(d["step"], d["seed_step"].astype(np.int64), refresh_interval=refresh_interval)
    out = lift_bins(d, ["source_age"], n_boot=n_boot, seed=seed)
    graded = d[d["lift"].notna()].groupby("source_age")
    out["writers"] = out["source_age"].map(graded["seed_step"].nunique()).astype(np.int64)
    out["age_mean"] = out["source_age"].map(graded["age"].mean().astype(float))
    return out


def cluster_bootstrap(values: np.ndarray, clusters: np.ndarray, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """Mean of ``values`` with a 95 % percentile interval and a two-sided bootstrap p-value (the share of resamples
    on the other side of 0, doubled), resampling whole clusters (a prompt's seeds move together): each resample is
    sum / count over the clusters drawn. Returns ``{"lift", "low", "high", "p"}``."""
    _, inv = np.unique(clusters, return_inverse=True)
    sums = np.bincount(inv, weights=values)
    counts = np.bincount(inv).astype(np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(sums), size=(n_boot, len(sums)))
    boots = sums[idx].sum(axis=1) / counts[idx].sum(axis=1)
    lo, hi = np.quantile(boots, [0.025, 0.975])
    p = 2 * min(np.mean(boots <= 0), np.mean(boots >= 0))
    return {"lift": float(sums.sum() / counts.sum()), "low": float(lo), "high": float(hi), "p": float(min(1.0, p))}


def lift_bins(seeds: pd.DataFrame, by: list[str], *, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Lift per bin of the columns ``by`` over the seeds with a lift (graded continuation and fresh group).

    Columns: by..., seeds, groups, lift_mean, lift_low, lift_high (95 %, groups resampled), value_seeded (mean y),
    value_fresh (mean V_fresh of the seeds' prompts), source_correct (share of seeds cut from a correct response).
    """
    d = seeds[seeds["lift"].notna()]
    rows = []
    for key, b in d.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        ci = cluster_bootstrap(b["lift"].to_numpy(float), b["group"].to_numpy(), n_boot=n_boot, seed=seed)
        rows.append({**dict(zip(by, key)), "seeds": len(b), "groups": int(b["group"].nunique()), "lift_mean": ci["lift"],
                     "lift_low": ci["low"], "lift_high": ci["high"], "value_seeded": float(b["correct"].mean()),
                     "value_fresh": float(b["value_fresh"].mean()),
                     "source_correct": float(b["source_correct"].mean())})
    cols = [*by, "seeds", "groups", "lift_mean", "lift_low", "lift_high", "value_seeded", "value_fresh",
            "source_correct"]
    return pd.DataFrame(rows, columns=cols)


def pair_correlation(seeds: pd.DataFrame) -> float:
    """Within-prompt correlation of each seed's source and continuation outcomes (s_i, y_i), pooled over groups:
    sum (s - s̄_q)(y - ȳ_q) / sqrt(sum (s - s̄_q)^2 sum (y - ȳ_q)^2) over seeds with both graded; the (G - 1)/G
    bias of within-group centring cancels in the ratio. NaN when either side never varies within a prompt."""
    d = seeds[seeds["correct"].notna() & seeds["source_correct"].notna()]
    if d.empty:
        return float("nan")
    g = d.groupby("group")
    s = d["source_correct"] - g["source_correct"].transform("mean")
    y = d["correct"] - g["correct"].transform("mean")
    den = float(np.sqrt((s ** 2).sum() * (y ** 2).sum()))
    return float((s * y).sum() / den) if den > 0 else float("nan")


def lift_summary(seeds: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row over the selected steps: seeded steps, groups, seeds; the prompt-level lift (mean over groups of
    V_seeded - V_fresh, interval resampling groups, standard deviation over groups); mean values; all-wrong fresh
    groups, those rescued and the rescued share (interval resampling the all-wrong groups); the observed
    zero-advantage shares of seeded and fresh groups; the pair correlation of ``pair_correlation``."""
    v = prompt_values(seeds["group"].to_numpy(), seeds["correct"].to_numpy(float),
                      seeds["source_correct"].to_numpy(float))
    lift = v["lift"][~np.isnan(v["lift"])]
    nan3 = (np.nan, np.nan, np.nan)
    lm, ll, lh = bootstrap_ci(lift, n_boot=n_boot, seed=seed) if lift.size else nan3
    aw = v["all_wrong_fresh"]
    rs, rl, rh = bootstrap_ci(v["rescued"][aw].astype(float), n_boot=n_boot, seed=seed) if aw.any() else nan3
    both = ~np.isnan(v["lift"])

    def share(side):
        has = v[f"n_{side}"] > 0
        return float(v[f"zero_adv_{side}"][has].mean()) if has.any() else np.nan

    return pd.DataFrame([{
        "seeded_steps": int(seeds["step"].nunique()), "groups": int(v["group"].size), "seeds": len(seeds),
        "lift_groups": int(lift.size), "lift_mean": lm, "lift_low": ll, "lift_high": lh,
        "lift_std": float(lift.std(ddof=1)) if lift.size > 1 else (0.0 if lift.size else np.nan),
        "value_seeded": float(v["value_seeded"][both].mean()) if both.any() else np.nan,
        "value_fresh": float(v["value_fresh"][both].mean()) if both.any() else np.nan,
        "all_wrong_fresh": int(aw.sum()), "rescued": int(v["rescued"].sum()),
        "rescued_share": rs, "rescued_low": rl, "rescued_high": rh,
        "zero_adv_seeded": share("seeded"), "zero_adv_fresh": share("fresh"),
        "pair_corr": pair_correlation(seeds),
    }])


def _groups(seeds: pd.DataFrame, outcome: str, kind: str) -> pd.DataFrame:
    """A ``lemma4.group_table``-shaped table of one kind from the seeds' graded outcomes (zero advantage: every
    graded verdict equal, as dynamic sampling decides)."""
    d = seeds[seeds[outcome].notna()]
    g = d.groupby(["step", "prompt_id", "rep"], sort=True)[outcome].agg(["size", "sum"]).reset_index()
    g = g.rename(columns={"sum": "n_correct"})
    g["n_correct"] = g["n_correct"].astype(np.int64)
    g["kind"] = kind
    g["zero_adv"] = (g["n_correct"] == 0) | (g["n_correct"] == g["size"])
    return g[["step", "prompt_id", "rep", "kind", "size", "n_correct", "zero_adv"]]


def zero_adv_comparison(seeds: pd.DataFrame) -> pd.DataFrame:
    """Observed vs Lemma 4 for the seeded groups (kind ``seeded``) and their fresh groups (``fresh``).

    Columns of ``lemma4.zero_adv_from_groups`` (kind, groups, success_mean, zero_adv_obs, zero_adv_obs_se, ...,
    groups_pred, zero_adv_obs_on_pred, zero_adv_pred (independent seeds, unbiased), zero_adv_pred_plugin) plus
    pair_corr (rho, the seeded kind's), zero_adv_pred_shared: Lemma 4's shared-seed value at the same plug-in p
    and rho, and shared_gap = zero_adv_pred_shared - zero_adv_pred_plugin (seeded kind only; NaN for fresh, and
    where no group has a prediction).
    """
    rho = pair_correlation(seeds)
    frames = []
    for outcome, kind in (("correct", "seeded"), ("source_correct", "fresh")):
        g = _groups(seeds, outcome, kind)
        if g.empty:
            continue
        out = L4.zero_adv_from_groups(g, by_step=False)
        pred = L4.leave_group_out(g)
        has = pred["zero_adv_pred"].notna()
        shared = np.nan
        if kind == "seeded" and has.any() and np.isfinite(rho):
            p = (pred.loc[has, "c_other"] / pred.loc[has, "n_other"]).to_numpy(float)
            G = pred.loc[has, "size"].to_numpy()
            shared = float(np.mean([L4.shared_seed_zero_adv_prob(pi, rho, int(gi)) for pi, gi in zip(p, G)]))
        out["pair_corr"] = rho if kind == "seeded" else np.nan
        out["zero_adv_pred_shared"] = shared
        out["shared_gap"] = shared - out["zero_adv_pred_plugin"]   # what one seed per group would add (>= 0)
        frames.append(out)
    return pd.concat(frames, ignore_index=True)
