"""Lemma 4 (tsanalysis.core.lemma4): exhaustive enumeration, simulation, Jensen, and the run-level estimator."""

from itertools import product
from math import comb

import numpy as np
import pandas as pd
import pytest

from tsanalysis.core.lemma4 import (all_wrong_prob, group_table, lemma4_table, shared_vs_independent,
                                    simulate_zero_adv, unbiased_all_wrong_prob, unbiased_equal_prob, zero_adv_from_groups,
                                    zero_adv_prob)

PS = [0.0, 0.03, 0.2, 0.5, 0.77, 1.0]


@pytest.mark.parametrize("G", range(1, 11))
def test_zero_adv_prob_equals_enumeration_of_all_outcomes(G):
    for p in PS:
        equal = wrong = 0.0
        for outcome in product((0, 1), repeat=G):   # all 2^G reward vectors
            k = sum(outcome)
            prob = p ** k * (1 - p) ** (G - k)
            equal += prob * (len(set(outcome)) == 1)
            wrong += prob * (k == 0)
        assert zero_adv_prob(p, G) == pytest.approx(equal, abs=1e-12)
        assert all_wrong_prob(p, G) == pytest.approx(wrong, abs=1e-12)
    np.testing.assert_allclose(zero_adv_prob(np.array(PS), G), [p ** G + (1 - p) ** G for p in PS])


def test_zero_adv_prob_matches_simulation_within_4_standard_errors():
    p = np.array([0.05, 0.3, 0.5, 0.9])
    n = 100_000
    sim = simulate_zero_adv(p, 8, n_groups=n, seed=1)
    exact = zero_adv_prob(p, 8)
    se = np.sqrt(exact * (1 - exact) / n)
    assert np.all(np.abs(sim["zero_adv_sim"].to_numpy() - exact) < 4 * se)
    aw = all_wrong_prob(p, 8)
    assert np.all(np.abs(sim["all_wrong_sim"].to_numpy() - aw) < 4 * np.sqrt(aw * (1 - aw) / n) + 1e-12)
    assert sim.equals(simulate_zero_adv(p, 8, n_groups=n, seed=1))   # fixed seed


def test_D_decreases_on_first_half_and_table():
    grid = np.linspace(0, 0.5, 101)
    for G in (2, 4, 8, 16):
        assert np.all(np.diff(zero_adv_prob(grid, G)) < 0)
    t = lemma4_table([0.1, 0.5], 8)
    assert t["zero_adv"].tolist() == pytest.approx([0.9 ** 8 + 0.1 ** 8, 2 * 0.5 ** 8])
    assert t["pass_at_G"].tolist() == pytest.approx([1 - 0.9 ** 8, 1 - 0.5 ** 8])
    with pytest.raises(ValueError):
        zero_adv_prob(1.5, 8)
    with pytest.raises(ValueError):
        zero_adv_prob(0.5, 0)


def test_shared_seed_never_below_independent():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        H = int(rng.integers(1, 12))
        G = int(rng.integers(1, 17))
        p = rng.random(H) ** rng.uniform(0.2, 5)
        w = rng.random(H) if rng.random() < 0.5 else None
        r = shared_vs_independent(p, G, weights=w)
        assert r["shared"] >= r["independent"] - 1e-12
        assert r["all_wrong_shared"] >= r["all_wrong_independent"] - 1e-12
    r = shared_vs_independent([0.0, 1.0], 2)        # hand value: shared always zero-adv, independent D(1/2)
    assert (r["shared"], r["independent"], r["p_marginal"]) == (1.0, 0.5, 0.5)
    r = shared_vs_independent(np.array([[0.2, 0.2], [0.1, 0.5]]), 4, weights=[1.0, 3.0])   # batched over prompts
    assert r["gap"][0] == pytest.approx(0.0)
    assert r["p_marginal"][1] == pytest.approx(0.4)
    assert r["shared"][1] == pytest.approx(0.25 * zero_adv_prob(0.1, 4) + 0.75 * zero_adv_prob(0.5, 4))


def test_unbiased_estimators_are_unbiased_and_reduce_to_the_indicator():
    for n, G, p in [(6, 3, 0.3), (8, 8, 0.6), (16, 8, 0.05), (9, 2, 0.5)]:
        c = np.arange(n + 1)
        pmf = np.array([comb(n, k) * p ** k * (1 - p) ** (n - k) for k in c])
        assert (pmf * unbiased_equal_prob(c, n, G)).sum() == pytest.approx(zero_adv_prob(p, G), abs=1e-12)
        assert (pmf * unbiased_all_wrong_prob(c, n, G)).sum() == pytest.approx(all_wrong_prob(p, G), abs=1e-12)
    c = np.arange(9)
    np.testing.assert_array_equal(unbiased_equal_prob(c, 8, 8), (c == 0) | (c == 8))
    assert unbiased_equal_prob(1, 2, 2) == 0.0 and unbiased_equal_prob(2, 2, 2) == 1.0
    assert unbiased_equal_prob(2, 4, 2) == pytest.approx((1 + 1) / 6)
    with pytest.raises(ValueError, match="n >= G"):
        unbiased_equal_prob(1, 3, 4)


