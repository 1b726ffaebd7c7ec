"""The addition miniature (``python -m demo --task addition``, ``--quick``), one function per stage, every stage
in this process.

    warm-up  -> a tiny model learns the task's solution format (supervised, ``trainer.warmup``), stopped at a loss
                that leaves it usable but imperfect, so RL has something to improve; shared by every run
    train    -> one ``trainer.train.train`` run per method, all from the warm-up, with matched budgets
    eval     -> ``eval.run`` on the task's held-out benchmark split: every final checkpoint and the warm-up
    relay    -> ``tsanalysis.relay``: an early on-policy checkpoint writes half a response, the final one finishes
    figures  -> ``figures.make_all``: per-position, truncation-token, zero-advantage and mismatch analyses of
                every run, then Figures 2-5 (+ Lemma 4, mismatch) as PNGs
    summary  -> a leaderboard per method (eval numbers beside training cost), stage timings, every path written

Each stage skips work whose outputs exist (a finished run, graded problems, up-to-date analyses), so an
interrupted demo resumes where it stopped; ``fresh=True`` deletes the output folder first. The output folder
is self-contained: ``runs/`` (one folder per run), ``warmup/`` (the warm-up checkpoint), ``data/`` (the
decontaminated training pool), ``eval/`` (sample files, leaderboard.md/.csv), ``analysis/`` (tables, relay
results), ``figures/`` (PNGs), ``summary.md``/``summary.json``.

Everything the miniature changes relative to the paper is in ``Budget`` (sizes) and ``METHODS`` (which preset
stands for which paper row); the methods themselves are the presets ``trainer/configs/mini_*.yaml``. What every demo
shares (a run from a preset, the output-folder claim, timings, threads, the machine line) is ``demo.common``'s.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from contracts.commands import pct, points
from contracts.files import atomic_write_json, atomic_write_jsonl, atomic_write_text
from contracts.samples import read_samples
from demo.common import (DemoError, Log, RunSpec, Timings, claim_out, machine, metric_mean, read_metrics, relay_rows,
                         run_config, seeded, train_run)
from eval.config import EvalConfig
from eval.metrics import compare
from eval.report import format_report
from eval.run import run_eval
from figures.make_all import make_all
from figures.style import use_headless_backend
from scoring.benchmarks import get_benchmark
from scoring.tasks import TRAIN_SEED, WARMUP_SEED, get_task
from trainer.checkpoint import checkpoint_dir
from trainer.warmup import build_warmup, read_warmup
from tsanalysis.config import RelayConfig
from tsanalysis.io import write_results
from tsanalysis.relay import run_relay

MARKER = "demo.json"          # written in the output folder: the budget it was made with (guards --fresh)
BASELINE = "onpolicy"         # the leaderboard's paired comparisons are against on-policy DAPO


# ------------------------------------------------------------------------------------------------------------
# what runs, at which size
# ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    """Sizes of one demo. Every RL run gets the same steps, prompts, samples, response budget and learning rate."""

    name: str
    model_size: str               # inference.tiny size of the policy
    warmup_max_steps: int         # supervised steps at most (batch 64, lr 3e-3, cosine)
    warmup_stop_loss: float       # ... stopped once the mean solution loss of the last 20 steps is at or below this
    total_steps: int              # RL optimizer steps per run
    prompts_per_step: int         # B
    samples_per_prompt: int       # G
    max_response_tokens: int      # generation budget per response (seed + continuation)
    lr: float                     # RL learning rate
    seed_interval: int            # T of the seeded runs (ratio, entropy, state)
    fig4_interval: int            # T of the Figure 4 run (ratio 0.7): the paper's 16 in the full demo (refreshes at
                                  # steps 0, 16, 32 of 40); 4 in the quick one, so its 8 steps hold two refreshes
    early_every: int              # the on-policy run saves a checkpoint every this many steps; relay's early model is the first
    eval_n: int                   # samples per held-out problem (avg@n, pass@k for k <= n)
    eval_limit: int | None        # held-out problems scored (None: the benchmark's whole split)
    relay_n: int                  # relay samples per problem (relay and final-only each)
    relay_limit: int | None       # relay problems (None: the whole split)
    task: str = "addition"        # embedded task (scoring.tasks) and benchmark (scoring.benchmarks.tasks) of the same name
    warmup_pool: int = 20000      # supervised examples generated (test prompts removed)
    train_pool: int = 4000        # RL prompts generated (test prompts removed)


QUICK = Budget(name="quick", model_size="1m", warmup_max_steps=300, warmup_stop_loss=0.2, total_steps=8,
               prompts_per_step=8, samples_per_prompt=8, max_response_tokens=40, lr=3e-5, seed_interval=4,
               fig4_interval=4, early_every=2, eval_n=4, eval_limit=48, relay_n=4, relay_limit=32)
# Full: RL learning rate and batch measured on this task (one seed, 40 steps, held-out avg@8 of the warm-up
# 25.3 %): lr 6e-5 with 32 prompts +4.7 points [+2.4, +7.0], 3e-5 +3.5; with 16 prompts lr 1e-4 lost 6 points and
# 3e-4 collapsed to 4 % (a step of parameter norm 0.05 along the policy gradient already halves the accuracy
# of this tiny policy, while 0.01 raises it: the landscape is sharp, and Adam moves every parameter by ~lr).
FULL = Budget(name="full", model_size="1m", warmup_max_steps=400, warmup_stop_loss=0.10, total_steps=40,
              prompts_per_step=32, samples_per_prompt=8, max_response_tokens=48, lr=6e-5, seed_interval=8,
              fig4_interval=16, early_every=10, eval_n=8, eval_limit=None, relay_n=8, relay_limit=None)
BUDGETS = {"quick": QUICK, "full": FULL}
# The code miniature (Table 2): the embedded ``minicode`` task, whose reward runs the policy's programs in the
# sandbox. Its own warm-up (the solver programs) and a budget sized to the sandbox's cost: ~60 ms of CPU per
# program, graded in worker processes (scoring.rewards.grade_code_batch), so a step of 16 x 8 programs costs ~2 s on idle cores (measured: 1.1 s for 8 x 8).
# The warm-up stops at mean loss 0.015 (195 steps here, held-out 51 %): run to 300 steps it reached 94 % and RL
# had nothing left to learn (held-out 94 -> 86 %); stopped at 0.04 / 0.025 it scored 15 / 41 %.
CODE = Budget(name="code", model_size="1m", warmup_max_steps=300, warmup_stop_loss=0.015, total_steps=60,
              prompts_per_step=16, samples_per_prompt=8, max_response_tokens=64, lr=2e-4, seed_interval=8,
              fig4_interval=8, early_every=10, eval_n=4, eval_limit=100, relay_n=4, relay_limit=32, task="minicode",
              warmup_pool=8000, train_pool=4000)


METHODS: tuple[RunSpec, ...] = (
    RunSpec("onpolicy", "mini_onpolicy", "On-policy DAPO (Tables 1-2); Figure 3(a); relay's final model",
            lambda b: {"save_every": b.early_every, "keep_checkpoints": 0}),
    RunSpec("onpolicy_minibatch", "mini_onpolicy_minibatch", "On-policy with 4 mini-batch updates per batch (Figure 3b)"),
    RunSpec("seeds_ratio", "mini_seeds_ratio", "Ours_ratio: ratio 0.5, state+action (Tables 1-2); Figure 5 ratio",
            seeded("ratio", 0.5, "state+action", lambda b: b.seed_interval)),
    RunSpec("seeds_entropy", "mini_seeds_entropy", "Ours_entropy: entropy rule, k 8 (Tables 1-2); Figure 5 entropy",
            seeded("entropy", 0.5, "state+action", lambda b: b.seed_interval)),
    RunSpec("seeds_state", "mini_seeds_state", "state variant: seed tokens masked (Table 2/3)",
            seeded("ratio", 0.5, "state", lambda b: b.seed_interval)),
    RunSpec("seeds_fig4", "mini_seeds_fig4", "Figure 4 run: ratio 0.7, state+action",
            seeded("ratio", 0.7, "state+action", lambda b: b.fig4_interval)),
    RunSpec("luffy", "mini_luffy", "LUFFY: 7 on-policy + 1 solver trace per group (Tables 1-2)"),
    RunSpec("m2po", "mini_m2po", "M2PO: rollouts 4 steps stale, second-moment mask (Tables 1-2)"),
)

# Table 2's rows at miniature scale: ratio 0.3 and T 8 as in the paper's code setting
CODE_METHODS: tuple[RunSpec, ...] = (
    RunSpec("code_onpolicy", "mini_code_onpolicy", "Table 2 On-policy (code, rewards from the sandbox)"),
    RunSpec("code_seeds_state_action", "mini_code_seeds_state_action", "Table 2 Ours state+action: ratio 0.3, T 8",
            seeded("ratio", 0.3, "state+action", lambda b: b.seed_interval)),
    RunSpec("code_seeds_state", "mini_code_seeds_state", "Table 2 Ours state: ratio 0.3, T 8, seed tokens masked",
            seeded("ratio", 0.3, "state", lambda b: b.seed_interval)),
)

# which run feeds which figure (figures.make_all would choose the same from the configs; explicit is safer)
FIGURE_RUNS = {"fig3": {"onpolicy": "onpolicy", "minibatch": "onpolicy_minibatch"}, "fig4": "seeds_fig4",
               "fig5": {"entropy": "seeds_entropy", "ratio": "seeds_ratio"}, "lemma4": "seeds_fig4",
               "mismatch": "seeds_fig4"}


# ------------------------------------------------------------------------------------------------------------
# the output folder
# ------------------------------------------------------------------------------------------------------------
def prepare_out(out: Path, budget: Budget, *, fresh: bool, log: Log) -> None:
    """Create ``out`` (or wipe it with ``fresh``); refuse a folder made with another budget, or not by the demo."""
    claim_out(out, MARKER, asdict(budget), owner="the demo", fresh=fresh, log=log)


# ------------------------------------------------------------------------------------------------------------
# stage 1: data and warm-up
# ------------------------------------------------------------------------------------------------------------
def heldout_prompts(task: str) -> set[str]:
    """Every prompt of the task's held-out benchmark split (the whole split, whatever eval_limit is)."""
    return {p.question for p in get_benchmark(task).load()}


