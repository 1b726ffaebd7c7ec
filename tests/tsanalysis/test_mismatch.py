"""Seed-token mismatch (tsanalysis.core.mismatch) on hand examples."""

import math

import numpy as np
import pytest

from tsanalysis.core.mismatch import MismatchAccumulator, mismatch_tables, seed_divergence

E = math.e
NAN = math.nan
# one seeded response: final length 5, seed 3, d = logp_old - logp_behavior = [0, 1, -1] on the seed
OLD = [np.array([-1.0, -1.0, -2.0, -1.0, -1.0])]
BEH = [np.array([-1.0, -2.0, -1.0, NAN, NAN])]


def test_seed_divergence_values():
    q = seed_divergence(np.array([0.0, 1.0, -1.0, 0.5, 0.5]), np.array([0, 3, 5]))
    assert q["cum_log_ratio"].tolist() == pytest.approx([0, 1, 0, 0.5, 1.0])
    assert q["cum_abs_log_ratio"].tolist() == pytest.approx([0, 1, 2, 0.5, 1.0])
    k3_half = math.exp(0.5) - 1 - 0.5
    assert q["kl_k3"].tolist() == pytest.approx([0, E - 2, 1 / E, k3_half, k3_half])
    assert q["cum_kl_k3"].tolist() == pytest.approx([0, E - 2, E - 2 + 1 / E, k3_half, 2 * k3_half])


def test_tables_hand_example():
    t = mismatch_tables(OLD, BEH, [3], [5], n_bins=3, width=2, thresholds=(0.5, 1.5, 3.0))
    rel = t["relative"]                                  # t / seed_len: one token per bin
    assert rel["count"].tolist() == [1, 1, 1]
    assert rel["cum_abs_log_ratio_mean"].tolist() == pytest.approx([0, 1, 2])
    assert rel["cum_kl_k3_mean"].tolist() == pytest.approx([0, E - 2, E - 2 + 1 / E])
    assert rel["log_ratio_mean"].tolist() == pytest.approx([0, 1, -1])
    ab = t["absolute"]                                   # width 2: tokens {0, 1} and {2}
    assert ab["pos_lo"].tolist() == [0, 2] and ab["count"].tolist() == [2, 1]
    assert ab["cum_abs_log_ratio_mean"].tolist() == pytest.approx([0.5, 2.0])
    cr = t["crossing"].set_index(["quantity", "threshold"])
    assert cr.loc[("cum_abs_log_ratio", 0.5), "pos_median"] == 1
    assert cr.loc[("cum_abs_log_ratio", 1.5), "pos_median"] == 2
    assert cr.loc[("cum_abs_log_ratio", 1.5), "rel_seed_median"] == pytest.approx(2 / 3)
    assert cr.loc[("cum_abs_log_ratio", 3.0), "crossed"] == 0
    assert cr.loc[("cum_kl_k3", 0.5), "pos_median"] == 1
    assert cr.loc[("cum_kl_k3", 1.5), "frac_crossed"] == 0.0      # e - 2 + 1/e = 1.086 < 1.5
    assert cr.loc[("cum_abs_log_ratio", 0.5), "mean_curve_rel_bin"] == 1
    assert cr.loc[("cum_abs_log_ratio", 1.5), "mean_curve_abs_pos"] == 2
    s = t["summary"].iloc[0]
    assert (s["responses"], s["seed_tokens"], s["skipped_nonfinite"]) == (1, 3, 0)
    assert s["cum_log_ratio_end_mean"] == pytest.approx(0.0)
    assert s["cum_abs_log_ratio_end_mean"] == pytest.approx(2.0)
    # relative to the final length (5 tokens, 5 bins): the seed fills bins 0..2
    t = mismatch_tables(OLD, BEH, [3], [5], n_bins=5, relative_to="response")
    assert t["relative"]["count"].tolist() == [1, 1, 1, 0, 0]


def test_nonfinite_seed_is_skipped_and_streaming_equals_in_memory():
    rng = np.random.default_rng(0)
    old, beh, seeds, finals = [], [], [], []
    for _ in range(60):
        L = int(rng.integers(2, 40))
        s = int(rng.integers(1, L + 1))
        o = rng.normal(-1, 0.3, L)
        b = np.full(L, np.nan)
        b[:s] = o[:s] + rng.normal(0, 0.2, s)
        old.append(o), beh.append(b), seeds.append(s), finals.append(L)
    beh[7][0] = np.nan   # a broken seed: skipped, counted
    want = mismatch_tables(old, beh, seeds, finals, width=8)
    acc = MismatchAccumulator(width=8)
    for i in range(0, 60, 25):
        acc.add(old[i:i + 25], beh[i:i + 25], seeds[i:i + 25], finals[i:i + 25])
    got = acc.tables()
    for name in ("relative", "absolute", "crossing", "summary"):
        np.testing.assert_allclose(got[name].select_dtypes("number").to_numpy(dtype=float),
                                   want[name].select_dtypes("number").to_numpy(dtype=float), rtol=1e-10)
    assert want["summary"]["skipped_nonfinite"].iloc[0] == 1
    assert want["summary"]["responses"].iloc[0] == 59
