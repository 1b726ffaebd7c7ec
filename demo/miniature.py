"""The miniature results table over training seeds: ``python -m demo.miniature --seeds 3 [--out runs/miniature]``.

Trains every method of the table (on-policy DAPO, Thinking Seeds with the ratio and entropy rules and the state
variant, LUFFY, M2PO) and the two ablations at miniature scale (truncation ratio 0.3/0.5/0.7/0.9 at the main T,
refresh interval T = 2/4/8 at ratio 0.5) with the full demo's budget (``demo.addition.FULL``), once per training
seed, from ONE shared supervised warm-up (the seeds vary the RL data order, sampling and truncation, not the
warm-up). Each final checkpoint is scored on the held-out split right after it finishes, so an interrupted
sweep keeps everything it finished; rerunning skips finished runs and graded problems. Runs go seed by seed
(every method of seed 0, then seed 1, ...), so a partial sweep fills whole columns first.

At the end (or alone, with ``--write-only``) the page is written from whatever has been scored, to
``OUT/miniature.md`` (``--doc docs/miniature.md`` updates the committed page):
per method the mean held-out avg@n over seeds with a 95 % t-interval (Student t over seeds, k − 1 degrees of
freedom), the per-seed values, the paired difference to on-policy DAPO (same seed: same prompts in the same
order) with its t-interval, and the measured cost; cells with no finished seed are marked "not run". The
hand-written notes from ``NOTES_HEADING`` on are kept, and every number in them is checked against the new tables
(``demo.page_numbers``, with ``NOTES_SOURCES`` below for the derived and cited ones): numbers that no longer match
are printed and listed in a line under the heading.

The page is rendered from a tables folder alone (issue #39 item 6): ``collect`` gathers from the run folders into
``OUT/tables`` the held-out per-problem counts (n, correct) of every scored model (``per_problem.csv``), each run's
train wall and CPU seconds and tokens generated (``runs.csv``), the warm-ups' summaries (``warmup.json``) and the
per-method, per-seed table the page prints (``methods.csv``: avg@n and the paired difference to on-policy of every
scored run); ``page.json`` holds the command, the budgets, the machine and commit that measured the runs and when the
page was written, ``notes_sources.json`` what each entry of ``NOTES_SOURCES`` gave on this page. The folder is copied
beside the page (``docs/miniature/tables/`` for ``--doc docs/miniature.md``), where ``tests/demo/test_pages.py``
renders the page again from it and recomputes its statistics from the per-problem counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from scipy.stats import t as student_t

from contracts.commands import EXIT_CODES_HELP, run_command
from contracts.files import atomic_write_json, atomic_write_text
from contracts.passk import avg_at_n
from contracts.samples import read_samples
from demo.addition import (CODE, CODE_METHODS, FULL, METHODS, Budget, evaluate, final_checkpoint, heldout_prompts,
                           make_data, prepare_out, warmup)
from demo.common import (MEASURED, PAGE_JSON, REPO, DemoError, RunSpec, auto_threads, code_commit, figure_dir, machine,
                         read_metrics, run_config, run_name, seeded, train_run)
from demo.page_numbers import Cited, Derived, Page, Source, Table, mark, parse_page, split, warning
from eval.metrics import counts
from scoring.tasks.addition import DIFFICULTY as ADDITION
from scoring.tasks.minicode import DIFFICULTY as MINICODE, FN_NAMES as MINICODE_NAMES, OPS as MINICODE_OPS
from trainer.algos.seeds import token_factor

_BY_NAME = {s.name: s for s in METHODS}

# the table's rows: the main methods, then the ablations (ratio 0.5 / T = main T is seeds_ratio itself)
TABLE: tuple[RunSpec, ...] = (
    _BY_NAME["onpolicy"], _BY_NAME["seeds_ratio"], _BY_NAME["seeds_entropy"], _BY_NAME["seeds_state"],
    _BY_NAME["luffy"], _BY_NAME["m2po"],
    *(RunSpec(f"seeds_ratio{int(100 * r)}", "mini_seeds_ratio", f"ratio ablation: ratio {r}, T main",
              seeded("ratio", r, "state+action", lambda b: b.seed_interval)) for r in (0.3, 0.7, 0.9)),
    *(RunSpec(f"seeds_T{t}", "mini_seeds_ratio", f"refresh-interval ablation: T {t}, ratio 0.5",
              seeded("ratio", 0.5, "state+action", lambda b, t=t: t)) for t in (2, 4)),
)


def label(name: str, b: Budget) -> str:
    fixed = {"onpolicy": "On-policy (DAPO)", "seeds_ratio": f"Thinking Seeds, ratio 0.5, T {b.seed_interval} (state+action)",
             "seeds_entropy": f"Thinking Seeds, entropy rule, T {b.seed_interval} (state+action)",
             "seeds_state": f"Thinking Seeds, ratio 0.5, T {b.seed_interval} (state)", "luffy": "LUFFY", "m2po": "M2PO"}
    if name in fixed:
        return fixed[name]
    if name.startswith("seeds_ratio"):
        return f"ablation: ratio 0.{name[len('seeds_ratio'):][0]}, T {b.seed_interval}"
    return f"ablation: T {name[len('seeds_T'):]}, ratio 0.5"

def t975(df: int) -> float:
    """The two-sided 95 % Student t quantile t_{0.975, df} (scipy.stats.t), any df >= 1: 12.706 at 1, 4.303 at 2,
    2.228 at 10, 2.201 at 11 (a table that stopped at 10 and fell back to z = 1.96 understated every interval over
    12 or more seeds)."""
    assert df >= 1, f"a t quantile needs df >= 1, got {df}"
    return float(student_t.ppf(0.975, df))


def t_interval(values: Sequence[float]) -> tuple[float, float | None]:
    """(mean, half-width of the 95 % t-interval over the values); half-width None for fewer than 2 values."""
    k = len(values)
    mean = sum(values) / k
    if k < 2:
        return mean, None
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (k - 1))
    return mean, t975(k - 1) * sd / math.sqrt(k)


TIMINGS = "timings.json"   # per run: wall and CPU seconds of training, torch threads, load average (this sweep's)


def sweep(out: Path, budget: Budget, seeds: int, *, fresh: bool = False, table: Sequence[RunSpec] = TABLE,
          log=print) -> None:
    prepare_out(out, budget, fresh=fresh, log=log)
    tfile = out / TIMINGS
    timings = json.loads(tfile.read_text()) if tfile.is_file() else {}
    train_file = make_data(out, budget, log=log)
    warm, _ = warmup(out, budget, log=log)
    evaluate([("warmup", warm)], budget, out=out, log=log, baseline=None)
    for seed in range(seeds):
        for spec in table:
            cfg = run_config(spec, budget, out=out, seed=seed, model=warm, train_file=train_file)
            t0 = time.perf_counter()
            res = train_run(cfg, log=log)
            if not res["skipped"]:
                timings[cfg.run_name] = {"wall_s": res["wall_s"], "cpu_s": res["cpu_s"],
                                         "threads": torch.get_num_threads(), "load_1min": os.getloadavg()[0]}
                atomic_write_json(tfile, timings, indent=1)
                log(f"{cfg.run_name}: trained in {time.perf_counter() - t0:.0f} s")
            evaluate([(cfg.run_name, final_checkpoint(cfg))], budget, out=out, log=log, baseline=None)
    # the machine and code that measured this folder, for the page (page_record)
    atomic_write_json(out / MEASURED, {"machine": machine(threads=False), "commit": code_commit()}, indent=1)


def code_dir(out: Path) -> Path:
    """The code table's folder beside the math one (its own budget and warm-up): ``runs/miniature-code``."""
    return out.with_name(out.name + "-code")


