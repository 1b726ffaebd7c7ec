"""Config validation: bad configs fail with a message naming the field, before any model is built."""

import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config import ConfigError, load_config, validate

REPO = Path(__file__).resolve().parents[2]
PRESETS = sorted((REPO / "trainer" / "configs").glob("*.yaml"))


def test_overrides_are_typed():
    cfg = load_config(None, ["total_steps=7", "lr=3e-4", "dynamic_sampling=false", "clip_ratio_c=3", "task_kwargs={max_digits: 4}"])
    assert (cfg.total_steps, cfg.lr, cfg.dynamic_sampling, cfg.clip_ratio_c) == (7, 3e-4, False, 3.0)
    assert cfg.task_kwargs == {"max_digits": 4}


@pytest.mark.parametrize("override, needle", [
    (["total_stpes=3"], "unknown config key(s) 'total_stpes' (did you mean 'total_steps'?)"),
    (["total_steps=abc"], "config field 'total_steps' expects int, got 'abc'"),
    (["lr=fast"], "config field 'lr' expects float"),
    (["prompts_per_step=10", "mini_batches_per_step=4"], "prompts_per_step=10 is not divisible by mini_batches_per_step=4"),
    (["samples_per_prompt=1"], "samples_per_prompt must be >= 2"),
    (["algorithm=ppo"],
     "config field 'algorithm' must be one of dapo, seeds, luffy, m2po, clip_cov, kl_cov; got 'ppo'"),
    (["algorithm=seeds", "seed_rule=middle"], "config field 'seed_rule' must be one of ratio, entropy"),
    (["algorithm=luffy", "luffy_off_policy_per_group=8"], "luffy_off_policy_per_group must be in [1, samples_per_prompt)"),
    (["model=tiny:3m"], "tiny sizes are"),
    (["train_forward=packed"], "config field 'train_forward' must be one of auto, flat, model; got 'packed'"),
    (["rollout_batch_size=0"], "rollout_batch_size must be >= 1, got 0"),
    (["sft_steps=10", "sft_stop_loss=-0.1"], "sft_stop_loss must be >= 0 (0: no early stop), got -0.1"),
    (["clip_ratio_c=1"], "clip_ratio_c (the dual clip) must be 0 (off) or > 1"),
    (["clip_ratio_c=0.5"], "clip_ratio_c (the dual clip) must be 0 (off) or > 1"),
    (["algorithm=m2po", "m2po_variant=authors"], "config field 'm2po_variant' must be one of paper, released"),
    (["algorithm=seeds", "seed_rule=adaptive", "seed_adaptive_discount=0"], "seed_adaptive_discount must lie in (0, 1]"),
    (["algorithm=seeds", "seed_adaptive_discount=1.5"], "seed_adaptive_discount must lie in (0, 1]"),
    (["seed_prefix_sft_coef=0.1"], "seed_prefix_sft_coef=0.1 trains the reference trace's prefix"),
    (["algorithm=seeds", "seed_source=external", "seed_loss=state", "seed_prefix_sft_coef=-1"],
     "seed_prefix_sft_coef must be >= 0"),
    (["task=countdown", "task_kwargs={min_digits: 1}"],   # another task's difficulty: one line, not a TypeError
     "task_kwargs: min_digits is not a difficulty of task=countdown; it takes min_numbers, max_numbers, min_number, "
     "max_number, min_target, max_target"),
])
def test_bad_configs_name_the_field(override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, override)
    assert needle in str(err.value)


def test_the_baselines_defaults_and_what_the_paper_presets_set():
    """The dual clip is on by default at verl's DAPO recipe's 10 and every paper preset says so; M2PO's presets run the
    paper's variant; the adaptive cut forgets at 0.9 per step; the prefix SFT term is off."""
    cfg = load_config(None, [])
    assert (cfg.clip_ratio_c, cfg.m2po_variant, cfg.seed_adaptive_discount, cfg.seed_prefix_sft_coef) == \
        (10.0, "paper", 0.9, 0.0)
    assert load_config(None, ["clip_ratio_c=0"]).clip_ratio_c == 0.0
    for preset in PAPER_PRESETS:
        assert "clip_ratio_c: 10.0" in preset.read_text(), preset.stem
        c = load_config(preset)
        assert c.clip_ratio_c == 10.0
        if c.algorithm == "m2po":
            assert c.m2po_variant == "paper" and "m2po_variant: paper" in preset.read_text()


def test_world_size_division():
    cfg = load_config(None, ["prompts_per_step=6"])
    validate(cfg, world_size=2)
    with pytest.raises(ConfigError, match="not divisible by the world size 4"):
        validate(cfg, world_size=4)


def test_bad_yaml_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="flat mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


@pytest.mark.slow
def test_cli_fails_before_building_a_model(tmp_path):
    # An unknown key exits with status 2 and a clear message; no run directory is created.
    res = subprocess.run([sys.executable, "-m", "trainer.train", f"output_dir={tmp_path}", "bogus_key=1"],
                         capture_output=True, text=True, cwd=REPO)
    assert res.returncode == 2
    assert "unknown config key(s) 'bogus_key'" in res.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_presets_validate(preset):
    cfg = load_config(preset)
    validate(cfg)


@pytest.mark.parametrize("preset", ["qwen25math7b_seeds_ratio", "r1distill15b_luffy", "qwen3_4b_code_seeds_state",
                                    "mini_m2po"])
def test_dry_run_builds_nothing(preset, capsys):
    from trainer.train import main
    assert main(["--config", str(REPO / "trainer" / "configs" / f"{preset}.yaml"), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert "config OK" in err


PAPER_PRESETS = [p for p in PRESETS if not p.stem.startswith(("mini_", "tiny"))]


@pytest.mark.parametrize("preset", PAPER_PRESETS, ids=lambda p: p.stem)
def test_paper_presets_cut_micro_batches_by_tokens_not_rows(preset):
    """``micro_batch_tokens`` is the update's memory bound (activations grow with it, docs/gpu_memory.md);
    ``micro_batch_size`` only caps rows. At the preset's longest rows, and at rows a quarter as long, the token
    budget cuts the micro-batch before the row cap does, in both forwards: once ``micro_batch_size: 8`` (math) held
    a micro-batch of 1k-token rows to 8k of its 32k tokens, and the code presets' 2 rows to 9k."""
    from inference.batching import micro_batches
    cfg = load_config(preset)
    G = cfg.samples_per_prompt
    for frac in (1, 4):
        p, r = cfg.max_prompt_tokens // frac, cfg.max_response_tokens // frac
        shapes = [(p, r)] * (cfg.prompts_per_step * G)
        padded, _ = micro_batches(shapes, rows=cfg.micro_batch_size, tokens=cfg.micro_batch_tokens)
        flat, _ = micro_batches(shapes, rows=cfg.micro_batch_size, tokens=cfg.micro_batch_tokens,
                                prompt_keys=[k // G for k in range(len(shapes))])
        for split in (padded, flat):
            assert len(split[0]) < cfg.micro_batch_size, (frac, len(split[0]))
        assert len(padded[0]) == cfg.micro_batch_tokens // (p + r)   # rows x (prompt + response) <= the budget
