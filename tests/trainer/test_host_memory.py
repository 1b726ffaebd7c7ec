"""Host memory on several ranks, measured: start-up reads each rank's shard only, and the HF engine's copy is synced
one tensor at a time (torchrun, 2 ranks, gloo; tests/helpers/host_memory_worker.py does the measuring).

The model is a 63M-parameter Llama saved in fp32 (254 MB): a full copy per rank, as ``from_pretrained`` on every
rank made one, is visible in each rank's peak resident set above what it held before (VmHWM), and so is a full
state dict per rank in the engine sync.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO

WORKER = REPO / "tests" / "helpers" / "host_memory_worker.py"
MB = 2**20


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def policies(tmp_path_factory) -> dict:
    """A 63M Llama in fp32 (untied head: 14 layers, hidden 512, MLP 2048, vocabulary 8192; its largest tensor is
    a 16 MB embedding, so one tensor in flight and a whole model are far apart) and a tiny tied one."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from inference.tiny import build_model, build_tokenizer
    root = tmp_path_factory.mktemp("host_memory")
    tok = build_tokenizer()
    cfg = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=2048, num_hidden_layers=14,
                      num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        big = LlamaForCausalLM(cfg)
    big.save_pretrained(root / "big")
    tok.save_pretrained(root / "big")
    n_params = sum(p.numel() for p in big.parameters())
    del big
    tied = build_model("1m", tok, seed=3)
    assert tied.config.tie_word_embeddings
    tied.save_pretrained(root / "tied")
    tok.save_pretrained(root / "tied")
    return {"root": root, "big": root / "big", "tied": root / "tied", "params": n_params}