CODE_LABELS = {"code_onpolicy": "On-policy (DAPO)",
               "code_seeds_state_action": "Thinking Seeds, ratio 0.3, T 8 (state+action)",
               "code_seeds_state": "Thinking Seeds, ratio 0.3, T 8 (state)"}


# A section of the page from this heading on is written by hand (what the numbers say) and kept on rewrites.
NOTES_HEADING = "## Reading the table"


# ------------------------------------------------------------------------------------------------------------
# where the notes' numbers come from that are not values of the tables (demo.page_numbers; checked on every write
# and by tests/demo/test_page_numbers.py)
# ------------------------------------------------------------------------------------------------------------
MEAN, PER_SEED, VS, SEEDS = "mean ± 95% t-interval", "per seed", "vs on-policy", "seeds"
WALL, CPU, TOKENS = "train wall s", "train CPU s", "tokens generated"
_WARM = "supervised warm-up (no RL)"
_ON, _M2PO = label("onpolicy", FULL), label("m2po", FULL)
_RL = [label(s.name, FULL) for s in TABLE]
_SEEDED = [label(n, FULL) for n in ("seeds_ratio", "seeds_entropy", "seeds_state")]
_ABLATIONS = [label(s.name, FULL) for s in TABLE if s.name not in _BY_NAME]
_CODE_ON, _CODE_SEEDED = CODE_LABELS["code_onpolicy"], [CODE_LABELS["code_seeds_state_action"],
                                                       CODE_LABELS["code_seeds_state"]]


def _math(p: Page) -> Table:
    return p.table("Held-out avg@n")


def _code(p: Page) -> Table:
    return p.table("Code (Table 2's rows)")


def _span(xs: Sequence[float]) -> tuple[float, float]:
    return min(xs), max(xs)


