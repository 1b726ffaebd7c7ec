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
from trainer.plan import (CARD_BYTES, CUDA_OVERHEAD_GB, GB, PLANNED_GPUS, SHAPES, disk_plan, lora_params, memory_plan,
                          model_shapes, params, plan_lines, shapes_from_config, step_time, terms, update_seconds,
                          verl_step_time)
from trainer.train import main as train_main

REPO = Path(__file__).resolve().parents[2]
PRESET = str(REPO / "trainer" / "configs" / "qwen25math7b_seeds_ratio.yaml")
# the one-GPU LoRA presets, two per backbone: rank 32 on the seven projections (A adapter parameters, by hand in
# test_the_adapter_of_each_lora_preset_by_hand), the engine share the plan derives, the planned update and generation
# peaks (GB), where the update peaks, and the update peak the full preset's share would give (the engine awake)
LORA_PLANS = {   # backbone: (A, share, update peak, generation peak, at, update peak at the full preset's share)
    "qwen25math7b": (80_740_352, 0.5, 75.8, 65.9, "last layer", 84.3),
    "r1distill15b": (36_929_536, 0.7, 73.0, 70.2, "LM head", 77.3),
    "qwen3_4b_code": (66_060_288, 0.6, 73.6, 66.8, "last layer", 82.2),
}
LORA_PRESETS = [str(REPO / "trainer" / "configs" / f"{b}_{m}_lora.yaml") for b, methods in
                [("qwen25math7b", ("onpolicy", "seeds_ratio")), ("r1distill15b", ("onpolicy", "seeds_ratio")),
                 ("qwen3_4b_code", ("onpolicy", "seeds_state_action"))] for m in methods]


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


