"""Thinking Seeds' cost per step vs on-policy DAPO (docs/method.md "Cost"): wall-clock and generated tokens.

Two short ``trainer.train`` runs with identical settings except ``algorithm`` (``seeds``: ratio rule 0.5, refresh
interval T = 8, state+action loss; ``dapo``: on-policy), both with ``ignore_eos=true`` (every response is sampled
to the budget, so token counts are exact) and ``dynamic_sampling=false`` (no data-dependent extra rounds).
Each run covers exactly one refresh cycle (T steps, the refresh step included) after a one-step warm-up run in
the same interpreter (imports, thread pools, allocator); a sample is the mean ``time/step_s`` over the cycle.
Both sides decode up to ``rollout_batch_size = T * B * G`` rows together: the refresh writes T batches in one
generation, which a user gives the engine at once (on-policy steps have B * G rows, so it changes nothing there).
Runs alternate seeds / seeds with ``behavior_logprobs=sampler`` / seeds with ``seed_loss=state`` / dapo in fresh
interpreters: the default seeded side (``seed_loss=state+action``, which reads pi_b on seed tokens) scores the
refresh's cached batches with one no-grad trainer forward (exact; docs/method.md); the second takes the behavior
log-probs and entropies from the sampler while it decodes (no extra forward); the third masks the seed tokens out of
the loss, so nothing reads pi_b and the refresh runs no forward at all (``trainer.rollout.behavior_forward_reason``;
the update computes the same tokens either way).

Targets: seeded / on-policy seconds per step <= 1.10 while generated tokens grow by
``token_factor(0.5, 8) = 1 + (1 - ratio)(T - 1)/T = 1.4375``.
"""

from __future__ import annotations

import statistics
import time

from perf.common import BenchResult, Check, Side, alternate, call_in_subprocess, ratio

NAME = "seeds_overhead"
TARGET = 1.10


def params_for(ctx) -> dict:
    if ctx.quick:
        return {"size": "1m", "prompts": 2, "samples": 2, "max_tokens": 8, "T": 2, "seed_ratio": 0.5}
    return {"size": "2m", "prompts": 16, "samples": 8, "max_tokens": 32, "T": 8, "seed_ratio": 0.5}


def cycle_run(*, algorithm: str, size: str, prompts: int, samples: int, max_tokens: int, T: int,
              seed_ratio: float, behavior_logprobs: str = "trainer", seed_loss: str = "state+action") -> dict:
    """Warm up with a one-step run, then run one refresh cycle (T steps); per-step time and tokens, and the time
    spent in the no-grad behavior forward of the refresh (the trainer's ``time/behavior_s`` metric)."""
    from perf.bench_trainer_vs_trl import ours_run

    over = {"algorithm": algorithm, "ignore_eos": True, "seed_refresh_interval": T, "seed_ratio": seed_ratio,
            "seed_rule": "ratio", "seed_loss": seed_loss, "behavior_logprobs": behavior_logprobs,
            "rollout_batch_size": T * prompts * samples}
    kw = dict(size=size, prompts=prompts, samples=samples, max_tokens=max_tokens, overrides=over)
    ours_run(steps=1, **kw)   # warm-up (not measured)
    cpu0 = time.process_time()
    out = ours_run(steps=T, **kw)
    cpu_s = time.process_time() - cpu0   # the process's CPU seconds (all threads): what a loaded machine leaves stable
    m = out["metrics"]
    return {"cpu_s_per_step": cpu_s / T, "step_s": [x["time/step_s"] for x in m], "gen_s": [x["time/gen_s"] for x in m],
            "train_s": [x["time/train_s"] for x in m], "generated": [x["tokens/generated"] for x in m],
            "token_factor": m[-1].get("seeds/token_factor"), "behavior_score_s": sum(x["time/behavior_s"] for x in m)}


