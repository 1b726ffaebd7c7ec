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
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import torch
from scipy.stats import t as student_t

from contracts.commands import EXIT_CODES_HELP, run_command
from contracts.files import atomic_write_json, atomic_write_text
from contracts.passk import summarize
from contracts.samples import read_samples
from demo.addition import (CODE, CODE_METHODS, FULL, METHODS, Budget, evaluate, final_checkpoint, heldout_prompts,
                           make_data, prepare_out, warmup)
from demo.common import (REPO, DemoError, RunSpec, auto_threads, machine, read_metrics, run_config, run_name, seeded,
                         train_run)
from demo.page_numbers import Cited, Derived, Page, Source, Table, mark, warning
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


def scores(out: Path, task: str) -> dict[str, float]:
    """{eval folder name: avg@n} of every scored model under out/eval."""
    res = {}
    for f in sorted((out / "eval").glob(f"*/{task}.jsonl")):
        rows = read_samples(f)
        if rows:
            _, n, c = counts(rows)
            res[f.parent.name] = summarize(n, c, ks=[1])["avg"]
    return res


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


def method_rows(out: Path, seeds: int, rows: list[tuple[str, str]], table: Sequence[RunSpec], sc: dict,
                timings: dict, *, baseline: str) -> list[str]:
    """The markdown table of one task: per method the mean over seeds with its t-interval, the per-seed values,
    the paired difference to ``baseline`` and the measured cost."""
    by_name = {s.name: s for s in table}
    base = {seed: sc.get(run_name(by_name[baseline], seed)) for seed in range(seeds)}
    lines = ["| method | mean ± 95% t-interval | seeds | per seed | vs on-policy (paired, same seed) | "
             "train wall s / run | train CPU s / run | tokens generated / run |",
             "|---|---|---:|---|---|---:|---:|---:|"]
    for name, title in rows:
        if name == "warmup":
            v = sc.get("warmup")
            cell = "not run" if v is None else f"{100 * v:.1f} (one model)"
            lines.append(f"| {title} | {cell} | – | – | – | – | – | – |")
            continue
        spec = by_name[name]
        vals, diffs, walls, cpus, toks = [], [], [], [], []
        for seed in range(seeds):
            rn = run_name(spec, seed)
            v = sc.get(rn)
            if v is None:
                continue
            vals.append(v)
            if base.get(seed) is not None and name != baseline:
                diffs.append(v - base[seed])
            m = read_metrics(out / "runs" / rn)
            walls.append(sum(x.get("time/step_s", 0.0) for x in m))
            if rn in timings:
                cpus.append(timings[rn]["cpu_s"])
            toks.append(sum(x.get("tokens/generated", 0) for x in m))
        if not vals:
            lines.append(f"| {title} | not run | 0/{seeds} | | | | | |")
            continue
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


def render_code(out: Path, budget: Budget, seeds: int) -> list[str]:
    """The code section (Table 2's rows at miniature scale) from ``out`` (the code sweep's folder)."""
    b = budget
    sc = scores(out, b.task)
    wfile = out / "warmup" / "warmup_summary.json"
    wsum = json.loads(wfile.read_text()) if wfile.is_file() else {}
    tfile = out / TIMINGS
    timings = json.loads(tfile.read_text()) if tfile.is_file() else {}
    rows = [("warmup", "supervised warm-up (no RL)")] + [(s.name, CODE_LABELS[s.name]) for s in CODE_METHODS]
    lines = ["## Code (Table 2's rows): held-out avg@n, %", "",
             f"Task `{b.task}` (scoring/tasks/minicode.py: read two integers from stdin and print a function of "
             "them, or write a two-argument function for a functional test), every reward a program run in the "
             "sandbox with LiveCodeBench's harness (all tests pass -> 1). Policy tiny:"
             f"{b.model_size}, warm-up {wsum.get('steps', '?')} supervised steps on the solver programs (batch 64, "
             f"lr 3e-3, stopped at mean loss <= {b.warmup_stop_loss:g}; final {wsum.get('loss_last', math.nan):.3f}), "
             "shared by every run and seed; the warm-up and the RL pool leave out every prompt of the held-out split "
             f"({len(heldout_prompts(b.task))} distinct prompts), so the score is on unseen combinations of "
             f"operation, constant and function name. RL {b.total_steps} steps x {b.prompts_per_step} prompts x "
             f"{b.samples_per_prompt} samples, <= {b.max_response_tokens} tokens, lr {b.lr:g}; seeded runs ratio 0.3, "
             f"T {b.seed_interval} (the paper's code setting). Held-out: benchmark `{b.task}` of `eval` "
             f"({b.eval_limit} problems, avg@{b.eval_n}, temperature 1.0, graded in the sandbox). Folder `{out}`.", ""]
    return lines + method_rows(out, seeds, rows, CODE_METHODS, sc, timings, baseline="code_onpolicy") + [""]



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