# ------------------------------------------------------------------------------------------------------------ LoRA
def test_the_lora_terms_at_7b_by_hand():
    """Rank 32 on the seven projections of the 7B: r x (d_in + d_out) per projection, 28 layers; the frozen base held
    once in bf16 (2 B/param), fp32 weights, gradients and AdamW's two moments (16 B) for the adapter alone."""
    s = SHAPES["Qwen/Qwen2.5-Math-7B"]
    h, q, kv, m = 3584, 28 * 128, 4 * 128, 18944
    per_layer = 32 * ((h + q) + (h + kv) + (h + kv) + (q + h) + (h + m) + (h + m) + (m + h))
    A = 28 * per_layer
    assert A == lora_params(s, 32, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert A == 80_740_352 and lora_params(s, 32, ["q_proj", "lm_head"]) == 28 * 32 * (h + q)   # lm_head: no shape
    P = params(s)
    t, full = terms(s, tokens=32768, ranks=1, lora=A), terms(s, tokens=32768)
    assert t["base"] == pytest.approx(2 * P / GB) and round(t["base"], 1) == 15.2
    assert t["adapter_state"] == pytest.approx(16 * A / GB) and round(t["adapter_state"], 2) == 1.29
    assert t["state"] == pytest.approx((2 * P + 16 * A) / GB)    # against the full run's 16 P / 8 ranks = 15.2
    # one process: nothing all-gathered; the frozen head has no gradient; a layer's adapter gradient in bf16
    assert t["root_unsharded"] == t["layers_in_flight"] == t["head_grad"] == t["head_grad_fp32"] == 0.0
    assert t["layer_grads"] == pytest.approx(2 * per_layer / GB)
    # the activations are a full run's
    for k in ("boundaries", "final_norm", "layer_recompute", "logit_chunk"):
        assert t[k] == full[k]
    # the frozen base's weight gradients are not computed: 6 P per token in the update instead of 8 P
    args = (s, 32, 8, 512.0, 3072)
    tokens = 32 * (512 + 8 * 1536)                              # each prompt once, every response token
    assert update_seconds(*args) - update_seconds(*args, frozen_base=True) == \
        pytest.approx(2 * P * tokens / (8 * 989e12 * 0.40))     # 8 H100s at 40 % MFU


@pytest.mark.parametrize("backbone,h,q,kv,m,layers", [("qwen25math7b", 3584, 28 * 128, 4 * 128, 18944, 28),
                                                      ("r1distill15b", 1536, 12 * 128, 2 * 128, 8960, 28),
                                                      ("qwen3_4b_code", 2560, 32 * 128, 8 * 128, 9728, 36)])
def test_the_adapter_of_each_lora_preset_by_hand(backbone, h, q, kv, m, layers):
    """r x (d_in + d_out) per projection at rank 32, from the published shapes of each backbone."""
    cfg = load_config(next(p for p in LORA_PRESETS if Path(p).name.startswith(backbone + "_")), [])
    per_layer = 32 * ((h + q) + (h + kv) + (h + kv) + (q + h) + (h + m) + (h + m) + (m + h))
    assert lora_params(SHAPES[cfg.model], cfg.lora_rank, cfg.lora_targets) == layers * per_layer \
        == LORA_PLANS[backbone][0]


@pytest.mark.parametrize("preset", LORA_PRESETS, ids=lambda p: Path(p).stem)
def test_the_lora_presets_fit_one_80gb_card(preset):
    """The one-GPU LoRA presets: both phases under 80 GB (the engine awake through the update: its share is held
    there too), the update phase's peak by hand, the method fields those of the full preset."""
    cfg = load_config(preset, [])
    full = load_config(preset.replace("_lora.yaml", ".yaml"), [])
    A, util, update, generation, at, at_full_share = next(v for b, v in LORA_PLANS.items()
                                                          if Path(preset).name.startswith(b + "_"))
    s = SHAPES[cfg.model]
    m = memory_plan(cfg, s)
    assert (m["gpus"], m["lora_params"], m["engine_awake_in_update"], cfg.lora_rank) == (1, A, True, 32)
    assert cfg.lora_targets == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert m["update_peak"] < 80 and m["generation"] < 80 and m["sleep_off"] < 80
    t = m["terms"]
    share = util * CARD_BYTES / GB
    assert m["util"] == m["derived_util"] == util
    assert m["update_peak_at"] == at
    # one process, the engine awake: no all-gather, no head gradient; the share in place of the asleep engine
    at_layer = t["state"] + t["boundaries"] + t["layer_recompute"] + t["layer_grads"] + CUDA_OVERHEAD_GB + share
    at_head = t["state"] + t["boundaries"] + t["final_norm"] + t["logit_chunk"] + CUDA_OVERHEAD_GB + share
    assert m["update_peak"] == pytest.approx(max(at_layer, at_head))
    assert (at_layer > at_head) == (at == "last layer")
    assert (round(m["update_peak"], 1), round(m["generation"], 1)) == (update, generation)
    assert cfg.lr == pytest.approx(10 * full.lr)
    differ = {"lora_rank", "lr", "vllm_gpu_memory_utilization", "run_name"}
    assert {k: v for k, v in vars(cfg).items() if k not in differ} == \
        {k: v for k, v in vars(full).items() if k not in differ}
    assert cfg.run_name == full.run_name + "_lora" and full.lora_rank == 0
    # the full preset's share would leave less than the headroom of the card in the awake update phase
    over = memory_plan(load_config(preset, [f"vllm_gpu_memory_utilization={full.vllm_gpu_memory_utilization}"]), s)
    assert full.vllm_gpu_memory_utilization > util and round(over["update_peak"], 1) == at_full_share


def test_the_lora_memory_table_is_the_plans():
    """docs/lora.md's per-backbone LoRA table: each cell the plan's number for that backbone's presets."""
    page = (REPO / "docs" / "lora.md").read_text().splitlines()
    page = page[next(i for i, x in enumerate(page) if x.startswith("| per GPU, LoRA rank 32, 1 × 80 GB |")):]
    row = lambda name: next(x for x in page if x.startswith(f"| {name} |")).rstrip(" |").split(" | ")[1:]
    for col, backbone in enumerate(LORA_PLANS):
        cfg = load_config(next(p for p in LORA_PRESETS if Path(p).name.startswith(backbone + "_")), [])
        m = memory_plan(cfg, SHAPES[cfg.model])
        A, P = m["lora_params"], m["params"]
        assert row("trainable parameters A")[col] == f"{A:,} ({100 * A / P:.2f} % of {P / 1e9:.2f} B)"
        assert row("engine share, derived (the full preset's)")[col].startswith(
            f"{m['util']:g} = {m['share']:.1f} GB")
        assert row("KV cache")[col].startswith(f"{m['kv_gb']:.1f} GB ≈ {m['kv_sequences']:.0f} × "
                                               f"{m['max_model_len']:,}")
        assert row("**update phase peak** (engine awake)")[col].startswith(
            f"**{m['update_peak']:.1f} GB** (at the {m['update_peak_at']})")
        assert row("**generation phase peak**")[col].startswith(f"**{m['generation']:.1f} GB**")
        assert row("weights + trainer state (base bf16 + adapter 16 B × A)")[col].startswith(
            f"{m['terms']['state']:.1f} GB")


def test_lora_rank_0_leaves_the_full_plan_unchanged():
    cfg = load_config(PRESET, [])
    s = SHAPES[cfg.model]
    m = memory_plan(cfg, s)
    assert (m["gpus"], m["lora_params"], m["engine_awake_in_update"]) == (PLANNED_GPUS, 0, False)
    assert terms(s, tokens=32768, lora=0) == terms(s, tokens=32768)
    assert m["terms"]["state"] == pytest.approx(16 * params(s) / 8 / GB)
    assert (round(m["update_peak"], 1), round(m["generation"], 1), m["derived_util"]) == (38.3, 75.9, 0.6)
    assert m["sleep_off"] == pytest.approx(m["update_peak"] - 1.0 + m["share"])
    # the targets alone (lora_rank 0) change nothing
    assert memory_plan(load_config(PRESET, ["lora_targets=[q_proj]"]), s) == m
    assert disk_plan(cfg, 1000, lora=0) == disk_plan(cfg, 1000)
    assert step_time(cfg, s) == step_time(load_config(PRESET, ["lora_targets=[q_proj]"]), s)
    assert not any("LoRA" in x for x in plan_lines(cfg))


def test_lora_disk_by_hand():
    cfg = load_config(LORA_PRESETS[1], [])
    d = disk_plan(cfg, 1000, lora=10)
    assert (d["export"], d["state"]) == (40, 120)          # the adapter in fp32; it and two moments
    merged = disk_plan(load_config(LORA_PRESETS[1], ["export_merged=true"]), 1000, lora=10)
    assert merged["export"] == 40 + 2000                   # + merged/: the base in bf16


def test_the_dry_run_of_a_lora_preset_prints_its_plan(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert train_main(["--config", LORA_PRESETS[1], "--dry-run"]) == 0
    block = "\n".join(_plan_block(capsys.readouterr().err))
    cfg = load_config(LORA_PRESETS[1], [])
    s = SHAPES[cfg.model]
    t = step_time(cfg, s, gpus=1)
    assert "planned for 1 x 80 GB (one process" in block and "prompts_per_step=32 divides 1: 32 groups per rank" in block
    assert "LoRA rank 32 on q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj: 80,740,352 trainable" in block
    assert "frozen base in bf16 15.2 GB, adapter fp32 weights + gradients + AdamW moments 1.29 GB" in block
    assert "update phase (engine awake: a LoRA engine does not sleep): 75.8 of 85.5 GB at the last layer" in block
    assert "generation phase (engine awake): 65.9 of 85.5 GB (engine share 0.5 = 42.8 GB" in block
    assert "WARNING" not in block and "the plan derives" not in block
    assert "on 1 x H100" in block and f"{t.total_s:.0f} s = generation {t.generation_s:.0f}" in block
    A = 80_740_352
    assert f"disk: {16 * A / GB:.2f} GB per checkpoint (adapter {4 * A / GB:.2f} + trainer_state {12 * A / GB:.2f})" \
        in block
