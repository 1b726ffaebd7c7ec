"""The paper's premise in miniature (issue #16): ``python -m demo --premise`` / ``python -m demo.premise``.

Section 3 of the paper rests on one observation: as on-policy RL sharpens the policy, reasoning states that
earlier checkpoints reached disappear, so the final checkpoint's pass@k at large k falls while its pass@1
rises, and a relay (an early checkpoint writes the first half of a response, the final one continues) has a
higher pass@k than the final checkpoint alone at large k (Figure 2). This module builds the CPU regime where
that can be looked for, measures it, and writes ``docs/premise.md`` from the cached tables:

    data      -> countdown problems with several valid solution paths (``scoring.tasks.countdown``, difficulty
                 in ``PremiseBudget``): a warm-up pool, an RL pool and a held-out split, decontaminated by prompt
    warm-up   -> supervised warm-up on ONE solver trace per problem drawn at random among its solutions, so the
                 warm-up's policy spreads over several paths (``trainer.sft``)
    train     -> one ``trainer.train`` run per (method, training seed) from the warm-up (``demo.pipeline``'s
                 ``run_config`` / ``train_run``: presets ``trainer/configs/mini_*.yaml``); on-policy seed 0 keeps
                 the checkpoint at ``early_step`` (the relay's and the curves' "early" model)
    eval      -> ``eval.run.run_eval`` on the held-out split with n samples per problem (pass@k for k <= n,
                 the unbiased estimator of ``contracts.passk``), every model
    analysis  -> pass@k-vs-k of warm-up / early / final with bootstrap intervals over problems, the crossover k
                 (where final − warm-up turns non-positive) with a bootstrap interval, distinct correct
                 solutions per problem, per-position entropy of the on-policy rollouts over training, the
                 methods table (pass@1 and pass@large-k, mean ± t-interval over training seeds)
    relay     -> ``tsanalysis.relay.run_relay`` (early -> final of on-policy seed 0, cut 0.5, n per problem)
    figures   -> ``figures.premise`` (curves, entropy) and ``figures.fig2_relay`` (relay), from the cached tables
    page      -> ``docs/premise.md`` (numbers, figures copied under ``docs/premise/``, the grid searched)

Everything is cached under the output folder (default ``runs/premise``): finished runs, graded problems,
relay problems and analysis tables are skipped on a rerun, so an interrupted regime resumes where it stopped.
``tables/`` holds the CSV/JSON files the figures and the notebook read.

The grid that was searched to choose ``PREMISE`` is ``demo.premise_search`` (its cached results are in
``docs/premise.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from contracts.passk import bootstrap_ci, paired_bootstrap, pass_at_k
from demo.miniature import t_interval
from demo.pipeline import (REPO, DemoError, RunSpec, Timings, _seeded, auto_threads, machine, read_metrics,
                           run_config, train_run)
from contracts.passk import k_grid
from tsanalysis.io import atomic_write_text

Log = Callable[[str], None]
MARKER = "premise.json"    # the budget the output folder was made with (guards --fresh and mixed budgets)
HELDOUT_SEED = 10_000      # the held-out split (as eval.benchmarks.tasks), generated at the budget's difficulty
WARMUP_SEED = 7919         # the supervised pool
TRAIN_SEED = 1             # the RL prompt pool
N_BOOT = 2000


# ------------------------------------------------------------------------------------------------------------
# sizes
# ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PremiseBudget:
    """Sizes of one premise regime (every RL run gets the same steps, batch, budget, lr and temperature)."""

    name: str
    # task: countdown with exactly `numbers` numbers in [1, max_number], targets in [min_target, max_target]
    numbers: int = 3
    max_number: int = 10
    min_target: int = 1
    max_target: int = 30
    # warm-up
    model_size: str = "1m"
    warmup_pool: int = 20000
    warmup_steps: int = 400        # supervised steps at most (batch 64, cosine)
    warmup_lr: float = 3e-3
    warmup_stop_loss: float = 0.0  # > 0: stop once the mean loss of the last 20 steps is at or below it
    # RL
    train_pool: int = 4000
    total_steps: int = 50
    prompts_per_step: int = 32
    samples_per_prompt: int = 8
    max_response_tokens: int = 40
    lr: float = 1e-4
    temperature: float = 1.0       # the trainer's sampling temperature (evaluation is always at 1.0)
    early_step: int = 10           # the on-policy checkpoint (1-based step count) used as "early"
    seed_interval: int = 8         # T of the Thinking Seeds runs
    # evaluation and relay
    heldout: int = 200             # held-out problems
    eval_n: int = 64               # samples per problem (pass@k for k <= eval_n)
    relay_n: int = 64
    seeds: int = 3                 # training seeds per method of the table
    methods: str = "onpolicy,seeds_ratio,seeds_entropy,seeds_state,luffy,m2po"

    @property
    def task(self) -> str:
        return "countdown"

    @property
    def difficulty(self) -> dict:
        return {"min_numbers": self.numbers, "max_numbers": self.numbers, "min_number": 1,
                "max_number": self.max_number, "min_target": self.min_target, "max_target": self.max_target}


PREMISE = PremiseBudget(name="premise")
TOY = PremiseBudget(name="toy", warmup_pool=500, warmup_steps=20, train_pool=200, total_steps=3,
                    prompts_per_step=4, samples_per_prompt=4, early_step=1, seed_interval=2, heldout=12,
                    eval_n=8, relay_n=8, seeds=1, methods="onpolicy,seeds_ratio")
BUDGETS = {"premise": PREMISE, "toy": TOY}


def _methods() -> dict[str, RunSpec]:
    """The table's rows: on-policy, Thinking Seeds (ratio / entropy rule, state+action; ratio, state), LUFFY, M2PO."""
    def T(b):
        return b.seed_interval
    return {
        "onpolicy": RunSpec("onpolicy", "mini_onpolicy", "On-policy DAPO"),
        "seeds_ratio": RunSpec("seeds_ratio", "mini_seeds_ratio", "Thinking Seeds, ratio 0.5 (state+action)",
                               _seeded("ratio", 0.5, "state+action", T)),
        "seeds_entropy": RunSpec("seeds_entropy", "mini_seeds_entropy", "Thinking Seeds, entropy rule (state+action)",
                                 _seeded("entropy", 0.5, "state+action", T)),
        "seeds_state": RunSpec("seeds_state", "mini_seeds_state", "Thinking Seeds, ratio 0.5 (state)",
                               _seeded("ratio", 0.5, "state", T)),
        "luffy": RunSpec("luffy", "mini_luffy", "LUFFY (1 solver trace per group)"),
        "m2po": RunSpec("m2po", "mini_m2po", "M2PO (rollouts 4 steps stale)"),
    }


