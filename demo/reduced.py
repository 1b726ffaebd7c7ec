"""``python -m demo``'s main job (issue #27): the paper's premise regime, reduced to minutes on CPU (times in
docs/performance.md).

The premise (``demo.premise``, paper §3) is where the miniature shows what the paper is about: on-policy RL raises
pass@1 while pass@k at large k falls (the policy narrows), and a relay from an early checkpoint recovers the lost
large-k pass rate. This job runs that regime with its task, warm-up, RL budget, held-out split and n, but ONE
training seed per method and three of its eight methods (``demo.premise_budget.REDUCED``): the warm-up, on-policy DAPO
with its early checkpoint, Thinking Seeds (ratio rule, state+action) and LUFFY, every model
scored with n = 64 (pass@k up to k = 64), the relay between early and final, the crossover k, then Figures 2-5
(``figures.make_all``) from those runs, and ``summary.md`` / ``summary.json`` that lead with what a reader should
see. Every number of the summary is read from the tables under ``OUT/tables`` (the premise's tables, plus
``methods_vs_onpolicy.csv``) and ``OUT/analysis``.

What the reduction costs (said in the summary too): the curves, the crossover, the relay and every interval over
problems are those of ``--premise`` (same problems and n); a method's difference to on-policy is one pair of
training runs, so its interval holds the held-out sampling noise only, not the spread between training seeds that
``--premise`` measures with 3 seeds per method.

Output folder (default ``runs/demo``): the premise layout (``data/ warmup/ runs/ eval/ analysis/ tables/
figures/``, ``premise.json`` the budget, ``stages.json`` the cost of every stage over all invocations), plus
``figures/fig*.png`` and ``summary.md`` / ``summary.json``. Resumable as the premise: finished runs, graded problems,
relay problems and up-to-date analyses are skipped.
"""

from __future__ import annotations

import json
import math
import shutil
from functools import partial
from pathlib import Path

import pandas as pd

from contracts.commands import pct, points
from contracts.files import atomic_write_json, atomic_write_text
from contracts.passk import paired_bootstrap, pass_at_k
from demo.addition import MARKER as ADDITION_MARKER
from demo.common import DemoError, Log, machine, relay_rows
from demo.miniature import t975
from demo.premise import _Stages, run_premise
from demo.premise_page import render_seed_lift, render_support, support_reading
from demo.premise_budget import MARKER, METHODS, PREMISE, STAGES, TIMINGS, PremiseBudget, eval_name, method_list
from demo.premise_stats import N_BOOT
from figures.make_all import make_all
from figures.style import use_headless_backend

SUMMARY = "summary.md"
# Figures 2-5 (+ Lemma 4, mismatch) and the run each one reads: on-policy seed 0 for Figure 3(a), the ratio run
# for Figure 4 (the paper's is ratio 0.7, T 16; here ratio 0.5, T 8, the table's run), both rules for Figure 5
FIGURES = ("fig2_relay", "fig3_positions", "fig4_seeded_positions", "fig5_truncation_tokens", "lemma4_zero_adv",
           "mismatch")


def figure_selection(b: PremiseBudget) -> dict:
    """``figures.make_all``'s selection for the regime's run names (seed 0 of each method)."""
    names = set(method_list(b))
    ratio = eval_name("seeds_ratio", 0) if "seeds_ratio" in names else None
    sel: dict = {"fig3": {"onpolicy": eval_name("onpolicy", 0)}}
    if ratio:
        sel.update(fig4=ratio, lemma4=ratio, mismatch=ratio)
        sel["fig5"] = {"ratio": ratio}
        if "seeds_entropy" in names:
            sel["fig5"] = {"entropy": eval_name("seeds_entropy", 0), "ratio": ratio}
    return sel


def draw_figures(out: Path, b: PremiseBudget, *, log: Log) -> dict:
    use_headless_backend()
    return make_all(out, selection=figure_selection(b), log=lambda m: log(f"  {m}"))