def _ratios(t: Table, col: str, rows: Sequence[str], base: str) -> list[float]:
    return [t.num(r, col) / t.num(base, col) for r in rows]


_PREVIOUS = "docs/miniature.md at commit 56ef472 (the previous version of the page, measured at commit 6c2e2ad)"
_STANDALONE = "the standalone preset's run and its evaluation at commit 6c2e2ad (README there)"
_REPLAY = "tests/trainer/test_code_rl.py's replay at commit 2226b63 (its docstring gives the EPYC numbers)"
_DEMO = "runs/demo/summary.md of `python -m demo` at commit debe0dd, quoted in docs/miniature.md there"
NOTES_SOURCES: tuple[Source, ...] = (
    Derived("gains 4.7-7.7 points over the warm-up", "min and max over the RL rows of mean − the warm-up's",
            lambda p: _span([m - _math(p).num(_WARM, MEAN) for m in _math(p).column(MEAN, _RL)])),
    Derived("for the 10 comparisons:", "the RL rows other than on-policy", lambda p: [len(_RL) - 1]),
    Derived("ablations +0.3 to +0.8 with intervals of ±1.1-2.9",
            "min and max of the ablation rows' paired difference, then of its half-width",
            lambda p: (*_span(_math(p).column(VS, _ABLATIONS)),
                       *_span([_math(p).nums(r, VS)[1] for r in _ABLATIONS]))),
    Derived("(t = 4.3)", "t_{0.975, k−1} (t975) for the table's k seeds",
            lambda p: [t975(int(_math(p).num(_ON, SEEDS)) - 1)]),
    Derived("addition of 1-3 digit numbers", "the operand digits of scoring.tasks.addition.DIFFICULTY (the demo "
            "passes no task_kwargs)", lambda p: (ADDITION["min_digits"], ADDITION["max_digits"])),
    Cited("not 367", _PREVIOUS),
    Cited("(was 26.6 %)", _PREVIOUS),
    Cited("was 30.1 ± 0.6", _PREVIOUS),
    Cited("(was +1.1 ± 0.9)", _PREVIOUS),
    Cited("correction for the 10 comparisons.", "the RL rows other than on-policy (the table)"),
    Cited("moved every row by about 4 points", "this table's means against the previous page's (its on-policy "
          "30.1 and warm-up 26.6)"),
    Cited("stopped at step 332 instead", _DEMO),
    Cited("26.9 % held-out) gave on-policy 33.5 %, Thinking Seeds ratio 34.4 %, entropy rule 32.8 %, `state` 30.0 %, "
          "LUFFY 31.2 %, M2PO 29.7 %", _DEMO),
    Derived("1.34-1.35 x the on-policy tokens", "min and max over the three seeded method rows of tokens / on-policy's",
            lambda p: _span(_ratios(_math(p), TOKENS, _SEEDED, _ON))),
    Derived("the formula's 1.4375", "trainer.algos.seeds.token_factor(0.5, T) with the budget's T",
            lambda p: [token_factor(0.5, FULL.seed_interval)]),
    Derived("for 1.1-1.3 x the CPU time", "min and max over the three seeded method rows of CPU s / on-policy's",
            lambda p: _span(_ratios(_math(p), CPU, _SEEDED, _ON))),
    Derived("every method by 9.7-13.8 points", "min and max over the code RL rows of mean − the warm-up's",
            lambda p: _span([_code(p).num(r, MEAN) - _code(p).num(_WARM, MEAN) for r in [_CODE_ON, *_CODE_SEEDED]])),
    Cited("52.19, 50.20, 48.58 on LiveCodeBench v6", "the paper, §5.2 Table 2 (Qwen3-4B-Thinking-2507: state, "
          "state+action, on-policy)"),
    Cited("order, +2.3 ± 20.6 and +2.3 ± 26.8)", _PREVIOUS),
    Cited("rises from 0.73-0.80 to 0.85-0.89", "the code runs' metrics.jsonl (runs/miniature-code) at commit 6c2e2ad"),
    Derived("rises from 52.5 to 60-68 %", "the code warm-up's mean, then min and max of every code RL row's per-seed "
            "values", lambda p: (_code(p).num(_WARM, MEAN),
                                 *_span([v for r in [_CODE_ON, *_CODE_SEEDED] for v in _code(p).nums(r, PER_SEED)]))),
    Cited("run to 300 supervised steps it scored 94 % held-out and RL made it worse (86 %); stopped at loss 0.04 or "
          "0.025 it scored 15 or 41 %", "the code budget's search at commit 6c2e2ad (demo.addition's note on CODE)"),
    Derived("costs 1.7-2.2 s", "min and max of the code rows' train wall s / run over the budget's RL steps",
            lambda p: _span([w / CODE.total_steps for w in _code(p).column(WALL, [_CODE_ON, *_CODE_SEEDED])])),
    Derived("generate 1.6 x the on-policy tokens and take 1.28 x the wall time",
            "mean over the two seeded code rows of tokens / on-policy's, then of train wall s / on-policy's",
            lambda p: [sum(_ratios(_code(p), c, _CODE_SEEDED, _CODE_ON)) / 2 for c in (TOKENS, WALL)]),
    Derived("(9 runs", "the code table's RL rows x their seeds",
            lambda p: [sum(int(_code(p).num(r, SEEDS)) for r in [_CODE_ON, *_CODE_SEEDED])]),
    Cited("takes about 20 minutes with 2 torch threads on otherwise idle cores (measured at commit 6c2e2ad; the load "
          "average sits near 3", "`python -m demo.miniature --seeds 3 --tables minicode` at commit 6c2e2ad (README "
          "there: ~20 min)"),
    Derived("on all 300 prompts", "the minicode prompts: operations x constants x (stdin + one per function name)",
            lambda p: [len(MINICODE_OPS) * (MINICODE["max_k"] + 1) * (1 + len(MINICODE_NAMES))]),
    Cited("held-out 55.2 % avg@8 on 200 problems", _STANDALONE),
    Cited("reached 58.6 % [55.1, 62.1], with a training reward flat at 0.51-0.52", _STANDALONE),
    Cited("at lr 6e-4 it collapsed instead: training reward 0.30 -> 0.17, commit 88141fa", "commit 88141fa"),
    Cited("replayed at 30 steps (commit 2226b63) went 52.5 -> 60.5 % on an AVX-512 Xeon but 65.7 -> 55.7 % on an "
          "AVX2 EPYC (warm-up stopped at step 173, not 195", _REPLAY),
    Cited("paired interval [-16.8, -3.3] points)", _REPLAY),
)


