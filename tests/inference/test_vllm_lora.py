"""LoRA with the vLLM engine (real vLLM CPU engine, in subprocesses: tests/helpers/vllm_lora_worker.py): the engine runs
with ``enable_lora`` over the frozen base, sent once; every later sync sends the adapter alone, as a new
``LoRARequest``, and reads it back from the engine's slot bit for bit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]
REPO = HERE.parent
RANK = 4
# the tiny (1m) Llama: 4 layers, hidden 128, MLP 512; rank 4 on the seven projections (lora_A: r x in, lora_B: out x r)
ADAPTER_NUMEL = 4 * RANK * (4 * (128 + 128) + 2 * (128 + 512) + (512 + 128))   # 47,104 (docs/lora.md)


def _scenario(name: str, tmp_path: Path, policy: Path, timeout: int = 900) -> dict:
    res = subprocess.run([sys.executable, str(HERE / "helpers" / "vllm_lora_worker.py"), name, str(tmp_path),
                          str(policy)], capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads((tmp_path / "result.json").read_text())


@pytest.mark.slow
def test_the_adapter_alone_is_synced_and_the_engine_follows_it(tmp_path, sft_policy_dir):
    r = _scenario("sync", tmp_path, sft_policy_dir)
    assert r["lora_kwargs"] == {"max_lora_rank": 8, "max_loras": 1}   # rank 4 -> vLLM's smallest rank above
    assert r["adapter"]["numel"] == ADAPTER_NUMEL and r["adapter"]["tensors"] == 56
    # the first sync: the base once (its 38 tensors, every one read back) and the adapter (56 tensors, read back)
    first = r["first"]
    assert first["lora_int_id"] == 1 and first["base_bytes"] == 4 * r["adapter"]["base_numel"]
    assert first["tensors"] == 38 + 56 and first["tensors_checked"] == 38 + 56
    # fp32 engine and trainer: log-probs equal to fp32 noise (the probe's random tokens sit at -10 to -20 nats,
    # where that noise reaches ~2e-5)
    assert first["probe_logp_diff_max"] < 1e-4 and r["first_diff"] < 1e-4
    # an optimizer step on the adapters moved the policy; the sync sends the adapter alone, under a new id
    assert r["stale_diff"] > 0.1, r["stale_diff"]
    upd = r["update"]
    assert upd["lora_int_id"] == 2 and upd["base_bytes"] == 0 and upd["tensors"] == 56
    assert upd["bytes"] == upd["adapter_bytes"] == 4 * ADAPTER_NUMEL   # fp32 engine: 4 bytes per element
    assert upd["bytes"] <= upd["adapter_file_bytes"] <= 1.05 * upd["bytes"]   # the file: the tensors + a header
    assert upd["bytes"] < 0.05 * first["base_bytes"]
    assert upd["adapter_checked"] == upd["tensors_checked"] == 56 and upd["probe_logp_diff_max"] < 1e-4
    assert r["synced_diff"] < 1e-4, r["synced_diff"]   # the engine samples what the trainer scores
    # the tokens sampled before the steps, scored by the engine after the sync: moved as far as the trainer's did,
    # onto the trainer's log-probs (a stale adapter would leave them where they were)
    assert r["engine_moved"] > 0.1 and r["rescored_diff"] < 1e-4, (r["engine_moved"], r["rescored_diff"])
    # the old adapter is gone from the engine and from disk: one adapter, one folder
    assert r["loras"] == [2] and r["folders"] == ["sync_2"]
    assert r["clean_check"] is None
    # the exact check: one element of the up_proj slice of a fused gate_up slot, named
    assert r["corrupted"] is not None and "model.layers.1.mlp.up_proj.lora_B.weight" in r["corrupted"]
    assert "gate_up_proj slot 0, slice 1" in r["corrupted"] and "1 of" in r["corrupted"]
    assert r["after_repair"] is None
    # an adapter loaded under an id the engine holds is not read (vLLM's cache): the check catches the stale copy
    assert r["same_id"] is not None and "lora_B.weight reads back" in r["same_id"]
    assert r["next"]["lora_int_id"] == 3 and r["loras_after"] == [3]
    assert r["lora_dir_removed"]


@pytest.mark.slow
def test_a_lora_run_with_vllm_trains_and_passes_the_rollout_check(tmp_path, sft_policy_dir):
    r = _scenario("train", tmp_path, sft_policy_dir)
    assert r["steps"] == 3 and r["engine_dtype"] == "float32"
    assert r["reward"][0] > 0.2   # the warmed policy: groups with signal, so updates happen
    # the constructor's sync sends the base and the adapter; each step's sync the adapter alone, under a new id
    assert r["first"]["base_bytes"] > 0 and r["first"]["lora_int_id"] == 1
    assert [u["lora_int_id"] for u in r["updates"]] == [2, 3, 4]
    assert all(u["base_bytes"] == 0 and u["bytes"] == 4 * ADAPTER_NUMEL for u in r["updates"])
    assert r["sync_bytes"] == [4 * ADAPTER_NUMEL] * 3 and r["adapter_numel"] == ADAPTER_NUMEL
    assert all(s is not None and s > 0 for s in r["sync_seconds"])
    assert r["tensors_checked"] == [56] * 3   # every adapter tensor read back at every sync
    assert r["loras"] == [[2], [3], [4]] and r["folders"] == [["sync_2"], ["sync_3"], ["sync_4"]]
    # the adapters moved between syncs (lr 1e-2), and each step the engine sampled what the trainer scored
    # adapters: at the engine's start, then after each step's sync; step i's update shows in sync i + 1
    moved = [r["adapter_moved"][i + 1] for i, g in enumerate(r["grad_norm"]) if g is not None
             and i + 1 < len(r["adapter_moved"])]
    assert r["adapter_moved"][0] == 0.0 and moved and min(moved) > 1e-3, r["adapter_moved"]
    checked = [(m, x) for m, x, g in zip(r["logp_diff_mean"], r["logp_diff_max"], r["grad_norm"])
               if m is not None and g is not None]
    assert checked and all(m < 1e-3 and x < 1e-2 for m, x in checked), checked
    assert all(g is not None and g < 1e-4 for g in r["gap"]), r["gap"]   # fp32: the probe's gap is noise


@pytest.mark.slow
def test_a_bf16_lora_run_sends_bf16_adapters_and_reads_them_back_exactly(tmp_path, sft_policy_dir):
    """dtype=bfloat16 over fp32 adapters: the adapter moves in the engine's dtype (2 bytes per element) and reads back
    bit for bit (B times alpha / r = 2, folded in bf16 as vLLM folds it). The log-prob gaps are bf16 kernels', the
    base's alone already at the start (B = 0: the adapter adds nothing there), as in a full bf16 run
    (test_vllm_sync.py): measured 0.06-0.10 at the probe, rollout/logp_diff_mean 3e-5-9e-4."""
    r = _scenario("train_bf16", tmp_path, sft_policy_dir)
    assert r["steps"] == 3 and r["engine_dtype"] == "bfloat16"
    assert r["first"]["base_bytes"] == r["first"]["bytes"] - 2 * ADAPTER_NUMEL   # base in bf16, once
    assert r["sync_bytes"] == [2 * ADAPTER_NUMEL] * 3 and r["tensors_checked"] == [56] * 3
    assert [u["lora_int_id"] for u in r["updates"]] == [2, 3, 4] and r["loras"] == [[2], [3], [4]]
    assert r["first"]["probe_logp_diff_max"] > 1e-3   # bf16 kernels, with an adapter that adds nothing yet
    checked = [m for m, g in zip(r["logp_diff_mean"], r["grad_norm"]) if m is not None and g is not None]
    assert checked and all(m < 1e-2 for m in checked), checked


def test_the_engine_rank_and_the_adapter_tensors_as_peft_writes_them():
    """vLLM takes max_lora_rank from a fixed set: the smallest that holds the rank. The tensors the engine is sent
    are those ``trainer.lora.write_adapter`` writes (PEFT's keys, ``PeftModel.from_pretrained`` reads them), cast."""
    import torch

    from inference.tiny import build_model, build_tokenizer
    from inference.vllm_engine import adapter_tensors, engine_lora_rank, lora_config
    from trainer.config import load_config
    from trainer.lora import add_adapters, adapter_state

    assert [engine_lora_rank(r) for r in (1, 2, 4, 8, 9, 16, 64, 300, 512)] == [1, 8, 8, 8, 16, 16, 64, 320, 512]
    with pytest.raises(ValueError, match="up to rank 512"):
        engine_lora_rank(513)
    tok = build_tokenizer()
    plain = build_model("1m", tok, seed=0)
    assert lora_config(plain) is None
    model = add_adapters(build_model("1m", tok, seed=0), load_config(None, [f"lora_rank={RANK}"]),
                         compute=torch.bfloat16, master=torch.float32, base=None)
    assert lora_config(model).r == RANK
    ours, theirs = adapter_tensors(model), adapter_state(model)
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert sum(t.numel() for t in ours.values()) == ADAPTER_NUMEL
    cast = adapter_tensors(model, torch.bfloat16)
    assert {t.dtype for t in cast.values()} == {torch.bfloat16}
    assert all(torch.equal(cast[k], theirs[k].to(torch.bfloat16)) for k in cast)