_PREVIOUS = "docs/miniature.md at commit debe0dd (the previous version of the page)"
_STANDALONE = "the standalone preset's run and its evaluation at commit 6c2e2ad (README there)"
_REPLAY = "tests/trainer/test_code_rl.py's replay at commit 2226b63 (its docstring gives the EPYC numbers)"
_DEMO = "runs/demo/summary.md of `python -m demo` at commit debe0dd, quoted in " + _PREVIOUS
NOTES_SOURCES: tuple[Source, ...] = (
    Derived("gains 2.3-4.6 points over the warm-up", "min and max over the RL rows of mean − the warm-up's",
            lambda p: _span([m - _math(p).num(_WARM, MEAN) for m in _math(p).column(MEAN, _RL)])),
    Derived("ablations +0.3 to +0.9 with intervals of ±1.4-2.8",
            "min and max of the ablation rows' paired difference, then of its half-width",
            lambda p: (*_span(_math(p).column(VS, _ABLATIONS)),
                       *_span([_math(p).nums(r, VS)[1] for r in _ABLATIONS]))),
    Derived("per seed 0.8, 1.0 and 0.8 points down", "on-policy's per-seed values − M2PO's, seed by seed",
            lambda p: [a - b for a, b in zip(_math(p).nums(_ON, PER_SEED), _math(p).nums(_M2PO, PER_SEED))]),
    Derived("(t = 4.3)", "t_{0.975, k−1} (t975) for the table's k seeds",
            lambda p: [t975(int(_math(p).num(_ON, SEEDS)) - 1)]),
    Derived("addition of 1-3 digit numbers", "the operand digits of scoring.tasks.addition.DIFFICULTY (the demo "
            "passes no task_kwargs)", lambda p: (ADDITION["min_digits"], ADDITION["max_digits"])),
    Cited("instead of 398k", f"M2PO's tokens / run (398203) in {_PREVIOUS}"),
    Cited("was 29.3 ± 1.1", _PREVIOUS),
    Cited("was 29.1", _PREVIOUS),
    Cited("moved from 27.3", f"on-policy's seed 0 in {_PREVIOUS}"),
    Derived("with 282 more tokens", f"on-policy's tokens / run − 368850, its value in {_PREVIOUS}",
            lambda p: [_math(p).num(_ON, TOKENS) - 368850]),
    Cited("was +1.9 ± 4.0", _PREVIOUS),
    Cited("stopped at step 332 instead", _DEMO),
    Cited("26.9 % held-out) gave on-policy 33.5 %, Thinking Seeds ratio 34.4 %, entropy rule 32.8 %, `state` 30.0 %, "
          "LUFFY 31.2 %, M2PO 29.7 %", _DEMO),
    Derived("1.30-1.31 x the on-policy tokens", "min and max over the three seeded method rows of tokens / on-policy's",
            lambda p: _span(_ratios(_math(p), TOKENS, _SEEDED, _ON))),
    Derived("the formula's 1.4375", "trainer.algos.seeds.token_factor(0.5, T) with the budget's T",
            lambda p: [token_factor(0.5, FULL.seed_interval)]),
    Derived("for 1.4-1.5 x the CPU time", "min and max over the three seeded method rows of CPU s / on-policy's",
            lambda p: _span(_ratios(_math(p), CPU, _SEEDED, _ON))),
    Derived("every method by 21-24 points", "min and max over the code RL rows of mean − the warm-up's",
            lambda p: _span([_code(p).num(r, MEAN) - _code(p).num(_WARM, MEAN) for r in [_CODE_ON, *_CODE_SEEDED]])),
    Derived("spread from 66.8 to 78.8", "min and max of on-policy's per-seed code values",
            lambda p: _span(_code(p).nums(_CODE_ON, PER_SEED))),
    Cited("52.19, 50.20, 48.58 on LiveCodeBench v6", "the paper, §5.2 Table 2 (Qwen3-4B-Thinking-2507: state, "
          "state+action, on-policy)"),
    Cited("rises from 0.73-0.80 to 0.85-0.89", "the code runs' metrics.jsonl (runs/miniature-code) at commit 6c2e2ad"),
    Derived("rises from 51 to 67-79 %", "the code warm-up's mean, then min and max of every code RL row's per-seed "
            "values", lambda p: (_code(p).num(_WARM, MEAN),
                                 *_span([v for r in [_CODE_ON, *_CODE_SEEDED] for v in _code(p).nums(r, PER_SEED)]))),
    Cited("run to 300 supervised steps it scored 94 % held-out and RL made it worse (86 %); stopped at loss 0.04 or "
          "0.025 it scored 15 or 41 %", "the code budget's search at commit 6c2e2ad (demo.addition's note on CODE)"),
    Derived("costs 1.7-2 s", "min and max of the code rows' train wall s / run over the budget's RL steps",
            lambda p: _span([w / CODE.total_steps for w in _code(p).column(WALL, [_CODE_ON, *_CODE_SEEDED])])),
    Derived("generate 1.4 x the on-policy tokens and take 1.13 x the wall time",
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
          "AVX2 EPYC (warm-up stopped at step 173, not", _REPLAY),
    Cited("paired interval [-16.8, -3.3] points)", _REPLAY),
)


