"""The GPU check, ready to run on a lent machine as it is (issue 21, item 9): one command, one JSON.

    PYTHONPATH=. python3 -m perf.device_check --out $OUT/device_check.json        # at most 6 minutes
    PYTHONPATH=. python3 -m perf.device_check --toy --out /tmp/check.json         # CPU smoke run (tests)

It needs only what the device machine's own ``python3`` has (torch with CUDA, transformers and what they bring:
safetensors, numpy; pandas, pyarrow, pyyaml, tqdm); no vLLM, no math-verify, nothing downloaded. Three parts, in
this order, each child in its own interpreter (so one probe's allocator peak is not another's), each part skipped
with the reason once ``--budget-s`` is spent, and every child stopped at ``--limit-s`` (340 s) after the start; the
JSON is rewritten after every part, so a check stopped from outside keeps what it finished:

1. **memory**: a 2-layer model with Qwen2.5-Math-7B's shapes (hidden 3584, MLP 18944, 28 heads / 4 KV heads of
   128, vocabulary 152,064, untied head), fp32 masters with the trainer's one-process bf16 compute
   (``trainer.fsdp.shard_model``), gradient checkpointing on, and one log-prob forward + backward
   (``trainer.policy.response_logprobs``, the trainer's flat forward) over 8 rows of 1024 prompt + 3072 response
   tokens: the paper preset's micro-batch (``micro_batch_tokens: 32768``). The measured peak above the resident
   weights and gradients is set against the plan of docs/gpu_memory.md (``trainer.plan``): checkpointed boundaries
   per layer, one layer recomputed in backward, the LM head's log-prob chunk. ``attention_backends``: the SDPA
   kernel each part of the flat attention got (``inference.flat.BACKENDS``: flash, efficient, cudnn or math).
2. **fsdp**: the same probe through the path the multi-GPU presets train with: a process group of one rank (NCCL),
   ``shard_model`` on a one-rank mesh (``fully_shard`` on both layers and the root, bf16 all-gathers of the fp32
   shards, the fp32 gradient reduction), once with the flat forward through FSDP's hooks and once with the model's
   own forward; each one's peak against the plan's FSDP terms (``plan.fsdp_transient``: the root unit gathered
   through backward, the layers in flight, their gradients before the reduce-scatter, the head gradient) and the
   flat/model ratio. One rank holds the whole fp32 state (8 ranks hold an eighth of it); everything above that state
   is what a rank of the 8-GPU presets holds at this micro-batch.
3. **step**: the GPU benchmark's trainer half with one repeat (``perf.bench_gpu.cycle_run``): the HF engine,
   bf16 compute over fp32 master weights, a Qwen2-architecture model with Qwen2.5-0.5B's shapes, 2T steps of
   Thinking Seeds (ratio 0.5) and of on-policy DAPO; the second cycle's mean seconds per step and their ratio.

The JSON holds the environment (GPU, torch, transformers), each part's numbers or its error, and the plan's terms
next to the measured ones. Numbers go into docs/performance.md and docs/gpu_memory.md with the commit that made
them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from trainer.plan import CUDA_OVERHEAD_GB, GB, SHAPES, VLLM_ASLEEP_GB, params, terms, update_peak

QWEN25_MATH_7B = SHAPES["Qwen/Qwen2.5-Math-7B"]
TOY = dict(layers=2, hidden=64, mlp=160, heads=4, kv_heads=2, head_dim=16, vocab=512, tied=False, qkv_bias=True)
# the paper preset's micro-batch: 8 rows x (1024 + 3072) = 32768 tokens; the toy one keeps the shape of the call
PROBE = {"full": dict(shape={**QWEN25_MATH_7B, "layers": 2}, rows=8, prompt=1024, response=3072),
         "toy": dict(shape=TOY, rows=2, prompt=16, response=48)}


def qwen2_config(shape: dict):
    """A transformers Qwen2 config of a ``perf.gpu_plan`` shape."""
    from transformers import Qwen2Config
    return Qwen2Config(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["mlp"],
                       num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                       num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"],
                       tie_word_embeddings=shape["tied"], max_position_embeddings=4096, rope_theta=10000.0,
                       rms_norm_eps=1e-6, hidden_act="silu")


def memory_plan(shape: dict, *, tokens: int) -> dict:
    """The plan's terms (``trainer.plan.terms``) for one unsharded process, in bytes, with the parameter
    count and the weights and gradients (fp32 each) that stay resident through backward. ``fsdp_transient``: the
    plan's update peak (``trainer.plan.update_peak``) less the trainer state and the allowances, i.e. what FSDP2's
    forward + backward adds on top of the resident weights and gradients (the fsdp part measures it as
    ``activation_peak_bytes``), and where in backward the plan puts it."""
    t = terms(shape, tokens=tokens, ranks=1)
    peak, where = update_peak(t)
    n = params(shape)
    return {"params": n, "weights_fp32": 4 * n, "grads_fp32": 4 * n,
            **{k: int(t[k] * GB) for k in ("boundaries", "final_norm", "layer_recompute", "logit_chunk",
                                           "root_unsharded", "layers_in_flight", "layer_grads", "head_grad",
                                           "head_grad_fp32")},
            "fsdp_transient": int((peak - t["state"] - CUDA_OVERHEAD_GB - VLLM_ASLEEP_GB) * GB),
            "fsdp_transient_at": where}


# ---------------------------------------------------------------------------------------------- children
def memory_probe(*, size: str = "full", device: str = "auto", sharded: bool = False, forward: str = "auto") -> dict:
    """One log-prob forward + backward of the probe model (module doc, part 1); peak memory in bytes, and the SDPA
    kernel each part of the flat attention got (``inference.flat.BACKENDS``).

    ``sharded`` (part 2): through FSDP2 as the multi-GPU presets train, on a process group of one rank (NCCL on
    CUDA, gloo on CPU): ``shard_model`` on a one-rank mesh, so ``fully_shard`` wraps every decoder layer and the
    root, each unit's bf16 all-gather, reshard and fp32 gradient reduction run, and ``forward="flat"`` goes
    through FSDP's hooks (``inference.flat.enable_fsdp``); ``forward="model"`` is the model's own forward for
    comparison."""
    import tempfile

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from transformers import Qwen2ForCausalLM

    from inference.flat import BACKENDS
    from trainer.fsdp import Dist, shard_model
    from trainer.policy import response_logprobs, use_flat

    spec = PROBE[size]
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    cuda = dev.type == "cuda"
    if cuda and dev.index is None:   # an index, as torchrun's ranks have (set_device and NCCL need one)
        dev = torch.device("cuda", torch.cuda.current_device())
    cfg = qwen2_config(spec["shape"])
    t0 = time.perf_counter()
    d = Dist(device=dev)
    store = tempfile.TemporaryDirectory(prefix="device_check_pg_")
    if sharded:   # a one-rank group: no torchrun, no port; the file store lives as long as the group
        if cuda:
            torch.cuda.set_device(dev)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store.name}/store", rank=0,
                                world_size=1)
        d = Dist(device=dev, mesh=init_device_mesh(dev.type, (1,)))
    try:
        with torch.device(dev):
            torch.manual_seed(0)
            model = Qwen2ForCausalLM(cfg)   # fp32 masters, random weights: the memory does not depend on them
        model.gradient_checkpointing_enable()
        model.train()
        # one process: bf16 compute casts; sharded: FSDP2 units with bf16 all-gathers over the fp32 shards
        model = shard_model(model, d, param_dtype=torch.bfloat16)
        g = torch.Generator().manual_seed(0)
        V = cfg.vocab_size
        prompts = torch.randint(0, V, (spec["rows"], spec["prompt"]), generator=g).tolist()
        responses = torch.randint(0, V, (spec["rows"], spec["response"]), generator=g).tolist()
        tokens = spec["rows"] * (spec["prompt"] + spec["response"])
        if cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        resident = torch.cuda.memory_allocated(dev) if cuda else None
        logp, ent, mask = response_logprobs(model, prompts, responses, pad_id=0, device=dev, forward=forward,
                                            entropy_grad=False)
        loss = -(logp * mask).sum() / mask.sum()
        after_forward = torch.cuda.max_memory_allocated(dev) if cuda else None
        loss.backward()
        if cuda:
            torch.cuda.synchronize(dev)
        grads = [p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for p in model.parameters()
                 if p.grad is not None]
        grad_bytes = sum(x.numel() * x.element_size() for x in grads)
        out = {"size": size, "device": str(dev), "tokens": tokens, "sharded": sharded,
               "fsdp_units": sum(isinstance(m, FSDPModule) for m in model.modules()),   # layers + root
               "forward": "flat" if use_flat(model, forward) else "model",
               "attention_backends": dict(BACKENDS),   # {"cuda/blocks": "flash", ...}; empty for the model forward
               "attn_implementation": getattr(model.config, "_attn_implementation", None),   # the model forward's
               "loss": float(loss), "grad_finite": bool(all(torch.isfinite(x).all() for x in grads)),
               "grads_bytes": grad_bytes, "time_s": time.perf_counter() - t0,
               "plan": memory_plan(spec["shape"], tokens=tokens)}
        if cuda:
            peak = torch.cuda.max_memory_allocated(dev)
            out.update({"resident_bytes": resident, "peak_forward_bytes": after_forward, "peak_bytes": peak,
                        "peak_reserved_bytes": torch.cuda.max_memory_reserved(dev),
                        "activation_peak_bytes": peak - resident - grad_bytes})
        return out
    finally:
        if sharded:
            dist.destroy_process_group()
        store.cleanup()


# ---------------------------------------------------------------------------------------------- parent
def _call(target: str, kwargs: dict, timeout: float, deadline: float | None = None) -> dict:
    """``target(**kwargs)`` in a fresh interpreter; killed after ``timeout`` s or at ``deadline`` (a
    ``time.perf_counter()`` value: the check's own limit), whichever comes first."""
    from perf.common import call_in_subprocess
    if deadline is not None:
        timeout = min(timeout, deadline - time.perf_counter())
        if timeout < 5:
            return {"error": "skipped: the check's time limit is reached"}
    try:
        return call_in_subprocess(target, kwargs, timeout=timeout, threads=min(8, os.cpu_count() or 1))
    except Exception as exc:   # the other part still runs; the JSON says what failed
        return {"error": f"{type(exc).__name__}: {str(exc)[-3000:]}"}


def fsdp_part(*, toy: bool, deadline: float | None = None) -> dict:
    """Part 2: the memory probe through FSDP2 on a one-rank process group, the flat forward through FSDP's hooks
    and the model's own forward, each in its own interpreter; the flat forward's peak over the model's."""
    size = "toy" if toy else "full"
    out = {f: _call("perf.device_check:memory_probe", {"size": size, "sharded": True, "forward": f},
                    timeout=300, deadline=deadline) for f in ("flat", "model")}
    if "peak_bytes" in out["flat"] and "peak_bytes" in out["model"]:
        out["flat_over_model_peak"] = out["flat"]["peak_bytes"] / out["model"]["peak_bytes"]
        out["flat_over_model_activation_peak"] = (out["flat"]["activation_peak_bytes"]
                                                  / out["model"]["activation_peak_bytes"])
    return out


def step_part(*, toy: bool, deadline: float | None = None) -> dict:
    """bench_gpu's trainer half, one repeat: seeds and dapo, HF engine, bf16 compute over fp32 masters."""
    spec = "qwen2-toy" if toy else "qwen2-0.5b"
    kw = dict(spec=spec, engine="hf", prompts=4 if toy else 16, samples=4 if toy else 8,
              max_tokens=8 if toy else 256, T=2 if toy else 4, seed_ratio=0.5, micro_batch_size=16 if toy else 32,
              dtype="bfloat16", master_dtype="float32")
    out = {"params": kw}
    for alg in ("seeds", "dapo"):
        out[alg] = _call("perf.bench_gpu:cycle_run", {**kw, "algorithm": alg}, timeout=900, deadline=deadline)
    s, d = out["seeds"].get("step_s"), out["dapo"].get("step_s")
    if s and d:
        out["seeds_step_s"] = sum(s) / len(s)
        out["dapo_step_s"] = sum(d) / len(d)
        out["seeds_over_dapo"] = out["seeds_step_s"] / out["dapo_step_s"]
    return out


def environment() -> dict:
    import importlib.util

    import torch
    import transformers
    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": cuda,
            "gpu": torch.cuda.get_device_name(0) if cuda else None,
            "gpu_memory_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else None,
            "vllm_installed": importlib.util.find_spec("vllm") is not None, "python": sys.version.split()[0]}


