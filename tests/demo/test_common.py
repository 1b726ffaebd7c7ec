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


def test_a_run_written_before_a_field_existed_counts_as_finished_and_a_changed_field_refuses(tmp_path):
    """A run folder whose config.yaml predates the LoRA fields (lora_targets has a default_factory) is the same
    run; one whose recorded value differs from this launch's is refused with the field named."""
    import pytest
    import yaml

    from demo.common import DemoError, run_finished
    from trainer.checkpoint import checkpoint_dir
    from trainer.config import Config, to_dict

    cfg = Config(output_dir=str(tmp_path), run_name="r", total_steps=2)
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True)
    recorded = {k: v for k, v in to_dict(cfg).items() if not k.startswith("lora_")}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(recorded))
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    assert not run_finished(cfg)                      # no final checkpoint yet
    checkpoint_dir(run_dir, 1).mkdir(parents=True)
    assert run_finished(cfg)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({**recorded, "lora_targets": ["q_proj"]}))
    with pytest.raises(DemoError, match=r"other settings \(lora_targets: recorded \['q_proj'\], now \['q_proj', "):
        run_finished(cfg)


def test_a_run_reached_through_a_linked_folder_is_the_same_run(tmp_path):
    """A folder whose runs/, warm-up and data are links to another's (a second page sharing finished runs) finds
    those runs finished; a run of another folder that is no link is still refused."""
    import pytest
    import yaml

    from demo.common import DemoError, run_finished
    from trainer.checkpoint import checkpoint_dir
    from trainer.config import Config, to_dict

    real = tmp_path / "real"
    cfg = Config(output_dir=str(real / "runs"), run_name="r", total_steps=1, model=str(real / "warm"),
                 train_file=str(real / "train.jsonl"))
    (real / "warm").mkdir(parents=True)
    (real / "train.jsonl").write_text("")
    cfg.run_dir.mkdir(parents=True)
    (cfg.run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    (cfg.run_dir / "metrics.jsonl").write_text('{"step": 0}\n')
    checkpoint_dir(cfg.run_dir, 0).mkdir(parents=True)
    other = tmp_path / "other"
    other.mkdir()
    for name in ("runs", "warm", "train.jsonl"):
        (other / name).symlink_to(real / name)
    linked = Config(output_dir=str(other / "runs"), run_name="r", total_steps=1, model=str(other / "warm"),
                    train_file=str(other / "train.jsonl"))
    assert run_finished(linked)
    (tmp_path / "copy").mkdir()
    copied = Config(output_dir=str(other / "runs"), run_name="r", total_steps=1, model=str(tmp_path / "copy"),
                    train_file=str(other / "train.jsonl"))
    with pytest.raises(DemoError, match=r"other settings \(model: recorded '.*real/warm', now '.*copy'\)"):
        run_finished(copied)