def make_data(out: Path, budget: Budget, *, log: Log) -> Path:
    """``out/data/<task>_train.jsonl``: the RL prompt pool, with every held-out test prompt removed."""
    path = out / "data" / f"{budget.task}_train.jsonl"
    if path.is_file():
        return path
    held = heldout_prompts(budget.task)
    rows = [r for r in get_task(budget.task).make_examples(budget.train_pool, seed=TRAIN_SEED)
            if r["prompt"] not in held]
    atomic_write_jsonl(path, rows)
    log(f"RL prompt pool: {len(rows)} of {budget.train_pool} generated rows ({budget.train_pool - len(rows)} "
        f"held-out test prompts removed) -> {path}")
    return path


def warmup(out: Path, budget: Budget, *, log: Log) -> tuple[Path, dict]:
    """The supervised warm-up checkpoint ``out/warmup`` (``trainer.warmup.build_warmup``, built once at one torch
    thread; ``warmup_summary.json`` inside) on the task's solver traces, every held-out test prompt removed."""
    path = out / "warmup"
    done = read_warmup(path)
    if done is not None:
        log(f"warm-up checkpoint exists: {path}")
        return path, done
    held = heldout_prompts(budget.task)
    pool = [r for r in get_task(budget.task).make_examples(budget.warmup_pool, seed=WARMUP_SEED)
            if r["prompt"] not in held]
    summary = build_warmup(path, size=budget.model_size, examples=pool, steps=budget.warmup_max_steps,
                           stop_loss=budget.warmup_stop_loss, lr=3e-3, batch_size=64, seed=0, log=log, log_every=50,
                           summary_extra={"model_size": budget.model_size, "task": budget.task})
    return path, summary