# ------------------------------------------------------------------------------------------------------------
# the tables behind the page (issue #39 item 6): collected from the run folders; the page renders from them alone
# ------------------------------------------------------------------------------------------------------------
PER_PROBLEM = "per_problem.csv"   # task, model, problem_id, n, correct: every scored model's held-out counts
RUNS = "runs.csv"                 # per run folder: step times and tokens (metrics.jsonl), CPU s and load (timings)
WARMUPS = "warmup.json"           # {task: the warm-up's warmup_summary.json}
METHODS_CSV = "methods.csv"       # task, method, seed, run, avg, diff, train_wall_s, train_cpu_s, tokens_generated
NOTES_JSON = "notes_sources.json"  # what each NOTES_SOURCES entry gave on the page written with these tables
_COLUMNS = {PER_PROBLEM: ["task", "model", "problem_id", "n", "correct"],
            RUNS: ["task", "run", "has_metrics", "train_wall_s", "tokens_generated", "train_cpu_s", "threads",
                   "load_1min"],
            METHODS_CSV: ["task", "method", "seed", "run", "avg", "diff", "train_wall_s", "train_cpu_s",
                          "tokens_generated"]}


def _frame(rows: list[dict], name: str) -> pd.DataFrame:
    d = pd.DataFrame(rows, columns=_COLUMNS[name])
    return d.astype({c: "Int64" for c in ("seed", "threads") if c in d})   # integers with blanks, not floats


def read_table(tdir: Path, name: str) -> pd.DataFrame:
    """One CSV of a tables folder (pandas writes and reads its floats back to the bit)."""
    return pd.read_csv(Path(tdir) / name, dtype={"problem_id": str, "model": str, "run": str})


def problem_counts(folder: Path, task: str) -> pd.DataFrame:
    """(n, correct) per held-out problem of every model scored under ``folder/eval`` (``eval.metrics.counts``)."""
    rows = []
    for f in sorted((folder / "eval").glob(f"*/{task}.jsonl")):
        ids, n, c = counts(read_samples(f))
        rows += [{"task": task, "model": f.parent.name, "problem_id": i, "n": int(a), "correct": int(b)}
                 for i, a, b in zip(ids, n, c)]
    return _frame(rows, PER_PROBLEM)


def run_costs(folder: Path, task: str) -> pd.DataFrame:
    """Per run of ``folder/runs`` (or of its ``timings.json``): the sum of the trainer's step times and of the tokens
    it generated (``metrics.jsonl``; 0 without one), and the sweep's CPU seconds, threads and load (``TIMINGS``)."""
    tfile = folder / TIMINGS
    timings = json.loads(tfile.read_text()) if tfile.is_file() else {}
    logged = {p.parent.name for p in (folder / "runs").glob("*/metrics.jsonl")}
    rows = []
    for rn in sorted(logged | set(timings)):
        m = read_metrics(folder / "runs" / rn)
        t = timings.get(rn, {})   # a run trained before timings were kept has none
        rows.append({"task": task, "run": rn, "has_metrics": rn in logged,
                     "train_wall_s": sum(x.get("time/step_s", 0.0) for x in m),
                     "tokens_generated": sum(x.get("tokens/generated", 0) for x in m),
                     "train_cpu_s": t.get("cpu_s", math.nan), "threads": t.get("threads", math.nan),
                     "load_1min": t.get("load_1min", math.nan)})
    return _frame(rows, RUNS)