METHODS = _methods()


# ------------------------------------------------------------------------------------------------------------
# pure pieces: solution identity, pass@k curves, crossover
# ------------------------------------------------------------------------------------------------------------
_TOK = re.compile(r"\d+|[-+*/()]")


def canonical_solution(response: str) -> str | None:
    """The final ``= EXPR`` line of a countdown response as a canonical expression tree (operands of + and *
    sorted, so ``(4*3)+8`` and ``8+(3*4)`` are one solution, as the task's solver counts them; ``(a+b)+c`` and
    ``a+(b+c)`` stay two, as there). None when the last non-blank line is not ``= EXPR`` or does not parse."""
    lines = [ln.replace(" ", "") for ln in response.splitlines() if ln.strip()]
    if not lines or not lines[-1].startswith("="):
        return None
    toks = _TOK.findall(lines[-1][1:])
    if "".join(toks) != lines[-1][1:] or not toks:
        return None
    pos = 0

    def factor():
        nonlocal pos
        if pos >= len(toks):
            raise ValueError
        t = toks[pos]
        pos += 1
        if t == "(":
            v = expr()
            if pos >= len(toks) or toks[pos] != ")":
                raise ValueError
            pos += 1
            return v
        if t.isdigit():
            return str(int(t))
        raise ValueError

    def chain(sub, ops):
        nonlocal pos
        v = sub()
        while pos < len(toks) and toks[pos] in ops:
            op = toks[pos]
            pos += 1
            w = sub()
            a, b = (sorted([v, w]) if op in "+*" else (v, w))
            v = f"({a}{op}{b})"
        return v

    def term():
        return chain(factor, "*/")

    def expr():
        return chain(term, "+-")

    try:
        out = expr()
    except (ValueError, RecursionError):
        return None
    return out if pos == len(toks) else None


def passk_matrix(n: np.ndarray, c: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """Per-problem unbiased pass@k, shape [P, len(ks)] (``contracts.passk.pass_at_k``)."""
    return np.stack([pass_at_k(n, c, int(k)) for k in ks], axis=1)


def crossover_k(ks: Sequence[int], diff: Sequence[float]) -> float:
    """The k at which ``diff`` (final − warm-up pass@k on the grid ``ks``) first turns non-positive after being
    positive, interpolated linearly in log2 k between the two grid points around the sign change.

    Returns ``ks[0]`` when diff is already <= 0 at the first k (the final model never leads), ``inf`` when it
    stays > 0 at every k (no crossover within the grid)."""
    ks = np.asarray(ks, dtype=float)
    d = np.asarray(diff, dtype=float)
    assert ks.shape == d.shape and ks.size >= 1, "ks and diff must have the same, non-empty shape"
    if d[0] <= 0:
        return float(ks[0])
    for i in range(1, len(d)):
        if d[i] <= 0:
            lo, hi = math.log2(ks[i - 1]), math.log2(ks[i])
            frac = d[i - 1] / (d[i - 1] - d[i])
            return float(2 ** (lo + frac * (hi - lo)))
    return math.inf


def curve_table(per_problem: dict[str, np.ndarray], ks: Sequence[int], *, seed: int = 0) -> list[dict]:
    """Rows {model, k, pass, low, high}: mean pass@k over problems with a 95 % percentile bootstrap interval."""
    rows = []
    for name, m in per_problem.items():
        for j, k in enumerate(ks):
            est, lo, hi = bootstrap_ci(m[:, j], n_boot=N_BOOT, seed=seed)
            rows.append({"model": name, "k": int(k), "pass": est, "low": lo, "high": hi})
    return rows


def crossover_table(a: np.ndarray, b: np.ndarray, ks: Sequence[int], *, seed: int = 0) -> dict:
    """Crossover of ``b`` against ``a`` (per-problem pass@k matrices [P, K] on the same problems): the point
    estimate, a 95 % bootstrap interval over problems (percentiles without interpolation; ``inf`` = beyond the
    grid), the fraction of resamples with a crossover inside the grid, and per k the paired difference."""
    assert a.shape == b.shape, "crossover needs the two models on the same problems"
    est = crossover_k(ks, (b - a).mean(axis=0))
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.shape[0], size=(N_BOOT, a.shape[0]))
    d = (b - a)
    boots = np.array([crossover_k(ks, d[row].mean(axis=0)) for row in idx])
    lo, hi = (float(np.percentile(boots, q, method="inverted_cdf")) for q in (2.5, 97.5))
    per_k = []
    for j, k in enumerate(ks):
        p = paired_bootstrap(b[:, j], a[:, j], n_boot=N_BOOT, seed=seed)
        per_k.append({"k": int(k), "diff": p["diff"], "low": p["low"], "high": p["high"], "p_value": p["p_value"]})
    return {"crossover_k": est, "low": lo, "high": hi, "frac_within_grid": float(np.mean(np.isfinite(boots) &
                                                                                       (boots > ks[0]))),
            "frac_final_never_leads": float(np.mean(boots <= ks[0])), "per_k": per_k}