# ------------------------------------------------------------------------------------------------------------
# the summary: every number read from the tables
# ------------------------------------------------------------------------------------------------------------
_pct = partial(pct, unit="", missing="")   # a table cell or a number whose text says %: contracts.commands.pct


def _ci(diff: float, low: float, high: float) -> str:
    return f"{points(diff)} [{points(low)}, {points(high)}]"


def verdict(low: float, high: float) -> str:
    """A paired 95 % interval read plainly: ``higher`` / ``lower`` when it excludes 0, else ``within noise``."""
    if low > 0:
        return "higher"
    if high < 0:
        return "lower"
    return "within noise"


def _kx(x: float) -> str:
    return "beyond the grid" if math.isinf(x) else f"{x:.1f}"


def read_tables(out: Path) -> dict:
    t = Path(out) / "tables"
    tables = {name: pd.read_csv(t / f"{name}.csv") for name in ("passk_curves", "passk_diff", "methods",
                                                              "methods_vs_onpolicy", "distinct")}
    for name in ("relay_passk", "relay_problems", "support", "seed_lift_summary"):
        tables[name] = pd.read_csv(t / f"{name}.csv") if (t / f"{name}.csv").is_file() else None
    tables["crossover"] = json.loads((t / "crossover.json").read_text())
    return tables


def headline(tables: dict) -> dict:
    """The numbers the summary leads with, from the tables: the narrowing (warm-up -> final at k = 1 and the largest
    k, the crossover), the relay's gain at the largest k, and each method at pass@1 and pass@K against on-policy."""
    curves, diff = tables["passk_curves"], tables["passk_diff"]
    K = int(curves["k"].max())

    def at(model: str, k: int) -> float:
        return float(curves[(curves["model"] == model) & (curves["k"] == k)]["pass"].iloc[0])

    def d(model: str, k: int) -> dict:
        r = diff[(diff["model"] == model) & (diff["k"] == k)].iloc[0]
        return {"diff": float(r["diff"]), "low": float(r["low"]), "high": float(r["high"])}

    h: dict = {"K": K, "passk": {m: {"1": at(m, 1), str(K): at(m, K)} for m in ("warmup", "early", "final")},
               "final_vs_warmup": {"1": d("final", 1), str(K): d("final", K)},
               "crossover": tables["crossover"]["final"]}
    h["narrowed"] = h["final_vs_warmup"]["1"]["low"] > 0 and h["final_vs_warmup"][str(K)]["high"] < 0
    relay = tables["relay_passk"]
    if relay is not None:
        big = relay[relay["k"] == relay["k"].max()].iloc[0]
        one = relay[relay["k"] == relay["k"].min()].iloc[0]
        h["relay"] = {"k": int(big["k"]), "diff": float(big["diff"]), "low": float(big["diff_low"]),
                      "high": float(big["diff_high"]), "relay": float(big["relay"]), "final": float(big["final"]),
                      "k1": {"diff": float(one["diff"]), "low": float(one["diff_low"]),
                             "high": float(one["diff_high"])}}
        counts = tables.get("relay_problems")
        if counts is not None and len(counts):   # relay - early at k, paired over problems: what the relay adds
            k = h["relay"]["k"]                    # beyond the checkpoint that wrote its prefixes (issue #40)
            n = counts["n"].to_numpy()
            h["relay"]["vs_early"] = paired_bootstrap(pass_at_k(n, counts["relay_correct"].to_numpy(), k),
                                                      pass_at_k(n, counts["early_correct"].to_numpy(), k))
    methods, vs = tables["methods"], tables["methods_vs_onpolicy"]
    rows = []
    for _, r in methods[methods["seed"] == 0].iterrows():
        row = {"method": r["method"], "pass@1": float(r["pass@1"]), f"pass@{K}": float(r[f"pass@{K}"]),
               "distinct_correct": float(r["distinct_correct"]), "crossover_k": float(r["crossover_k"])}
        for k in (1, K):
            p = vs[(vs["method"] == r["method"]) & (vs["seed"] == 0) & (vs["k"] == k)]
            if len(p):
                p = p.iloc[0]
                row[f"vs_onpolicy@{k}"] = {"diff": float(p["diff"]), "low": float(p["low"]),
                                           "high": float(p["high"]), "p_value": float(p["p_value"]),
                                           "verdict": verdict(float(p["low"]), float(p["high"]))}
        rows.append(row)
    h["methods"] = rows
    sup = tables.get("support")
    if sup is not None:
        d = sup[sup["k"] == K]
        h["support"] = {f"{r['from']}->{r['to']}": {c: float(r[c]) for c in ("gained", "gained_low", "gained_high",
                                                                           "lost", "lost_low", "lost_high", "kept")}
                        for _, r in d.iterrows()}
    lift = tables.get("seed_lift_summary")
    if lift is not None and len(lift):
        h["seed_lift"] = {c: float(lift.iloc[0][c]) for c in ("lift_mean", "lift_low", "lift_high", "rescued_share",
                                                              "zero_adv_seeded", "zero_adv_fresh")}
    return h


