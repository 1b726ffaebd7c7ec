"""GPU: vLLM rollout tokens/s, the trainer's step time, and the seeded / on-policy step ratio at 0.5B parameters.

Runs only where CUDA is available (skipped with a message otherwise). The model is a Qwen2-architecture
causal LM with Qwen2.5-0.5B's shapes (24 layers, hidden 896, 14 heads / 2 KV heads, MLP 4864, vocab 151,936,
tied embeddings; 494M parameters), randomly initialised from a config: nothing is downloaded. Prompts are the
addition task through the character tokenizer of ``inference.tiny`` (token ids < 100; the model may sample any of
its 151,936 ids, which decode to nothing, so rewards are 0 and every group has zero advantage: the step still
does all its work; ``ignore_eos`` makes every response exactly ``max_tokens`` long).

1. Rollout: ``VLLMSampler`` (when vLLM is installed) vs ``HFSampler`` on the same GPU, same prompts, batch and
   ``new_tokens``, EOS ignored; tokens/s. The model is saved once as a Hugging Face directory without tokenizer
   files, so vLLM runs with ``skip_tokenizer_init`` (token ids in and out).
2. Trainer: ``trainer.train.train`` with bf16 compute and fp32 master weights (``master_dtype`` float32, the
   default: the model is built in fp32, ``shard_model`` casts for forward/backward, vLLM samples in bf16) for 2T steps with ``algorithm=seeds`` (ratio 0.5, T = 8) and with
   ``algorithm=dapo``, each in a fresh interpreter; the first cycle is warm-up (engine start-up, CUDA graphs,
   allocator) and the mean ``time/step_s`` over the second cycle is the sample. Engine: vLLM when installed and
   one GPU, else the HF sampler. With 2+ GPUs the runs go through ``torchrun`` so FSDP2 shards the model (one
   rank per GPU, HF engine); with one GPU FSDP2 is a no-op (world size 1) and the number is the plain step.
   Each run also reports its peak GPU memory (``torch.cuda.max_memory_allocated`` and ``_reserved`` of the process
   that trains and hosts the engine, rank 0).

The trainer child hands ``trainer.train.train`` two builders instead of patching anything: ``policy_builder``
(a Qwen2 model from the config above, with the character tokenizer, instead of a checkpoint directory) and
``sampler_builder`` (``inference.make_sampler``, except that vLLM gets token ids only: no tokenizer, which the
character tokenizer could not be for vLLM).
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import time

from perf.common import BenchResult, Check, Side, call_in_subprocess, ratio

NAME = "gpu"
TARGET_SEEDS = 1.10

QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096, rope_theta=1e6,
                 rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu")
# the same code path at toy size, so the CPU smoke test exercises the plumbing
QWEN2_TOY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512, rope_theta=1e4, rms_norm_eps=1e-6,
                 tie_word_embeddings=True, hidden_act="silu")
SPECS = {"qwen2-0.5b": QWEN2_05B, "qwen2-toy": QWEN2_TOY}


def params_for(ctx) -> dict:
    return {"spec": "qwen2-0.5b", "rollout_batch": 256, "rollout_prompt_len": 64, "rollout_new_tokens": 256,
            "prompts": 16, "samples": 8, "max_tokens": 256, "T": 8, "seed_ratio": 0.5, "micro_batch_size": 32}


def build_qwen2(spec: str, tokenizer, *, dtype=None, seed: int = 0):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, **SPECS[spec])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(cfg)
    if dtype is not None:
        model = model.to(dtype)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def qwen2_policy_builder(spec: str):
    """A ``policy_builder`` for ``trainer.train.train``: the Qwen2 model of ``spec`` (random init from a config,
    ignoring the configured model name) and the character tokenizer of ``inference.tiny``."""
    def build(model_name: str, *, dtype, seed: int):
        from inference.tiny import build_tokenizer
        tok = build_tokenizer()
        return build_qwen2(spec, tok, dtype=dtype, seed=seed), tok
    return build


def token_ids_sampler_builder(max_model_len: int):
    """A ``sampler_builder`` for ``trainer.train.train``: ``inference.make_sampler``, but vLLM is given no tokenizer
    (token ids in and out, ``skip_tokenizer_init``) and a ``max_model_len`` sized to the benchmark."""
    def build(model, tokenizer, *, engine: str = "hf", **kw):
        from inference import make_sampler
        if engine != "vllm":
            return make_sampler(model, tokenizer, engine=engine, **kw)
        return make_sampler(model, None, engine="vllm", eos_token_id=[tokenizer.eos_token_id],
                            pad_token_id=tokenizer.pad_token_id, max_model_len=max_model_len, **kw)
    return build


# ---------------------------------------------------------------------------------------------- children
def rollout_run(*, spec: str, batch: int, prompt_len: int, new_tokens: int, repeats: int, engines: list[str]) -> dict:
    """tokens/s of each engine (alternating) on the same prompts; EOS ignored."""
    import torch

    from inference.hf import HFSampler
    from inference.tiny import build_tokenizer
    from inference.vllm_engine import VLLMSampler

    tok = build_tokenizer()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = build_qwen2(spec, tok, dtype=dtype).to(device).eval()
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(4, 100, (batch, prompt_len), generator=g).tolist()
    samplers = {}
    if "hf" in engines:
        samplers["hf"] = HFSampler(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                   max_batch_size=batch, ignore_eos=True)
    if "vllm" in engines:
        path = tempfile.mkdtemp(prefix="bench_vllm_")
        model.save_pretrained(path)   # config + weights, no tokenizer files: vLLM skips its tokenizer
        samplers["vllm"] = VLLMSampler(model, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                       model_path=path, gpu_memory_utilization=0.5,
                                       max_model_len=prompt_len + new_tokens + 16, ignore_eos=True)
    out = {k: [] for k in samplers}
    for r in range(repeats + 1):   # round 0: warm-up
        for name, s in samplers.items():
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            comps = s.generate(prompts, max_new_tokens=new_tokens, temperature=1.0, seed=r)
            if device == "cuda":
                torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            n = sum(len(c.token_ids) for c in comps)
            if r:
                out[name].append(n / dt)
    return out


def cycle_run(*, spec: str, algorithm: str, engine: str, prompts: int, samples: int, max_tokens: int, T: int,
              seed_ratio: float, micro_batch_size: int, device: str = "auto", dtype: str = "bfloat16",
              master_dtype: str = "float32") -> dict:
    """2T trainer steps; the second refresh cycle's per-step times (the first is warm-up) and peak GPU memory."""
    import torch

    from perf.bench_trainer_vs_trl import ours_run
    over = {"algorithm": algorithm, "ignore_eos": True, "seed_refresh_interval": T, "seed_ratio": seed_ratio,
            "seed_rule": "ratio", "engine": engine, "dtype": dtype, "master_dtype": master_dtype,
            "micro_batch_size": micro_batch_size,
            "micro_batch_tokens": 0,
            "vllm_gpu_memory_utilization": 0.4}
    out = ours_run(size="2m", prompts=prompts, samples=samples, max_tokens=max_tokens, steps=2 * T, overrides=over,
                   device=device, policy_builder=qwen2_policy_builder(spec),
                   sampler_builder=token_ids_sampler_builder(max_model_len=64 + max_tokens))
    if not out:   # a non-zero torchrun rank
        return {}
    m = out["metrics"][T:]
    cuda = torch.cuda.is_available()
    return {"step_s": [x["time/step_s"] for x in m], "gen_s": [x["time/gen_s"] for x in m],
            "train_s": [x["time/train_s"] for x in m], "generated": [x["tokens/generated"] for x in m],
            "peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
            "peak_reserved_gb": torch.cuda.max_memory_reserved() / 1e9 if cuda else None}


