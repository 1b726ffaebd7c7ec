"""One optimizer step of our trainer vs TRL's GRPOTrainer on the same tiny Llama, prompts and DAPO settings.

Both sides: ``inference.tiny`` model (same size and init seed), the embedded addition task, B prompts x G samples,
at most ``max_tokens`` completion tokens, temperature 1, DAPO token-mean loss with clip 0.2 / 0.28, no KL and no
reference model, one optimizer update per generation batch, fp32 on CPU with 2 threads. TRL computes the update
in one forward/backward over all B*G rows (``per_device_train_batch_size = B*G``); ours runs its default
padding-free forward (``train_forward=auto``: each prompt once, no padding) over micro-batches of at most 2048 of
those tokens (``micro_batch_size = B*G``, ``micro_batch_tokens = 2048``: same gradient), the setting a user would
pick.
TRL: ``loss_type="dapo"``, ``beta=0``, ``epsilon_high=0.28``, ``bf16=False``, activation checkpointing off (its
default is on), generation through ``model.generate``. Ours: ``trainer.train.train`` with dynamic sampling off
(TRL has none) and no rollout records (TRL writes none).

A sample is the wall-clock between the ends of two consecutive optimizer steps, read inside each run (TRL: a
``TrainerCallback.on_step_end``; ours: each ``metrics.jsonl`` append), so the first step of every run (warm-up)
and the set-up are never timed. Runs alternate ours, TRL, ours, TRL in fresh interpreters.

Roofline: a large fp32 matmul gives the achievable FLOP/s; a step's FLOPs are estimated as
6 * params * (tokens through forward+backward) + 2 * params * (prompt + generated tokens of the rollout), counting
every row's prompt: the nominal work of the step, which the flat forward and prefill do with fewer FLOPs (each
prompt once), so their "share" is of that nominal work.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from perf.common import BenchResult, Check, Side, call_in_subprocess, matmul_flops, ratio

NAME = "trainer_vs_trl"
TARGET = 0.7   # ours <= 0.7 x TRL's median seconds per step


def params_for(ctx) -> dict:
    if ctx.quick:
        return {"size": "1m", "prompts": 2, "samples": 2, "max_tokens": 8, "steps": 2, "lr": 1e-6}
    return {"size": "2m", "prompts": 16, "samples": 8, "max_tokens": 32, "steps": 4, "lr": 1e-6}


# ---------------------------------------------------------------------------------------------- ours (child)
def ours_run(*, size: str, prompts: int, samples: int, max_tokens: int, steps: int, lr: float = 1e-6, seed: int = 0,
             overrides: dict | None = None, device: str = "cpu", micro_batch_tokens: int = 2048,
             policy_builder=None, sampler_builder=None) -> dict:
    """``trainer.train.train`` for ``steps`` steps; per-step wall-clock between metrics appends (first step not
    timed) plus the trainer's own ``time/*`` metrics and token counts. ``device="cpu"`` forces the CPU even where
    CUDA exists; ``"auto"`` takes what ``init_distributed`` picks (a GPU, a torchrun rank). ``policy_builder`` and
    ``sampler_builder`` go to ``train`` (the GPU benchmark's Qwen2 model built from a config)."""
    from trainer.config import load_config
    from trainer.fsdp import Dist, init_distributed
    from trainer.train import train

    stamps: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench_ours_") as tmp:
        values = {"output_dir": tmp, "run_name": "bench", "model": f"tiny:{size}", "task": "addition",
                  "prompts_per_step": prompts, "samples_per_prompt": samples, "max_response_tokens": max_tokens,
                  "micro_batch_size": prompts * samples, "micro_batch_tokens": micro_batch_tokens,
                  "total_steps": steps, "lr": lr, "seed": seed,
                  "dynamic_sampling": False, "log_rollouts": False, "save_every": 0, "progress": False,
                  "resume": "never", "dtype": "float32"}
        values.update(overrides or {})
        cfg = load_config(None, values)
        d = Dist() if device == "cpu" else init_distributed()   # auto: one GPU, or a torchrun rank (FSDP2)
        # the end of a step, as the trainer sees it: right after its metrics line is written
        run_dir = train(cfg, d, policy_builder=policy_builder, sampler_builder=sampler_builder,
                        on_step=lambda _metrics: stamps.append(time.perf_counter()))
        if not d.is_main:
            return {}
        metrics = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    from scoring.tasks import get_task
    exs = get_task("addition").make_examples(cfg.num_train_examples, seed=seed, **cfg.task_kwargs)
    prompt_len = statistics.mean(len(e["prompt"]) for e in exs)   # one token per character (tiny tokenizer)
    return {
        "wall_s": [b - a for a, b in zip(stamps, stamps[1:])],
        "step_s": [m["time/step_s"] for m in metrics[1:]], "gen_s": [m["time/gen_s"] for m in metrics[1:]],
        "train_s": [m["time/train_s"] for m in metrics[1:]],
        "generated": [m["tokens/generated"] for m in metrics[1:]],
        "len_mean": [m["response/len_mean"] for m in metrics[1:]],
        "prompt_len": prompt_len, "metrics": metrics,
    }


# ---------------------------------------------------------------------------------------------- TRL (child)
def _addition_reward(completions, answer, **_):
    from scoring.tasks import get_task
    task = get_task("addition")
    return [task.reward(c, {"answer": a}) for c, a in zip(completions, answer)]


def trl_run(*, size: str, prompts: int, samples: int, max_tokens: int, steps: int, lr: float = 1e-6,
            seed: int = 0) -> dict:
    """TRL's GRPOTrainer on the same model and task for ``steps`` steps; wall-clock between step ends."""
    import logging
    import warnings

    import datasets
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from scoring.tasks import get_task
    from inference.tiny import build_model, build_tokenizer

    warnings.filterwarnings("ignore")
    logging.getLogger("trl").setLevel(logging.ERROR)
    datasets.disable_progress_bars()
    tok = build_tokenizer()
    model = build_model(size, tok, seed=seed)
    exs = get_task("addition").make_examples(max(64, 4 * prompts * steps), seed=seed)
    ds = datasets.Dataset.from_list([{"prompt": e["prompt"], "answer": e["answer"]} for e in exs])
    stamps: list[float] = []
    lengths: list[float] = []

    class Stamp(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                lengths.append(float(logs["completions/mean_length"]))

    with tempfile.TemporaryDirectory(prefix="bench_trl_") as tmp:
        args = GRPOConfig(
            output_dir=tmp, use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no",
            logging_steps=1, disable_tqdm=True, seed=seed, max_steps=steps, learning_rate=lr,
            lr_scheduler_type="constant", per_device_train_batch_size=prompts * samples,
            gradient_accumulation_steps=1, num_generations=samples, max_completion_length=max_tokens,
            temperature=1.0, top_p=1.0, loss_type="dapo", beta=0.0, epsilon=0.2, epsilon_high=0.28,
            scale_rewards="group", gradient_checkpointing=False, dataloader_num_workers=0, max_grad_norm=1.0,
            weight_decay=0.0,   # optim: TRL's default (adamw_torch_fused)
        )
        trainer = GRPOTrainer(model=model, reward_funcs=_addition_reward, args=args, train_dataset=ds,
                              processing_class=tok, callbacks=[Stamp()])
        trainer.train()
    prompt_len = statistics.mean(len(e["prompt"]) for e in exs)
    return {"wall_s": [b - a for a, b in zip(stamps, stamps[1:])], "len_mean": lengths[1:],
            "prompt_len": prompt_len}


# ---------------------------------------------------------------------------------------------- parent
def _side_fn(target: str, kw: dict, store: list, ctx):
    def run():
        if ctx.isolate:
            out = call_in_subprocess(target, kw, threads=ctx.threads)
        else:
            import importlib
            mod, fn = target.split(":")
            out = getattr(importlib.import_module(mod), fn)(**kw)
        store.append(out)
        return out["wall_s"]
    return run


def run(ctx) -> BenchResult:
    import importlib.util

    from perf.common import alternate
    p = params_for(ctx)
    res = BenchResult(NAME, "one optimizer step (generate + reward + advantage + update), ours vs TRL GRPOTrainer, "
                      f"seconds per step; target ours <= {TARGET} x TRL", params=p)
    if importlib.util.find_spec("trl") is None:
        res.skipped = "TRL is not installed: pip install -e '.[bench]' (with the same torch pin as the install)"
        return res
    ours_out, trl_out = [], []
    sides = alternate({"ours": _side_fn("perf.bench_trainer_vs_trl:ours_run", p, ours_out, ctx),
                       "trl": _side_fn("perf.bench_trainer_vs_trl:trl_run", p, trl_out, ctx)},
                      units="s/step", repeats=ctx.repeats, warmup=0, log=ctx.log)
    res.sides = sides
    ours, trl = sides
    res.checks.append(Check("ours / TRL seconds per step", ratio(ours.median, trl.median), "<=", TARGET,
                            "median ours / median TRL (wall-clock between step ends)"))
    # bursts of load multiply single steps; the best steps of each side are the contention-robust cross-check
    res.info["ours_over_trl_min"] = ratio(ours.min, trl.min)
    # the trainer's own split of a step (generation vs update), and token counts of both sides
    gen = [x for o in ours_out for x in o["gen_s"]]
    train_s = [x for o in ours_out for x in o["train_s"]]
    step_s = [x for o in ours_out for x in o["step_s"]]
    res.sides.append(Side("ours time/step_s", "s/step", step_s))
    res.sides.append(Side("ours time/gen_s", "s/step", gen))
    res.sides.append(Side("ours time/train_s", "s/step", train_s))
    ours_len = statistics.mean(x for o in ours_out for x in o["len_mean"])
    trl_lens = [x for o in trl_out for x in o["len_mean"]]
    res.info["ours_mean_completion_tokens"] = ours_len
    res.info["trl_mean_completion_tokens"] = statistics.mean(trl_lens) if trl_lens else float("nan")
    # roofline share of our step
    from inference.tiny import build_model, build_tokenizer, num_parameters
    n_params = num_parameters(build_model(p["size"], build_tokenizer()))
    n_rows = p["prompts"] * p["samples"]
    prompt_tokens = n_rows * ours_out[0]["prompt_len"]
    gen_tokens = n_rows * ours_len
    flops = 6 * n_params * (prompt_tokens + gen_tokens) + 2 * n_params * (prompt_tokens + gen_tokens)
    peak = matmul_flops(512 if ctx.quick else 2048)
    res.info.update({"params": n_params, "step_gflop_estimate": flops / 1e9, "matmul_gflops": peak / 1e9,
                     "ours_achieved_gflops": flops / ours.median / 1e9 if ours.median else float("nan"),
                     "ours_roofline_share": ratio(flops / ours.median, peak),
                     "trl_roofline_share": ratio(flops / trl.median, peak)})
    return res
