"""What ``--dry-run`` says a run will cost (trainer/plan.py): the GPUs it was planned for, the memory plan of that very
preset by phase, disk per checkpoint and per run, the downloads, and the step-time estimate, each number the one the
pages' tables render, and a hub id's shapes read from its cached config.json."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.config import load_config
from trainer.plan import (GB, SHAPES, disk_plan, memory_plan, model_shapes, params, plan_lines, shapes_from_config,
                          step_time, verl_step_time)
from trainer.train import main as train_main

REPO = Path(__file__).resolve().parents[2]
PRESET = str(REPO / "trainer" / "configs" / "qwen25math7b_seeds_ratio.yaml")


def _plan_block(err: str) -> list[str]:
    lines = err.splitlines()
    start = lines.index("plan (trainer/plan.py: arithmetic, not measurements):")
    return lines[start + 1:lines.index(next(x for x in lines[start:] if x.startswith("config ")))]


def test_the_dry_run_of_a_paper_preset_prints_its_own_plan(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert train_main(["--config", PRESET, "--dry-run"]) == 0
    block = "\n".join(_plan_block(capsys.readouterr().err))
    cfg = load_config(PRESET, [])
    s = SHAPES["Qwen/Qwen2.5-Math-7B"]
    m, t = memory_plan(cfg, s), step_time(cfg, s)
    assert "planned for 8 x 80 GB on one node" in block and "prompts_per_step=32 divides 8: 4 groups per rank" in block
    # this preset's own memory plan: the 7B update peak at the last layer, the generation phase with its 0.6 share
    assert f"update phase (engine asleep): {m['update_peak']:.1f} of 85.5 GB at the last layer" in block
    assert round(m["update_peak"], 1) == 38.3 and round(m["generation"], 1) == 75.9
    assert f"generation phase (engine awake): 75.9 of 85.5 GB (engine share 0.6 = 51.3 GB" in block
    # the step-time model's estimate, said to be one, with the run's length
    assert "ESTIMATE" in block and "not measured" in block
    assert f"{t.total_s:.0f} s = generation {t.generation_s:.0f}" in block and "500 steps ~ 6.3 h" in block
    assert f"verl's DAPO recipe at the same settings: {verl_step_time(cfg, s).total_s:.0f} s/step" in block
    # disk: the bf16 export (2 B per parameter) and fp32 weights + two moments (12 B); every save kept
    P = params(s)
    assert f"{14 * P / GB:.1f} GB per checkpoint (export {2 * P / GB:.1f} + trainer_state {12 * P / GB:.1f})" in block
    assert "25 saves" in block and f"at most {(25 * 2 * P + 3 * 12 * P) / GB:.1f} GB for the run" in block
    # downloads, offline: the model's size from its parameter count, the data's unknown
    assert f"downloads about {2 * P / GB:.1f} GB (bf16 safetensors of 7.62 B parameters)" in block
    assert "its size is unknown offline" in block


def test_a_batch_the_planned_gpus_do_not_divide_is_said(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert train_main(["--config", PRESET, "--dry-run", "prompts_per_step=20"]) == 0
    assert "prompts_per_step=20 does NOT divide 8: use a multiple of 8" in capsys.readouterr().err


def test_a_phase_over_the_card_is_a_warning():
    cfg = load_config(PRESET, ["micro_batch_tokens=400000"])
    lines = plan_lines(cfg)
    assert memory_plan(cfg, SHAPES[cfg.model])["update_peak"] > 85.5
    assert any("WARNING: a phase exceeds the card" in x for x in lines)


@pytest.mark.parametrize("keep,keep_resume,save_every,kept,states", [(0, 2, 20, 25, 3), (3, 2, 20, 4, 3),
                                                                     (3, 1, 0, 1, 1), (2, 5, 100, 3, 5)])
def test_disk_by_hand(keep, keep_resume, save_every, kept, states):
    cfg = load_config(PRESET, [f"keep_checkpoints={keep}", f"keep_resume_states={keep_resume}",
                               f"save_every={save_every}"])
    d = disk_plan(cfg, 1000)
    assert (d["export"], d["state"], d["kept"]) == (2000, 12000, kept)
    assert d["run"] == kept * 2000 + states * 12000
    assert disk_plan(load_config(PRESET, ["master_dtype=bfloat16"]), 1000)["state"] == 6000   # pure bf16 state


def test_the_shapes_of_a_config_json_are_the_published_ones():
    """The 7B's config.json as the hub serves it gives the shape the plan was written with (qkv bias from qwen2)."""
    c = {"model_type": "qwen2", "num_hidden_layers": 28, "hidden_size": 3584, "intermediate_size": 18944,
         "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False}
    assert shapes_from_config(c) == {**SHAPES["Qwen/Qwen2.5-Math-7B"], "qk_norm": False}
    q3 = {"model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 2560, "intermediate_size": 9728,
          "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
          "tie_word_embeddings": True, "attention_bias": False}
    assert params(shapes_from_config(q3)) == 4_022_468_096


@pytest.mark.slow
def test_a_hub_id_in_the_cache_is_planned_from_its_config_json(tmp_path):
    """A model outside the paper's three, in the local hub cache: the dry run reads its config.json (nothing is
    downloaded, HF_HUB_OFFLINE=1) and says it is cached, with the snapshot's size."""
    shape = {"model_type": "qwen2", "num_hidden_layers": 4, "hidden_size": 1024, "intermediate_size": 2816,
             "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 32000, "tie_word_embeddings": False}
    snap = tmp_path / "hf" / "hub" / "models--org--small" / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps(shape))
    (snap / "model.safetensors").write_bytes(b"\0" * 5_000_000)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("a" * 40)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-m", "trainer.train", "--config", PRESET, "--dry-run", "model=org/small"],
                         cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    block = "\n".join(_plan_block(res.stderr))
    P = params(shapes_from_config(shape))
    assert f"shapes from {snap}/config.json, {P / 1e9:.2f} B parameters" in block
    assert f"model: org/small is cached (0.01 GB of snapshot {'a' * 40}); nothing to download" in block


def test_shapes_not_known_say_why(tmp_path):
    assert model_shapes("tiny:2m") == (None, "a tiny model built locally")
    (tmp_path / "config.json").write_text("{}")
    s, why = model_shapes(str(tmp_path))
    assert s is None and "has no decoder shape the plan reads" in why


def test_online_sizes_come_from_the_hubs_file_metadata(monkeypatch):
    import huggingface_hub
    import inference.hub
    from trainer import plan

    class Info:
        siblings = [type("F", (), {"size": 3_000_000_000})(), type("F", (), {"size": 1_000})()]

    class Api:
        def model_info(self, repo_id, files_metadata, timeout):
            assert files_metadata and repo_id == "Qwen/Qwen2.5-Math-7B"
            return Info()

    monkeypatch.setattr(inference.hub, "offline", lambda: False)
    monkeypatch.setattr(inference.hub, "hub_reachable", lambda: True)
    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    assert plan.hub_size("Qwen/Qwen2.5-Math-7B") == 3_000_001_000
    monkeypatch.setattr(inference.hub, "hub_reachable", lambda: False)
    assert plan.hub_size("Qwen/Qwen2.5-Math-7B") is None
