"""Per-position binning (tsanalysis.core.bins) against hand-built arrays, and streaming == in-memory."""

import numpy as np
import pandas as pd
import pytest

from tsanalysis.core.bins import (AbsoluteBinner, PositionBinner, absolute_bins, flatten, per_1e4, position_bins,
                                  relative_bin_index, seed_token_mask)

A = np.array([1.0, 2.0, 3.0])                         # L=3:  t -> floor(10 t / 3) = 0, 3, 6
Bv = np.array([10.0, 20.0, 30.0, 40.0, 50.0])         # L=5:  bins 0, 2, 4, 6, 8
C = np.arange(100.0, 110.0)                           # L=10: bin t

# hand-computed: bin -> (mean, count)
EXPECTED_10 = {0: ((1 + 10 + 100) / 3, 3), 1: (101, 1), 2: ((20 + 102) / 2, 2), 3: ((2 + 103) / 2, 2),
               4: ((30 + 104) / 2, 2), 5: (105, 1), 6: ((3 + 40 + 106) / 3, 3), 7: (107, 1), 8: ((50 + 108) / 2, 2),
               9: (109, 1)}


def test_bin_index_is_floor_of_n_bins_t_over_L():
    _, offsets = flatten([A, Bv, C])
    idx = relative_bin_index(offsets, n_bins=10)
    assert idx.tolist() == [0, 3, 6] + [0, 2, 4, 6, 8] + list(range(10))
    assert relative_bin_index(offsets, n_bins=4).tolist() == [0, 1, 2] + [0, 0, 1, 2, 3] + [0, 0, 0, 1, 1, 2, 2, 2, 3, 3]


def test_position_bins_hand_values():
    t = position_bins([A, Bv, C], n_bins=10)
    assert list(t.columns) == ["bin", "mean", "count", "sum"]
    assert t["bin"].tolist() == list(range(10))
    for b, (mean, count) in EXPECTED_10.items():
        assert t.loc[b, "mean"] == pytest.approx(mean)
        assert t.loc[b, "count"] == count
    assert t["count"].sum() == 18


def test_empty_bins_are_present_with_nan_mean():
    t = position_bins([A], n_bins=10)
    assert t["count"].tolist() == [1, 0, 0, 1, 0, 0, 1, 0, 0, 0]
    assert t["mean"].isna().tolist() == [c == 0 for c in t["count"]]
    assert t.loc[3, "mean"] == 2.0


def test_lengths_normalise_by_final_length_and_mask_selects_tokens():
    # the seed (first 4 tokens) of a 10-token response, normalised by the final length: bins 0..3
    t = position_bins([C[:4]], n_bins=10, lengths=[10])
    assert t["count"].tolist() == [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    # the mask keeps continuation tokens only
    m = seed_token_mask(flatten([C])[1], [4])
    assert m.tolist() == [True] * 4 + [False] * 6
    t = position_bins([C], n_bins=5, mask=[~m])
    assert t["count"].tolist() == [0, 0, 2, 2, 2]
    assert t["mean"].tolist()[2:] == [104.5, 106.5, 108.5]
    with pytest.raises(ValueError, match="shorter"):
        position_bins([C], lengths=[5])


def test_nan_values_are_skipped_not_counted():
    t = position_bins([np.array([1.0, np.nan, 3.0, 5.0])], n_bins=2)
    assert t["count"].tolist() == [1, 2]
    assert t["mean"].tolist() == [1.0, 4.0]


def test_streaming_binner_equals_in_memory_function():
    rng = np.random.default_rng(0)
    values = [rng.normal(size=rng.integers(1, 300)) for _ in range(200)]
    masks = [rng.random(len(v)) < 0.7 for v in values]
    lengths = [len(v) + int(rng.integers(0, 50)) for v in values]
    want = position_bins(values, n_bins=10, mask=masks, lengths=lengths)
    binner = PositionBinner(n_bins=10)
    for i in range(0, 200, 37):   # uneven chunks
        sl = slice(i, i + 37)
        flat, offsets = flatten(values[sl])
        binner.add_flat(flat, offsets, key="x", lengths=lengths[sl], mask=np.concatenate(masks[sl]))
    got = binner.table("x")
    np.testing.assert_array_equal(got["count"], want["count"])
    np.testing.assert_allclose(got["mean"], want["mean"], rtol=1e-12)
    # list interface, several keys, and an unseen key gives empty bins
    b2 = PositionBinner(n_bins=10)
    b2.add(values[:100], key=("e", "all"))
    b2.add(values[100:], key=("e", "all"))
    pd.testing.assert_series_equal(b2.table(("e", "all"))["count"], position_bins(values)["count"])
    assert b2.table("never")["count"].sum() == 0
    assert set(b2.table()["key"]) == {("e", "all")}


def test_absolute_bins():
    t = absolute_bins([A, Bv, C], width=4)
    assert t["bin"].tolist() == [0, 1, 2]
    assert t["pos_lo"].tolist() == [0, 4, 8] and t["pos_hi"].tolist() == [4, 8, 12]
    assert t["count"].tolist() == [3 + 4 + 4, 1 + 4, 2]
    assert t.loc[2, "mean"] == pytest.approx((108 + 109) / 2)
    # streaming with a growing number of bins
    b = AbsoluteBinner(width=4)
    b.add([A], key="k")
    b.add([C], key="k")
    b.add([Bv], key="j")
    assert b.table("k")["count"].tolist() == [3 + 4, 4, 2]
    assert b.table("j")["count"].tolist() == [4, 1, 0]


def test_per_1e4():
    np.testing.assert_allclose(per_1e4([1, 0, 3], [4, 5, 0]), [2500.0, 0.0, np.nan])