def _reading(h: dict, b: PremiseBudget) -> list[str]:
    K, fw, cx = h["K"], h["final_vs_warmup"], h["crossover"]
    w, e, f = h["passk"]["warmup"], h["passk"]["early"], h["passk"]["final"]
    one, big = fw["1"], fw[str(K)]
    if h["narrowed"]:
        what = "**On-policy RL narrowed the policy.**"
    elif one["low"] > 0:
        what = (f"**On-policy RL raised pass@1, but the fall at pass@{K} is within noise at this size** "
                f"(its interval includes 0).")
    else:
        what = f"**No narrowing at this size:** the final checkpoint's pass@1 gain is {verdict(one['low'], one['high'])}."
    lines = [
        f"1. {what} From the warm-up to the final on-policy checkpoint (step {b.total_steps}), pass@1 went "
        f"{_pct(w['1'])} → {_pct(f['1'])} % ({_ci(one['diff'], one['low'], one['high'])} points) and pass@{K} "
        f"{_pct(w[str(K)])} → {_pct(f[str(K)])} % ({_ci(big['diff'], big['low'], big['high'])}); the early "
        f"checkpoint (step {b.early_step}) has {_pct(e['1'])} / {_pct(e[str(K)])} %. The curves cross "
        f"at k = {_kx(cx['crossover_k'])} [{_kx(cx['low'])}, {_kx(cx['high'])}] (`figures/premise_passk.png`).",
    ]
    r = h.get("relay")
    if r is not None:
        lines.append(
            f"2. **The relay at k = {r['k']}** (early writes half of each response, final continues): "
            f"{_pct(r['relay'])} % against the final checkpoint's {_pct(r['final'])} %, "
            f"{_ci(r['diff'], r['low'], r['high'])} points — {_relay_word(r)}; at k = 1 it is "
            f"{_ci(r['k1']['diff'], r['k1']['low'], r['k1']['high'])} (`figures/fig2_relay.png`).")
        if "vs_early" in r:
            v = r["vs_early"]
            lines.append(f"   Against the early checkpoint that wrote the prefixes, the relay is "
                         f"{_ci(v['diff'], v['low'], v['high'])} points at k = {r['k']}: {_early_word(v)}")
    sup = h.get("support", {})
    if "warmup->final" in sup and "final->relay" in sup:
        wf, fr = sup["warmup->final"], sup["final->relay"]
        lines.append(f"   Problem by problem at k = {K}: the final checkpoint lost {wf['lost']:.1f} "
                     f"[{wf['lost_low']:.1f}, {wf['lost_high']:.1f}] problems the warm-up solved, and the relay "
                     f"regained {fr['gained']:.1f} [{fr['gained_low']:.1f}, {fr['gained_high']:.1f}] that the final "
                     f"checkpoint does not solve (expected counts; table below).")
    parts = []
    for m in h["methods"]:
        if m["method"] == "onpolicy" or f"vs_onpolicy@{K}" not in m:
            continue
        a, z = m["vs_onpolicy@1"], m[f"vs_onpolicy@{K}"]
        parts.append(f"{METHODS[m['method']].paper}: pass@1 {points(a['diff'])} ({a['verdict']}), pass@{K} "
                     f"{points(z['diff'])} ({z['verdict']})")
    if parts:
        lines.append("3. **Each method against on-policy** (same training seed, paired over the held-out problems; "
                     "the table below has the intervals): " + "; ".join(parts) + ".")
    return lines