PARTS = ("memory", "fsdp", "step")   # the cheap, fixed-size probes first: the step part takes what time is left


def _write(out: Path, result: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m perf.device_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the JSON file to write (rewritten after every part)")
    p.add_argument("--toy", action="store_true", help="toy sizes (a CPU smoke run of the same code)")
    p.add_argument("--budget-s", type=float, default=330.0, help="skip a part that would start after this")
    p.add_argument("--limit-s", type=float, default=340.0,
                   help="stop any child still running this long after the start (its part records the error)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    deadline = t0 + a.limit_s
    parts = [x for x in a.parts.split(",") if x]
    unknown = [x for x in parts if x not in PARTS]
    if unknown:
        print(f"error: --parts: unknown part '{unknown[0]}' ({', '.join(PARTS)})", file=sys.stderr)
        return 2
    out = Path(a.out)
    result = {"environment": environment(), "toy": a.toy, "parts": {}}
    for part in parts:
        if time.perf_counter() - t0 > a.budget_s:
            result["parts"][part] = {"skipped": f"time budget of {a.budget_s:g} s spent"}
            continue
        t = time.perf_counter()
        if part == "memory":
            result["parts"][part] = _call("perf.device_check:memory_probe", {"size": "toy" if a.toy else "full"},
                                          timeout=600, deadline=deadline)
        elif part == "fsdp":
            result["parts"][part] = fsdp_part(toy=a.toy, deadline=deadline)
        else:
            result["parts"][part] = step_part(toy=a.toy, deadline=deadline)
        result["parts"][part]["wall_s"] = time.perf_counter() - t
        result["wall_s"] = time.perf_counter() - t0
        _write(out, result)   # what is done survives a kill of the whole check
        print(f"{part}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    result["wall_s"] = time.perf_counter() - t0
    _write(out, result)
    print(json.dumps(result, indent=1))
    failed = [k for k, v in result["parts"].items() if "error" in v or any(isinstance(x, dict) and "error" in x
                                                                           for x in v.values())]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