def model_avg(pp: pd.DataFrame, task: str) -> dict[str, float]:
    """{model: held-out avg@n} of one task's per-problem counts (the mean over problems of c / n)."""
    d = pp[pp["task"] == task]
    return {m: float(np.mean(avg_at_n(g["n"].to_numpy(), g["correct"].to_numpy())))
            for m, g in d.groupby("model", sort=False)}


def method_table(pp: pd.DataFrame, runs: pd.DataFrame, *, task: str, table: Sequence[RunSpec], seeds: int,
                 baseline: str) -> pd.DataFrame:
    """The rows the page prints for one task: the warm-up's avg@n, and per method and seed < ``seeds`` that was
    scored its avg@n, the difference to ``baseline`` of the same seed (NaN: the baseline itself, or unscored) and the
    run's cost (wall s and tokens 0 without metrics, CPU s NaN without a timing)."""
    avg = model_avg(pp, task)
    cost = runs[runs["task"] == task].set_index("run")
    by_name = {s.name: s for s in table}
    rows = [{"task": task, "method": "warmup", "run": "warmup", "avg": avg["warmup"]}] if "warmup" in avg else []
    for spec in table:
        for seed in range(seeds):
            rn = run_name(spec, seed)
            if rn not in avg:
                continue
            base = avg.get(run_name(by_name[baseline], seed))
            c = cost.loc[rn] if rn in cost.index else None
            rows.append({"task": task, "method": spec.name, "seed": seed, "run": rn, "avg": avg[rn],
                         "diff": avg[rn] - base if base is not None and spec.name != baseline else math.nan,
                         "train_wall_s": 0.0 if c is None else float(c["train_wall_s"]),
                         "train_cpu_s": math.nan if c is None else float(c["train_cpu_s"]),
                         "tokens_generated": 0 if c is None else c["tokens_generated"]})
    return _frame(rows, METHODS_CSV)


def sections(record: dict) -> list[tuple[str, Budget, Sequence[RunSpec], str]]:
    """(folder, budget, methods, baseline) of each table of the page: the math one, then the code one."""
    out = [(record["out"], Budget(**record["budget"]), TABLE, "onpolicy")]
    if record["code_out"] is not None:
        out.append((record["code_out"], Budget(**record["code_budget"]), CODE_METHODS, "code_onpolicy"))
    return out


def page_record(out: Path, seeds: int, *, command: str, code_out: Path | None) -> dict:
    """``page.json``: what ``render`` needs beyond the CSVs. The machine and commit are those that measured the runs
    (``MEASURED`` of the sweep folders), else this process's (a folder from before they were recorded)."""
    swept = [f / MEASURED for f in (out, code_out) if f is not None and (f / MEASURED).is_file()]
    measured = json.loads(swept[0].read_text()) if swept else {}
    return {"writer": "demo.miniature", "command": command, "seeds": seeds,
            "budget": dataclasses.asdict(FULL), "code_budget": dataclasses.asdict(CODE),
            "code_heldout_prompts": len(heldout_prompts(CODE.task)),
            "machine": measured.get("machine") or machine(threads=False),
            "commit": measured.get("commit") or code_commit(),
            "written": time.strftime("%Y-%m-%d %H:%M"), "out": str(out),
            "code_out": None if code_out is None else str(code_out)}


def collect(out: Path, seeds: int, *, command: str, code_out: Path | None = None) -> Path:
    """``out/tables``: everything the page renders from (module docstring), gathered from ``out`` and ``code_out``
    (the code table's folder); returns the folder."""
    tdir = out / "tables"
    tdir.mkdir(parents=True, exist_ok=True)
    record = page_record(out, seeds, command=command, code_out=code_out)
    pp, runs, warm = [], [], {}
    for folder, b, _, _ in sections(record):
        pp.append(problem_counts(Path(folder), b.task))
        runs.append(run_costs(Path(folder), b.task))
        wfile = Path(folder) / "warmup" / "warmup_summary.json"
        warm[b.task] = json.loads(wfile.read_text()) if wfile.is_file() else {}
    pp, runs = pd.concat(pp, ignore_index=True), pd.concat(runs, ignore_index=True)
    methods = pd.concat([method_table(pp, runs, task=b.task, table=table, seeds=seeds, baseline=base)
                         for _, b, table, base in sections(record)], ignore_index=True)
    pp.to_csv(tdir / PER_PROBLEM, index=False)
    runs.to_csv(tdir / RUNS, index=False)
    methods.to_csv(tdir / METHODS_CSV, index=False)
    atomic_write_json(tdir / WARMUPS, warm, indent=1)
    atomic_write_json(tdir / PAGE_JSON, record, indent=1)
    (tdir / NOTES_JSON).unlink(missing_ok=True)   # written with the page (write_page)
    return tdir


