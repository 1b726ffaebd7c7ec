"""What a weight sync to vLLM costs with LoRA against a full fine-tuning run: bytes and seconds per sync.

Two engines on the same model (a tiny Llama, or a Qwen2 model with Qwen2.5-0.5B's shapes built from its config), side by side in one interpreter (vLLM's CPU build; vLLM pins torch to one
thread, so the sides run in a child): the full run's engine, whose every sync streams every weight in place
(``VLLMSampler.update_weights``: ``reload_weights``, a rotating read-back), and a LoRA engine (rank 16 on the seven
projections, ``enable_lora``), whose syncs after the first send the adapter alone (a PEFT folder written, loaded
as a new ``LoRARequest``, every adapter tensor read back). Before each sync the trained tensors change (noise
added: the weights for the full run, the adapters for LoRA), so every sync carries new values. A round is one sync
of each side (A B A B); the seconds are ``last_update["seconds"]``, the sync alone (no probe), and the bytes what
it sent. Checks: the adapter's bytes and seconds per sync over the full sync's.
"""

from __future__ import annotations

from perf.common import BenchResult, Check, Side, call_in_subprocess, ratio

NAME = "lora_sync"
RANK = 16


def params_for(ctx) -> dict:
    if ctx.quick:
        return {"sizes": ["1m"], "rank": RANK, "dtype": "float32"}
    return {"sizes": ["1m", "20m", QWEN2_05B], "rank": RANK, "dtype": "float32"}


QWEN2_05B = "qwen2-0.5b"   # Qwen2.5-0.5B's shapes (config.json of the hub model), random weights built from a config


def build_sized(size: str, tok, torch_dtype):
    """A model of ``size``: a tiny Llama (``inference.tiny``), or ``qwen2-0.5b``, a Qwen2ForCausalLM with
    Qwen2.5-0.5B's shapes (24 layers, hidden 896, MLP 4864, 14 query / 2 KV heads, vocabulary 151,936, tied
    embeddings: 494 M parameters) and seeded random weights, built from its config (no download)."""
    import torch

    from inference.tiny import build_model

    if size != QWEN2_05B:
        return build_model(size, tok, seed=0).to(torch_dtype)
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch_dtype).eval()


def side_run(size: str, rank: int, dtype: str, repeats: int, warmup: int) -> dict:
    """Both engines in this (fresh) interpreter, synced in turn: per side the seconds of each timed sync and the
    bytes it sent, and the first LoRA sync's (base + adapter)."""
    import os

    import torch

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from inference import make_sampler
    from inference.tiny import build_tokenizer
    from trainer.config import load_config
    from trainer.lora import add_adapters

    torch_dtype = getattr(torch, dtype)
    tok = build_tokenizer()
    kw = dict(gpu_memory_utilization=0.1, max_model_len=64, enforce_eager=True, max_batch_size=8)
    full_model = build_sized(size, tok, torch_dtype)
    lora_model = add_adapters(build_sized(size, tok, torch_dtype), load_config(None, [f"lora_rank={rank}"]),
                              compute=torch_dtype, master=torch_dtype, base=None)
    engines = {"full": make_sampler(full_model, tok, engine="vllm", **kw),
               "lora": make_sampler(lora_model, tok, engine="vllm", **kw)}
    first_lora = dict(engines["lora"].last_update)
    models = {"full": full_model, "lora": lora_model}
    g = torch.Generator().manual_seed(0)
    out = {name: {"seconds": [], "bytes": []} for name in engines}
    for r in range(warmup + repeats):
        for name, engine in engines.items():
            with torch.no_grad():   # new values in every trained tensor
                for p in models[name].parameters():
                    if name == "full" or p.requires_grad:
                        p.add_(1e-4 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            engine.update_weights(models[name], probe=False)
            if r >= warmup:
                out[name]["seconds"].append(engine.last_update["seconds"])
                out[name]["bytes"].append(engine.last_update["bytes"])
    out["params"] = sum(p.numel() for p in full_model.parameters())
    out["adapter_params"] = sum(p.numel() for p in lora_model.parameters() if p.requires_grad)
    out["first_lora"] = {k: first_lora[k] for k in ("bytes", "base_bytes", "adapter_bytes", "adapter_file_bytes",
                                                    "seconds")}
    out["adapter_file_bytes"] = engines["lora"].last_update["adapter_file_bytes"]
    for engine in engines.values():
        engine.close()
    return out


def run(ctx) -> BenchResult:
    p = params_for(ctx)
    res = BenchResult(NAME, f"bytes and seconds per weight sync to vLLM (CPU build): the adapter alone (LoRA rank "
                      f"{p['rank']}, a new LoRARequest) against every weight streamed in place, {p['dtype']}",
                      params=p)
    rows = []
    for size in p["sizes"]:
        out = call_in_subprocess("perf.bench_lora_sync:side_run", dict(
            size=size, rank=p["rank"], dtype=p["dtype"], repeats=ctx.repeats, warmup=max(1, ctx.warmup)),
            threads=ctx.threads)
        sides = {}
        for name in ("full", "lora"):
            side = Side(f"{name} sync {size}", "s")
            side.samples.extend(out[name]["seconds"])
            sides[name] = side
            res.sides.append(side)
            ctx.log(f"  {side.name}: median {side.median * 1e3:.3g} ms, {out[name]['bytes'][-1]:,} bytes")
        full_bytes, lora_bytes = out["full"]["bytes"][-1], out["lora"]["bytes"][-1]
        label = size if size == QWEN2_05B else f"tiny:{size}"
        rows.append({"model": label, "params": out["params"], "adapter params": out["adapter_params"],
                     "full bytes/sync": full_bytes, "adapter bytes/sync": lora_bytes,
                     "adapter file bytes": out["adapter_file_bytes"],
                     "full ms/sync (median)": sides["full"].median * 1e3,
                     "adapter ms/sync (median)": sides["lora"].median * 1e3,
                     "first LoRA sync bytes (base + adapter)": out["first_lora"]["bytes"],
                     "first LoRA sync ms": out["first_lora"]["seconds"] * 1e3})
        res.checks.append(Check(f"adapter / full bytes per sync, {label}", ratio(lora_bytes, full_bytes), "<=",
                                0.25, "bytes the LoRA sync sent over the full sync's"))
        res.checks.append(Check(f"adapter / full seconds per sync, {label}",
                                ratio(sides["lora"].median, sides["full"].median), "<=", 1.0,
                                "median seconds per sync, LoRA over full"))
    res.tables["per size"] = rows
    return res
