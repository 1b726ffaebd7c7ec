"""Sampling throughput: our ``HFSampler`` vs ``transformers``' ``model.generate`` on the same model and batch.

The same tiny Llama (``inference.tiny``), the same prompts (addition task, left-padded for ``generate``), the same
batch and number of new tokens, temperature 1 and top_p 1 (plain multinomial sampling), KV cache on both sides,
EOS ignored on both (``HFSampler(ignore_eos=True)``; ``generate`` with ``eos_token_id=None``) so both produce
exactly ``batch * new_tokens`` tokens. Tokens per second, alternating ours / generate, for each length.
Target: ours >= 1.3x generate's tokens/s.
"""

from __future__ import annotations

import inspect
import time

from perf.common import BenchResult, Check, alternate, ratio, set_threads

NAME = "sampler_vs_generate"
TARGET = 1.3


def params_for(ctx) -> dict:
    if ctx.quick:
        return {"size": "1m", "batch": 8, "new_tokens": [8]}
    return {"size": "2m", "batch": 128, "new_tokens": [32, 64]}


def make_hf_sampler(model, tokenizer, **kw):
    """An ``HFSampler`` that never stops at EOS (``ignore_eos`` when the sampler has it, else an EOS id that
    cannot be sampled)."""
    from inference.hf import HFSampler
    if "ignore_eos" in inspect.signature(HFSampler.__init__).parameters:
        return HFSampler(model, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         ignore_eos=True, **kw)
    return HFSampler(model, eos_token_id=[-1], pad_token_id=tokenizer.pad_token_id, **kw)


def run(ctx) -> BenchResult:
    import torch
    from transformers import GenerationConfig

    from scoring.tasks import get_task
    from inference.tiny import build_model, build_tokenizer

    set_threads(ctx.threads)
    p = params_for(ctx)
    res = BenchResult(NAME, f"tokens/s of HFSampler vs model.generate, batch {p['batch']}, EOS ignored; "
                      f"target ours >= {TARGET:g}x", params=p)
    tok = build_tokenizer()
    model = build_model(p["size"], tok, seed=0).eval()
    exs = get_task("addition").make_examples(p["batch"], seed=0)
    prompts = [tok(e["prompt"], add_special_tokens=False)["input_ids"] for e in exs]
    L = max(len(x) for x in prompts)
    ids = torch.tensor([[tok.pad_token_id] * (L - len(x)) + x for x in prompts])
    attn = torch.tensor([[0] * (L - len(x)) + [1] * len(x) for x in prompts])
    sampler = make_hf_sampler(model, tok, max_batch_size=p["batch"])
    res.info["hf_sampler_fast_path"] = bool(sampler.fast)
    sides = []
    for n_new in p["new_tokens"]:
        gc = GenerationConfig(do_sample=True, max_new_tokens=n_new, min_new_tokens=0, eos_token_id=None,
                              pad_token_id=tok.pad_token_id, temperature=1.0, top_p=1.0, top_k=0, use_cache=True)
        calls = {"n": 0}

        def ours(n_new=n_new):
            calls["n"] += 1
            t0 = time.perf_counter()
            comps = sampler.generate(prompts, max_new_tokens=n_new, temperature=1.0, top_p=1.0, seed=calls["n"])
            dt = time.perf_counter() - t0
            n = sum(len(c.token_ids) for c in comps)
            assert n == len(prompts) * n_new, f"HFSampler produced {n} tokens, expected {len(prompts) * n_new}"
            return n / dt

        def generate(gc=gc, n_new=n_new):
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=attn, generation_config=gc)
            dt = time.perf_counter() - t0
            n = (out.shape[1] - L) * out.shape[0]
            assert n == len(prompts) * n_new, f"generate produced {n} tokens, expected {len(prompts) * n_new}"
            return n / dt

        s_ours, s_gen = alternate({f"HFSampler @{n_new}": ours, f"generate @{n_new}": generate},
                                  units="tokens/s", repeats=ctx.repeats, warmup=ctx.warmup, log=ctx.log)
        sides += [s_ours, s_gen]
        res.checks.append(Check(f"HFSampler / generate tokens/s @{n_new}", ratio(s_ours.median, s_gen.median), ">=",
                                TARGET, "median tokens/s ours / generate"))
    res.sides = sides
    return res
