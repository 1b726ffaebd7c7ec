"""torchrun worker for tests/trainer/test_host_memory.py: start-up host memory and the HF engine's weight sync on N ranks.

    torchrun --nproc_per_node 2 tests/helpers/host_memory_worker.py OUT_JSON MODE POLICY_DIR [TIED_POLICY_DIR]

MODE ``sharded`` loads POLICY_DIR as the trainer does (``trainer.policy.load_for_training``: meta device, each rank
its own rows); ``full`` the way it did before (``from_pretrained`` on every rank, then ``shard_model``), to measure
what that costs. Each rank measures the peak of its resident set (VmHWM, reset through ``/proc/self/clear_refs``)
above what it held before the phase, and writes its numbers to OUT_JSON.rank<r>. In ``sharded`` mode the worker
then checks the loaded model against ``from_pretrained`` (every parameter and buffer, bit for bit), builds the HF
engine's compute-dtype copy (``trainer.policy.engine_copy``), syncs it twice (``trainer.fsdp.copy_full_weights``,
the second time after the masters moved) and measures the sync's peak, and the peak of the state-dict sync it
replaced (``get_model_state_dict(full_state_dict=True)`` + ``load_state_dict``). TIED_POLICY_DIR (a model whose
head is tied to its embedding) is loaded and checked the same way, without measuring.
"""

from __future__ import annotations

import ctypes
import gc
import json
import re
import sys

import torch



def _status(key: str) -> int:
    text = open("/proc/self/status").read()
    return int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) * 1024


class Peak:
    """The peak resident set during the block, above the resident set at its start (bytes)."""

    def __enter__(self):
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)   # freed heap goes back, so the start is what is really held
        self.start = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:   # "5": reset VmHWM to the current resident set
            f.write("5")
        return self

    def __exit__(self, *exc):
        self.bytes = _status("VmHWM") - self.start


def _reference(path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def check_against_checkpoint(model, path) -> dict:
    """Every parameter (full tensor) and buffer of the sharded ``model`` equals ``from_pretrained``'s, bit for bit;
    this rank's shard is the checkpoint's rows. Returns counts."""
    from trainer.fsdp import _dim0_rows
    ref = _reference(path)
    ref_params = dict(ref.named_parameters(remove_duplicate=False))
    n = 0
    for name, p in model.named_parameters(remove_duplicate=False):
        want = ref_params[name].detach()
        start, stop = _dim0_rows(p)
        assert torch.equal(p.to_local(), want[start:stop]), f"{name}: this rank's shard differs"
        assert torch.equal(p.full_tensor(), want), f"{name}: the gathered tensor differs"
        n += 1
    ref_buffers = dict(ref.named_buffers())
    buffers = dict(model.named_buffers())
    assert buffers.keys() == ref_buffers.keys(), (sorted(buffers), sorted(ref_buffers))
    for name, b in buffers.items():
        assert b.dtype == ref_buffers[name].dtype and torch.equal(b, ref_buffers[name]), f"buffer {name} differs"
    tied = getattr(model.config, "tie_word_embeddings", False)
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight, "the tie was lost"
    return {"params": n, "buffers": len(buffers), "tied": bool(tied)}


def check_engine(engine, model, dtype) -> int:
    """The engine copy holds the master's full tensors cast to ``dtype``, its buffers the master's."""
    n = 0
    for name, e in engine.named_parameters():
        want = model.get_parameter(name).full_tensor().to(dtype)
        assert e.dtype == dtype and torch.equal(e.detach(), want), f"engine {name} differs from the master"
        n += 1
    for name, b in model.named_buffers():
        assert torch.equal(engine.get_buffer(name), b), f"engine buffer {name} differs"
    if getattr(model.config, "tie_word_embeddings", False):
        assert engine.lm_head.weight is engine.model.embed_tokens.weight
    return n


def _load(mode: str, path: str, d):
    from trainer.fsdp import shard_model
    from trainer.policy import build_policy, load_for_training
    if mode == "sharded":
        return load_for_training(path, d, master=torch.float32, compute=torch.bfloat16, seed=0)[0]
    model, _ = build_policy(path, dtype=torch.float32, seed=0)   # what train() did before: the whole model on
    return shard_model(model.to(d.device), d, param_dtype=torch.bfloat16)   # every rank, then sharded


def main(out: str, mode: str, path: str, tied_path: str) -> None:
    from trainer.fsdp import copy_full_weights, init_distributed, shutdown
    from trainer.policy import engine_copy
    torch.set_num_threads(1)
    d = init_distributed()
    compute = torch.bfloat16
    res: dict = {"rank": d.rank, "mode": mode}
    # the small tied model first, the same way: every module either path imports is imported before measuring
    tied = _load(mode, tied_path, d)
    if mode == "sharded":
        res["tied_check"] = check_against_checkpoint(tied, tied_path)
        tied_engine = engine_copy(tied, compute, d.device)
        copy_full_weights(tied_engine, tied)
        check_engine(tied_engine, tied, compute)
        del tied_engine
    del tied
    with Peak() as start_up:
        model = _load(mode, path, d)
    res["start_up_peak_bytes"] = start_up.bytes
    res["model_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    if mode == "sharded":
        res["check"] = check_against_checkpoint(model, path)
        engine = engine_copy(model, compute, d.device)
        res["largest_tensor_bytes"] = max(p.numel() * p.element_size() for p in engine.parameters())
        res["engine_bytes"] = sum(p.numel() * p.element_size() for p in engine.parameters())
        copy_full_weights(engine, model)   # the first sync also touches the engine's fresh pages: not measured
        res["engine_params_checked"] = check_engine(engine, model, compute)
        with torch.no_grad():   # the masters move (as an optimizer step moves them); the next sync follows
            for p in model.parameters():
                p.to_local().add_(1e-3 * (d.rank + 1))
        with Peak() as sync:
            copy_full_weights(engine, model)
        res["sync_peak_bytes"] = sync.bytes
        check_engine(engine, model, compute)
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        with Peak() as old_sync:   # the sync this replaced: a full state dict on every rank, then loaded
            engine.load_state_dict(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))
        res["state_dict_sync_peak_bytes"] = old_sync.bytes
    with open(f"{out}.rank{d.rank}", "w") as f:
        json.dump(res, f)
    shutdown(d)


if __name__ == "__main__":
    main(*sys.argv[1:])
