"""The GPU check, ready to run on a lent machine as it is (issue 21, item 9): one command, one JSON.

    PYTHONPATH=. python3 -m benchmarks.device_check --out $OUT/device_check.json        # about 4-6 minutes
    PYTHONPATH=. python3 -m benchmarks.device_check --toy --out /tmp/check.json         # CPU smoke run (tests)

It needs only what the device machine's own ``python3`` has (torch with CUDA, transformers, numpy, pandas,
pyarrow, pyyaml, tqdm); no vLLM, no math-verify, nothing downloaded. Two parts, each in its own interpreter (so
one part's allocator peak is not the other's), each skipped with the reason when the time budget is spent:

1. **step**: the GPU benchmark's trainer half with one repeat (``benchmarks.bench_gpu.cycle_run``): the HF engine,
   bf16 compute over fp32 master weights, a Qwen2-architecture model with Qwen2.5-0.5B's shapes, 2T steps of
   Thinking Seeds (ratio 0.5) and of on-policy DAPO; the second cycle's mean seconds per step and their ratio.
2. **memory**: a 2-layer model with Qwen2.5-Math-7B's shapes (hidden 3584, MLP 18944, 28 heads / 4 KV heads of
   128, vocabulary 152,064, untied head), fp32 masters with the trainer's one-process bf16 compute
   (``trainer.fsdp.shard_model``), gradient checkpointing on, and one log-prob forward + backward
   (``trainer.policy.response_logprobs``, the trainer's flat forward) over 8 rows of 1024 prompt + 3072 response
   tokens: the paper preset's micro-batch (``micro_batch_tokens: 32768``). The measured peak above the resident
   weights and gradients is set against the plan of docs/gpu_memory.md (``benchmarks.gpu_plan``): checkpointed boundaries
   per layer, one layer recomputed in backward, the LM head's log-prob chunk.

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

from benchmarks.gpu_plan import SHAPES, params, terms

QWEN25_MATH_7B = SHAPES["Qwen/Qwen2.5-Math-7B"]
TOY = dict(layers=2, hidden=64, mlp=160, heads=4, kv_heads=2, head_dim=16, vocab=512, tied=False, qkv_bias=True)
# the paper preset's micro-batch: 8 rows x (1024 + 3072) = 32768 tokens; the toy one keeps the shape of the call
PROBE = {"full": dict(shape={**QWEN25_MATH_7B, "layers": 2}, rows=8, prompt=1024, response=3072),
         "toy": dict(shape=TOY, rows=2, prompt=16, response=48)}


def qwen2_config(shape: dict):
    """A transformers Qwen2 config of a ``benchmarks.gpu_plan`` shape."""
    from transformers import Qwen2Config
    return Qwen2Config(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["mlp"],
                       num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                       num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"],
                       tie_word_embeddings=shape["tied"], max_position_embeddings=4096, rope_theta=10000.0,
                       rms_norm_eps=1e-6, hidden_act="silu")


def memory_plan(shape: dict, *, tokens: int) -> dict:
    """The plan's terms (``benchmarks.gpu_plan.terms``) for one unsharded process, in bytes, with the parameter
    count and the weights and gradients (fp32 each) that stay resident through backward."""
    t = {k: int(v * 1e9) for k, v in terms(shape, tokens=tokens, ranks=1).items()}
    n = params(shape)
    return {"params": n, "weights_fp32": 4 * n, "grads_fp32": 4 * n,
            **{k: t[k] for k in ("boundaries", "final_norm", "layer_recompute", "logit_chunk")}}


# ---------------------------------------------------------------------------------------------- children
def memory_probe(*, size: str = "full", device: str = "auto") -> dict:
    """One log-prob forward + backward of the probe model (module doc, part 2); peak memory in bytes."""
    import torch
    from transformers import Qwen2ForCausalLM

    from trainer.fsdp import Dist, shard_model
    from trainer.policy import response_logprobs, use_flat

    spec = PROBE[size]
    dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                       ("cpu" if device == "auto" else device))
    cuda = dev.type == "cuda"
    cfg = qwen2_config(spec["shape"])
    t0 = time.perf_counter()
    with torch.device(dev):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg)   # fp32 masters, random weights: the memory does not depend on them
    model.gradient_checkpointing_enable()
    model.train()
    model = shard_model(model, Dist(device=dev), param_dtype=torch.bfloat16)   # one process: bf16 compute casts
    g = torch.Generator().manual_seed(0)
    V = cfg.vocab_size
    prompts = torch.randint(0, V, (spec["rows"], spec["prompt"]), generator=g).tolist()
    responses = torch.randint(0, V, (spec["rows"], spec["response"]), generator=g).tolist()
    tokens = spec["rows"] * (spec["prompt"] + spec["response"])
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    resident = torch.cuda.memory_allocated(dev) if cuda else None
    logp, ent, mask = response_logprobs(model, prompts, responses, pad_id=0, device=dev, forward="auto",
                                        entropy_grad=False)
    loss = -(logp * mask).sum() / mask.sum()
    after_forward = torch.cuda.max_memory_allocated(dev) if cuda else None
    loss.backward()
    if cuda:
        torch.cuda.synchronize(dev)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    out = {"size": size, "device": str(dev), "tokens": tokens, "forward": "flat" if use_flat(model, "auto") else "model",
           "loss": float(loss), "grad_finite": bool(all(torch.isfinite(p.grad).all() for p in model.parameters()
                                                       if p.grad is not None)),
           "grads_bytes": grads, "time_s": time.perf_counter() - t0,
           "plan": memory_plan(spec["shape"], tokens=tokens)}
    if cuda:
        peak = torch.cuda.max_memory_allocated(dev)
        out.update({"resident_bytes": resident, "peak_forward_bytes": after_forward, "peak_bytes": peak,
                    "peak_reserved_bytes": torch.cuda.max_memory_reserved(dev),
                    "activation_peak_bytes": peak - resident - grads})
    return out


# ---------------------------------------------------------------------------------------------- parent
def _call(target: str, kwargs: dict, timeout: float) -> dict:
    from benchmarks.common import call_in_subprocess
    try:
        return call_in_subprocess(target, kwargs, timeout=timeout, threads=min(8, os.cpu_count() or 1))
    except Exception as exc:   # the other part still runs; the JSON says what failed
        return {"error": f"{type(exc).__name__}: {str(exc)[-3000:]}"}


def step_part(*, toy: bool) -> dict:
    """bench_gpu's trainer half, one repeat: seeds and dapo, HF engine, bf16 compute over fp32 masters."""
    spec = "qwen2-toy" if toy else "qwen2-0.5b"
    kw = dict(spec=spec, engine="hf", prompts=4 if toy else 16, samples=4 if toy else 8,
              max_tokens=8 if toy else 256, T=2 if toy else 4, seed_ratio=0.5, micro_batch_size=16 if toy else 32,
              dtype="bfloat16", master_dtype="float32")
    out = {"params": kw}
    for alg in ("seeds", "dapo"):
        out[alg] = _call("benchmarks.bench_gpu:cycle_run", {**kw, "algorithm": alg}, timeout=900)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.device_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the JSON file to write")
    p.add_argument("--toy", action="store_true", help="toy sizes (a CPU smoke run of the same code)")
    p.add_argument("--budget-s", type=float, default=330.0, help="skip a part that would start after this")
    p.add_argument("--parts", default="memory,step", help="comma list of memory, step")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    result = {"environment": environment(), "toy": a.toy, "parts": {}}
    for part in [x for x in a.parts.split(",") if x]:
        if part not in ("memory", "step"):
            print(f"error: --parts: unknown part '{part}' (memory, step)", file=sys.stderr)
            return 2
        if time.perf_counter() - t0 > a.budget_s:
            result["parts"][part] = {"skipped": f"time budget of {a.budget_s:g} s spent"}
            continue
        t = time.perf_counter()
        result["parts"][part] = (_call("benchmarks.device_check:memory_probe", {"size": "toy" if a.toy else "full"},
                                       timeout=600) if part == "memory" else step_part(toy=a.toy))
        result["parts"][part]["wall_s"] = time.perf_counter() - t
        print(f"{part}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    result["wall_s"] = time.perf_counter() - t0
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out)
    print(json.dumps(result, indent=1))
    failed = [k for k, v in result["parts"].items() if "error" in v or any(isinstance(x, dict) and "error" in x
                                                                           for x in v.values())]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
