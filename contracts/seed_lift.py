"""Restart values of Thinking Seeds (pure numpy): what a seeded step's continuations are worth against the fresh
group of the same prompt. The trainer logs these per seeded step (``seeds/lift_*`` in ``metrics.jsonl``) and
``tsanalysis seeds`` recomputes and bins them from the rollout records, so both read this one definition.

What is compared. A seeded step has, per prompt q, only seeded rows: G continuations y_i of the current policy
π_θ from seeds h_i = õ_i[:m_i], each cut from one of the G responses õ_1..õ_G that π_b (the policy of the refresh
step that wrote the seeds) sampled for q. No fresh on-policy group of q is sampled at that step (dynamic sampling's
refills are other prompts), so the fresh value of q is the one its own source group gives: the trainer grades the
G cached responses õ_i in full at the seeded step (one extra grading batch, no generation) and records each row's
``source_correct``. Per prompt q with outcomes y_i (continuation correct) and s_i (source correct):

    V_seeded(q) = mean_i y_i          the current policy's value from the seeds (one continuation per seed)
    V_fresh(q)  = mean_i s_i          π_b's value from the prompt alone (its G fresh responses)
    lift(q)     = V_seeded(q) - V_fresh(q)
    lift_i      = y_i - V_fresh(q)    one seed's lift (what tsanalysis bins by cut depth, seed age, token type)

so lift(q) = mean_i lift_i. The lift mixes two things the data cannot separate: restarting from h_i instead of
from q, and the j = step - seed_step updates between π_b and π_θ. Outcomes are the grader's verdicts (unshaped by
overlong penalties); an ungraded outcome (NaN here) is left out: a continuation without a verdict is no seed of
the prompt's V_seeded, a source without one no sample of V_fresh, and a prompt counts when both have one.

Rescue: of the prompts whose fresh group is all wrong (every graded s_i = 0, the prompts an on-policy step could not
learn from), the share with at least one correct continuation. Zero advantage (paper Lemma 4): a group whose
graded verdicts are all equal, for the seeded group (y) and the fresh group (s) of each prompt; Lemma 4's
predictions need more samples of the prompt than one step holds (``tsanalysis seeds``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["prompt_values", "seed_lifts", "step_summary", "SUMMARY_KEYS"]

# the per-step summary, and the metric each key is logged as (the trainer prefixes "seeds/")
SUMMARY_KEYS = ("lift_mean", "lift_std", "lift_prompts", "value_seeded", "value_fresh", "all_wrong_fresh",
                "rescued", "rescued_share", "zero_adv_share", "zero_adv_fresh_share")


def _as_outcomes(x, name: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    ok = np.isnan(x) | (x == 0) | (x == 1)
    assert x.ndim == 1 and ok.all(), f"{name} must be a 1-D array of 0, 1 or NaN (ungraded)"
    return x


def prompt_values(group, correct, source_correct) -> dict[str, np.ndarray]:
    """Per prompt (group) values of one seeded step, groups in order of first appearance.

    group: [N] group ids (one per seeded row: a prompt's G seeds); correct: [N] continuation verdicts, 1/0, NaN when
    ungraded; source_correct: [N] the verdict of the cached response each seed was cut from, 1/0, NaN when ungraded.
    Returns arrays [Q]: ``group``, ``n_seeded`` / ``n_fresh`` (graded outcomes), ``value_seeded``, ``value_fresh``,
    ``lift`` (NaN where either side has no graded outcome), ``all_wrong_fresh``, ``rescued`` (all-wrong fresh group
    and a correct continuation), ``zero_adv_seeded`` / ``zero_adv_fresh`` (all graded verdicts equal; False for a
    side without any).
    """
    group = np.asarray(group)
    y, s = _as_outcomes(correct, "correct"), _as_outcomes(source_correct, "source_correct")
    assert group.shape == y.shape == s.shape, f"group {group.shape}, correct {y.shape}, source {s.shape} must match"
    _, first, inv = np.unique(group, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")          # groups in order of first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    g = rank[inv]                                     # [N] group index 0..Q-1
    Q = order.size

    def side(x):
        graded = ~np.isnan(x)
        n = np.bincount(g[graded], minlength=Q)
        c = np.bincount(g[graded], weights=x[graded], minlength=Q)
        with np.errstate(invalid="ignore", divide="ignore"):
            v = np.where(n > 0, c / np.maximum(n, 1), np.nan)
        equal = (n > 0) & ((c == 0) | (c == n))
        return n, c, v, equal

    ny, cy, vy, eq_y = side(y)
    ns, cs, vs, eq_s = side(s)
    all_wrong = (ns > 0) & (cs == 0)
    return {"group": group[first[order]], "n_seeded": ny, "n_fresh": ns, "value_seeded": vy, "value_fresh": vs,
            "lift": vy - vs, "all_wrong_fresh": all_wrong, "rescued": all_wrong & (cy > 0),
            "zero_adv_seeded": eq_y, "zero_adv_fresh": eq_s}


def seed_lifts(group, correct, source_correct) -> np.ndarray:
    """[N] each seed's lift y_i - V_fresh(q) (NaN when its continuation or its prompt's fresh group is ungraded)."""
    v = prompt_values(group, correct, source_correct)
    idx = {k: i for i, k in enumerate(v["group"].tolist())}
    fresh = v["value_fresh"][[idx[k] for k in np.asarray(group).tolist()]]
    return _as_outcomes(correct, "correct") - fresh


def step_summary(group, correct, source_correct) -> dict[str, float | int]:
    """The step's summary (``SUMMARY_KEYS``): lift mean and standard deviation over prompts (unbiased, 0.0 for one
    prompt) with their count, mean values, the count of all-wrong fresh groups and of those rescued (both absent
    when no source is graded: nothing fresh to count), the rescued share (absent when no fresh group is all wrong:
    a share of nothing), and the zero-advantage shares of the
    seeded and the fresh groups (over prompts with a graded outcome on that side)."""
    v = prompt_values(group, correct, source_correct)
    both = ~np.isnan(v["lift"])
    lift = v["lift"][both]
    out: dict[str, float | int] = {"lift_prompts": int(both.sum())}
    if lift.size:
        out.update(lift_mean=float(lift.mean()), lift_std=float(lift.std(ddof=1)) if lift.size > 1 else 0.0,
                   value_seeded=float(v["value_seeded"][both].mean()),
                   value_fresh=float(v["value_fresh"][both].mean()))
    if (v["n_fresh"] > 0).any():   # no graded source at all (seed_grade_sources=false): nothing fresh to count
        aw = int(v["all_wrong_fresh"].sum())
        out.update(all_wrong_fresh=aw, rescued=int(v["rescued"].sum()))
        if aw:
            out["rescued_share"] = out["rescued"] / aw
    for side, key in (("seeded", "zero_adv_share"), ("fresh", "zero_adv_fresh_share")):
        has = v[f"n_{side}"] > 0
        if has.any():
            out[key] = float(v[f"zero_adv_{side}"][has].mean())
    return out