# ------------------------------------------------------------------------------------------------------------
# stages
# ------------------------------------------------------------------------------------------------------------
def prepare_out(out: Path, budget: PremiseBudget, *, fresh: bool, log: Log) -> None:
    """Create ``out`` (``fresh``: wipe it first); refuse a folder made with another budget or not by this module."""
    marker = out / MARKER
    if fresh and out.exists():
        if any(out.iterdir()) and not marker.is_file():
            raise DemoError(f"--fresh would delete '{out}', which was not written by demo.premise (no {MARKER})")
        log(f"--fresh: deleting {out}")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    want = json.loads(json.dumps(asdict(budget)))
    if marker.is_file():
        have = json.loads(marker.read_text()).get("budget", {})
        diff = sorted(k for k in want if have.get(k) != want[k])
        if diff:
            raise DemoError(f"'{out}' holds a premise regime made with another budget (differs in "
                            f"{', '.join(diff)}); rerun with --fresh, or choose another --out")
    elif any(out.iterdir()):
        raise DemoError(f"'{out}' is not empty and was not written by demo.premise (no {MARKER}); choose another --out")
    else:
        atomic_write_text(marker, json.dumps({"budget": want}, indent=2) + "\n")


def make_data(out: Path, b: PremiseBudget, *, log: Log) -> dict[str, Path]:
    """``out/data/{heldout,warmup,train}.jsonl``: the held-out split and the two training pools without its prompts."""
    from scoring.tasks import countdown
    from scoring.tasks.make import write_jsonl

    d = out / "data"
    paths = {k: d / f"{k}.jsonl" for k in ("heldout", "warmup", "train")}
    if all(p.is_file() for p in paths.values()):
        return paths
    held = countdown.make_examples(b.heldout, seed=HELDOUT_SEED, **b.difficulty)
    held_prompts = {r["prompt"] for r in held}
    write_jsonl(held, paths["heldout"])
    for key, n, seed in (("warmup", b.warmup_pool, WARMUP_SEED), ("train", b.train_pool, TRAIN_SEED)):
        rows = [r for r in countdown.make_examples(n, seed=seed, **b.difficulty) if r["prompt"] not in held_prompts]
        write_jsonl(rows, paths[key])
        log(f"{key} pool: {len(rows)} of {n} rows ({n - len(rows)} held-out prompts removed)")
    ns = np.array([r["n_solutions"] for r in held])
    log(f"held-out: {len(held)} problems, solutions per problem mean {ns.mean():.2f}, median {np.median(ns):.0f}, "
        f"one solution {np.mean(ns == 1):.0%}")
    return paths


def warmup(path: Path, pool: Path, b: PremiseBudget, *, log: Log) -> tuple[Path, dict]:
    """The supervised warm-up checkpoint at ``path`` (built once; ``warmup_summary.json`` inside)."""
    summary_file = path / "warmup_summary.json"
    if summary_file.is_file():
        return path, json.loads(summary_file.read_text())
    from inference.tiny import build_model, build_tokenizer, save_pretrained_atomic
    from trainer.sft import sft

    rows = [json.loads(line) for line in pool.read_text().splitlines() if line.strip()]
    tok = build_tokenizer()
    model = build_model(b.model_size, tok, seed=0)
    log(f"warm-up: tiny:{b.model_size} on {len(rows)} countdown traces, {b.warmup_steps} steps of 64, "
        f"lr {b.warmup_lr:g}" + (f", stop at loss <= {b.warmup_stop_loss}" if b.warmup_stop_loss > 0 else ""))
    stats = sft(model, tok, rows, steps=b.warmup_steps, batch_size=64, lr=b.warmup_lr, seed=0,
                stop_loss=b.warmup_stop_loss if b.warmup_stop_loss > 0 else None, log_every=100,
                log=lambda m: log(f"  {m}"))
    summary = {"steps": stats["steps"], "loss_first": stats["loss_first"], "loss_last": stats["loss_last"],
               "time_s": stats["time_s"], "pool": len(rows)}
    save_pretrained_atomic(model, tok, path, extra_files={"warmup_summary.json": summary})
    log(f"warm-up: {stats['steps']} steps, loss {stats['loss_first']:.3f} -> {stats['loss_last']:.3f}, "
        f"{stats['time_s']:.0f} s")
    return path, summary


def rl_config(method: str, b: PremiseBudget, *, out: Path, seed: int, model: Path, train_file: Path,
              save_steps: Sequence[int] = (), name: str | None = None):
    """``demo.pipeline.run_config`` for one method, plus the regime's temperature and checkpoint schedule
    (checkpoints at every multiple of gcd(save_steps), all kept, when ``save_steps`` is given)."""
    spec = METHODS[method]
    every = math.gcd(*save_steps) if save_steps else 0
    extra = {"temperature": b.temperature, "save_every": every, "keep_checkpoints": 0, "log_rollouts": True}
    spec = replace(spec, name=name or spec.name, extra=lambda bb, f=spec.extra: {**f(bb), **extra})
    return run_config(spec, b, out=out, seed=seed, model=model, train_file=train_file)


def checkpoint(cfg, step: int) -> Path:
    """The checkpoint after ``step`` optimizer steps (1-based)."""
    from trainer.checkpoint import checkpoint_dir
    return checkpoint_dir(cfg.run_dir, step - 1)


def evaluate(models: Sequence[tuple[str, Path]], b: PremiseBudget, *, heldout: Path, root: Path, n: int,
             log: Log) -> None:
    """``eval.run.run_eval`` of every (name, checkpoint) on the held-out file, n samples at temperature 1."""
    from eval.run import format_report, run_eval

    root.mkdir(parents=True, exist_ok=True)
    todo = [(name, p) for name, p in models]
    res = run_eval([str(p) for _, p in todo], ["countdown"], names=[nm for nm, _ in todo], out=root, n=n,
                   temperature=1.0, top_p=1.0, max_tokens=b.max_response_tokens, problems=str(heldout), seed=0,
                   engine="hf", progress=False, log=lambda m: None)
    for r in res["reports"]:
        log(f"  {r['model']:<24} {format_report(r)}")