def read_page_record(tdir: Path) -> dict:
    """A tables folder's ``page.json`` (``page_record``)."""
    return json.loads((Path(tdir) / PAGE_JSON).read_text())


# ------------------------------------------------------------------------------------------------------------
# the page, from the tables folder alone
# ------------------------------------------------------------------------------------------------------------
def method_rows(d: pd.DataFrame, seeds: int, rows: list[tuple[str, str]], *, baseline: str) -> list[str]:
    """The markdown table of one task from its ``methods.csv`` rows ``d``: per method the mean over seeds with its
    t-interval, the per-seed values, the paired difference to ``baseline`` and the measured cost."""
    lines = ["| method | mean ± 95% t-interval | seeds | per seed | vs on-policy (paired, same seed) | "
             "train wall s / run | train CPU s / run | tokens generated / run |",
             "|---|---|---:|---|---|---:|---:|---:|"]
    for name, title in rows:
        m = d[d["method"] == name].sort_values("seed")
        if name == "warmup":
            cell = "not run" if m.empty else f"{100 * float(m['avg'].iloc[0]):.1f} (one model)"
            lines.append(f"| {title} | {cell} | – | – | – | – | – | – |")
            continue
        if m.empty:
            lines.append(f"| {title} | not run | 0/{seeds} | | | | | |")
            continue
        vals = [float(v) for v in m["avg"]]
        diffs = [float(v) for v in m["diff"].dropna()]
        walls = [float(v) for v in m["train_wall_s"]]
        cpus = [float(v) for v in m["train_cpu_s"].dropna()]
        toks = list(m["tokens_generated"])
        mean, hw = t_interval(vals)
        cell = f"{100 * mean:.1f}" + ("" if hw is None else f" ± {100 * hw:.1f}")
        per = ", ".join(f"{100 * v:.1f}" for v in vals)
        if diffs:
            dm, dhw = t_interval(diffs)
            dcell = f"{100 * dm:+.1f}" + ("" if dhw is None else f" ± {100 * dhw:.1f}") + f" (k={len(diffs)})"
        else:
            dcell = "–" if name == baseline else "no paired seed"
        cpu = f"{sum(cpus) / len(cpus):.0f}" if cpus else ""
        lines.append(f"| {title} | {cell} | {len(vals)}/{seeds} | {per} | {dcell} | "
                     f"{sum(walls) / len(walls):.0f} | {cpu} | {sum(toks) / len(toks):.0f} |")
    return lines


def render_code(d: pd.DataFrame, b: Budget, seeds: int, *, wsum: dict, heldout: int, folder: str) -> list[str]:
    """The code section (Table 2's rows at miniature scale) from the code table's ``methods.csv`` rows ``d``."""
    rows = [("warmup", "supervised warm-up (no RL)")] + [(s.name, CODE_LABELS[s.name]) for s in CODE_METHODS]
    lines = ["## Code (Table 2's rows): held-out avg@n, %", "",
             f"Task `{b.task}` (scoring/tasks/minicode.py: read two integers from stdin and print a function of "
             "them, or write a two-argument function for a functional test), every reward a program run in the "
             "sandbox with LiveCodeBench's harness (all tests pass -> 1). Policy tiny:"
             f"{b.model_size}, warm-up {wsum.get('steps', '?')} supervised steps on the solver programs (batch 64, "
             f"lr 3e-3, stopped at mean loss <= {b.warmup_stop_loss:g}; final {wsum.get('loss_last', math.nan):.3f}), "
             "shared by every run and seed; the warm-up and the RL pool leave out every prompt of the held-out split "
             f"({heldout} distinct prompts), so the score is on unseen combinations of "
             f"operation, constant and function name. RL {b.total_steps} steps x {b.prompts_per_step} prompts x "
             f"{b.samples_per_prompt} samples, <= {b.max_response_tokens} tokens, lr {b.lr:g}; seeded runs ratio 0.3, "
             f"T {b.seed_interval} (the paper's code setting). Held-out: benchmark `{b.task}` of `eval` "
             f"({b.eval_limit} problems, avg@{b.eval_n}, temperature 1.0, graded in the sandbox). "
             f"Folder `{folder}`.", ""]
    return lines + method_rows(d, seeds, rows, baseline="code_onpolicy") + [""]


