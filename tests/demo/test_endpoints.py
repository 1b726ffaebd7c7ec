"""The power study's endpoints (issue #40 item 2, ``demo.endpoints``) on hand-made tables whose answers scipy gives:
paired t intervals and p-values per comparison, Holm's step-down over the family, the interval at Holm's level, and
the seeds E2 leaves out."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from demo.endpoints import COLUMNS, endpoint_table, endpoints, render_endpoints
from demo.premise_stats import holm

SEEDS = 8
SHIFT = {"onpolicy": 0.0, "seeds_ratio": 0.04, "seeds_state": -0.01, "restart_fr3e": 0.0, "luffy": -0.06}


def _tables(K: int = 64):
    rng = np.random.default_rng(5)
    base1, baseK = rng.normal(0.30, 0.01, SEEDS), rng.normal(0.80, 0.03, SEEDS)
    rows = []
    for m, s in SHIFT.items():
        for seed in range(SEEDS):
            rows.append({"method": m, "seed": seed, "pass@1": base1[seed] + s + rng.normal(0, 0.01),
                         f"pass@{K}": baseK[seed] - s + rng.normal(0, 0.02)})
    methods = pd.DataFrame(rows)
    mrows = []
    for m in SHIFT:
        for seed in range(SEEDS):
            reached = not (m == "luffy" and seed < 3)          # three LUFFY seeds never reach on-policy's pass@1
            mrows.append({"method": m, "seed": seed, "k": K, "reached": reached,
                          "diff": (0.05 + rng.normal(0, 0.02)) if reached and m != "onpolicy" else
                          (0.0 if m == "onpolicy" else math.nan)})
    return methods, pd.DataFrame(mrows)


def test_each_comparison_is_scipys_paired_t_and_holm_runs_over_the_family():
    methods, matched = _tables()
    t = endpoint_table(methods, matched, 64)
    assert list(t.columns) == COLUMNS and len(t) == sum(len(e.pairs) for e in endpoints()) == 10
    by = methods.set_index(["method", "seed"])
    r = t[(t["endpoint"] == "E1") & (t["method"] == "luffy")].iloc[0]
    a, b = by.loc["luffy"]["pass@1"].to_numpy(), by.loc["onpolicy"]["pass@1"].to_numpy()
    assert r["seeds"] == SEEDS and r["diff"] == pytest.approx((a - b).mean())
    assert r["p"] == pytest.approx(stats.ttest_rel(a, b).pvalue)
    lo, hi = stats.t.interval(0.95, SEEDS - 1, loc=(a - b).mean(), scale=stats.sem(a - b))
    assert (r["low"], r["high"]) == pytest.approx((lo, hi))
    e3 = t[(t["endpoint"] == "E3") & (t["method"] == "seeds_ratio")].iloc[0]
    x, y = by.loc["seeds_ratio"]["pass@64"].to_numpy(), by.loc["restart_fr3e"]["pass@64"].to_numpy()
    assert e3["against"] == "restart_fr3e" and e3["p"] == pytest.approx(stats.ttest_rel(x, y).pvalue)
    assert t["p_holm"].to_numpy() == pytest.approx(holm(t["p"].to_numpy()))
    assert t["rejected"].tolist() == (t["p_holm"] < 0.05).tolist() and t["rejected"].any() and not t["rejected"].all()


def test_holms_interval_excludes_zero_exactly_when_holm_rejects():
    t = endpoint_table(*_tables(), 64).sort_values("p")
    m = len(t)
    for i, (_, r) in enumerate(t.iterrows()):
        assert r["holm_level"] == pytest.approx(1 - 0.05 / (m - i))
        excludes = r["low_holm"] > 0 or r["high_holm"] < 0
        if t["rejected"].iloc[:i].all():             # Holm reaches this comparison
            assert excludes == bool(r["rejected"]), r.to_dict()
        assert r["high_holm"] - r["low_holm"] >= r["high"] - r["low"] - 1e-12


def test_e2_reads_the_matched_table_and_counts_the_seeds_that_never_reached():
    methods, matched = _tables()
    r = endpoint_table(methods, matched, 64).set_index(["endpoint", "method"]).loc[("E2", "luffy")]
    want = matched[(matched["method"] == "luffy") & matched["reached"]]["diff"]
    assert r["seeds"] == SEEDS - 3 and r["missing"] == 3 and r["diff"] == pytest.approx(want.mean())


def test_a_comparison_without_two_seeds_has_no_statistics_and_leaves_the_family():
    methods, matched = _tables()
    methods = methods[methods["method"] != "restart_fr3e"]
    matched = matched[matched["method"] != "restart_fr3e"]
    t = endpoint_table(methods, matched, 64)
    gone = t["method"].eq("restart_fr3e") | t["against"].eq("restart_fr3e")
    assert gone.sum() == 4 and t[gone]["p"].isna().all() and not t[gone]["rejected"].any()
    assert t[~gone]["p_holm"].to_numpy() == pytest.approx(holm(t[~gone]["p"].to_numpy()))
    page = "\n".join(render_endpoints(t, 64, {"luffy": "LUFFY"}))
    assert "The family is the 6 comparisons" in page and "| LUFFY − onpolicy |" in page and "[–, –]" in page