def read_eval(root: Path, name: str) -> list[dict]:
    from eval.samples import read_samples
    return read_samples(root / name / "countdown.jsonl")


def per_problem(rows: list[dict], ks: Sequence[int]) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """(ids order, n, c, pass@k matrix [P, K]) of one model's eval rows, problems sorted by id."""
    rows = sorted(rows, key=lambda r: r["problem_id"])
    n = np.array([len(r["correct"]) for r in rows])
    c = np.array([sum(map(bool, r["correct"])) for r in rows])
    return n, c, [r["problem_id"] for r in rows], passk_matrix(n, c, ks)


def distinct_correct(rows: list[dict]) -> np.ndarray:
    """Per problem (sorted by id): distinct correct solutions (``canonical_solution``) among its samples."""
    out = []
    for r in sorted(rows, key=lambda r: r["problem_id"]):
        sols = {canonical_solution(t) for t, ok in zip(r["responses"], r["correct"]) if ok}
        sols.discard(None)
        out.append(len(sols))
    return np.array(out)


def entropy_by_position(run_dir: Path, *, max_pos: int) -> list[dict]:
    """Per training step and response position: mean policy entropy of the on-policy tokens of that step's
    rollouts (``entropy`` column of the rollout records) and how many tokens it averages. The trainer computes
    entropy in its training forward, so only responses of groups that were trained on (mixed rewards) carry it;
    the others are NaN and left out."""
    import pyarrow.parquet as pq

    rows = []
    for f in sorted((Path(run_dir) / "rollouts").glob("step_*.parquet")):
        t = pq.read_table(f, columns=["step", "variant", "entropy"]).to_pydict()
        ents = [e for v, e in zip(t["variant"], t["entropy"]) if v == "on_policy"]
        if not ents:
            continue
        step = int(t["step"][0])
        sums, cnts = np.zeros(max_pos), np.zeros(max_pos)
        for e in ents:
            e = np.asarray(e, dtype=float)[:max_pos]
            ok = np.isfinite(e)
            sums[:len(e)] += np.where(ok, e, 0.0)
            cnts[:len(e)] += ok
        for p in range(max_pos):
            if cnts[p]:
                rows.append({"step": step, "position": p, "entropy": sums[p] / cnts[p], "tokens": int(cnts[p])})
    return rows


# ------------------------------------------------------------------------------------------------------------
# the regime
# ------------------------------------------------------------------------------------------------------------
TIMINGS = "timings.json"


def eval_name(method: str, seed: int) -> str:
    return f"{method}-seed{seed}"


def method_list(b: PremiseBudget) -> list[str]:
    names = [m.strip() for m in b.methods.split(",") if m.strip()]
    bad = [m for m in names if m not in METHODS]
    if bad or "onpolicy" not in names:
        raise DemoError(f"methods {bad or names}: choose from {sorted(METHODS)}, including onpolicy")
    return names


def train_all(out: Path, b: PremiseBudget, *, warm: Path, data: dict, log: Log, only_first: bool = False) -> dict:
    """Every (seed, method) run (``only_first``: on-policy seed 0 alone), each scored on the held-out split as soon
    as it finishes; returns their configs."""
    import torch

    tfile = out / TIMINGS
    timings = json.loads(tfile.read_text()) if tfile.is_file() else {}
    cfgs = {}
    for seed in range(1 if only_first else b.seeds):
        for method in (["onpolicy"] if only_first else method_list(b)):
            keep = (b.early_step,) if (method == "onpolicy" and seed == 0) else ()
            # run_config names a run <name> for seed 0 and <name>-seed<k> otherwise: <method>-seed<k> for every seed
            cfg = rl_config(method, b, out=out, seed=seed, model=warm, train_file=data["train"], save_steps=keep,
                            name=eval_name(method, 0) if seed == 0 else method)
            assert cfg.run_name == eval_name(method, seed), cfg.run_name
            cfgs[cfg.run_name] = cfg
            res = train_run(cfg, log=log)
            if not res["skipped"]:
                timings[cfg.run_name] = {"wall_s": res["wall_s"], "cpu_s": res["cpu_s"],
                                         "threads": torch.get_num_threads(), "load_1min": os.getloadavg()[0]}
                atomic_write_text(tfile, json.dumps(timings, indent=1) + "\n")
            models = [(cfg.run_name, checkpoint(cfg, b.total_steps))]
            if keep:
                models.append(("early", checkpoint(cfg, b.early_step)))
            evaluate(models, b, heldout=data["heldout"], root=out / "eval", n=b.eval_n, log=log)
    return cfgs


def run_relay_stage(out: Path, b: PremiseBudget, *, early: Path, final: Path, heldout: Path, log: Log):
    """Relay early -> final (cut 0.5) on the held-out split; tables under ``out/analysis/relay/<tag>/``."""
    from tsanalysis import io as tio
    from tsanalysis.relay import run_relay

    rdir = out / "analysis" / "relay" / "countdown-early-to-final-cut0.5"
    tables, rdir, settings = run_relay(early=str(early), final=str(final), benchmark="countdown",
                                       problems=str(heldout), n=b.relay_n, cut=0.5,
                                       max_tokens=b.max_response_tokens, temperature=1.0, seed=0, engine="hf",
                                       out=rdir, batch_problems=16, log=lambda m: log(f"  {m}"))
    tio.write_results(rdir, tables, settings)
    return tables["relay_passk"]


