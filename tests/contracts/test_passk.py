"""pass@k (contracts.passk): the unbiased estimator against brute-force subset enumeration, refusals, and
the bootstrap intervals' determinism."""

from itertools import combinations

import numpy as np
import pytest

from contracts.passk import (avg_at_n, bootstrap_ci, k_grid, paired_bootstrap, pass_at_k, passk_curve, passk_matrix,
                             summarize)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of the k-subsets of n samples (c of them correct) that hold at least one correct sample."""
    samples = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_pass_at_k_equals_subset_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_vectorised_over_problems():
    n = np.array([4, 6, 8, 8])
    c = np.array([0, 3, 8, 1])
    got = pass_at_k(n, c, 2)
    want = [brute_pass_at_k(int(a), int(b), 2) for a, b in zip(n, c)]
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert got.shape == (4,)
    # pass@1 is the fraction correct
    np.testing.assert_allclose(pass_at_k(n, c, 1), c / n)


def test_pass_at_k_refuses_k_larger_than_n():
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="at least 3 samples"):
        pass_at_k(np.array([8, 2]), np.array([1, 1]), 3)   # one problem too small is enough to refuse
    with pytest.raises(ValueError, match="k >= 1"):
        pass_at_k(4, 1, 0)
    with pytest.raises(ValueError, match=r"\[0, n\]"):
        pass_at_k(4, 5, 1)


def test_avg_at_n_and_curve():
    np.testing.assert_allclose(avg_at_n([4, 8], [1, 8]), [0.25, 1.0])
    m = passk_matrix(np.array([8, 8]), np.array([1, 4]))   # one column per k of k_grid(8) = 1, 2, 4, 8
    assert m.shape == (2, 4)
    np.testing.assert_allclose(m[:, 3], [1.0, 1.0])
    np.testing.assert_allclose(m[:, 1], [brute_pass_at_k(8, 1, 2), brute_pass_at_k(8, 4, 2)])


def test_passk_matrix_columns_are_pass_at_k_of_the_given_ks():
    n, c = np.array([4, 6, 8]), np.array([0, 3, 8])
    m = passk_matrix(n, c, [1, 3])
    assert m.shape == (3, 2)
    np.testing.assert_allclose(m[:, 0], [0.0, 0.5, 1.0])
    np.testing.assert_allclose(m[:, 1], [0.0, brute_pass_at_k(6, 3, 3), 1.0])   # 1 - C(3,3)/C(6,3) = 0.95
    assert m[1, 1] == pytest.approx(0.95)
    assert passk_matrix(n, c, []).shape == (3, 0)
    with pytest.raises(ValueError, match="at least 5 samples"):
        passk_matrix(n, c, [5])


def test_passk_curve_hand_derived_intervals():
    # column k=1: scores 0 and 1, so a resample of the two problems is all-0 or all-1 with chance 1/4 each: the
    # 2.5 % and 97.5 % quantiles are 0 and 1; column k=2: both problems 1, a zero-width interval
    m = np.array([[0.0, 1.0], [1.0, 1.0]])
    assert passk_curve(m, [1, 2]) == {1: (0.5, 0.0, 1.0), 2: (1.0, 1.0, 1.0)}
    n, c = np.array([6, 6, 6, 6]), np.array([0, 1, 3, 6])
    ks = k_grid(6)
    assert passk_curve(passk_matrix(n, c, ks), ks, seed=7) == summarize(n, c, seed=7)["pass"]
    with pytest.raises(ValueError, match=r"needs a \[problems, 3\] matrix"):
        passk_curve(m, [1, 2, 4])


def test_bootstrap_ci_fixed_seed_and_degenerate_cases():
    v = np.array([0.0, 1.0, 0.5, 0.25, 0.75])
    est, lo, hi = bootstrap_ci(v, seed=3)
    assert est == pytest.approx(0.5)
    assert (est, lo, hi) == bootstrap_ci(v, seed=3)           # same seed, same interval
    assert lo < est < hi
    assert bootstrap_ci(np.array([0.3])) == (pytest.approx(0.3), pytest.approx(0.3), pytest.approx(0.3))
    with pytest.raises(ValueError):
        bootstrap_ci(np.array([]))


def test_paired_bootstrap():
    a = np.array([0.5, 0.6, 0.9, 0.2])
    r = paired_bootstrap(a, a - 0.1)
    assert r["diff"] == pytest.approx(0.1)
    assert r["low"] == pytest.approx(0.1) and r["high"] == pytest.approx(0.1)   # constant difference
    assert r["p_value"] == 0.0
    with pytest.raises(ValueError, match="same problems"):
        paired_bootstrap(a, a[:3])
