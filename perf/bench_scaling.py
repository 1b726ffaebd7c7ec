"""How the cost grows: trainer step pieces vs prompts, samples and response length; the sampler vs batch and
length; the graders vs items and test cases per call. Tables (and ``scaling.png``) for predicting cost.

- Trainer: for each (B prompts, G samples, L response tokens) the two halves of a step on the same tiny model,
  timed separately: generation (``HFSampler``, EOS ignored, B*G rows of exactly L tokens) and the update
  (``trainer.update.update``: forward, DAPO loss, backward, AdamW step over the B*G rows as one micro-batch).
  A least-squares line ``seconds = a + b * tokens`` per half gives the per-token cost.
- Sampler: tokens/s vs batch rows and new tokens.
- Graders: math answers/s vs number of answers (pool of one worker per core); sandbox executions/s vs test cases
  per sandbox call (the per-call start-up is amortised over the cases).
Each cell is the best (minimum) of ``repeats`` runs after ``warmup`` — on a shared machine the load comes in bursts
that multiply a run's time, so the minimum is the estimate of the cost itself; the trainer table also gives the
medians.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from perf.common import BenchResult, set_threads

NAME = "scaling"


def params_for(ctx) -> dict:
    if ctx.quick:
        return {"size": "1m", "trainer_grid": [(2, 2, 8), (2, 4, 8), (2, 2, 16)], "sampler_grid": [(8, 8), (16, 8)],
                "math_items": [8, 16], "cases_per_call": [1, 2], "repeats_cap": 1}
    return {"size": "2m",
            "trainer_grid": [(4, 8, 32), (8, 8, 32), (16, 8, 32), (32, 8, 32),     # prompts
                             (16, 4, 32), (16, 16, 32),                           # samples per prompt
                             (16, 8, 16), (16, 8, 64)],                           # response length
            "sampler_grid": [(32, 32), (128, 32), (256, 32), (128, 16), (128, 64), (128, 128)],
            "math_items": [64, 256], "cases_per_call": [1, 4, 16], "repeats_cap": 2}


def _times(fn, repeats: int, warmup: int) -> tuple[float, float]:
    """(best, median) seconds of ``repeats`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts), statistics.median(ts)


def trainer_rows(p: dict, ctx) -> list[dict]:
    import torch

    from perf.bench_sampler_vs_generate import make_hf_sampler
    from trainer.config import load_config
    from trainer.fsdp import Dist
    from trainer.rollout import Rollout
    from scoring.tasks import get_task
    from inference.tiny import build_model, build_tokenizer
    from trainer.update import assign_advantages, make_scheduler, update

    tok = build_tokenizer()
    model = build_model(p["size"], tok, seed=0)
    sampler = make_hf_sampler(model, tok, max_batch_size=1024)
    exs = get_task("addition").make_examples(64, seed=0)
    prompt_ids = [tok(e["prompt"], add_special_tokens=False)["input_ids"] for e in exs]
    reps = min(ctx.repeats, p["repeats_cap"])
    rows_out = []
    for B, G, L in p["trainer_grid"]:
        cfg = load_config(None, {"prompts_per_step": B, "samples_per_prompt": G, "max_response_tokens": L,
                                 "micro_batch_size": B * G, "lr": 1e-6, "model": f"tiny:{p['size']}"})
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        scheduler = make_scheduler(optimizer, cfg)
        prompts = [prompt_ids[i % len(prompt_ids)] for i in range(B) for _ in range(G)]
        state = {}

        def gen():
            state["comps"] = sampler.generate(prompts, max_new_tokens=L, temperature=1.0, seed=1)

        gen_s, gen_med = _times(gen, reps, ctx.warmup)
        rows = [Rollout(example_idx=i // G, prompt_id=str(i // G), group=i // G, sample_idx=i % G,
                        prompt_ids=list(pr), response_ids=list(c.token_ids), finish_reason=c.finish_reason,
                        reward=float(np.random.default_rng(i).integers(0, 2)))
                for i, (pr, c) in enumerate(zip(prompts, state["comps"]))]
        assign_advantages(rows, cfg)
        model.train()
        upd_s, upd_med = _times(lambda: update(model, optimizer, scheduler, cfg, rows, Dist(), pad_id=tok.pad_token_id),
                                reps, ctx.warmup)
        gen_tokens = B * G * L
        trained_tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in rows)
        rows_out.append({"prompts": B, "samples": G, "resp_tokens": L, "rows": B * G, "gen_tokens": gen_tokens,
                         "gen_s": gen_s, "update_s": upd_s, "step_s": gen_s + upd_s,
                         "gen_tok_per_s": gen_tokens / gen_s, "update_tok_per_s": trained_tokens / upd_s,
                         "gen_s_median": gen_med, "update_s_median": upd_med})
        ctx.log(f"  trainer B={B} G={G} L={L}: gen {gen_s:.3f} s, update {upd_s:.3f} s")
    return rows_out


def sampler_rows(p: dict, ctx) -> list[dict]:
    from perf.bench_sampler_vs_generate import make_hf_sampler
    from scoring.tasks import get_task
    from inference.tiny import build_model, build_tokenizer

    tok = build_tokenizer()
    model = build_model(p["size"], tok, seed=0).eval()
    sampler = make_hf_sampler(model, tok, max_batch_size=1024)
    exs = get_task("addition").make_examples(512, seed=0)
    prompt_ids = [tok(e["prompt"], add_special_tokens=False)["input_ids"] for e in exs]
    reps = min(ctx.repeats, p["repeats_cap"])
    out = []
    for batch, n_new in p["sampler_grid"]:
        prompts = prompt_ids[:batch]
        s, _ = _times(lambda: sampler.generate(prompts, max_new_tokens=n_new, temperature=1.0, seed=0), reps,
                      ctx.warmup)
        out.append({"batch": batch, "new_tokens": n_new, "seconds": s, "tokens_per_s": batch * n_new / s})
        ctx.log(f"  sampler batch={batch} new={n_new}: {batch * n_new / s:.0f} tokens/s")
    return out


def grader_rows(p: dict, ctx) -> list[dict]:
    from perf.bench_graders import _PROGRAM, math_items
    from scoring.grading import grade_math_many
    from scoring.pool import WorkerPool, default_workers, math_item
    from scoring.sandbox import run_cases, run_many

    workers = default_workers()
    reps = min(ctx.repeats, p["repeats_cap"])
    out = []
    with WorkerPool(math_item, workers=workers, timeout=10.0) as pool:
        grade_math_many(math_items(2 * workers), pool=pool)
        for n in p["math_items"]:
            items = math_items(n)
            s, _ = _times(lambda: grade_math_many(items, pool=pool), reps, 0)
            out.append({"grader": "math (pool)", "items": n, "per_call": "", "seconds": s, "per_s": n / s})
    for k in p["cases_per_call"]:
        calls = 2 * workers
        cases = [[f"{i} {j}" for j in range(k)] for i in range(calls)]
        jobs = [lambda c=c: run_cases(_PROGRAM, c) for c in cases]
        s, _ = _times(lambda: run_many(jobs, workers=workers), reps, ctx.warmup)
        out.append({"grader": "sandbox executions", "items": calls * k, "per_call": k, "seconds": s,
                    "per_s": calls * k / s})
    for r in out:
        ctx.log(f"  {r['grader']} items={r['items']} per_call={r['per_call']}: {r['per_s']:.1f}/s")
    return out


def _fit(x, y) -> tuple[float, float]:
    """Least squares y = a + b x."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    A = np.stack([np.ones_like(x), x], 1)
    (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(a), float(b)


def _plot(res: BenchResult, out_dir) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    tr = res.tables["trainer step vs B, G, L"]
    x = [r["gen_tokens"] for r in tr]
    axes[0].scatter(x, [r["gen_s"] for r in tr], label="generation")
    axes[0].scatter(x, [r["update_s"] for r in tr], label="update")
    axes[0].set(xlabel="generated tokens per step (B*G*L)", ylabel="seconds", title="trainer step")
    axes[0].legend()
    sm = res.tables["sampler"]
    for n_new in sorted({r["new_tokens"] for r in sm}):
        rr = [r for r in sm if r["new_tokens"] == n_new]
        axes[1].plot([r["batch"] for r in rr], [r["tokens_per_s"] for r in rr], "o-", label=f"{n_new} new tokens")
    axes[1].set(xlabel="batch rows", ylabel="tokens/s", title="HFSampler")
    axes[1].legend()
    gr = [r for r in res.tables["graders"] if r["grader"] == "sandbox executions"]
    axes[2].plot([r["per_call"] for r in gr], [r["per_s"] for r in gr], "o-")
    axes[2].set(xlabel="test cases per sandbox call", ylabel="executions/s", title="code sandbox")
    fig.tight_layout()
    path = out_dir / "scaling.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def run(ctx) -> BenchResult:
    set_threads(ctx.threads)
    p = params_for(ctx)
    res = BenchResult(NAME, "cost vs batch, samples, length (trainer halves), batch and length (sampler), items "
                      "and cases per call (graders); best of repeats", params={k: v for k, v in p.items()})
    tr = trainer_rows(p, ctx)
    res.tables["trainer step vs B, G, L"] = tr
    res.tables["sampler"] = sampler_rows(p, ctx)
    res.tables["graders"] = grader_rows(p, ctx)
    ga, gb = _fit([r["gen_tokens"] for r in tr], [r["gen_s"] for r in tr])
    ua, ub = _fit([r["gen_tokens"] for r in tr], [r["update_s"] for r in tr])
    res.info.update({"gen_s_intercept": ga, "gen_ms_per_1k_tokens": gb * 1e6,
                     "update_s_intercept": ua, "update_ms_per_1k_tokens": ub * 1e6})
    if ctx.out is not None:
        path = _plot(res, ctx.out)
        if path:
            res.files.append(path)
    return res