def analyse(out: Path, b: PremiseBudget, *, log: Log) -> dict:
    """Every cached table under ``out/tables`` from the eval files, the relay results and the rollouts."""
    import pandas as pd

    tdir = out / "tables"
    tdir.mkdir(parents=True, exist_ok=True)
    root = out / "eval"
    ks = k_grid(b.eval_n)
    nsol = {r["id"]: r["n_solutions"] for r in map(json.loads, (out / "data" / "heldout.jsonl").read_text().splitlines())}

    def model(name):
        rows = read_eval(root, name)
        n, c, ids, m = per_problem(rows, ks)
        return {"ids": ids, "n": n, "c": c, "m": m, "distinct": distinct_correct(rows)}

    base = {"warmup": model("warmup"), "early": model("early"), "final": model(eval_name("onpolicy", 0))}
    ids = base["warmup"]["ids"]
    assert all(v["ids"] == ids for v in base.values()), "warm-up, early and final were scored on other problems"
    curves = pd.DataFrame(curve_table({k: v["m"] for k, v in base.items()}, ks))
    diffs, cross = [], {}
    for name in ("early", "final"):
        ct = crossover_table(base["warmup"]["m"], base[name]["m"], ks)
        cross[name] = {k: v for k, v in ct.items() if k != "per_k"}
        diffs += [{"model": name, **r} for r in ct["per_k"]]
    ns = np.array([nsol[i] for i in ids])
    distinct = []
    for name, v in base.items():
        est, lo, hi = bootstrap_ci(v["distinct"].astype(float), n_boot=N_BOOT)
        cov = bootstrap_ci(v["distinct"] / ns, n_boot=N_BOOT)
        multi = ns >= 2
        distinct.append({"model": name, "distinct_correct": est, "low": lo, "high": hi, "coverage": cov[0],
                         "coverage_low": cov[1], "coverage_high": cov[2],
                         "distinct_multi": float(v["distinct"][multi].mean()) if multi.any() else math.nan,
                         "solved": float((v["c"] > 0).mean()), "problems": len(ids), "n": int(v["n"].min())})
    # the methods table: per (method, seed) pass@k and distinct solutions; crossover against the warm-up
    mrows = []
    for method in method_list(b):
        for seed in range(b.seeds):
            f = root / eval_name(method, seed) / "countdown.jsonl"
            if not f.is_file():
                continue
            v = model(eval_name(method, seed))
            if v["ids"] != ids:
                continue   # not every problem scored yet
            run_dir = out / "runs" / eval_name(method, seed)
            m = read_metrics(run_dir)
            mrows.append({"method": method, "seed": seed,
                          **{f"pass@{k}": float(v["m"][:, j].mean()) for j, k in enumerate(ks)},
                          "distinct_correct": float(v["distinct"].mean()),
                          "crossover_k": crossover_k(ks, (v["m"] - base["warmup"]["m"]).mean(axis=0)),
                          "train_wall_s": sum(x.get("time/step_s", 0.0) for x in m),
                          "tokens_generated": int(sum(x.get("tokens/generated", 0) for x in m))})
    tables = {"passk_curves": curves, "passk_diff": pd.DataFrame(diffs), "distinct": pd.DataFrame(distinct),
              "methods": pd.DataFrame(mrows)}
    ent_run = out / "runs" / eval_name("onpolicy", 0)
    tables["entropy_positions"] = pd.DataFrame(entropy_by_position(ent_run, max_pos=b.max_response_tokens),
                                               columns=["step", "position", "entropy", "tokens"])
    rel = out / "analysis" / "relay" / "countdown-early-to-final-cut0.5" / "relay_passk.csv"
    if rel.is_file():
        tables["relay_passk"] = pd.read_csv(rel)
    for name, df in tables.items():
        df.to_csv(tdir / f"{name}.csv", index=False)
    atomic_write_text(tdir / "crossover.json", json.dumps(cross, indent=2) + "\n")
    log(f"tables: {', '.join(sorted(tables))}, crossover -> {tdir}")
    return {**tables, "crossover": cross}


def draw(out: Path, *, log: Log) -> dict[str, Path]:
    """The PNGs from the cached tables: ``out/figures/premise_{passk,entropy,relay}.png``."""
    from figures.fig2_relay import plot_relay_passk
    from figures.premise import load_tables, plot_entropy, plot_passk_curves
    from figures.style import DPI, use_headless_backend

    use_headless_backend()
    t = load_tables(out)
    fdir = out / "figures"
    fdir.mkdir(parents=True, exist_ok=True)
    figs = {"premise_passk": plot_passk_curves(t["passk_curves"], t["passk_diff"], t["crossover"]),
            "premise_entropy": plot_entropy(t["entropy_positions"])}
    if "relay_passk" in t:
        figs["premise_relay"] = plot_relay_passk({"countdown (held-out)": t["relay_passk"]})
    paths = {}
    for name, fig in figs.items():
        paths[name] = fdir / f"{name}.png"
        fig.savefig(paths[name], dpi=DPI)
    log(f"figures: {', '.join(str(p) for p in paths.values())}")
    return paths


class _Stages(Timings):
    """Timings whose every finished stage is added at once to ``out/stages.json`` (the cost over all invocations,
    interrupted ones included)."""

    def __init__(self, out: Path):
        super().__init__()
        self.out = out

    def stage(self, name, log):

        @contextlib.contextmanager
        def run():
            with Timings.stage(self, name, log) as entry:
                yield entry
            _add_stage(self.out, name, self.stages[name])
        return run()