def render(out: Path, budget: Budget, seeds: int, *, command: str, code_out: Path | None = None) -> str:
    b = budget
    sc = scores(out, b.task)
    warm_summary = out / "warmup" / "warmup_summary.json"
    wsum = json.loads(warm_summary.read_text()) if warm_summary.is_file() else {}
    lines = [
        "# Miniature results table", "",
        "The paper's comparison at toy scale on CPU: every method trains the same tiny policy from the same "
        "supervised warm-up on the embedded `addition` task with the same budget, once per training seed, and is "
        "scored on the task's held-out split. It exercises the whole pipeline; at this scale the differences "
        "between methods say little about the paper's claims, and the numbers below are reported as measured.", "",
        f"Regenerate: `{command}` (resumable: finished runs and graded problems are skipped; "
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
    tfile = out / TIMINGS
    timings = json.loads(tfile.read_text()) if tfile.is_file() else {}
    lines += ["## Held-out avg@n, %", ""] + method_rows(out, seeds, rows, TABLE, sc, timings, baseline="onpolicy")
    runs_done = [p for p in (out / "runs").glob("*/metrics.jsonl")] if (out / "runs").is_dir() else []
    threads = sorted({t["threads"] for t in timings.values()})
    loads = [t["load_1min"] for t in timings.values()]
    lines += ["", "Rows \"ablation: ratio 0.5\" and \"ablation: T {}\" are the Thinking Seeds ratio 0.5 row above.".format(
              b.seed_interval), ""]
    if code_out is not None:
        lines += render_code(code_out, CODE, seeds)
    lines += ["## Machine and cost", "",
              f"{machine(threads=False)}. Training used {', '.join(map(str, threads)) or '?'} torch thread(s); "
              "train wall s is the sum of the trainer's step times (`time/step_s`), train CPU s the process CPU time "
              "of the run (with one thread, about the wall time it would take on an idle core)."
              + (f" The sweep shared the two cores with other jobs (1-minute load average {min(loads):.1f}-"
                 f"{max(loads):.1f} at the end of the runs), so wall times overstate an idle machine." if loads else ""),
              "",
              f"Page written {time.strftime('%Y-%m-%d %H:%M')} from {len(sc)} scored models and "
              f"{len(runs_done)} run folders under `{out}`.", ""]
    return "\n".join(lines)


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
        page = render(out, FULL, args.seeds, command=command, code_out=code_dir(out))
        doc = Path(args.doc) if args.doc else out / "miniature.md"
        committed = REPO / "docs" / "miniature.md"   # a new page elsewhere carries the committed page's notes
        old = doc.read_text() if doc.is_file() else (committed.read_text() if committed.is_file() else "")
        if NOTES_HEADING in old:   # the hand-written reading of the numbers is kept
            page = page.rstrip("\n") + "\n\n" + old[old.index(NOTES_HEADING):]
        page, stale = mark(page, NOTES_HEADING, NOTES_SOURCES)
        if stale:
            print(warning(stale, doc=doc, heading=NOTES_HEADING, sources_in="demo/miniature.py"), file=sys.stderr)
        atomic_write_text(doc, page)
        print(page)
        print(f"wrote {doc}" + ("" if doc.resolve() == committed.resolve() else
                                f" (the committed page is {committed.relative_to(REPO)}: --doc {committed.relative_to(REPO)} "
                                f"updates it)"))
        return 0

    # contracts.commands: DemoError one line, exit 2; other failures one line, exit 1; Ctrl-C 130, SIGTERM 143
    resume = f"finished runs and scores are kept in {out}/ and the same command resumes after them"
    return run_command(body, input_errors=(DemoError,), resume=lambda: resume, kept=lambda: resume)


if __name__ == "__main__":
    sys.exit(main())