# ------------------------------------------------------------------------------------------------------------
# stage 2: training (one run: demo.common.run_config, train_run)
# ------------------------------------------------------------------------------------------------------------
def final_checkpoint(cfg) -> Path:
    return checkpoint_dir(cfg.run_dir, cfg.total_steps - 1)


# ------------------------------------------------------------------------------------------------------------
# stage 3: evaluation (the same runner as the real benchmarks)
# ------------------------------------------------------------------------------------------------------------
def evaluate(models: Sequence[tuple[str, Path]], budget: Budget, *, out: Path, log: Log,
             baseline: str | None = BASELINE) -> dict:
    """``eval.run.run_eval`` on every (name, checkpoint); returns the leaderboard dict (``baseline`` is the
    reference of its paired comparisons). Its report lines and the leaderboard also go to ``out/eval/eval.log``."""

    root = out / "eval"
    root.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    cfg = EvalConfig(models=[str(path) for _, path in models], benchmarks=[budget.task],
                     names=[name for name, _ in models], out=str(root), n=budget.eval_n, limit=budget.eval_limit,
                     seed=0, engine="hf", progress=False,
                     baseline=baseline if baseline in {n for n, _ in models} else None)
    result = run_eval(cfg, log=lines.append)
    for r in result["reports"]:
        log(f"  {r['model']:<20} {format_report(r)}")
    (root / "eval.log").write_text("\n".join(lines) + "\n\n" + result["leaderboard_md"] + "\n")
    return result["leaderboard"]