def run_premise(b: PremiseBudget, out: str | os.PathLike, *, fresh: bool = False, doc: str | os.PathLike | None = None,
                log: Log = print) -> dict:
    """Every stage (module docstring), resumable; returns {"tables", "figures", "timings", "page"}."""
    out = Path(out)
    prepare_out(out, b, fresh=fresh, log=log)
    t = _Stages(out)
    with t.stage("data + warm-up", log) as st:
        data = make_data(out, b, log=log)
        warm, wsum = warmup(out / "warmup", data["warmup"], b, log=log)
        evaluate([("warmup", warm)], b, heldout=data["heldout"], root=out / "eval", n=b.eval_n, log=log)
        st["note"] = f"{wsum['steps']} supervised steps, loss {wsum['loss_last']:.3f}; warm-up scored"
    # on-policy seed 0 and the relay first: the premise's curves and Figure 2 come before the methods table
    with t.stage("on-policy seed 0 + eval", log) as st:
        on = train_all(out, b, warm=warm, data=data, log=log, only_first=True)[eval_name("onpolicy", 0)]
        st["note"] = f"{b.total_steps} steps; early (step {b.early_step}) and final scored (n = {b.eval_n})"
    with t.stage("relay", log) as st:
        run_relay_stage(out, b, early=checkpoint(on, b.early_step), final=checkpoint(on, b.total_steps),
                        heldout=data["heldout"], log=log)
        st["note"] = f"step {b.early_step} -> step {b.total_steps} of onpolicy-seed0, n = {b.relay_n}"
    with t.stage("methods x seeds + eval", log) as st:
        cfgs = train_all(out, b, warm=warm, data=data, log=log)
        st["note"] = f"{len(cfgs)} runs x {b.total_steps} steps (on-policy seed 0 above), each scored (n = {b.eval_n})"
    with t.stage("analysis + figures", log) as st:
        tables = analyse(out, b, log=log)
        figs = draw(out, log=log)
        st["note"] = f"{len(tables)} tables, {len(figs)} PNGs"
    page = None
    if doc is not None:
        page = write_page(out, b, doc=Path(doc), log=log)
    return {"tables": tables, "figures": figs, "timings": t, "page": page}


def _add_stage(out: Path, name: str, entry: dict) -> None:
    """Add one finished stage's wall and CPU seconds to ``out/stages.json``."""
    f = out / "stages.json"
    stages = json.loads(f.read_text()) if f.is_file() else {}
    o = stages.get(name, {})
    stages[name] = {"wall_s": o.get("wall_s", 0.0) + entry.get("wall_s", 0.0),
                    "cpu_s": o.get("cpu_s", 0.0) + entry.get("cpu_s", 0.0),
                    "note": entry.get("note") or o.get("note", "")}
    atomic_write_text(f, json.dumps(stages, indent=1) + "\n")


# ------------------------------------------------------------------------------------------------------------
# the page
# ------------------------------------------------------------------------------------------------------------
NOTES_HEADING = "## Reading the numbers"       # from this heading on the page is written by hand and kept
GRID_START, GRID_END = "<!-- grid:start -->", "<!-- grid:end -->"   # demo.premise_search writes between these


def _pct(x: float) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}"


def _kx(x: float) -> str:
    return f"> {'grid'}" if math.isinf(x) else f"{x:.1f}"


def _mean_t(vals: Sequence[float], scale: float = 100.0, signed: bool = False, digits: int = 1) -> str:
    vals = [float(v) for v in vals]
    if not vals:
        return ""
    m, hw = t_interval(vals)
    f = f"{'+' if signed else ''}.{digits}f"
    return f"{format(scale * m, f)}" + ("" if hw is None else f" ± {format(scale * hw, f'.{digits}f')}")