def _hand_groups() -> pd.DataFrame:
    # prompt a: on-policy at steps 0 and 1; b: seeded at steps 0 and 1; c: on-policy once (no prediction)
    rows = [(0, "a", [1, 1], "on_policy"), (1, "a", [1, 0], "on_policy"), (0, "b", [0, 0], "seed"),
            (1, "b", [0, 0], "seed"), (0, "c", [0, 1], "on_policy")]
    step, pid, corr, var = [], [], [], []
    for s, p, cs, v in rows:
        for x in cs:
            step.append(s), pid.append(p), corr.append(bool(x)), var.append(v)
    return group_table(step, pid, corr, np.array(corr, dtype=float), var)


def test_group_table():
    g = _hand_groups()
    assert (g["rep"] == 0).all()
    assert g[["step", "prompt_id", "kind", "size", "n_correct", "zero_adv"]].values.tolist() == [
        [0, "a", "on_policy", 2, 2, True], [0, "b", "seeded", 2, 0, True], [0, "c", "on_policy", 2, 1, False],
        [1, "a", "on_policy", 2, 1, False], [1, "b", "seeded", 2, 0, True]]
    # zero advantage is about equal rewards, e.g. all 0.5
    g2 = group_table([0, 0], ["q", "q"], [True, True], [0.5, 0.5], ["luffy_off", "on_policy"])
    assert g2["zero_adv"].tolist() == [True] and g2["kind"].tolist() == ["luffy_off+on_policy"]
    # the same prompt sampled twice in one step (repeating sample indices): two groups
    g3 = group_table([5] * 4, ["q"] * 4, [1, 1, 0, 1], [1, 1, 0, 1], ["on_policy"] * 4, sample_idx=[0, 1, 0, 1])
    assert g3[["rep", "size", "n_correct", "zero_adv"]].values.tolist() == [[0, 2, 2, True], [1, 2, 1, False]]


def test_zero_adv_from_groups_hand_example():
    g = _hand_groups()
    by = zero_adv_from_groups(g).set_index(["step", "kind"])
    r = by.loc[(0, "on_policy")]
    assert (r["groups"], r["zero_adv_obs"], r["success_mean"]) == (2, 0.5, 0.75)
    # group a@0 is predicted from a@1 only (n_o = 2, c_o = 1): unbiased D̂ = 0, plug-in D(1/2) = 1/2
    assert (r["groups_pred"], r["zero_adv_obs_on_pred"], r["zero_adv_pred"], r["zero_adv_pred_plugin"]) == (1, 1.0, 0.0, 0.5)
    r = by.loc[(1, "on_policy")]
    assert (r["zero_adv_obs"], r["zero_adv_pred"]) == (0.0, 1.0)
    r = by.loc[(0, "seeded")]
    assert (r["zero_adv_obs"], r["all_wrong_obs"], r["zero_adv_pred"], r["all_wrong_pred"]) == (1.0, 1.0, 1.0, 1.0)
    s = zero_adv_from_groups(g, by_step=False).set_index("kind")
    assert s.loc["on_policy", "groups"] == 3
    assert s.loc["on_policy", "zero_adv_obs"] == pytest.approx(1 / 3)
    assert (s.loc["on_policy", "groups_pred"], s.loc["on_policy", "zero_adv_obs_on_pred"],
            s.loc["on_policy", "zero_adv_pred"]) == (2, 0.5, 0.5)
    assert s.loc["on_policy", "zero_adv_obs_se"] == pytest.approx(np.sqrt((1 / 3) * (2 / 3) / 3))


def test_leave_group_out_prediction_is_unbiased_in_simulation():
    # 3000 prompts with their own p, each seen in 3 i.i.d. groups of G = 4: observed and predicted agree
    rng = np.random.default_rng(5)
    P, reps, G = 3000, 3, 4
    p = rng.beta(0.5, 0.5, size=P)
    step = np.repeat(np.arange(reps), P * G)
    pid = np.tile(np.repeat(np.arange(P).astype(str), G), reps)
    correct = rng.random(P * G * reps) < np.tile(np.repeat(p, G), reps)
    g = group_table(step, pid, correct, correct.astype(float), ["on_policy"] * correct.size)
    s = zero_adv_from_groups(g, by_step=False).iloc[0]
    assert s["groups_pred"] == P * reps
    se = np.sqrt(s["zero_adv_obs"] * (1 - s["zero_adv_obs"]) / s["groups"])
    assert abs(s["zero_adv_obs"] - s["zero_adv_pred"]) < 4 * se
    assert s["zero_adv_pred_plugin"] > s["zero_adv_pred"]   # the plug-in is biased upward (convexity)