# ------------------------------------------------------------------------------------------------------------
# stage 4: relay inference (Figure 2)
# ------------------------------------------------------------------------------------------------------------
def relay(early: Path, final: Path, budget: Budget, *, out: Path, log: Log):
    """Relay early -> final on the held-out split; tables written under ``out/analysis/relay/<tag>/``."""
    tag = f"{budget.task}-{early.name}-to-{final.name}-cut0.5"
    cfg = RelayConfig(early=str(early), final=str(final), benchmark=budget.task, n=budget.relay_n, cut=0.5,
                      temperature=1.0, seed=0, limit=budget.relay_limit, engine="hf",
                      out=out / "analysis" / "relay" / tag, batch_problems=16)
    tables, rdir, settings = run_relay(cfg, log=lambda m: log(f"  {m}"))
    write_results(rdir, tables, settings)
    return tables["relay_passk"], rdir


# ------------------------------------------------------------------------------------------------------------
# stage 5: analyses and figures
# ------------------------------------------------------------------------------------------------------------
def figures(out: Path, *, log: Log) -> dict:
    use_headless_backend()
    return make_all(out, selection=FIGURE_RUNS, log=lambda m: log(f"  {m}"))


# ------------------------------------------------------------------------------------------------------------
# the summary
# ------------------------------------------------------------------------------------------------------------
def paired_vs(root: Path, task: str, name: str, base: str) -> dict | None:
    """Paired bootstrap (over shared problems) of avg@n of ``name`` minus ``base``: {diff, low, high, p_value}."""
    a, b = root / name / f"{task}.jsonl", root / base / f"{task}.jsonl"
    if not (a.is_file() and b.is_file()):
        return None
    return compare(read_samples(a), read_samples(b))


def method_table(board: dict, runs: dict[str, dict], *, root: Path, task: str,
                 warmup_name: str = "warmup") -> list[dict]:
    """One row per evaluated model: held-out avg@n with its interval, pass@k, the paired difference to the
    warm-up, and the run's training cost."""
    entries = {e["model"]: e for e in board["entries"] if e["source"] == "samples"}
    order = [warmup_name] + [n for n in runs if n in entries] + sorted(set(entries) - set(runs) - {warmup_name})
    rows = []
    for name in order:
        e = entries.get(name)
        if e is None:
            continue
        r = runs.get(name, {})
        m = read_metrics(r["run_dir"]) if r.get("run_dir") else []
        rows.append({
            "method": name, "avg": e["avg"], "ci_low": e["ci_low"], "ci_high": e["ci_high"],
            "problems": e["problems"], "n": e["n"], "pass": e["pass"],
            "vs_warmup": None if name == warmup_name else paired_vs(root, task, name, warmup_name),
            "train_reward_first": metric_mean(m, "reward/mean", first=True) if m else None,
            "train_reward_last": metric_mean(m, "reward/mean") if m else None,
            "generated_tokens": int(sum(x.get("tokens/generated", 0) for x in m)) if m else None,
            "train_wall_s": sum(x.get("time/step_s", 0.0) for x in m) if m else None,
            "token_factor": m[-1].get("seeds/token_factor") if m else None,
        })
    return rows