COMMITTED_PAGE = REPO / "docs" / "miniature.md"


def render(tdir: Path, *, record: dict, doc: Path | None = None) -> str:
    """The page's generated part (everything above ``NOTES_HEADING``) from the tables folder ``tdir`` alone and its
    ``page.json`` record (``collect``)."""
    tdir = Path(tdir)
    methods, runs = read_table(tdir, METHODS_CSV), read_table(tdir, RUNS)
    pp = read_table(tdir, PER_PROBLEM)
    warm = json.loads((tdir / WARMUPS).read_text())
    seeds = record["seeds"]
    (out, b, _, _), *code = sections(record)
    wsum = warm[b.task]
    doc = Path(doc) if doc is not None else COMMITTED_PAGE
    rel = os.path.relpath(figure_dir(doc), doc.parent)
    lines = [
        "# Miniature results table", "",
        "The paper's comparison at toy scale on CPU: every method trains the same tiny policy from the same "
        "supervised warm-up on the embedded `addition` task with the same budget, once per training seed, and is "
        "scored on the task's held-out split. It exercises the whole pipeline; at this scale the differences "
        "between methods say little about the paper's claims, and the numbers below are reported as measured.", "",
        f"Regenerate: `{record['command']}` (resumable: finished runs and graded problems are skipped; "
        f"`python -m demo.miniature --seeds {seeds} --write-only` rewrites this page from what exists).", "",
        "## Budget", "",
        f"- policy: tiny:{b.model_size} (Llama, char tokenizer), supervised warm-up {wsum.get('steps', '?')} steps "
        f"(batch 64, lr 3e-3, stopped at mean loss <= {b.warmup_stop_loss}; final {wsum.get('loss_last', math.nan):.3f}), "
        "shared by every run and seed",
        f"- RL, identical for every run: {b.total_steps} steps x {b.prompts_per_step} prompts x "
        f"{b.samples_per_prompt} samples, <= {b.max_response_tokens} response tokens, AdamW lr {b.lr:g}, "
        "dynamic sampling (at most 2 sampling rounds per step); the presets `trainer/configs/mini_*.yaml` for "
        "everything else",
        f"- Thinking Seeds: T = {b.seed_interval} unless stated; entropy rule k = 8; LUFFY: 1 solver trace per "
        "group of 8; M2PO: rollouts 4 steps stale",
        f"- evaluation: benchmark `{b.task}` of `eval` ({b.eval_limit or 200} held-out problems, none of them in "
        f"the training pools), avg@{b.eval_n} at temperature 1.0",
        f"- training seeds: 0..{seeds - 1}; the interval is mean ± t_{{0.975, k-1}} · s / √k over the k seeds "
        "that finished (Student t; none for k = 1)", "",
    ]
    rows = [("warmup", "supervised warm-up (no RL)")] + [(s.name, label(s.name, b)) for s in TABLE]
    lines += ["## Held-out avg@n, %", ""] + method_rows(methods[methods["task"] == b.task], seeds, rows,
                                                        baseline="onpolicy")
    mine = runs[runs["task"] == b.task]
    threads = sorted({int(t) for t in mine["threads"].dropna()})
    loads = [float(x) for x in mine["load_1min"].dropna()]
    lines += ["", "Rows \"ablation: ratio 0.5\" and \"ablation: T {}\" are the Thinking Seeds ratio 0.5 row above.".format(
              b.seed_interval), ""]
    for folder, cb, _, _ in code:
        lines += render_code(methods[methods["task"] == cb.task], cb, seeds, wsum=warm[cb.task],
                             heldout=record["code_heldout_prompts"], folder=folder)
    scored = pp.loc[pp["task"] == b.task, "model"].nunique()
    lines += ["## Machine and cost", "",
              f"{record['machine']}. Training used {', '.join(map(str, threads)) or '?'} torch thread(s); "
              "train wall s is the sum of the trainer's step times (`time/step_s`), train CPU s the process CPU time "
              "of the run (with one thread, about the wall time it would take on an idle core)."
              + (f" The sweep shared the two cores with other jobs (1-minute load average {min(loads):.1f}-"
                 f"{max(loads):.1f} at the end of the runs), so wall times overstate an idle machine." if loads else ""),
              "",
              f"Page written {record['written']} from {scored} scored models and "
              f"{int(mine['has_metrics'].astype(bool).sum())} run folders under `{out}`, measured with the code of "
              f"commit {record['commit'] or '(unknown)'}; the tables behind every number are in `{rel}/tables/` "
              "(`tests/demo/test_pages.py` renders this page again from them and recomputes its statistics).", ""]
    return "\n".join(lines)


