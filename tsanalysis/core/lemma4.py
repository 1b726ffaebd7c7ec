"""Zero-advantage groups (paper Lemma 4 and the remark after its proof; docs/method.md "Lemma 4").

With i.i.d. binary rewards of success probability p, a group of G responses has zero advantage (all rewards
equal) with probability ``D(p) = p^G + (1-p)^G`` and is all-wrong with probability ``(1-p)^G = 1 - pass@G``.
D is convex and decreases on [0, 1/2]. If the G continuations shared one seed h with success probability p_h,
the zero-advantage probability would be ``E_h[D(p_h)] >= D(E_h[p_h])`` (Jensen): independent seeds never give
more zero-advantage groups than shared ones at the same marginal success rate.

Observed runs (:func:`zero_adv_from_groups`): the observed fraction of zero-advantage groups is compared with
the value Lemma 4 predicts from the prompt's success rate. The prediction for group g of prompt q uses only the
OTHER groups of q of the same kind (leave-group-out, n_o samples, c_o correct) and the unbiased estimator

    D̂ = [C(c_o, G) + C(n_o - c_o, G)] / C(n_o, G)          (needs n_o >= G)

i.e. the probability that G draws without replacement from the n_o pooled outcomes are all equal. If q has
the same success probability p in all its groups and rewards are i.i.d. within a group, E[D̂] = D(p) =
E[1{group g has zero advantage}] exactly, for any G and n_o; D̂ is independent of group g, so observed and
predicted estimate the same number and a gap means the i.i.d.-within-group assumption fails (e.g. shared seeds,
correlated rewards) or p drifts between the prompt's groups (training changes the policy; Jensen again makes
the observed value larger then). Predicting from the group's own outcomes would be circular: the unbiased
estimator from the group alone IS the observed indicator, and the plug-in D(c/G) is always >= it. The plug-in
on the other groups, D(c_o/n_o), is reported too (``zero_adv_pred_plugin``); it is biased upward by convexity,
E[D(p̂)] - D(p) = O(G² p(1-p)/n_o), which matters for small pools. Groups whose prompt has fewer than G other
samples get no prediction; the ``*_on_pred`` observed columns are restricted to the groups that have one, so
the comparison is on the same groups.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = ["zero_adv_prob", "all_wrong_prob", "lemma4_table", "simulate_zero_adv", "shared_vs_independent",
           "group_kind", "group_table", "unbiased_equal_prob", "unbiased_all_wrong_prob", "zero_adv_from_groups",
           "leave_group_out", "shared_seed_zero_adv_prob"]


def _check_p(p) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if np.any((p < 0) | (p > 1)) or np.any(~np.isfinite(p)):
        raise ValueError("success probabilities must lie in [0, 1]")
    return p


def _check_G(G) -> int:
    if int(G) != G or G < 1:
        raise ValueError(f"group size G must be a positive integer, got {G}")
    return int(G)


def zero_adv_prob(p, G: int) -> np.ndarray:
    """D(p) = p^G + (1-p)^G, vectorised over p."""
    p, G = _check_p(p), _check_G(G)
    return p ** G + (1.0 - p) ** G


def all_wrong_prob(p, G: int) -> np.ndarray:
    """(1-p)^G = 1 - pass@G, vectorised over p."""
    p, G = _check_p(p), _check_G(G)
    return (1.0 - p) ** G


def lemma4_table(p, G: int) -> pd.DataFrame:
    """Columns p, G, zero_adv (D), all_wrong, all_right, pass_at_G for each p."""
    p = np.atleast_1d(_check_p(p))
    G = _check_G(G)
    aw = all_wrong_prob(p, G)
    return pd.DataFrame({"p": p, "G": G, "zero_adv": zero_adv_prob(p, G), "all_wrong": aw, "all_right": p ** G,
                         "pass_at_G": 1.0 - aw})


def simulate_zero_adv(p, G: int, *, n_groups: int, seed: int = 0, chunk: int = 200_000) -> pd.DataFrame:
    """Monte Carlo check of Lemma 4: draw ``n_groups`` groups of G i.i.d. Bernoulli(p) rewards for each p.

    Returns columns p, G, n_groups, zero_adv_sim, zero_adv_se, all_wrong_sim, all_wrong_se, zero_adv_exact,
    all_wrong_exact (se = binomial standard error of the simulated fraction).
    """
    p = np.atleast_1d(_check_p(p))
    G = _check_G(G)
    if n_groups < 1:
        raise ValueError(f"n_groups must be >= 1, got {n_groups}")
    rng = np.random.default_rng(seed)
    rows = []
    for pi in p:
        equal = wrong = 0
        left = n_groups
        while left:
            m = min(chunk, left)
            r = rng.random((m, G)) < pi           # [m, G] rewards
            s = r.sum(axis=1)
            equal += int(np.count_nonzero((s == 0) | (s == G)))
            wrong += int(np.count_nonzero(s == 0))
            left -= m
        fz, fw = equal / n_groups, wrong / n_groups
        rows.append({"p": float(pi), "G": G, "n_groups": n_groups,
                     "zero_adv_sim": fz, "zero_adv_se": np.sqrt(fz * (1 - fz) / n_groups),
                     "all_wrong_sim": fw, "all_wrong_se": np.sqrt(fw * (1 - fw) / n_groups),
                     "zero_adv_exact": float(zero_adv_prob(pi, G)), "all_wrong_exact": float(all_wrong_prob(pi, G))})
    return pd.DataFrame(rows)


def shared_vs_independent(seed_probs, G: int, *, weights=None) -> dict[str, np.ndarray]:
    """Zero-advantage probability with one shared seed per group vs independent seeds (Lemma 4 remark).

    seed_probs: [..., H] success probabilities p_h of the current policy from each seed h (last axis: seeds);
    weights: [..., H] probabilities of the seeds (default uniform). Returns a dict of arrays of shape [...]:
    ``p_marginal`` = E_h p_h, ``shared`` = E_h[D(p_h)], ``independent`` = D(E_h p_h), ``gap`` = shared -
    independent (>= 0 by Jensen), and the all-wrong counterparts ``all_wrong_shared`` = E_h[(1-p_h)^G],
    ``all_wrong_independent`` = (1 - E_h p_h)^G.
    """
    p = _check_p(seed_probs)
    G = _check_G(G)
    if p.ndim == 0 or p.shape[-1] == 0:
        raise ValueError("seed_probs needs at least one seed on its last axis")
    if weights is None:
        w = np.full(p.shape, 1.0 / p.shape[-1])
    else:
        w = np.broadcast_to(np.asarray(weights, dtype=np.float64), p.shape)
        if np.any(w < 0):
            raise ValueError("seed weights must be non-negative")
        total = w.sum(axis=-1, keepdims=True)
        if np.any(total <= 0):
            raise ValueError("seed weights must not all be zero")
        w = w / total
    pm = np.clip((w * p).sum(axis=-1), 0.0, 1.0)
    shared = (w * zero_adv_prob(p, G)).sum(axis=-1)
    indep = zero_adv_prob(pm, G)
    return {"p_marginal": pm, "shared": shared, "independent": indep, "gap": shared - indep,
            "all_wrong_shared": (w * all_wrong_prob(p, G)).sum(axis=-1), "all_wrong_independent": all_wrong_prob(pm, G)}


def group_kind(variants) -> str:
    """Kind of a group from its members' variants: ``seeded`` if any member is a seed row, ``on_policy`` if all
    are on-policy, else the sorted variants joined by '+' (e.g. ``luffy_off+on_policy``)."""
    vs = set(variants)
    if "seed" in vs:
        return "seeded"
    if vs == {"on_policy"}:
        return "on_policy"
    return "+".join(sorted(str(v) for v in vs))


def group_table(step, prompt_id, correct, reward, variant, sample_idx=None) -> pd.DataFrame:
    """Rows (one per response) → one row per group.

    A group is (step, prompt_id, rep): when a prompt is sampled twice in one step (e.g. a dynamic-sampling
    round drew it again) its sample indices repeat, and the r-th occurrence of each sample_idx belongs to
    group rep = r (rows in file order). Without ``sample_idx`` every (step, prompt_id) is one group.
    Columns: step, prompt_id, rep, kind (see :func:`group_kind`), size, n_correct, zero_adv (all rewards
    equal: the group's advantages are all zero).
    """
    df = pd.DataFrame({"step": np.asarray(step, dtype=np.int64), "prompt_id": np.asarray(prompt_id, dtype=object),
                       "correct": np.asarray(correct, dtype=bool), "reward": np.asarray(reward, dtype=np.float64),
                       "variant": np.asarray(variant, dtype=object)})
    cols = ["step", "prompt_id", "rep", "kind", "size", "n_correct", "zero_adv"]
    if df.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(
            cols, (np.int64, object, np.int64, object, np.int64, np.int64, bool))})
    if sample_idx is None:
        df["rep"] = 0
    else:
        df["sample_idx"] = np.asarray(sample_idx, dtype=np.int64)
        df["rep"] = df.groupby(["step", "prompt_id", "sample_idx"]).cumcount().to_numpy()
    g = df.groupby(["step", "prompt_id", "rep"], sort=True)
    out = g.agg(size=("correct", "size"), n_correct=("correct", "sum"), rmin=("reward", "min"),
                rmax=("reward", "max")).reset_index()
    out["kind"] = g["variant"].agg(group_kind).to_numpy()
    out["zero_adv"] = (out["rmax"] - out["rmin"]).to_numpy() == 0
    out["n_correct"] = out["n_correct"].astype(np.int64)
    out["size"] = out["size"].astype(np.int64)
    out["rep"] = out["rep"].astype(np.int64)
    return out[cols]


def shared_seed_zero_adv_prob(p, rho, G: int) -> np.ndarray:
    """E_h[D(p_h)] of Lemma 4's remark when the G continuations of a group share one seed h and p_h ~ Beta with mean
    p and intra-seed correlation rho = Var_h(p_h) / (p (1 - p)) (the beta-binomial: a = p (1 - rho) / rho,
    b = (1 - p) (1 - rho) / rho, E[p_h^G] = prod_{k<G} (a + k) / (a + b + k)). rho <= 0 gives D(p) (independent
    seeds), rho >= 1 gives 1 (the seed decides the reward); vectorised over p and rho."""
    p, G = _check_p(p), _check_G(G)
    p, rho = np.broadcast_arrays(p, np.asarray(rho, dtype=np.float64))
    r = np.clip(rho, 1e-12, 1.0)
    s = (1.0 - r) / r                                     # a + b
    k = np.arange(G, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        up = np.prod((p[..., None] * s[..., None] + k) / (s[..., None] + k), axis=-1)
        down = np.prod(((1 - p[..., None]) * s[..., None] + k) / (s[..., None] + k), axis=-1)
    shared = np.where(r >= 1.0, 1.0, up + down)
    return np.where(rho <= 0, zero_adv_prob(p, G), shared)


def _ratio_of_combs(c, n, G) -> np.ndarray:
    """C(c, G) / C(n, G) = prod_{i<G} (c-i)/(n-i), vectorised over c, n (0 when c < G); needs n >= G."""
    c = np.asarray(c, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    i = np.arange(G, dtype=np.float64)
    terms = (c[..., None] - i) / (n[..., None] - i)        # [..., G]
    return np.where(c >= G, np.prod(np.clip(terms, 0.0, None), axis=-1), 0.0)


def unbiased_equal_prob(c, n, G: int) -> np.ndarray:
    """Unbiased estimate of D(p) from c successes in n i.i.d. trials (n >= G): [C(c,G) + C(n-c,G)] / C(n,G)."""
    G = _check_G(G)
    c, n = np.broadcast_arrays(np.asarray(c), np.asarray(n))
    if np.any(n < G):
        raise ValueError(f"the unbiased estimator of D(p) needs n >= G={G} samples")
    return _ratio_of_combs(c, n, G) + _ratio_of_combs(n - c, n, G)


def unbiased_all_wrong_prob(c, n, G: int) -> np.ndarray:
    """Unbiased estimate of (1-p)^G from c successes in n trials (n >= G): C(n-c, G) / C(n, G)."""
    G = _check_G(G)
    c, n = np.broadcast_arrays(np.asarray(c), np.asarray(n))
    if np.any(n < G):
        raise ValueError(f"the unbiased estimator of (1-p)^G needs n >= G={G} samples")
    return _ratio_of_combs(n - c, n, G)


def _predict(groups: pd.DataFrame) -> pd.DataFrame:
    """Leave-group-out predictions per group (see the module docstring)."""
    g = groups.copy()
    tot = g.groupby(["prompt_id", "kind"])[["size", "n_correct"]].transform("sum")
    g["n_other"] = (tot["size"] - g["size"]).astype(np.int64)
    g["c_other"] = (tot["n_correct"] - g["n_correct"]).astype(np.int64)
    g["zero_adv_pred"] = np.nan
    g["all_wrong_pred"] = np.nan
    g["zero_adv_pred_plugin"] = np.nan
    for G in np.unique(g["size"].to_numpy()):
        sel = (g["size"].to_numpy() == G) & (g["n_other"].to_numpy() >= G)
        if not sel.any():
            continue
        c, n = g.loc[sel, "c_other"].to_numpy(), g.loc[sel, "n_other"].to_numpy()
        g.loc[sel, "zero_adv_pred"] = unbiased_equal_prob(c, n, int(G))
        g.loc[sel, "all_wrong_pred"] = unbiased_all_wrong_prob(c, n, int(G))
        g.loc[sel, "zero_adv_pred_plugin"] = zero_adv_prob(c / n, int(G))
    return g


def leave_group_out(groups: pd.DataFrame) -> pd.DataFrame:
    """``groups`` (a :func:`group_table`) with each group's leave-group-out pool and predictions (module docstring):
    n_other, c_other, zero_adv_pred, all_wrong_pred, zero_adv_pred_plugin (NaN without G other samples)."""
    return _predict(groups)


def zero_adv_from_groups(groups: pd.DataFrame, *, by_step: bool = True) -> pd.DataFrame:
    """Observed vs predicted zero-advantage fractions, per step and kind (or per kind with ``by_step=False``).

    groups: the output of :func:`group_table` (columns step, prompt_id, kind, size, n_correct, zero_adv; rep
    optional).
    Output columns: [step,] kind, groups, success_mean (mean c/size), zero_adv_obs, zero_adv_obs_se,
    all_wrong_obs, all_right_obs, groups_pred (groups with a prediction), zero_adv_obs_on_pred,
    all_wrong_obs_on_pred, zero_adv_pred, all_wrong_pred, zero_adv_pred_plugin. Fractions are over groups.
    """
    need = {"step", "prompt_id", "kind", "size", "n_correct", "zero_adv"}
    if missing := need - set(groups.columns):
        raise ValueError(f"groups table lacks columns {sorted(missing)}")
    g = _predict(groups)
    g["all_wrong"] = g["n_correct"] == 0
    g["all_right"] = g["n_correct"] == g["size"]
    g["success"] = g["n_correct"] / g["size"]
    has = g["zero_adv_pred"].notna()
    g["zero_adv_on_pred"] = g["zero_adv"].where(has).astype(float)
    g["all_wrong_on_pred"] = g["all_wrong"].where(has).astype(float)
    keys = ["step", "kind"] if by_step else ["kind"]
    agg = g.groupby(keys, sort=True).agg(
        groups=("zero_adv", "size"), success_mean=("success", "mean"), zero_adv_obs=("zero_adv", "mean"),
        all_wrong_obs=("all_wrong", "mean"), all_right_obs=("all_right", "mean"),
        groups_pred=("zero_adv_pred", "count"), zero_adv_obs_on_pred=("zero_adv_on_pred", "mean"),
        all_wrong_obs_on_pred=("all_wrong_on_pred", "mean"), zero_adv_pred=("zero_adv_pred", "mean"),
        all_wrong_pred=("all_wrong_pred", "mean"), zero_adv_pred_plugin=("zero_adv_pred_plugin", "mean"),
    ).reset_index()
    f = agg["zero_adv_obs"].to_numpy(dtype=float)
    agg.insert(agg.columns.get_loc("zero_adv_obs") + 1, "zero_adv_obs_se", np.sqrt(f * (1 - f) / agg["groups"]))
    return agg