def render_page(out: Path, b: PremiseBudget, *, command: str) -> str:
    import pandas as pd

    tdir = out / "tables"
    curves = pd.read_csv(tdir / "passk_curves.csv")
    diff = pd.read_csv(tdir / "passk_diff.csv")
    cross = json.loads((tdir / "crossover.json").read_text())
    distinct = pd.read_csv(tdir / "distinct.csv")
    methods = pd.read_csv(tdir / "methods.csv")
    ent = pd.read_csv(tdir / "entropy_positions.csv")
    relay = pd.read_csv(tdir / "relay_passk.csv") if (tdir / "relay_passk.csv").is_file() else None
    wsum = json.loads((out / "warmup" / "warmup_summary.json").read_text())
    stages = json.loads((out / "stages.json").read_text()) if (out / "stages.json").is_file() else {}
    timings = json.loads((out / TIMINGS).read_text()) if (out / TIMINGS).is_file() else {}
    ks = sorted(curves["k"].unique())
    K = int(max(ks))
    held = [json.loads(x) for x in (out / "data" / "heldout.jsonl").read_text().splitlines()]
    ns = np.array([r["n_solutions"] for r in held])
    rel = os.path.relpath(REPO / "docs" / "premise", REPO / "docs")
    lines = [
        "# The premise in miniature: on-policy RL narrows the policy, and the relay",
        "",
        "Paper §3 / Figure 2: as on-policy RL sharpens the policy, reasoning states that earlier checkpoints reached "
        "disappear from its samples, so the final checkpoint's pass@k at large k falls while its pass@1 rises, and a "
        "relay (an early checkpoint writes the first half of a response, the final one continues) can beat the final "
        "checkpoint alone at large k. This page measures both on CPU with a 1M-parameter policy on the embedded "
        "countdown task, where most problems have several valid solution paths (the addition miniature of "
        "`docs/miniature.md` has one path per problem and showed no narrowing).",
        "",
        f"Regenerate: `{command}` (resumable: finished runs, graded problems and relay problems are skipped; "
        "`python -m demo.premise --write-only` rewrites this page from the cached tables; the figures and "
        "`notebooks/premise.ipynb` read the same tables under `<out>/tables/`). The grid that chose this regime: "
        "`python -m demo.premise_search` (section *Grid searched*).",
        "",
        "## Regime",
        "",
        f"- task: countdown with {b.numbers} numbers in 1..{b.max_number}, target in {b.min_target}..{b.max_target}, "
        "every given number used once, + − × and exact ÷ (`scoring.tasks.countdown`); held-out split of "
        f"{len(held)} problems (seed {HELDOUT_SEED}, prompts removed from both training pools): solutions per "
        f"problem mean {ns.mean():.2f}, median {np.median(ns):.0f}, {np.mean(ns >= 2):.0%} with two or more",
        f"- policy: tiny:{b.model_size}, supervised warm-up {wsum['steps']} steps of 64 (lr {b.warmup_lr:g}, "
        f"cosine; final loss {wsum['loss_last']:.3f}) on {wsum['pool']} solver traces, each ONE solution drawn at "
        "random among the problem's solutions",
        f"- RL, identical for every run: {b.total_steps} steps x {b.prompts_per_step} prompts x "
        f"{b.samples_per_prompt} samples, <= {b.max_response_tokens} tokens, AdamW lr {b.lr:g}, sampling "
        f"temperature {b.temperature:g}; presets `trainer/configs/mini_*.yaml` for the rest (dynamic sampling, at "
        f"most 2 rounds). Thinking Seeds T = {b.seed_interval}; early checkpoint = on-policy seed 0 after "
        f"{b.early_step} steps",
        f"- evaluation: n = {b.eval_n} samples per problem at temperature 1.0, <= {b.max_response_tokens} tokens; "
        "pass@k by the unbiased estimator (`contracts.passk`); intervals are 95 % percentile bootstraps over "
        "problems (2000 resamples, seed 0; differences paired over the same problems) unless stated",
        "",
        "## Does RL narrow the policy? warm-up vs early vs final (on-policy, training seed 0)",
        "",
        f"![pass@k of warm-up, early and final]({rel}/premise_passk.png)",
        "",
        "| k | " + " | ".join(f"{m} pass@k % [95% CI]" for m in ("warmup", "early", "final"))
        + " | final − warm-up, points [95% CI] |",
        "|---:|---|---|---|---|",
    ]
    for k in ks:
        cells = []
        for m in ("warmup", "early", "final"):
            r = curves[(curves["model"] == m) & (curves["k"] == k)].iloc[0]
            cells.append(f"{_pct(r['pass'])} [{_pct(r['low'])}, {_pct(r['high'])}]")
        d = diff[(diff["model"] == "final") & (diff["k"] == k)].iloc[0]
        lines.append(f"| {k} | " + " | ".join(cells) + f" | {100 * d['diff']:+.1f} [{100 * d['low']:+.1f}, "
                     f"{100 * d['high']:+.1f}] |")
    cf, ce = cross["final"], cross["early"]
    lines += [
        "",
        f"**Crossover** (the k at which final − warm-up pass@k turns non-positive, linear in log2 k between grid "
        f"points): final **k = {_kx(cf['crossover_k'])}** (95 % bootstrap over problems [{_kx(cf['low'])}, "
        f"{_kx(cf['high'])}]; {cf['frac_within_grid']:.0%} of resamples cross inside 1 < k <= {K}); early "
        f"checkpoint k = {_kx(ce['crossover_k'])} [{_kx(ce['low'])}, {_kx(ce['high'])}].",
        "",
        "Distinct correct solutions per problem among the n samples (final `= EXPR` line as an expression tree, "
        "operands of + and × unordered, as the task's solver counts solutions):",
        "",
        "| model | distinct correct / problem [95% CI] | on problems with >= 2 solutions | share of the solver's "
        "solutions found | problems solved (pass@n) |",
        "|---|---|---:|---:|---:|",
    ]
    for _, r in distinct.iterrows():
        lines.append(f"| {r['model']} | {r['distinct_correct']:.2f} [{r['low']:.2f}, {r['high']:.2f}] | "
                     f"{r['distinct_multi']:.2f} | {_pct(r['coverage'])} % | {_pct(r['solved'])} % |")
    tok = ent.assign(w=ent["entropy"] * ent["tokens"]).groupby("step")[["w", "tokens"]].sum()
    per_step = (tok["w"] / tok["tokens"]).to_numpy()
    n5 = min(5, len(per_step))
    lines += [
        "",
        "Per-position entropy of the on-policy rollouts over training (seed 0, the rollout records' `entropy`, which "
        "the trainer computes for the responses of groups it trains on, i.e. groups with mixed rewards): "
        + (f"token-mean {per_step[:n5].mean():.3f} nats over the first {n5} steps, {per_step[-n5:].mean():.3f} "
           f"over the last {n5}." if n5 else "no trained tokens in this run."),
        "",
        f"![entropy by position over training]({rel}/premise_entropy.png)",
        "",
    ]
    if relay is not None:
        big = relay[relay["k"] == relay["k"].max()].iloc[0]
        lines += [
            "## Relay (Figure 2): early checkpoint writes half, final continues",
            "",
            f"Early = on-policy seed 0 after {b.early_step} steps, final = after {b.total_steps}; cut 0.5 of the "
            f"early response's tokens; n = {b.relay_n} relay and {b.relay_n} final-only samples per problem "
            "(`tsanalysis.relay`); interval: paired bootstrap over problems.",
            "",
            f"![relay minus final]({rel}/premise_relay.png)",
            "",
            "| k | early % | relay % | final only % | relay − final, points [95% CI] |",
            "|---:|---:|---:|---:|---|",
        ]
        for _, r in relay.iterrows():
            lines.append(f"| {int(r['k'])} | {_pct(r['early'])} | {_pct(r['relay'])} | {_pct(r['final'])} | "
                         f"{100 * r['diff']:+.1f} [{100 * r['diff_low']:+.1f}, {100 * r['diff_high']:+.1f}] |")
        lines += ["", f"At k = {int(big['k'])}: relay − final = **{100 * big['diff']:+.1f} points "
                      f"[{100 * big['diff_low']:+.1f}, {100 * big['diff_high']:+.1f}]**.", ""]
    # methods
    lines += [
        "## Methods table (training seeds)",
        "",
        f"Every method from the same warm-up with the same RL budget, once per training seed (0..{b.seeds - 1}); "
        "mean ± 95 % Student-t half-width over the seeds that finished (none for one seed); \"vs on-policy\" is the "
        "mean paired difference to on-policy with the same training seed, with its t-interval. Crossover: per seed, "
        "the k where the run's pass@k falls to the warm-up's (`> grid`: never within k <= "
        f"{K}), listed per seed.",
        "",
        f"| method | seeds | pass@1 % | pass@1 vs on-policy | pass@8 % | pass@{K} % | pass@{K} vs on-policy | "
        "distinct correct / problem | crossover k per seed | train wall s / run |",
        "|---|---:|---|---|---|---|---|---|---|---:|",
    ]
    w = curves[curves["model"] == "warmup"].set_index("k")["pass"]
    wd = distinct.set_index("model").loc["warmup", "distinct_correct"]
    lines.append(f"| supervised warm-up (no RL) | – | {_pct(w[1])} | – | {_pct(w.get(8, math.nan))} | {_pct(w[K])} | – | "
                 f"{wd:.2f} | – | – |")
    base = methods[methods["method"] == "onpolicy"].set_index("seed")
    for method in method_list(b):
        d = methods[methods["method"] == method]
        if d.empty:
            lines.append(f"| {METHODS[method].paper} | 0/{b.seeds} | not run | | | | | | | |")
            continue
        vs = [r[f"pass@{K}"] - base.loc[r["seed"], f"pass@{K}"] for _, r in d.iterrows()
              if method != "onpolicy" and r["seed"] in base.index]
        vs1 = [r["pass@1"] - base.loc[r["seed"], "pass@1"] for _, r in d.iterrows()
               if method != "onpolicy" and r["seed"] in base.index]
        walls = [timings.get(eval_name(method, s), {}).get("wall_s") for s in d["seed"]]
        walls = [x for x in walls if x]
        p8 = _mean_t(d["pass@8"]) if "pass@8" in d else ""
        lines.append(
            f"| {METHODS[method].paper} | {len(d)}/{b.seeds} | {_mean_t(d['pass@1'])} | "
            f"{_mean_t(vs1, signed=True) if vs1 else '–'} | {p8} | "
            f"{_mean_t(d[f'pass@{K}'])} | {_mean_t(vs, signed=True) if vs else '–'} | "
            f"{_mean_t(d['distinct_correct'], scale=1.0, digits=2)} | "
            f"{', '.join(_kx(x) for x in d['crossover_k'])} | {f'{np.mean(walls):.0f}' if walls else ''} |")
    per_seed = methods.pivot_table(index="method", columns="seed", values=f"pass@{K}")
    lines += ["", f"pass@{K} per seed: " + "; ".join(
        f"{m} " + ", ".join(_pct(v) for v in per_seed.loc[m].dropna()) for m in method_list(b) if m in per_seed.index),
        ""]
    total_w = sum(s.get("wall_s", 0) for s in stages.values())
    lines += ["## Cost", "", "| stage | wall s | CPU s | note |", "|---|---:|---:|---|"]
    for name, s in stages.items():
        lines.append(f"| {name} | {s['wall_s']:.0f} | {s['cpu_s']:.0f} | {s.get('note', '')} |")
    lines += [f"| **total** | {total_w:.0f} | {sum(s.get('cpu_s', 0) for s in stages.values()):.0f} | "
              f"{total_w / 60:.1f} minutes |", "",
              f"{machine(threads=False)}; training used "
              f"{', '.join(sorted({str(t['threads']) for t in timings.values()})) or '?'} torch thread(s). Written "
              f"{time.strftime('%Y-%m-%d %H:%M')} from `{'runs/premise' if _default_out(out) else out}`.", ""]
    return "\n".join(lines)