def notes_sources(generated: str) -> list[dict]:
    """Each ``NOTES_SOURCES`` entry as written to ``notes_sources.json``: its phrase, where its numbers come from,
    and for a derivation the values it gives on the page's generated part (None: not computable from these tables)."""
    page, out = parse_page(generated), []
    for src in NOTES_SOURCES:
        if isinstance(src, Cited):
            out.append({"phrase": src.phrase, "cited": src.source})
            continue
        try:
            values = [float(x) for x in src.compute(page)]
        except (AssertionError, IndexError, KeyError, ValueError, ZeroDivisionError):   # a table not run yet
            values = None
        out.append({"phrase": src.phrase, "derived": src.how, "values": values})
    return out


def write_page(out: Path, seeds: int, *, doc: Path, command: str, code_out: Path | None = None) -> tuple[str, list]:
    """``doc`` rendered from the tables ``collect`` gathers, with the hand-written notes of the existing page (a new
    page elsewhere takes them from the committed one) checked against the new tables (``mark``); the tables are
    copied beside the page (``figure_dir``). Returns (the page, the notes' stale numbers)."""
    tdir = collect(out, seeds, command=command, code_out=code_out)
    generated = render(tdir, record=read_page_record(tdir), doc=doc)
    page = generated
    old = doc.read_text() if doc.is_file() else (COMMITTED_PAGE.read_text() if COMMITTED_PAGE.is_file() else "")
    if NOTES_HEADING in old:   # the hand-written reading of the numbers is kept
        page = page.rstrip("\n") + "\n\n" + old[old.index(NOTES_HEADING):]
    page, stale = mark(page, NOTES_HEADING, NOTES_SOURCES)
    atomic_write_json(tdir / NOTES_JSON, notes_sources(split(page, NOTES_HEADING)[0]), indent=1)
    beside = figure_dir(doc) / "tables"
    if beside.resolve() != tdir.resolve():
        shutil.rmtree(beside, ignore_errors=True)
        shutil.copytree(tdir, beside)
    atomic_write_text(doc, page)
    return page, stale


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.miniature", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1] + "\n" + EXIT_CODES_HELP)
    p.add_argument("--seeds", type=int, default=3, help="training seeds per method (default 3)")
    p.add_argument("--out", default="runs/miniature", help="runs, eval results (default runs/miniature)")
    p.add_argument("--doc", default=None, help="the page to write (default OUT/miniature.md; --doc docs/miniature.md "
                                                 "updates the committed page)")
    p.add_argument("--write-only", action="store_true", help="only rewrite the page from what has been scored")
    p.add_argument("--fresh", action="store_true", help="delete the output folder first")
    p.add_argument("--tables", default="addition,minicode",
                   help="which tables to train: addition (the math rows), minicode (Table 2's code rows, in "
                        "OUT-code), or both (default)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 2 when the cores are idle, else 1, as python -m demo)")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    tables = {t.strip() for t in args.tables.split(",") if t.strip()}
    if not tables or not tables <= {"addition", "minicode"}:
        p.error(f"--tables takes addition, minicode or both, got {args.tables!r}")
    out = Path(args.out)
    command = "python -m demo.miniature --seeds {}{}{}".format(
        args.seeds, "" if args.out == "runs/miniature" else f" --out {args.out}",
        f" --doc {args.doc}" if args.doc else "")

    def body() -> int:
        if not args.write_only:
            threads, why = (args.threads, "--threads") if args.threads else auto_threads()
            torch.set_num_threads(max(1, threads))
            print(f"torch threads: {threads} ({why})", flush=True)
            if "addition" in tables:
                sweep(out, FULL, args.seeds, fresh=args.fresh)
            if "minicode" in tables:
                sweep(code_dir(out), CODE, args.seeds, fresh=args.fresh, table=CODE_METHODS)
        doc = Path(args.doc) if args.doc else out / "miniature.md"
        page, stale = write_page(out, args.seeds, doc=doc, command=command, code_out=code_dir(out))
        if stale:
            print(warning(stale, doc=doc, heading=NOTES_HEADING, sources_in="demo/miniature.py"), file=sys.stderr)
        print(page)
        committed = COMMITTED_PAGE.relative_to(REPO)
        print(f"wrote {doc} and its tables {figure_dir(doc) / 'tables'}" + (
            "" if doc.resolve() == COMMITTED_PAGE.resolve() else
            f" (the committed page is {committed}: --doc {committed} updates it)"))
        return 0

    # contracts.commands: DemoError one line, exit 2; other failures one line, exit 1; Ctrl-C 130, SIGTERM 143
    resume = f"finished runs and scores are kept in {out}/ and the same command resumes after them"
    return run_command(body, input_errors=(DemoError,), resume=lambda: resume, kept=lambda: resume)


if __name__ == "__main__":
    sys.exit(main())