def _run(policies, mode: str) -> list[dict]:
    out = policies["root"] / mode
    # every allocation above 128 kB is its own mapping, returned when freed: the resident set follows the live
    # tensors instead of what glibc's heap keeps cached (without it the same sync reads 20-33 MB run to run)
    env = dict(os.environ, PYTHONPATH=f"{REPO}", OMP_NUM_THREADS="1",
               MALLOC_MMAP_THRESHOLD_="131072")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(free_port()), str(WORKER), str(out), mode, str(policies["big"]), str(policies["tied"])],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return [json.loads(Path(f"{out}.rank{r}").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def sharded(policies) -> list[dict]:
    return _run(policies, "sharded")


@pytest.mark.slow
def test_start_up_reads_each_ranks_shard_only(policies, sharded):
    """``load_for_training`` on 2 ranks: the non-zero rank's peak stays near its half of the fp32 model (one
    tensor's slice above it), where loading the whole model on every rank, as before, peaks above a full copy. The
    worker also checked every shard, gathered tensor and buffer against ``from_pretrained``, bit for bit, and the
    tie of the tiny model."""
    full_bytes = 4 * policies["params"]
    assert sharded[1]["model_bytes"] == full_bytes
    before = _run(policies, "full")
    for r in (0, 1):
        assert sharded[r]["check"] == {"params": 129, "buffers": 2, "tied": False}
        assert sharded[r]["tied_check"]["tied"] is True
    peak, old = sharded[1]["start_up_peak_bytes"], before[1]["start_up_peak_bytes"]
    print(f"rank 1 start-up peak: {peak / MB:.0f} MB sharded, {old / MB:.0f} MB loading the whole model "
          f"(full fp32 copy {full_bytes / MB:.0f} MB, a shard {full_bytes / 2 / MB:.0f} MB)")
    assert old >= full_bytes, "the whole-model load should show a full copy: the measurement is broken"
    assert peak < 0.75 * full_bytes, f"start-up peaked at {peak / MB:.0f} MB, a full copy is {full_bytes / MB:.0f} MB"
    assert sharded[0]["start_up_peak_bytes"] < 0.75 * full_bytes


@pytest.mark.slow
def test_the_hf_engine_copy_is_compute_dtype_and_synced_one_tensor_at_a_time(policies, sharded):
    """The engine copy costs 2 bytes per parameter (bf16; no fp32 deepcopy), holds the masters' full tensors cast
    to bf16 after each sync (checked by the worker, bit for bit, also after the masters moved), and the sync's
    peak is a few of its largest tensor, where a full state dict per rank (the sync it replaced) costs the model."""
    for r in (0, 1):
        res = sharded[r]
        assert res["engine_bytes"] == 2 * policies["params"] and res["engine_params_checked"] == 129
        peak, old, largest = res["sync_peak_bytes"], res["state_dict_sync_peak_bytes"], res["largest_tensor_bytes"]
        print(f"rank {r} sync peak: {peak / MB:.1f} MB streamed, {old / MB:.0f} MB through a full state dict "
              f"(largest tensor {largest / MB:.0f} MB, engine {res['engine_bytes'] / MB:.0f} MB)")
        assert old >= res["engine_bytes"], "a state-dict sync should show a whole model: the measurement is broken"
        assert peak < 4 * largest, f"the sync peaked at {peak / MB:.1f} MB: more than a few tensors in flight"


# ---------------------------------------------------------------------------------------------------------
# the same helpers on one process (no shards): what they read, and the errors bad directories give
# ---------------------------------------------------------------------------------------------------------
def _tiny_dir(tmp_path, **save):
    from inference.tiny import build_model, build_tokenizer
    tok = build_tokenizer()
    model = build_model("1m", tok, seed=5)
    model.save_pretrained(tmp_path, **save)
    tok.save_pretrained(tmp_path)
    return model


def test_a_meta_built_model_filled_by_load_shards_is_from_pretrained_bit_for_bit(tmp_path):
    from trainer.fsdp import Dist, load_shards
    from trainer.policy import build_policy
    want = _tiny_dir(tmp_path)
    model, _ = build_policy(str(tmp_path), dtype=torch.float32, seed=0, meta=True)
    assert all(p.is_meta for p in model.parameters()) and not any(b.is_meta for b in model.buffers())
    load_shards(model, tmp_path, Dist())
    assert model.lm_head.weight is model.model.embed_tokens.weight   # the tie survives to_empty
    got, ref = dict(model.named_parameters()), dict(want.named_parameters())
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
    assert all(torch.equal(b, want.get_buffer(k)) for k, b in model.named_buffers())
    ids = torch.arange(4, 30).unsqueeze(0)
    assert torch.equal(model(ids).logits, want.eval()(ids).logits)


def test_unreadable_weights_are_one_line_errors(tmp_path):
    from inference.hub import ModelSourceError
    from trainer.fsdp import Dist, load_shards
    from trainer.policy import build_policy
    bin_only = _tiny_dir(tmp_path / "bin")   # an old pytorch_model.bin checkpoint: no safetensors to slice
    (tmp_path / "bin" / "model.safetensors").unlink()
    torch.save(bin_only.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    model, _ = build_policy(str(tmp_path / "bin"), dtype=torch.float32, seed=0, meta=True)
    with pytest.raises(ModelSourceError, match="no model.safetensors"):
        load_shards(model, tmp_path / "bin", Dist())
    _tiny_dir(tmp_path / "other")
    from safetensors.torch import load_file, save_file
    files = load_file(tmp_path / "other" / "model.safetensors")
    files["model.embed_tokens.weight"] = files["model.embed_tokens.weight"][:-1]
    save_file(files, tmp_path / "other" / "model.safetensors", metadata={"format": "pt"})
    model, _ = build_policy(str(tmp_path / "other"), dtype=torch.float32, seed=0, meta=True)
    with pytest.raises(ModelSourceError, match="embed_tokens.weight has shape .* config.json and the weights"):
        load_shards(model, tmp_path / "other", Dist())
    files = {k: v.contiguous() for k, v in _tiny_dir(tmp_path / "whole").state_dict().items()
             if k not in ("lm_head.weight", "model.norm.weight")}   # the tied head is not stored either
    save_file(files, tmp_path / "other" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelSourceError, match="no tensor model.norm.weight"):
        load_shards(model, tmp_path / "other", Dist())