# ---------------------------------------------------------------------------------------------- parent
def run(ctx) -> BenchResult:
    p = params_for(ctx)
    res = BenchResult(NAME, "vLLM rollout tokens/s, trainer step and seeded/on-policy step ratio at 0.5B (Qwen2 "
                      "architecture, random init); GPU only", params=p)
    import torch
    if not torch.cuda.is_available():
        res.skipped = "no CUDA GPU on this machine (this section runs only where torch.cuda.is_available())"
        return res
    n_gpus = torch.cuda.device_count()
    has_vllm = importlib.util.find_spec("vllm") is not None
    res.info.update({"gpus": n_gpus, "gpu": torch.cuda.get_device_name(0), "vllm_installed": has_vllm})
    reps = max(1, min(ctx.repeats, 3))

    # 1. rollout throughput
    engines = ["vllm", "hf"] if has_vllm else ["hf"]
    try:
        ro = call_in_subprocess("perf.bench_gpu:rollout_run",
                                {"spec": p["spec"], "batch": p["rollout_batch"], "prompt_len": p["rollout_prompt_len"],
                                 "new_tokens": p["rollout_new_tokens"], "repeats": reps, "engines": engines},
                                timeout=900)
        for name in engines:
            res.sides.append(Side(f"{name} rollout", "tokens/s", ro[name]))
        if has_vllm:
            res.info["vllm_over_hf_tokens_per_s"] = ratio(statistics.median(ro["vllm"]), statistics.median(ro["hf"]))
        else:
            res.info["vllm"] = "not installed: pip install thinking-seeds[vllm] for the vLLM numbers"
    except Exception as e:   # keep going: the trainer half is independent
        res.info["rollout_error"] = str(e)[-2000:]

    # 2. trainer step, seeds vs dapo
    distributed = n_gpus >= 2
    engine = "vllm" if has_vllm and not distributed else "hf"
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n_gpus}"]
                if distributed else None)
    res.info.update({"trainer_engine": engine, "trainer_world_size": n_gpus if distributed else 1,
                     "fsdp2": "sharded over GPUs" if distributed else "no-op at world size 1 (one GPU)"})
    outs = {"seeds": [], "dapo": []}
    kw = {k: p[k] for k in ("prompts", "samples", "max_tokens", "T", "seed_ratio", "micro_batch_size")}
    try:
        for _ in range(reps if reps < 3 else 2):   # a run is 2T steps plus engine start-up: at most 2 rounds
            for alg in ("seeds", "dapo"):
                o = call_in_subprocess("perf.bench_gpu:cycle_run",
                                       {**kw, "spec": p["spec"], "algorithm": alg, "engine": engine},
                                       timeout=1200, launcher=launcher)
                outs[alg].append(o)
                ctx.log(f"  gpu {alg}: {statistics.mean(o['step_s']):.3f} s/step, peak GPU memory "
                        f"{o['peak_allocated_gb']:.1f} GB allocated / {o['peak_reserved_gb']:.1f} GB reserved")
    except Exception as e:
        res.info["trainer_error"] = str(e)[-2000:]
    if outs["seeds"] and outs["dapo"]:
        s = Side("seeds step (cycle mean)", "s/step", [statistics.mean(o["step_s"]) for o in outs["seeds"]])
        d = Side("dapo step (cycle mean)", "s/step", [statistics.mean(o["step_s"]) for o in outs["dapo"]])
        res.sides += [s, d]
        for alg in ("seeds", "dapo"):
            for k in ("gen_s", "train_s"):
                res.sides.append(Side(f"{alg} {k}", "s/step", [statistics.mean(o[k]) for o in outs[alg]]))
            for k in ("peak_allocated_gb", "peak_reserved_gb"):
                res.sides.append(Side(f"{alg} {k}", "GB", [o[k] for o in outs[alg]]))
        res.checks.append(Check("seeds / dapo seconds per step (GPU)", ratio(s.median, d.median), "<=", TARGET_SEEDS,
                                "median of cycle means, second cycle"))
        res.info["token_ratio"] = ratio(sum(outs["seeds"][0]["generated"]), sum(outs["dapo"][0]["generated"]))
    return res