def render_methods(rows: list[dict]) -> str:
    ks = sorted({k for r in rows for k in r["pass"]})
    head = ("| method | avg@n % [95% CI] | " + " | ".join(f"pass@{k}" for k in ks)
            + " | vs warm-up, points [95% CI] | train reward first→last | tokens generated | train wall s |")
    lines = [head, "|---|---|" + "---:|" * len(ks) + "---:|---|---:|---:|"]
    for r in rows:
        reward = ("" if r["train_reward_first"] is None else
                  f"{r['train_reward_first']:.2f} → {r['train_reward_last']:.2f}")
        d = r["vs_warmup"]
        vs = "" if d is None else f"{points(d['diff'])} [{points(d['low'])}, {points(d['high'])}]"
        avg, low, high = (pct(r[key], unit="", missing="") for key in ("avg", "ci_low", "ci_high"))
        wall = "" if r["train_wall_s"] is None else f"{r['train_wall_s']:.0f}"
        lines.append(f"| {r['method']} | {avg} [{low}, {high}] (P={r['problems']}, n={r['n']}) | "
                     + " | ".join(pct(r["pass"].get(k), unit="", missing="") for k in ks)
                     + f" | {vs} | {reward} | {r['generated_tokens'] if r['generated_tokens'] is not None else ''} | "
                     + f"{wall} |")
    return "\n".join(lines)


def render_relay(passk) -> str:
    lines = ["| k | early | relay | final | relay − final [95% CI] |", "|---:|---:|---:|---:|---|"]
    return "\n".join(lines + relay_rows(passk))