def _early_word(v: dict) -> str:
    return {"higher": "the final policy completes old states better than the policy that wrote them, which is what "
                      "restarting from old states can exploit.",
            "lower": "the final policy completes old states worse than the policy that wrote them.",
            "within noise": "**the relay equals the early checkpoint here.** The first half of a response already "
                            "decides its outcome in this regime, so relay − final measures the narrowing itself "
                            "(early − final), not the final policy completing old states better; this regime cannot "
                            "show why restarting helps."}[verdict(v["low"], v["high"])]


def _relay_word(r: dict) -> str:
    v = verdict(r["low"], r["high"])
    return {"higher": "the relay recovers large-k pass rate the final checkpoint lost",
            "lower": "the relay is below the final checkpoint",
            "within noise": "within noise"}[v]


def _cost_of_reduction(b: PremiseBudget) -> str:
    premise_t = t975(PREMISE.seeds - 1)
    left_out = sorted(set(method_list(PREMISE)) - set(method_list(b)))
    return (
        f"**What the reduction costs** against `python -m demo --premise`: {b.seeds} training "
        f"seed{'s' if b.seeds != 1 else ''} per method instead of {PREMISE.seeds}"
        + (f", and the {', '.join(f'`{m}`' for m in left_out)} row{'s' if len(left_out) > 1 else ''} left out"
           if left_out else "")
        + f". The warm-up, the RL budget, the {b.heldout} held-out problems and n = {b.eval_n} are "
        + ("the premise's" if (b.heldout, b.eval_n, b.total_steps) == (PREMISE.heldout, PREMISE.eval_n,
                                                                       PREMISE.total_steps) else "this budget's")
        + ", so the curves, the crossover, the relay and every interval over problems here are as precise as there. "
        "What is lost is the spread between training runs: a method's difference to on-policy here is one pair of "
        "runs, and its interval holds the held-out sampling noise only. `--premise` trains each method "
        f"{PREMISE.seeds} times and gives Student-t intervals over the seeds (t = {premise_t:.2f} for "
        f"{PREMISE.seeds} seeds), so read \"higher\" / \"lower\" below as \"for this training seed\" and rerun with "
        "`--seeds 3` or `--premise` before citing a difference between methods.")


