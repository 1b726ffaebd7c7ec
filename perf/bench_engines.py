"""Which engine a CPU user should pick: tokens/s of vLLM's CPU build, our ``HFSampler`` and ``model.generate``.

The same model, prompts (addition task), batch and budget on every side, temperature 1, EOS ignored so each side
writes exactly ``batch x new_tokens`` tokens. Two models: the tiny Llama the tests use (1M parameters) and a
Qwen2-shaped model of ~0.5B parameters built from a config (Qwen2.5-0.5B's shapes, random weights), each in
float32 and bfloat16. vLLM pins torch to one thread and seeds the global RNG when it starts, so every side runs
in its own interpreter: one child per (model, dtype, engine), which times ``repeats`` calls after ``warmup``
(sides follow each other rather than alternate; the spread is reported). ``engine=auto`` picks from these
numbers (``inference.engines.CPU_VLLM_MIN_PARAMS``).
"""

from __future__ import annotations

import time

from perf.common import BenchResult, Check, Side, call_in_subprocess, ratio

NAME = "engines"
QWEN2_0_5B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True)


def params_for(ctx) -> dict:
    if ctx.quick:
        return {"models": ["tiny"], "dtypes": ["float32"], "batch": 8, "new_tokens": 8}
    return {"models": ["tiny", "qwen2-0.5b"], "dtypes": ["float32", "bfloat16"], "batch": 32, "new_tokens": 64}


def _model(kind: str, dtype: str):
    import torch

    from inference.tiny import build_model, build_tokenizer
    tok = build_tokenizer()
    if kind == "tiny":
        model = build_model("1m", tok, seed=0)
    else:
        from transformers import Qwen2Config, Qwen2ForCausalLM
        torch.manual_seed(0)
        cfg = Qwen2Config(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id, **QWEN2_0_5B)
        model = Qwen2ForCausalLM(cfg)
    return model.to(getattr(torch, dtype)).eval(), tok


def side_run(engine: str, kind: str, dtype: str, batch: int, new_tokens: int, repeats: int, warmup: int,
             workdir: str) -> dict:
    """One side in this (fresh) interpreter: tokens/s of ``repeats`` timed calls, and the parameter count."""
    import os

    import torch

    from inference import make_sampler
    from inference.tiny import save_pretrained_atomic
    from scoring.tasks import get_task
    model, tok = _model(kind, dtype)
    exs = get_task("addition").make_examples(batch, seed=0)
    prompts = [[tok.bos_token_id] + tok(e["prompt"], add_special_tokens=False)["input_ids"] for e in exs]
    if engine == "vllm":
        path = save_pretrained_atomic(model, tok, os.path.join(workdir, f"{kind}-{dtype}"))
        sampler = make_sampler(model, tok, engine="vllm", model_path=str(path), sync_weights=False,
                               ignore_eos=True, max_model_len=max(map(len, prompts)) + new_tokens,
                               max_batch_size=batch)

        def call(seed):
            return sampler.generate(prompts, max_new_tokens=new_tokens, temperature=1.0, seed=seed)
    elif engine == "hf":
        sampler = make_sampler(model, tok, engine="hf", ignore_eos=True, max_batch_size=batch)

        def call(seed):
            return sampler.generate(prompts, max_new_tokens=new_tokens, temperature=1.0, seed=seed)
    else:
        from transformers import GenerationConfig
        L = max(map(len, prompts))
        ids = torch.tensor([[tok.pad_token_id] * (L - len(x)) + x for x in prompts])
        attn = torch.tensor([[0] * (L - len(x)) + [1] * len(x) for x in prompts])
        gc = GenerationConfig(do_sample=True, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              eos_token_id=None, pad_token_id=tok.pad_token_id, temperature=1.0, top_p=1.0, top_k=0)

        def call(seed):
            torch.manual_seed(seed)
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=attn, generation_config=gc)
            return [list(r) for r in out[:, L:].tolist()]
    rates = []
    for r in range(warmup + repeats):
        t0 = time.perf_counter()
        comps = call(r)
        dt = time.perf_counter() - t0
        n = sum(len(c.token_ids) if hasattr(c, "token_ids") else len(c) for c in comps)
        assert n == batch * new_tokens, f"{engine} wrote {n} tokens, expected {batch * new_tokens}"
        if r >= warmup:
            rates.append(n / dt)
    return {"rates": rates, "params": sum(p.numel() for p in model.parameters())}


def run(ctx) -> BenchResult:
    import tempfile

    from inference.engines import resolve_engine
    p = params_for(ctx)
    res = BenchResult(NAME, f"tokens/s of vLLM (CPU build), HFSampler and model.generate, {p['batch']} prompts x "
                      f"{p['new_tokens']} new tokens, EOS ignored; which engine to pick at which size", params=p)
    sides = []
    with tempfile.TemporaryDirectory(prefix="bench_engines_") as work:
        for kind in p["models"]:
            for dtype in p["dtypes"]:
                got = {}
                for engine in ("vllm", "hf", "generate"):
                    out = call_in_subprocess("perf.bench_engines:side_run", dict(
                        engine=engine, kind=kind, dtype=dtype, batch=p["batch"], new_tokens=p["new_tokens"],
                        repeats=ctx.repeats, warmup=max(1, ctx.warmup), workdir=work), threads=ctx.threads)
                    side = Side(f"{engine} {kind} {dtype}", "tokens/s")
                    side.samples.extend(out["rates"])
                    got[engine] = side
                    sides.append(side)
                    res.info[f"params {kind}"] = out["params"]
                    ctx.log(f"  {side.name}: median {side.median:.4g} tokens/s")
                res.info[f"vLLM / HFSampler {kind} {dtype}"] = ratio(got["vllm"].median, got["hf"].median)
                res.info[f"HFSampler / generate {kind} {dtype}"] = ratio(got["hf"].median, got["generate"].median)
                # engine=auto's rule: the engine it picks at this size is the faster one
                picked = resolve_engine("auto", model=None, model_path=None, num_params=res.info[f"params {kind}"])
                other = "hf" if picked == "vllm" else "vllm"
                res.checks.append(Check(f"auto's pick ({picked}) / {other} tokens/s, {kind} {dtype}",
                                        ratio(got[picked].median, got[other].median), ">=", 1.0,
                                        "median tokens/s of the engine engine=auto picks over the other"))
    res.sides = sides
    return res
