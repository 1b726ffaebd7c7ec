"""The paper's premise in miniature (issue #16): ``python -m demo --premise`` / ``python -m demo.premise``.

Section 3 of the paper rests on one observation: as on-policy RL sharpens the policy, reasoning states that
earlier checkpoints reached disappear, so the final checkpoint's pass@k at large k falls while its pass@1
rises, and a relay (an early checkpoint writes the first half of a response, the final one continues) has a
higher pass@k than the final checkpoint alone at large k (Figure 2). This module builds the CPU regime where
that can be looked for, measures it, and writes its page from the cached tables (``OUT/premise.md``; ``--doc
docs/premise.md`` updates the committed page):

    data      -> countdown problems with several valid solution paths (``scoring.tasks.countdown``, difficulty
                 in ``PremiseBudget``): a warm-up pool, an RL pool and a held-out split, decontaminated by prompt
    warm-up   -> supervised warm-up on ONE solver trace per problem drawn at random among its solutions, so the
                 warm-up's policy spreads over several paths (``trainer.warmup``, at one torch thread)
    train     -> one ``trainer.train`` run per (method, training seed) from the warm-up (``demo.common``'s
                 ``run_config`` / ``train_run``: presets ``trainer/configs/mini_*.yaml``); on-policy seed 0 keeps
                 the checkpoint at ``early_step`` (the relay's and the curves' "early" model), every run the
                 checkpoints each ``curve_every`` steps (scored as ``<run>-stepNNN``)
    eval      -> ``eval.run.run_eval`` on the held-out split with n samples per problem (pass@k for k <= n,
                 the unbiased estimator of ``contracts.passk``), every model and every kept checkpoint
    analysis  -> pass@k-vs-k of warm-up / early / final with bootstrap intervals over problems, the crossover k
                 (where final − warm-up turns non-positive) with a bootstrap interval, distinct correct
                 solutions per problem, per-position entropy of the on-policy rollouts over training, the
                 methods table (pass@1 and pass@large-k, mean ± t-interval over training seeds)
                 and each method against on-policy paired over problems; the support table (``tsanalysis support``:
                 problems gained / lost per k, warm-up -> early -> final -> relay) and the ratio run's seed lift
                 (``tsanalysis seeds``: the continuations' value from the seeds against the fresh group's);
                 along training (issue #25): ``training_curve`` (pass@1, pass@k and the tokens generated,
                 prefilled and trained up to each scored checkpoint) and ``matched_pass1`` (each run's pass@k where
                 its pass@1 reaches on-policy's final pass@1, and both at matched generated tokens)
    relay     -> ``tsanalysis.relay.run_relay`` (early -> final of on-policy seed 0, cut 0.5, n per problem)
    figures   -> ``figures.premise`` (curves, entropy, seed lift, the pass@1 / pass@k frontier) and
                 ``figures.fig2_relay`` (relay), from the cached tables
    page      -> ``OUT/premise.md`` (numbers, figures copied under ``premise/`` beside it, the grid searched)

Everything is cached under the output folder (default ``runs/premise``): finished runs, graded problems,
relay problems and analysis tables are skipped on a rerun, so an interrupted regime resumes where it stopped.
``tables/`` holds the CSV/JSON files the figures and the notebook read.

This module runs the stages; the sizes and the methods are ``demo.premise_budget``, the estimators (pure functions)
``demo.premise_stats``, the page ``demo.premise_page``. The grid that was searched to choose ``PREMISE`` is
``demo.premise_search`` (its cached results are in ``docs/premise.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import torch

from contracts.commands import EXIT_CODES_HELP, run_command
from contracts.files import atomic_write_json, atomic_write_jsonl
from contracts.jsonl import read_jsonl
from contracts.passk import bootstrap_ci, k_grid, paired_bootstrap
from contracts.samples import read_samples
from demo.common import (MEASURED, DemoError, Log, Timings, auto_threads, claim_out, code_commit, machine, read_metrics,
                         run_config, train_run)
from demo.premise_budget import (ADDED_FIELDS, BUDGETS, EXTENSION, MARKER, METHODS, STAGES, TIMINGS, PremiseBudget,
                                 curve_name, curve_steps, eval_name, extension_steps, long_name, method_list)
from demo.endpoints import POWER_METHODS
from demo.premise_page import write_page
from demo.premise_stats import (N_BOOT, at_first_reach, crossover_k, crossover_table, curve_table, distinct_correct,
                                per_problem)
from eval.config import EvalConfig
from eval.report import format_report
from eval.run import run_eval
from figures.fig2_relay import plot_relay_passk
from figures.premise import load_tables, plot_entropy, plot_frontier, plot_passk_curves, plot_seed_lift
from figures.style import DPI, use_headless_backend
from scoring.tasks import HELDOUT_SEED, TRAIN_SEED, WARMUP_SEED, countdown
from trainer.checkpoint import checkpoint_dir
from trainer.config import load_config
from trainer.fsdp import Dist
from trainer.train import train
from trainer.warmup import build_warmup, read_warmup
from tsanalysis.config import RelayConfig, SupportConfig
from tsanalysis.io import RecordsError, write_results
from tsanalysis.relay import run_relay
from tsanalysis.support import support_tables
from tsanalysis.tables import seeds_tables

RELAY_TAG = "countdown-early-to-final-cut0.5"   # the relay's folder under <out>/analysis/relay/


# ------------------------------------------------------------------------------------------------------------
# stages
# ------------------------------------------------------------------------------------------------------------

def prepare_out(out: Path, budget: PremiseBudget, *, fresh: bool, log: Log) -> None:
    """Create ``out`` (``fresh``: wipe it first); refuse a folder made with another budget or not by this module."""
    claim_out(out, MARKER, asdict(budget), owner="demo.premise", fresh=fresh, log=log, defaults=ADDED_FIELDS)


def make_data(out: Path, b: PremiseBudget, *, log: Log) -> dict[str, Path]:
    """``out/data/{heldout,warmup,train}.jsonl``: the held-out split and the two training pools without its prompts."""
    d = out / "data"
    paths = {k: d / f"{k}.jsonl" for k in ("heldout", "warmup", "train")}
    if all(p.is_file() for p in paths.values()):
        return paths
    held = countdown.make_examples(b.heldout, seed=HELDOUT_SEED, **b.difficulty)
    held_prompts = {r["prompt"] for r in held}
    atomic_write_jsonl(paths["heldout"], held)
    for key, n, seed in (("warmup", b.warmup_pool, WARMUP_SEED), ("train", b.train_pool, TRAIN_SEED)):
        rows = [r for r in countdown.make_examples(n, seed=seed, **b.difficulty) if r["prompt"] not in held_prompts]
        atomic_write_jsonl(paths[key], rows)
        log(f"{key} pool: {len(rows)} of {n} rows ({n - len(rows)} held-out prompts removed)")
    ns = np.array([r["n_solutions"] for r in held])
    log(f"held-out: {len(held)} problems, solutions per problem mean {ns.mean():.2f}, median {np.median(ns):.0f}, "
        f"one solution {np.mean(ns == 1):.0%}")
    return paths


def warmup(path: Path, pool: Path, b: PremiseBudget, *, log: Log) -> tuple[Path, dict]:
    """The supervised warm-up checkpoint at ``path`` on the rows of ``pool`` (``trainer.warmup.build_warmup``, built
    once at one torch thread; ``warmup_summary.json`` inside)."""
    done = read_warmup(path)
    if done is not None:
        return path, done
    summary = build_warmup(path, size=b.model_size, examples=read_jsonl(pool), steps=b.warmup_steps,
                           stop_loss=b.warmup_stop_loss, lr=b.warmup_lr, batch_size=64, seed=0, log=log,
                           log_every=100)
    return path, summary


def rl_config(method: str, b: PremiseBudget, *, out: Path, seed: int, model: Path, train_file: Path,
              save_steps: Sequence[int] = (), name: str | None = None):
    """``demo.common.run_config`` for one method, plus the regime's temperature and checkpoint schedule
    (checkpoints at every multiple of gcd(save_steps), all kept, when ``save_steps`` is given)."""
    spec = METHODS[method]
    every = math.gcd(*save_steps) if save_steps else 0
    extra = {"temperature": b.temperature, "save_every": every, "keep_checkpoints": 0, "log_rollouts": True}
    spec = replace(spec, name=name or spec.name, extra=lambda bb, f=spec.extra: {**f(bb), **extra})
    return run_config(spec, b, out=out, seed=seed, model=model, train_file=train_file)


def checkpoint(cfg, step: int) -> Path:
    """The checkpoint after ``step`` optimizer steps (1-based)."""
    return checkpoint_dir(cfg.run_dir, step - 1)


def evaluate(models: Sequence[tuple[str, Path]], b: PremiseBudget, *, heldout: Path, root: Path, n: int,
             log: Log) -> None:
    """``eval.run.run_eval`` of every (name, checkpoint) on the held-out file, n samples at temperature 1."""

    root.mkdir(parents=True, exist_ok=True)
    todo = [(name, p) for name, p in models]
    cfg = EvalConfig(models=[str(p) for _, p in todo], benchmarks=["countdown"], names=[nm for nm, _ in todo],
                     out=str(root), n=n, temperature=1.0, top_p=1.0, max_tokens=b.max_response_tokens,
                     problems=str(heldout), seed=0, engine="hf", progress=False)
    res = run_eval(cfg, log=lambda m: None)
    for r in res["reports"]:
        log(f"  {r['model']:<24} {format_report(r)}")


def read_eval(root: Path, name: str) -> list[dict]:
    return read_samples(root / name / "countdown.jsonl")


def entropy_by_position(run_dir: Path, *, max_pos: int) -> list[dict]:
    """Per training step and response position: mean policy entropy of the on-policy tokens of that step's
    rollouts (``entropy`` column of the rollout records) and how many tokens it averages. The trainer computes
    entropy in its training forward, so only responses of groups that were trained on (mixed rewards) carry it;
    the others are NaN and left out."""
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

def train_all(out: Path, b: PremiseBudget, *, warm: Path, data: dict, log: Log, only_first: bool = False) -> dict:
    """Every (seed, method) run (``only_first``: on-policy seed 0 alone), each scored on the held-out split as soon
    as it finishes; returns their configs."""
    tfile = out / TIMINGS
    timings = json.loads(tfile.read_text()) if tfile.is_file() else {}
    cfgs = {}
    for seed in range(1 if only_first else b.seeds):
        for method in (["onpolicy"] if only_first else method_list(b)):
            keep = ((b.early_step,) if (method == "onpolicy" and seed == 0) else ()) + tuple(curve_steps(b))
            # run_config names a run <name> for seed 0 and <name>-seed<k> otherwise: <method>-seed<k> for every seed
            cfg = rl_config(method, b, out=out, seed=seed, model=warm, train_file=data["train"], save_steps=keep,
                            name=eval_name(method, 0) if seed == 0 else method)
            assert cfg.run_name == eval_name(method, seed), cfg.run_name
            cfgs[cfg.run_name] = cfg
            res = train_run(cfg, log=log)
            if not res["skipped"]:
                timings[cfg.run_name] = {"wall_s": res["wall_s"], "cpu_s": res["cpu_s"],
                                         "threads": torch.get_num_threads(), "load_1min": os.getloadavg()[0]}
                atomic_write_json(tfile, timings, indent=1)
            models = [(cfg.run_name, checkpoint(cfg, b.total_steps))]
            if method == "onpolicy" and seed == 0:
                models.append(("early", checkpoint(cfg, b.early_step)))
            models += [(curve_name(method, seed, st), checkpoint(cfg, st)) for st in curve_steps(b)]
            evaluate(models, b, heldout=data["heldout"], root=out / "eval", n=b.eval_n, log=log)
    return cfgs


def _pass1(root: Path, name: str, ks: Sequence[int]) -> float | None:
    """pass@1 of an eval name as the tables compute it (``per_problem``), None when it has not been scored."""
    if not (root / name / "countdown.jsonl").is_file():
        return None
    return float(per_problem(read_eval(root, name), ks)[3][:, list(ks).index(1)].mean())


LINKED = (".safetensors", ".parquet", ".pt", ".distcp")   # files a run writes once and never opens again to write


def _link_copy(src: str, dst: str) -> None:
    """Hard-link what a run writes once (``LINKED``: the checkpoints' tensors, the rollout records) and copy the
    rest (metrics, config and history, which a resumed run appends to or rewrites), so a copy of a run costs almost
    no disk and writing to the copy never changes the original."""
    if Path(src).suffix in LINKED:
        try:
            os.link(src, dst)
            return
        except OSError:   # another filesystem
            pass
    shutil.copy2(src, dst)


def extend_runs(out: Path, b: PremiseBudget, *, data: dict, extend_to: int, log: Log) -> dict:
    """``--extend-to``: matched pass@1 for the runs that did not get there within the budget (issue #25 item 4).
    A run whose pass@1 never reached the final pass@1 of on-policy with the same training seed at any scored
    checkpoint is copied to ``runs/<run>-long`` (``long_name``) and that copy resumed with a larger
    ``total_steps`` (the trainer's resume: the learning rate is constant, so the steps it already has are those of
    a longer run), ``curve_every`` steps at a time, each new checkpoint scored as ``<run>-stepNNN``, until its
    pass@1 reaches the target or it has trained ``extend_to`` steps. The run itself is untouched, so every table
    of the budget (methods, seed lift, compute) reads the same steps as without the extension.
    ``out/extension.json`` records which runs went how far; returns it."""
    root, ks = out / "eval", k_grid(b.eval_n)
    steps = check_extend_to(b, extend_to)
    record = {"extend_to": extend_to, "curve_every": b.curve_every, "runs": {}}
    for seed in range(b.seeds):
        target = _pass1(root, eval_name("onpolicy", seed), ks)
        if target is None:
            continue
        for method in method_list(b):
            run = eval_name(method, seed)
            final = _pass1(root, run, ks)
            if method == "onpolicy" or final is None:
                continue
            best = max([final, *(x for st in curve_steps(b)
                                 if (x := _pass1(root, curve_name(method, seed, st), ks)) is not None)])
            if best >= target:
                continue
            src = out / "runs" / run
            long = src.parent / long_name(run)
            if not long.is_dir():
                tmp = long.with_name(long.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(src, tmp, copy_function=_link_copy)
                tmp.rename(long)
            reached = None
            for st in steps:
                # the run's own recorded settings, continued: only the folder and the step count change
                cfg = load_config(long / "config.yaml", {"run_name": long.name, "output_dir": str(long.parent),
                                                         "total_steps": st})
                if not (len(read_metrics(long)) >= st and checkpoint(cfg, st).is_dir()):
                    log(f"{long.name}: pass@1 {best:.1%} < on-policy's {target:.1%}: training to step {st}")
                    train(cfg, Dist())
                evaluate([(curve_name(method, seed, st), checkpoint(cfg, st))], b, heldout=data["heldout"],
                         root=root, n=b.eval_n, log=log)
                best = max(best, _pass1(root, curve_name(method, seed, st), ks))
                if best >= target:
                    reached = st
                    break
            record["runs"][run] = {"method": method, "seed": seed, "target_pass@1": target, "trained_to": st,
                                   "reached_at": reached}
    atomic_write_json(out / EXTENSION, record, indent=1)   # a rerun re-derives it from the eval files
    log(f"extension: {len(record['runs'])} runs continued past step {b.total_steps} (-> {out / EXTENSION})")
    return record


def check_extend_to(b: PremiseBudget, extend_to: int) -> list[int]:
    """The checkpoints ``--extend-to`` would score past the budget (``extension_steps``); DemoError when none."""
    steps = extension_steps(b, extend_to)
    if not steps:
        raise DemoError(f"--extend-to {extend_to}: give a step count of at least total_steps + curve_every "
                        f"({b.total_steps} + {b.curve_every}) for budget {b.name}")
    return steps


def run_relay_stage(out: Path, b: PremiseBudget, *, early: Path, final: Path, heldout: Path, log: Log):
    """Relay early -> final (cut 0.5) on the held-out split; tables under ``out/analysis/relay/<tag>/``."""
    rdir = out / "analysis" / "relay" / RELAY_TAG
    cfg = RelayConfig(early=str(early), final=str(final), benchmark="countdown", problems=str(heldout),
                      n=b.relay_n, cut=0.5, max_tokens=b.max_response_tokens, temperature=1.0, seed=0, engine="hf",
                      out=rdir, batch_problems=16)
    tables, rdir, settings = run_relay(cfg, log=lambda m: log(f"  {m}"))
    write_results(rdir, tables, settings)
    return tables["relay_passk"]


TOKENS = ("generated", "prefilled", "trained")
CURVE_COLUMNS = ["method", "seed", "step", "pass@1", "pass@k", "k", *[f"tokens_{t}" for t in TOKENS],
                 "train_wall_s", "past_budget"]
MATCHED_COLUMNS = ["method", "seed", "k", "target_pass@1", "reached", "step", "pass@k", "onpolicy_pass@k", "diff",
                   "final_pass@1", "compute_tokens", "pass@1_at_compute", "onpolicy_pass@1_at_compute",
                   "diff1_at_compute", "pass@k_at_compute", "onpolicy_pass@k_at_compute", "diff_at_compute"]


def _tokens(metrics: list[dict], steps: int) -> dict:
    """The tokens a run generated, prefilled and trained in its first ``steps`` steps (``tokens/*`` metrics)."""
    return {f"tokens_{t}": int(sum(x.get(f"tokens/{t}", 0) for x in metrics if x["step"] < steps)) for t in TOKENS}


def _curve_rows(method: str, seed: int, points: list[tuple[int, dict]], metrics: list[dict], ks: Sequence[int],
                ids: list[str], *, total_steps: int) -> list[dict]:
    """One row per scored checkpoint of a run (step 0: the warm-up): pass@1 and pass@k at the largest k, and the
    tokens and wall seconds spent up to it; ``past_budget``: a checkpoint of its ``--extend-to`` continuation. A
    checkpoint scored on other problems (unfinished) is left out."""
    j1, jk = list(ks).index(1), len(ks) - 1
    rows = []
    for step, v in points:
        if v["ids"] != ids:
            continue
        rows.append({"method": method, "seed": seed, "step": step, "pass@1": float(v["m"][:, j1].mean()),
                     "pass@k": float(v["m"][:, jk].mean()), "k": int(ks[jk]), **_tokens(metrics, step),
                     "train_wall_s": sum(x.get("time/step_s", 0.0) for x in metrics if x["step"] < step),
                     "past_budget": step > total_steps})
    return rows


def matched_rows(curve: list[dict], k: int, *, total_steps: int | None = None) -> list[dict]:
    """Per (method, seed), against on-policy of the same training seed (``at_first_reach`` along the scored
    checkpoints): matched pass@1 -- its pass@k where its pass@1 first reaches on-policy's final pass@1, and
    on-policy's own pass@k there (``reached`` False: not within the checkpoints scored); matched compute -- both
    runs' pass@1 and pass@k at C = the smaller of their final generated-token counts, and the differences (pass@k
    alone would favour a run that spends more tokens per step: at C it has trained fewer steps, so it has narrowed
    less). ``total_steps``: checkpoints past it (``--extend-to``) count for the reach only; the target, the final
    pass@1 and the compute comparison read the budget's steps."""
    d = pd.DataFrame(curve)
    out = []
    if d.empty:
        return out
    for (method, seed), whole in d.groupby(["method", "seed"]):
        whole = whole.sort_values("step")
        g = whole if total_steps is None else whole[whole["step"] <= total_steps]
        ref = d[(d["method"] == "onpolicy") & (d["seed"] == seed)].sort_values("step")
        if total_steps is not None:
            ref = ref[ref["step"] <= total_steps]
        if ref.empty:
            continue
        target = float(ref["pass@1"].iloc[-1])
        hit = at_first_reach(whole["step"], whole["pass@1"], whole["pass@k"], target)
        own = at_first_reach(ref["step"], ref["pass@1"], ref["pass@k"], target)["y"]
        c = float(min(g["tokens_generated"].iloc[-1], ref["tokens_generated"].iloc[-1]))
        at_c, on_c = ({col: at_first_reach(r["step"], r["tokens_generated"], r[col], c)["y"]
                       for col in ("pass@1", "pass@k")} for r in (g, ref))
        out.append({"method": method, "seed": seed, "k": k, "target_pass@1": target, "reached": hit["reached"],
                    "step": hit["step"], "pass@k": hit["y"], "onpolicy_pass@k": own, "diff": hit["y"] - own,
                    "final_pass@1": float(g["pass@1"].iloc[-1]), "compute_tokens": c,
                    "pass@1_at_compute": at_c["pass@1"], "onpolicy_pass@1_at_compute": on_c["pass@1"],
                    "diff1_at_compute": at_c["pass@1"] - on_c["pass@1"], "pass@k_at_compute": at_c["pass@k"],
                    "onpolicy_pass@k_at_compute": on_c["pass@k"], "diff_at_compute": at_c["pass@k"] - on_c["pass@k"]})
    return out


def analyse(out: Path, b: PremiseBudget, *, log: Log) -> dict:
    """Every cached table under ``out/tables`` from the eval files, the relay results and the rollouts."""
    tdir = out / "tables"
    tdir.mkdir(parents=True, exist_ok=True)
    root = out / "eval"
    ks = k_grid(b.eval_n)
    nsol = {r["id"]: r["n_solutions"] for r in map(json.loads, (out / "data" / "heldout.jsonl").read_text().splitlines())}

    counts: list[pd.DataFrame] = []   # per (model, problem): n, correct, distinct; every table's source (committed)

    def model(name, keep=False):
        rows = read_eval(root, name)
        n, c, ids, m = per_problem(rows, ks)
        d = distinct_correct(rows)
        if keep:
            counts.append(pd.DataFrame({"model": name, "problem_id": ids, "n": n, "correct": c, "distinct": d}))
        return {"ids": ids, "n": n, "c": c, "m": m, "distinct": d}

    base = {"warmup": model("warmup", True), "early": model("early", True), "final": model(eval_name("onpolicy", 0))}
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
    mrows, per_run, curve = [], {}, []
    timings = json.loads((out / TIMINGS).read_text()) if (out / TIMINGS).is_file() else {}
    extended = json.loads((out / EXTENSION).read_text())["runs"] if (out / EXTENSION).is_file() else {}
    for method in method_list(b):
        for seed in range(b.seeds):
            f = root / eval_name(method, seed) / "countdown.jsonl"
            if not f.is_file():
                continue
            v = model(eval_name(method, seed))
            if v["ids"] != ids:
                continue   # not every problem scored yet
            model(eval_name(method, seed), keep=True)
            per_run[(method, seed)] = v["m"]
            run_dir = out / "runs" / eval_name(method, seed)
            m = read_metrics(run_dir)
            mrows.append({"method": method, "seed": seed,
                          **{f"pass@{k}": float(v["m"][:, j].mean()) for j, k in enumerate(ks)},
                          "distinct_correct": float(v["distinct"].mean()),
                          "crossover_k": crossover_k(ks, (v["m"] - base["warmup"]["m"]).mean(axis=0)),
                          "train_wall_s": sum(x.get("time/step_s", 0.0) for x in m),
                          "train_cpu_s": timings.get(eval_name(method, seed), {}).get("cpu_s", math.nan),
                          "cov_selected_share": _cov_share(m),
                          **_tokens(m, b.total_steps)})
            scored = [st for st in curve_steps(b)
                      if (root / curve_name(method, seed, st) / "countdown.jsonl").is_file()]
            # --extend-to: the continued copy's checkpoints past the budget, with its metrics (the same first steps)
            ext = extended.get(eval_name(method, seed))
            later = [st for st in extension_steps(b, ext["trained_to"])
                     if (root / curve_name(method, seed, st) / "countdown.jsonl").is_file()] if ext else []
            points = [(0, base["warmup"]), *[(st, model(curve_name(method, seed, st))) for st in scored],
                      (b.total_steps, v), *[(st, model(curve_name(method, seed, st))) for st in later]]
            if later:
                m = read_metrics(run_dir.parent / long_name(eval_name(method, seed)))
            curve += _curve_rows(method, seed, points, m, ks, ids, total_steps=b.total_steps)
    # every method against on-policy of the same training seed, paired over the problems, at every k (the only
    # interval a one-seed table has: it holds the held-out sampling noise, not the spread over training seeds)
    paired = []
    for (method, seed), m in per_run.items():
        on = per_run.get(("onpolicy", seed))
        if method == "onpolicy" or on is None:
            continue
        for j, k in enumerate(ks):
            p = paired_bootstrap(m[:, j], on[:, j], n_boot=N_BOOT)
            paired.append({"method": method, "seed": seed, "k": int(k), **p})
    tables = {"passk_curves": curves, "passk_diff": pd.DataFrame(diffs), "distinct": pd.DataFrame(distinct),
              "methods": pd.DataFrame(mrows), "training_curve": pd.DataFrame(curve, columns=CURVE_COLUMNS),
              "matched_pass1": pd.DataFrame(matched_rows(curve, b.eval_n, total_steps=b.total_steps),
                                            columns=MATCHED_COLUMNS),
              "methods_vs_onpolicy": pd.DataFrame(paired, columns=["method", "seed", "k", "diff", "low", "high",
                                                                   "p_value"])}
    ent_run = out / "runs" / eval_name("onpolicy", 0)
    tables["entropy_positions"] = pd.DataFrame(entropy_by_position(ent_run, max_pos=b.max_response_tokens),
                                               columns=["step", "position", "entropy", "tokens"])
    tables["per_problem"] = pd.concat(counts, ignore_index=True)
    rel = out / "analysis" / "relay" / RELAY_TAG
    for name in ("relay_passk", "relay_problems"):
        if (rel / f"{name}.csv").is_file():
            tables[name] = pd.read_csv(rel / f"{name}.csv")
    tables.update(support_and_lift(out, b, log=log))
    for name, df in tables.items():
        df.to_csv(tdir / f"{name}.csv", index=False)
    atomic_write_json(tdir / "crossover.json", cross)
    log(f"tables: {', '.join(sorted(tables))}, crossover -> {tdir}")
    return {**tables, "crossover": cross}


def _cov_share(metrics: list[dict]) -> float:
    """Mean over a run's updates of the share of loss tokens Clip-Cov zeroes or KL-Cov penalises
    (``clip_cov/selected_share``, ``kl_cov/selected_share``); NaN for the other methods."""
    vals = [x[k] for x in metrics for k in ("clip_cov/selected_share", "kl_cov/selected_share") if k in x]
    return float(np.mean(vals)) if vals else math.nan


def support_and_lift(out: Path, b: PremiseBudget, *, log: Log) -> dict[str, pd.DataFrame]:
    """Issue #26 on the regime's cached files: ``support`` (``tsanalysis support`` over warm-up -> early -> final
    -> relay: the problems each later model gained and lost per k, expected counts with paired intervals; the final
    checkpoint is named ``final``) and, from the ratio run's rollout records (``tsanalysis seeds``),
    ``seed_lift_summary`` / ``seed_lift_by_depth`` / ``seed_lift_by_age``: the continuations' value from each seed
    against the fresh group of its prompt. A run written before the records carried ``source_correct`` has no
    lift tables (logged)."""
    final = eval_name("onpolicy", 0)
    rdir = out / "analysis" / "relay" / RELAY_TAG
    relay = rdir if (rdir / "results.jsonl").is_file() else None
    models = ["warmup", "early", final] + (["relay"] if relay else [])
    cfg = SupportConfig(eval_dir=out / "eval", models=models, relay=relay)
    sup = support_tables(cfg, log=lambda m: None)["support"]
    tables = {"support": sup.replace({"from": {final: "final"}, "to": {final: "final"}})}
    run = out / "runs" / eval_name("seeds_ratio", 0)
    if "seeds_ratio" in method_list(b) and run.is_dir():
        try:
            lift = seeds_tables(run)
        except RecordsError as e:
            log(f"seed lift: not measured ({e})")
        else:
            tables.update({f"seed_lift_{k}": lift[k] for k in ("summary", "by_depth", "by_age")})
    return tables


def draw(out: Path, *, log: Log) -> dict[str, Path]:
    """The PNGs from the cached tables: ``out/figures/premise_{passk,entropy,relay,frontier,seed_lift}.png``."""
    use_headless_backend()
    t = load_tables(out)
    fdir = out / "figures"
    fdir.mkdir(parents=True, exist_ok=True)
    figs = {"premise_passk": plot_passk_curves(t["passk_curves"], t["passk_diff"], t["crossover"]),
            "premise_entropy": plot_entropy(t["entropy_positions"])}
    if "relay_passk" in t:
        figs["premise_relay"] = plot_relay_passk({"countdown (held-out)": t["relay_passk"]})
    if "training_curve" in t and len(t["training_curve"]):
        figs["premise_frontier"] = plot_frontier(t["training_curve"], labels={m: s.paper for m, s in METHODS.items()})
    if "seed_lift_by_depth" in t:
        figs["premise_seed_lift"] = plot_seed_lift(t["seed_lift_by_depth"], t["seed_lift_by_age"])
    paths = {}
    for name, fig in figs.items():
        paths[name] = fdir / f"{name}.png"
        fig.savefig(paths[name], dpi=DPI)
    log(f"figures: {', '.join(str(p) for p in paths.values())}")
    return paths


class _Stages(Timings):
    """Timings whose every finished stage is added at once to ``out/<STAGES>`` (the cost over all invocations,
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
                log: Log = print, extend_to: int = 0, title: str | None = None, command: str | None = None,
                endpoints: bool = False) -> dict:
    """Every stage (module docstring), resumable; ``extend_to`` > 0 adds ``extend_runs`` after the methods (runs
    that did not reach on-policy's pass@1 continue up to that step); returns {"tables", "figures", "timings",
    "page"}."""
    out = Path(out)
    prepare_out(out, b, fresh=fresh, log=log)
    work_before = _work_done(out)
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
    if extend_to:
        with t.stage("extension (--extend-to)", log) as st:
            ext = extend_runs(out, b, data=data, extend_to=extend_to, log=log)
            st["note"] = (f"{len(ext['runs'])} runs continued past step {b.total_steps} (at most to {extend_to}), "
                          f"each new checkpoint scored")
    # the machine and code that measured this folder, for the page (demo.premise_page.page_record); a resume that
    # trained nothing keeps the record of the invocation that did
    if not (out / MEASURED).is_file() or _work_done(out) != work_before:
        atomic_write_json(out / MEASURED, {"machine": machine(threads=False), "commit": code_commit()}, indent=1)
    with t.stage("analysis + figures", log) as st:
        tables = analyse(out, b, log=log)
        figs = draw(out, log=log)
        st["note"] = f"{len(tables)} tables, {len(figs)} PNGs"
    page = None
    if doc is not None:
        page = write_page(out, b, doc=Path(doc), log=log, title=title, command=command, endpoints=endpoints)
    return {"tables": tables, "figures": figs, "timings": t, "page": page}


def _work_done(out: Path) -> tuple[bytes, ...]:
    """What the folder records of its training (the warm-up's summary, each run's timing, the extension): a change
    means this invocation trained something."""
    files = (Path("warmup") / "warmup_summary.json", Path(TIMINGS), Path(EXTENSION))
    return tuple((out / f).read_bytes() if (out / f).is_file() else b"" for f in files)


def _add_stage(out: Path, name: str, entry: dict) -> None:
    """Add one finished stage's wall and CPU seconds to ``out/<STAGES>``."""
    f = out / STAGES
    stages = json.loads(f.read_text()) if f.is_file() else {}
    o = stages.get(name, {})
    stages[name] = {"wall_s": o.get("wall_s", 0.0) + entry.get("wall_s", 0.0),
                    "cpu_s": o.get("cpu_s", 0.0) + entry.get("cpu_s", 0.0),
                    "note": entry.get("note") or o.get("note", "")}
    atomic_write_json(f, stages, indent=1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.premise", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1] + "\n" + EXIT_CODES_HELP)
    p.add_argument("--budget", choices=sorted(BUDGETS), default="premise",
                   help="premise (the documented regime, ~90 minutes on 2 cores) or toy (seconds; the tests)")
    p.add_argument("--out", default=None, help="output folder (default runs/premise, runs/premise-toy with --budget toy)")
    p.add_argument("--doc", default=None,
                   help="the page to write (default OUT/premise.md for the premise budget, none for toy; "
                        "--doc docs/premise.md updates the committed page)")
    p.add_argument("--seeds", type=int, default=None, help="training seeds per method (default: the budget's, 3)")
    p.add_argument("--methods", default=None,
                   help=f"comma-separated table rows, onpolicy among them (default: the budget's); choose from "
                        f"{', '.join(METHODS)}")
    p.add_argument("--extend-to", type=int, default=0, metavar="STEPS",
                   help="matched pass@1: continue every run whose pass@1 did not reach on-policy's (same training "
                        "seed) within the budget, scoring a checkpoint every curve_every steps, up to STEPS steps "
                        "(a copy of the run is resumed; the run and the budget's tables are unchanged)")
    p.add_argument("--title", default=None, help="the page's heading (a page of other rows than the premise's)")
    p.add_argument("--endpoints", action="store_true",
                   help="add the power study's endpoints, fixed before its runs (demo/endpoints.py: pass@1 at the "
                        "budget, pass@K at matched pass@1, Thinking Seeds against the current-state restart; paired "
                        f"by seed, Holm over the family); its rows: --methods {POWER_METHODS}")
    p.add_argument("--write-only", action="store_true", help="only rewrite the figures and the page from the tables")
    p.add_argument("--fresh", action="store_true", help="delete the output folder first")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 2 when the cores are idle, else 1, as python -m demo)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    b = BUDGETS[args.budget]
    # the page's "Regenerate" line: the command itself where it chose rows, a page, a title or an extension
    rest = [a for a in argv if a not in ("--write-only", "--fresh")]
    command = ("python -m demo.premise " + shlex.join(rest)) if rest and (
        args.methods or args.title or args.extend_to or args.endpoints or args.seeds is not None) else None
    if args.seeds is not None:
        if args.seeds < 1:
            p.error("--seeds must be >= 1")
        b = replace(b, seeds=args.seeds)
    if args.methods is not None:
        b = replace(b, methods=args.methods)
    out = Path(args.out or ("runs/premise" if args.budget == "premise" else "runs/premise-toy"))
    # the page goes under the run folder; the committed docs/premise.md only when asked (--doc docs/premise.md)
    doc = args.doc or (str(out / "premise.md") if args.budget == "premise" else None)

    def body() -> int:
        method_list(b)   # a bad --methods: one line, exit 2, before anything runs
        if args.extend_to:
            check_extend_to(b, args.extend_to)   # before anything runs
        if args.write_only:
            analyse(out, b, log=print)
            draw(out, log=print)
            if doc:
                write_page(out, b, doc=Path(doc), log=print, title=args.title, command=command,
                           endpoints=args.endpoints)
            return 0
        threads, why = (args.threads, "--threads") if args.threads else auto_threads()
        torch.set_num_threads(max(1, threads))
        print(f"torch threads: {threads} ({why})", flush=True)
        run_premise(b, out, fresh=args.fresh, doc=doc, extend_to=args.extend_to, title=args.title, command=command,
                    endpoints=args.endpoints)
        return 0

    # contracts.commands: DemoError one line, exit 2; other failures one line, exit 1; Ctrl-C 130, SIGTERM 143
    resume = f"finished stages are kept in {out}/ and the same command resumes after them"
    return run_command(body, input_errors=(DemoError,), resume=lambda: resume, kept=lambda: resume)


if __name__ == "__main__":
    sys.exit(main())