def render_summary(out: Path, b: PremiseBudget, report: dict, *, command: str, tables: dict | None = None) -> str:
    tables = read_tables(out) if tables is None else tables
    h = headline(tables)
    K = h["K"]
    wsum = json.loads((out / "warmup" / "warmup_summary.json").read_text())
    stages = json.loads((out / STAGES).read_text()) if (out / STAGES).is_file() else {}
    timings = json.loads((out / TIMINGS).read_text()) if (out / TIMINGS).is_file() else {}
    lines = [
        "# Thinking Seeds demo: on-policy RL narrows the policy, the relay recovers it",
        "",
        f"Countdown ({b.numbers} numbers in 1..{b.max_number}, target {b.min_target}..{b.max_target}; most problems "
        f"have several solutions), a tiny:{b.model_size} policy warmed up on one random solver trace per problem "
        f"({wsum['steps']} steps, loss {wsum['loss_last']:.3f}), then RL for every method with the same budget "
        f"({b.total_steps} steps x {b.prompts_per_step} prompts x {b.samples_per_prompt} samples, <= "
        f"{b.max_response_tokens} tokens, lr {b.lr:g}; Thinking Seeds T = {b.seed_interval}). Held-out: {b.heldout} "
        f"problems, n = {b.eval_n} samples each at temperature 1.0 (pass@k up to k = {K}, unbiased estimator); "
        f"intervals are 95 % bootstraps over problems ({N_BOOT} resamples), differences paired. Budget "
        f"`{b.name}`; `{command}` wrote this from `tables/` of this folder.",
        "",
        "## What to see",
        "",
        *_reading(h, b),
        "",
        _cost_of_reduction(b),
        "",
        "## pass@k: warm-up, early, final (on-policy, training seed 0)",
        "",
        "| k | warm-up % | early % | final % | final − warm-up, points [95% CI] |",
        "|---:|---:|---:|---:|---|",
    ]
    curves, diff = tables["passk_curves"], tables["passk_diff"]
    for k in sorted(curves["k"].unique()):
        cell = {m: curves[(curves["model"] == m) & (curves["k"] == k)]["pass"].iloc[0] for m in ("warmup", "early",
                                                                                              "final")}
        dd = diff[(diff["model"] == "final") & (diff["k"] == k)].iloc[0]
        lines.append(f"| {k} | {_pct(cell['warmup'])} | {_pct(cell['early'])} | {_pct(cell['final'])} | "
                     f"{_ci(dd['diff'], dd['low'], dd['high'])} |")
    relay = tables["relay_passk"]
    if relay is not None:
        lines += ["", f"## Relay (Figure 2): early (step {b.early_step}) writes half, final (step {b.total_steps}) "
                      "continues", "", "| k | early % | relay % | final % | relay − final, points [95% CI] |",
                  "|---:|---:|---:|---:|---|"]
        lines += relay_rows(relay)
    if tables["support"] is not None:
        lines += ["", "## What RL lost and the relay recovers, problem by problem (`tsanalysis support`)", "",
                  *render_support(tables["support"], K), "", support_reading(tables["support"], K)]
    if "seeds_ratio" in method_list(b):
        lines += ["", "## Restart value of the seeds (`tsanalysis seeds`, the ratio run)", "",
                  *render_seed_lift(tables["seed_lift_summary"], eval_name("seeds_ratio", 0))]
        if tables["seed_lift_summary"] is not None:
            lines += ["", "By cut depth and seed age: `figures/premise_seed_lift.png`."]
    lines += ["", "## Methods (training seed 0)", "",
              f"| method | pass@1 % | pass@1 vs on-policy [95% CI] | pass@{K} % | pass@{K} vs on-policy [95% CI] | "
              f"distinct correct / problem | crossover k vs warm-up | train wall s |",
              "|---|---:|---|---:|---|---:|---:|---:|"]
    w = h["passk"]["warmup"]
    wd = tables["distinct"].set_index("model").loc["warmup", "distinct_correct"]
    lines.append(f"| supervised warm-up (no RL) | {_pct(w['1'])} | – | {_pct(w[str(K)])} | – | {wd:.2f} | – | – |")
    for m in h["methods"]:
        cells = []
        for k in (1, K):
            v = m.get(f"vs_onpolicy@{k}")
            cells.append("–" if v is None else f"{_ci(v['diff'], v['low'], v['high'])} {v['verdict']}")
        wall = timings.get(eval_name(m["method"], 0), {}).get("wall_s")
        lines.append(f"| {METHODS[m['method']].paper} | {_pct(m['pass@1'])} | {cells[0]} | {_pct(m[f'pass@{K}'])} | "
                     f"{cells[1]} | {m['distinct_correct']:.2f} | {_kx(m['crossover_k'])} | "
                     f"{'' if wall is None else f'{wall:.0f}'} |")
    methods = tables["methods"]
    if methods["seed"].nunique() > 1:
        per_seed = methods.pivot_table(index="method", columns="seed", values=f"pass@{K}")
        lines += ["", f"pass@{K} per training seed: " + "; ".join(
            f"{m} " + ", ".join(_pct(v) for v in per_seed.loc[m].dropna()) for m in method_list(b)
            if m in per_seed.index) + "."]
    lines += ["", "## Figures", ""]
    for f in sorted((out / "figures").glob("*.png")):
        lines.append(f"- `{f.relative_to(out)}`")
    for name, why in report.get("skipped", {}).items():
        lines.append(f"- {name}: skipped ({why})")
    total = sum(s.get("wall_s", 0) for s in stages.values())
    lines += ["", "## Cost", "", "| stage | wall s | CPU s | note |", "|---|---:|---:|---|"]
    for name, s in stages.items():
        lines.append(f"| {name} | {s['wall_s']:.0f} | {s['cpu_s']:.0f} | {s.get('note', '')} |")
    lines += [f"| **total** | {total:.0f} | {sum(s.get('cpu_s', 0) for s in stages.values()):.0f} | "
              f"{total / 60:.1f} minutes over every invocation |", "",
              f"{machine(threads=False)}; training used "
              f"{', '.join(sorted({str(t['threads']) for t in timings.values()})) or '?'} torch thread(s).", "",
              "## Where everything is", "",
              "- `tables/*.csv`: every number above (`passk_curves`, `passk_diff`, `crossover.json`, `relay_passk`, "
              "`methods`, `methods_vs_onpolicy`, `distinct`, `entropy_positions`, `support`, `seed_lift_*`); "
              "`notebooks/premise.ipynb` reads them",
              "- `runs/<method>-seed<k>/`: config.yaml, metrics.jsonl, rollouts/, checkpoints/",
              "- `eval/<model>/countdown.jsonl`: every sample with its verdict",
              "- `analysis/`: the relay's and each run's tsanalysis tables (Figures 2-5 read them)",
              "- the premise with 3 training seeds and its page: `python -m demo --premise`; the addition "
              "miniature: `python -m demo --task addition`", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# the job
# ------------------------------------------------------------------------------------------------------------
def claim(out: Path, *, fresh: bool, log: Log) -> None:
    """A folder of the addition demo (``demo.json``, the main job before issue #27) is named as such: ``--fresh``
    replaces it, otherwise the message says how to continue it or where else to write."""
    if (out / ADDITION_MARKER).is_file() and not (out / MARKER).is_file():
        if not fresh:
            raise DemoError(f"'{out}' holds an addition demo ({ADDITION_MARKER}; the main job before it ran the "
                            f"countdown regime): `python -m demo --task addition --out {out}` continues it; rerun "
                            "with --fresh to replace it, or choose another --out")
        log(f"--fresh: deleting the addition demo in {out}")
        shutil.rmtree(out)


def run_reduced(b: PremiseBudget, out: str | Path, *, fresh: bool = False, log: Log = print,
                command: str = "python -m demo") -> dict:
    """Every stage of the premise regime at budget ``b`` (resumable), then Figures 2-5 and the summary; returns
    {"summary", "headline", "figures", "tables"}. DemoError when a figure failed (the summary is written first)."""
    out = Path(out)
    claim(out, fresh=fresh, log=log)
    res = run_premise(b, out, fresh=fresh, doc=None, log=log)
    stages = _Stages(out)
    with stages.stage("Figures 2-5 (+ Lemma 4, mismatch)", log) as st:
        report = draw_figures(out, b, log=log)
        st["note"] = f"{len(report['written'])} PNGs from the runs' tsanalysis tables"
    tables = read_tables(out)
    summary = render_summary(out, b, report, command=command, tables=tables)
    atomic_write_text(out / SUMMARY, summary)
    h = headline(tables)
    atomic_write_json(out / "summary.json", {"budget": b.name, "headline": h, "figures": [str(p) for p in
                                                                                          report["written"]],
                                             "figures_skipped": report["skipped"], "figures_failed": report["failed"],
                                             "machine": machine(threads=False)}, indent=1, default=str)
    log("\n" + summary)
    if report["failed"]:
        raise DemoError(f"figures failed: {report['failed']}")
    return {"summary": summary, "headline": h, "figures": report, "tables": res["tables"]}