def _default_out(out: Path) -> bool:
    """Whether ``out`` is the default ``runs/premise`` (of any checkout)."""
    return Path(out).parts[-2:] == ("runs", "premise")


def write_page(out: Path, b: PremiseBudget, *, doc: Path, log: Log, command: str | None = None) -> str:
    """``doc`` from the cached tables; figures copied to ``docs/premise/`` beside it; the grid block and the
    hand-written notes of an existing page are kept."""
    command = command or ("python -m demo --premise" + ("" if _default_out(out) else f" --out {out}"))
    page = render_page(out, b, command=command)
    fig_dir = doc.parent / "premise"
    fig_dir.mkdir(parents=True, exist_ok=True)
    for f in (out / "figures").glob("premise_*.png"):
        shutil.copyfile(f, fig_dir / f.name)
    old = doc.read_text() if doc.is_file() else ""
    grid = (old[old.index(GRID_START):old.index(GRID_END) + len(GRID_END)] if GRID_START in old and GRID_END in old
            else f"{GRID_START}\n(run `python -m demo.premise_search --write-grid` to fill this section)\n{GRID_END}")
    page = page.rstrip("\n") + "\n\n## Grid searched\n\n" + grid + "\n"
    if NOTES_HEADING in old:
        page += "\n" + old[old.index(NOTES_HEADING):]
    atomic_write_text(doc, page)
    log(f"wrote {doc}")
    return page


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.premise", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--budget", choices=sorted(BUDGETS), default="premise",
                   help="premise (the documented regime, ~30 minutes on 2 cores) or toy (seconds; the tests)")
    p.add_argument("--out", default=None, help="output folder (default runs/premise, runs/premise-toy with --budget toy)")
    p.add_argument("--doc", default=None,
                   help="the page to write (default docs/premise.md for the premise budget, none for toy)")
    p.add_argument("--seeds", type=int, default=None, help="training seeds per method (default: the budget's, 3)")
    p.add_argument("--write-only", action="store_true", help="only rewrite the figures and the page from the tables")
    p.add_argument("--fresh", action="store_true", help="delete the output folder first")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 2 when the cores are idle, else 1, as python -m demo)")
    args = p.parse_args(argv)
    b = BUDGETS[args.budget]
    if args.seeds is not None:
        if args.seeds < 1:
            p.error("--seeds must be >= 1")
        b = replace(b, seeds=args.seeds)
    out = Path(args.out or ("runs/premise" if args.budget == "premise" else "runs/premise-toy"))
    doc = args.doc or (str(REPO / "docs" / "premise.md") if args.budget == "premise" else None)
    try:
        if args.write_only:
            analyse(out, b, log=print)
            draw(out, log=print)
            if doc:
                write_page(out, b, doc=Path(doc), log=print)
            return 0
        import torch

        threads, why = (args.threads, "--threads") if args.threads else auto_threads()
        torch.set_num_threads(max(1, threads))
        print(f"torch threads: {threads} ({why})", flush=True)
        run_premise(b, out, fresh=args.fresh, doc=doc)
    except DemoError as e:
        print(f"demo.premise: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
