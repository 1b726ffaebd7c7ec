"""Dynamic sampling in one round (``oversample``, trainer/sampling.py): extra rounds and seconds per step at a 50 %
keep rate, auto-sized rounds vs one prompt per missing group.

Short ``trainer.train`` runs of a fresh tiny model with dynamic sampling on and a grader that makes about half the
groups verdict-mixed whatever the policy learns (``half_mixed``: a prompt whose id hashes odd is never solved, the
others' responses are right when their text hashes even; with 8 samples 99 % of those groups are mixed), so the
keep rate stays near 0.5 for the whole run. Sides, alternated in fresh interpreters: ``oversample=0`` (auto, the
default), ``oversample=1`` (the refills before it: one prompt per missing group) and ``oversample=3`` (verl's DAPO
recipe), all with ``max_sampling_rounds=10`` (the paper presets'). A sample is a run's mean ``time/step_s`` over
its steps after the first; the rounds, rows and unused share are read from every step's metrics.

On a CPU a round's cost grows with its rows (the tiny model decodes compute-bound), so the seconds here say little
about a GPU, where a round waits for its longest response and one round of 2.6x the rows costs about one round of
1x; the rounds per step are what carries over.

Target: auto averages <= 1.5 rounds per step, <= 0.5 extra rounds (oversample=1: about one more per halving of the
missing count).
"""

from __future__ import annotations

import statistics
import zlib

from perf.common import BenchResult, Check, Side, alternate, call_in_subprocess

NAME = "dynamic_sampling"
TARGET_ROUNDS = 1.5   # rounds per step: at most 0.5 extra rounds
FACTORS = {"auto": 0, "oversample=1": 1, "oversample=3": 3}


def half_mixed(response: str, example: dict) -> bool:
    """A ``reward_fn`` that keeps about half the groups verdict-mixed, whatever the policy (module docstring)."""
    return zlib.crc32(str(example["id"]).encode()) % 2 == 0 and zlib.crc32(response.encode()) % 2 == 0


def params_for(ctx) -> dict:
    if ctx.quick:
        return {"size": "1m", "prompts": 4, "samples": 8, "max_tokens": 6, "steps": 3}
    return {"size": "2m", "prompts": 16, "samples": 8, "max_tokens": 32, "steps": 8}


def sampling_run(*, oversample: float, size: str, prompts: int, samples: int, max_tokens: int, steps: int) -> dict:
    """One run; per step its rounds, rows, unused share and seconds (the first step's seconds left out)."""
    from perf.bench_trainer_vs_trl import ours_run
    over = {"dynamic_sampling": True, "oversample": oversample, "max_sampling_rounds": 10,
            "reward_fn": f"{__name__}:half_mixed", "num_train_examples": 4000}
    out = ours_run(size=size, prompts=prompts, samples=samples, max_tokens=max_tokens, steps=steps, lr=1e-4,
                   overrides=over)
    m = out["metrics"]
    return {"rounds": [1 + x["sampling/extra_rounds"] for x in m],
            "unused_share": [x["sampling/unused_share"] for x in m],
            "keep_rate": m[-1]["sampling/keep_rate"], "generated": [x["tokens/generated"] for x in m],
            "step_s": out["step_s"], "gen_s": out["gen_s"]}


def run(ctx) -> BenchResult:
    p = params_for(ctx)
    res = BenchResult(NAME, f"dynamic sampling at a 50 % keep rate ({p['prompts']} prompts x {p['samples']}): extra "
                      f"rounds per step, auto-sized rounds vs one prompt per missing group; target auto <= "
                      f"{TARGET_ROUNDS:g} rounds per step", params=p)
    outs: dict[str, list[dict]] = {name: [] for name in FACTORS}

    def side(name):
        def f():
            kw = {**p, "oversample": FACTORS[name]}
            o = (call_in_subprocess(f"{__name__}:sampling_run", kw, threads=ctx.threads) if ctx.isolate
                 else sampling_run(**kw))
            outs[name].append(o)
            return statistics.mean(o["step_s"])
        return f

    res.sides = alternate({name: side(name) for name in FACTORS}, units="s/step (run mean)", repeats=ctx.repeats,
                          warmup=0, log=ctx.log)
    for name in FACTORS:
        runs = outs[name]
        res.sides.append(Side(f"{name} rounds", "rounds/step", [x for o in runs for x in o["rounds"]]))
        res.sides.append(Side(f"{name} gen_s", "s/step", [statistics.mean(o["gen_s"]) for o in runs]))
        res.info[f"{name}_rounds_per_step"] = statistics.mean(x for o in runs for x in o["rounds"])
        res.info[f"{name}_unused_share"] = statistics.mean(x for o in runs for x in o["unused_share"])
        res.info[f"{name}_generated_tokens_per_step"] = statistics.mean(x for o in runs for x in o["generated"])
        res.info[f"{name}_final_keep_rate"] = statistics.mean(o["keep_rate"] for o in runs)
    res.checks.append(Check("auto: rounds per step", res.info["auto_rounds_per_step"], "<=", TARGET_ROUNDS,
                            "mean over every step of every run (oversample=1: "
                            f"{res.info['oversample=1_rounds_per_step']:.2f})"))
    return res