# ------------------------------------------------------------------------------------------------------------
# the whole demo
# ------------------------------------------------------------------------------------------------------------
def run_demo(budget: Budget, out: str | os.PathLike, *, seeds: int = 1, fresh: bool = False,
             progress: bool = False, methods: Sequence[RunSpec] = METHODS, log: Log = print) -> dict:
    """Every stage, in order; returns {"timings", "methods", "relay", "figures", "paths", "summary"}."""
    out = Path(out)
    if seeds < 1:
        raise DemoError(f"--seeds must be >= 1, got {seeds}")
    prepare_out(out, budget, fresh=fresh, log=log)
    t = Timings()
    with t.stage("data + warm-up", log) as st:
        train_file = make_data(out, budget, log=log)
        warm, wsum = warmup(out, budget, log=log)
        st["note"] = f"tiny:{budget.model_size}, {wsum['steps']} supervised steps, final loss {wsum['loss_last']:.3f}"

    cfgs, runs = {}, {}
    with t.stage("train", log) as st:
        for seed in range(seeds):
            for spec in methods:
                cfg = run_config(spec, budget, out=out, seed=seed, model=warm, train_file=train_file,
                                 progress=progress)
                cfgs[cfg.run_name] = cfg
                runs[cfg.run_name] = train_run(cfg, log=log)
        done = [r for r in runs.values() if not r["skipped"]]
        st["note"] = (f"{len(runs)} runs x {budget.total_steps} steps ({len(done)} trained, "
                      f"{len(runs) - len(done)} cached)")
        st["runs"] = {n: {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "skipped": r["skipped"]} for n, r in runs.items()}

    with t.stage("eval", log) as st:
        models = [("warmup", warm)] + [(n, final_checkpoint(c)) for n, c in cfgs.items()]
        board = evaluate(models, budget, out=out, log=log)
        st["note"] = (f"{len(models)} models x {budget.eval_limit or 'all'} problems x n={budget.eval_n} "
                      f"(benchmark '{budget.task}')")

    relay_passk, relay_dir = None, None
    if "onpolicy" in cfgs:
        with t.stage("relay", log) as st:
            early = checkpoint_dir(cfgs["onpolicy"].run_dir, budget.early_every - 1)
            relay_passk, relay_dir = relay(early, final_checkpoint(cfgs["onpolicy"]), budget, out=out, log=log)
            st["note"] = (f"{early.name} -> {final_checkpoint(cfgs['onpolicy']).name} of onpolicy, "
                          f"{budget.relay_limit or 'all'} problems x n={budget.relay_n}")

    with t.stage("analyses + figures", log) as st:
        report = figures(out, log=log)
        st["note"] = f"{len(report['written'])} PNGs" + (f", {len(report['failed'])} failed" if report["failed"] else "")

    rows = method_table(board, runs, root=out / "eval", task=budget.task)
    paths = {
        "runs": sorted(str(c.run_dir) for c in cfgs.values()),
        "warm-up checkpoint": str(warm),
        "eval samples": sorted(str(p) for p in (out / "eval").glob(f"*/{budget.task}.jsonl")),
        "leaderboard": [str(out / "eval" / "leaderboard.md"), str(out / "eval" / "leaderboard.csv")],
        "relay": str(relay_dir) if relay_dir else None,
        "analysis tables": str(out / "analysis"),
        "figures": [str(p) for p in report["written"]],
        "summary": [str(out / "summary.md"), str(out / "summary.json")],
    }
    summary = render_summary(budget, seeds, out, wsum, rows, relay_passk, report, t, paths)
    atomic_write_text(out / "summary.md", summary)
    atomic_write_json(out / "summary.json", {
        "budget": asdict(budget), "seeds": seeds, "warmup": wsum, "methods": rows,
        "relay_passk": None if relay_passk is None else relay_passk.to_dict(orient="records"),
        "timings": t.stages, "machine": machine(), "figures_failed": report["failed"], "paths": paths,
    }, default=str)
    log("\n" + summary)
    if report["failed"]:
        raise DemoError(f"figures failed: {report['failed']}")
    return {"timings": t, "methods": rows, "relay": relay_passk, "figures": report, "paths": paths,
            "summary": summary}


def render_summary(budget: Budget, seeds: int, out: Path, wsum: dict, rows: list[dict], relay_passk,
                   report: dict, t: Timings, paths: dict) -> str:
    b = budget
    parts = [
        f"# Thinking Seeds miniature demo ({b.name})", "",
        f"Task `{b.task}` (embedded), policy tiny:{b.model_size}, supervised warm-up {wsum['steps']} steps "
        f"(loss {wsum['loss_last']:.3f}), then RL for every method with the same budget: {b.total_steps} steps x "
        f"{b.prompts_per_step} prompts x {b.samples_per_prompt} samples, <= {b.max_response_tokens} tokens, "
        f"lr {b.lr:g}; seeded runs T = {b.seed_interval} (Figure 4 run: T = {b.fig4_interval}); "
        f"training seeds: {seeds}.", "",
        f"Held-out evaluation: benchmark `{b.task}` of `eval` ({b.eval_limit or 'all'} problems, n = {b.eval_n}, "
        f"temperature 1.0); intervals are 95 % bootstraps over problems (the difference to the warm-up: paired, "
        f"over the same problems).", "",
        "## Leaderboard", "", render_methods(rows), "",
    ]
    if relay_passk is not None:
        parts += ["## Relay (Figure 2): early on-policy checkpoint writes half, final continues", "",
                  render_relay(relay_passk), ""]
    parts += ["## Stage timings", "", t.table(), "", f"Machine: {machine()}.", "", "## Written", ""]
    for k, v in paths.items():
        if isinstance(v, list):
            parts.append(f"- {k}:" + "".join(f"\n  - {x}" for x in v))
        elif v:
            parts.append(f"- {k}: {v}")
    if report["skipped"]:
        parts += ["", "Skipped figures: " + "; ".join(f"{k} ({v})" for k, v in report["skipped"].items())]
    return "\n".join(parts) + "\n"
