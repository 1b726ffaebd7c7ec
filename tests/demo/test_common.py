"""demo/common.py: the pieces every demo shares, on hand-made inputs (no model, no run)."""

from __future__ import annotations

import math

import pandas as pd

from demo.common import RunSpec, metric_mean, relay_rows, run_name, seeded


def test_relay_rows_are_percentages_and_signed_points():
    passk = pd.DataFrame([
        {"k": 1, "early": 0.25, "relay": 0.5, "final": 0.375, "diff": 0.125, "diff_low": -0.0625, "diff_high": 0.3125},
        {"k": 8, "early": float("nan"), "relay": 0.875, "final": 1.0, "diff": -0.125, "diff_low": -0.25,
         "diff_high": 0.0},
    ])
    assert relay_rows(passk) == ["| 1 | 25.0 | 50.0 | 37.5 | +12.5 [-6.2, +31.2] |",   # -6.25, 31.25: half to even
                                 "| 8 |  | 87.5 | 100.0 | -12.5 [-25.0, +0.0] |"]      # a missing rate: empty cell


def test_metric_mean_of_the_first_or_last_steps_that_log_the_key():
    metrics = [{"reward/mean": 1.0}, {"reward/mean": 2.0}, {"loss": 0.5}, {"reward/mean": 3.0}]
    assert metric_mean(metrics, "reward/mean", k=2) == 2.5
    assert metric_mean(metrics, "reward/mean", first=True, k=2) == 1.5
    assert metric_mean(metrics, "reward/mean") == 2.0
    assert math.isnan(metric_mean(metrics, "entropy"))


def test_seeded_overrides_and_run_names():
    spec = RunSpec("seeds_ratio", "mini_seeds_ratio", "Ours_ratio",
                   seeded("ratio", 0.5, "state+action", lambda b: b["T"]))
    assert spec.extra({"T": 8}) == {"seed_rule": "ratio", "seed_ratio": 0.5, "seed_loss": "state+action",
                                    "seed_refresh_interval": 8}
    assert RunSpec("onpolicy", "mini_onpolicy", "On-policy").extra({"T": 8}) == {}
    assert (run_name(spec, 0), run_name(spec, 2)) == ("seeds_ratio", "seeds_ratio-seed2")