def run(ctx) -> BenchResult:
    from trainer.algos import token_factor
    p = params_for(ctx)
    factor = token_factor(p["seed_ratio"], p["T"])
    res = BenchResult(NAME, f"seeded (ratio {p['seed_ratio']}, T {p['T']}) vs on-policy: seconds per step over one "
                      f"refresh cycle; target <= {TARGET:g}x at {factor:.4g}x generated tokens", params=p)
    outs: dict[str, list[dict]] = {"seeds": [], "seeds_sampler_logprobs": [], "seeds_state": [], "dapo": []}

    def side(name, alg, behavior="trainer", seed_loss="state+action"):
        def f():
            kw = {**p, "algorithm": alg, "behavior_logprobs": behavior, "seed_loss": seed_loss}
            if ctx.isolate:
                o = call_in_subprocess("perf.bench_seeds_overhead:cycle_run", kw, threads=ctx.threads)
            else:
                o = cycle_run(**kw)
            outs[name].append(o)
            return statistics.mean(o["step_s"])
        return f

    s_seeds, s_sampler, s_state, s_dapo = alternate(
        {"seeds": side("seeds", "seeds"),
         "seeds, behavior_logprobs=sampler": side("seeds_sampler_logprobs", "seeds", "sampler"),
         "seeds, seed_loss=state (no behavior forward)": side("seeds_state", "seeds", seed_loss="state"),
         "dapo": side("dapo", "dapo")},
        units="s/step (cycle mean)", repeats=ctx.repeats, warmup=0, log=ctx.log)
    res.sides = [s_seeds, s_sampler, s_state, s_dapo]
    for alg in ("seeds", "seeds_sampler_logprobs", "seeds_state", "dapo"):
        for k in ("gen_s", "train_s"):
            res.sides.append(Side(f"{alg} {k} (cycle mean)", "s/step",
                                  [statistics.mean(o[k]) for o in outs[alg]]))
    tok_s = sum(outs["seeds"][0]["generated"])
    tok_d = sum(outs["dapo"][0]["generated"])
    res.checks.append(Check("seeds / dapo seconds per step", ratio(s_seeds.median, s_dapo.median), "<=", TARGET,
                            "median of per-run cycle means; behavior log-probs from a trainer forward (default)"))
    res.checks.append(Check("seeds (behavior_logprobs=sampler) / dapo seconds per step",
                            ratio(s_sampler.median, s_dapo.median), "<=", TARGET,
                            "median of per-run cycle means; behavior log-probs from the sampler, no extra forward"))
    res.checks.append(Check("seeds (seed_loss=state) / dapo seconds per step", ratio(s_state.median, s_dapo.median),
                            "<=", TARGET, "median of per-run cycle means; nothing reads pi_b: no refresh forward"))
    tok_ratio = ratio(tok_s, tok_d)
    res.checks.append(Check("generated-token ratio: |measured / token_factor - 1|", abs(tok_ratio / factor - 1), "<=",
                            0.01, f"tokens/generated over the cycle, seeds / dapo = {tok_ratio:.4g}; "
                            f"token_factor = {factor:.4g}"))
    first = outs["seeds"][0]
    score = statistics.median(o["behavior_score_s"] for o in outs["seeds"]) / p["T"]
    res.info["seeds_behavior_forward_s_per_step"] = score
    res.info["seeds_over_dapo_without_behavior_forward"] = ratio(s_seeds.median - score, s_dapo.median)
    res.info["seeds_state_behavior_forward_s"] = max(o["behavior_score_s"] for o in outs["seeds_state"])   # 0: skipped
    # CPU seconds per step (median over runs): on a shared machine the wall clock carries the others' load, the
    # process's CPU time much less so (with 1 thread per side nothing spins)
    cpu = {k: statistics.median(o["cpu_s_per_step"] for o in v) for k, v in outs.items()}
    res.info.update({f"{k}_cpu_s_per_step": v for k, v in cpu.items()})
    res.info.update({f"{k}_over_dapo_cpu": ratio(cpu[k], cpu["dapo"]) for k in cpu if k != "dapo"})
    res.info.update({"token_ratio_measured": tok_ratio, "token_factor_formula": factor, "tokens_seeds_cycle": tok_s,
                     "tokens_dapo_cycle": tok_d,
                     "seeds_token_factor_metric": first["token_factor"],
                     "seeds_refresh_step_s_median": statistics.median(o["step_s"][0] for o in outs["seeds"]),
                     "seeds_refresh_gen_s_median": statistics.median(o["gen_s"][0] for o in outs["seeds"]),
                     "seeds_later_gen_s_median": statistics.median(x for o in outs["seeds"] for x in o["gen_s"][1:]),
                     "dapo_gen_s_median": statistics.median(x for o in outs["dapo"] for x in o["gen_s"]),
                     "seeds_later_step_s_median": statistics.median(x for o in outs["seeds"] for x in o["step_s"][1:]),
                     "dapo_step_s_median": statistics.median(x for o in outs["dapo"] for x in o["step_s"])})
    return res
