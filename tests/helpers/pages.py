"""A measured page against the tables committed beside it (issue #39 item 6).

``demo.premise_page.write_page`` and ``demo.miniature.write_page`` copy the tables folder a page was rendered from
into ``<page>/tables/`` (its ``page.json`` names the writer). Two checks, shared by the committed pages' test and the
toy folders':

- ``rerender``: the page's generated part (everything above *Grid searched*, or above the miniature page's notes) is
  what the writer's render writes from that folder alone, so every formatted number (means, t-intervals, Bonferroni
  intervals, crossovers, support counts, the cost tables) comes from the committed tables;
- ``recompute``: the statistical tables themselves are recomputed from the per-problem counts (``per_problem.csv``:
  n, correct and distinct solutions of every scored model on every problem; ``relay_problems.csv``) with the
  project's estimators (``contracts.passk``, ``demo.premise_stats``, ``tsanalysis.core.support``, the relay's
  ``pass_k_table``) and compared value by value; the miniature page's ``methods.csv`` and every number of its tables
  from ``per_problem.csv`` (avg@n, ``demo.miniature.t_interval`` over seeds, the paired differences) and
  ``runs.csv``.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from contracts.passk import bootstrap_ci, k_grid, passk_matrix, summarize
from demo import miniature
from demo.common import run_name
from demo.miniature import t_interval
from demo.page_numbers import parse_page
from demo.premise_budget import eval_name, method_list
from demo.common import figure_dir
from demo.premise_page import read_page_record, render_page
from demo.premise_stats import N_BOOT, crossover_k, crossover_table, curve_table
from tsanalysis.config import SupportConfig
from tsanalysis.core.support import support_rows
from tsanalysis.relay import pass_k_table

GRID = "\n## Grid searched"


def generated_part(page: str) -> str:
    """The part of a page its writer renders from the tables (the premise pages' grid block and any page's
    hand-written notes follow it)."""
    at = page.find(GRID)
    at = at if at >= 0 else page.find("\n" + miniature.NOTES_HEADING + "\n")
    return (page if at < 0 else page[:at]).rstrip("\n")


def rerender(doc: Path) -> str:
    """``doc``'s generated part rendered again from ``<doc>/tables`` (``figure_dir``) and its ``page.json``."""
    tdir = figure_dir(doc) / "tables"
    if writer(tdir) == "demo.miniature":
        return miniature.render(tdir, record=miniature.read_page_record(tdir), doc=doc).rstrip("\n")
    b, record = read_page_record(tdir)
    return render_page(tdir, b, record=record, doc=doc).rstrip("\n")


def _counts(tdir: Path) -> dict[str, pd.DataFrame]:
    pp = pd.read_csv(tdir / "per_problem.csv", dtype={"problem_id": str})
    return {m: d.sort_values("problem_id", key=lambda s: s.astype(str)) for m, d in pp.groupby("model")}


def _close(what: str, got, want, bad: list[str], tol: float = 1e-9) -> None:
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    if got.shape != want.shape or not np.allclose(got, want, rtol=0, atol=tol, equal_nan=True):
        bad.append(f"{what}: recomputed {np.round(got, 6).tolist()} but the table says {np.round(want, 6).tolist()}")


def recompute(tdir: Path) -> list[str]:
    """Every statistic of the tables folder ``tdir`` recomputed from its per-problem counts; the mismatches (none
    when the tables are what their counts give)."""
    tdir = Path(tdir)
    if writer(tdir) == "demo.miniature":
        return _recompute_miniature(tdir)
    b, _ = read_page_record(tdir)
    ks = k_grid(b.eval_n)
    counts = _counts(tdir)
    mats = {m: passk_matrix(d["n"].to_numpy(), d["correct"].to_numpy(), ks) for m, d in counts.items()}
    final = eval_name("onpolicy", 0)
    base = {"warmup": mats["warmup"], "early": mats["early"], "final": mats[final]}
    bad: list[str] = []
    # pass@k curves with their bootstrap intervals
    curves = pd.read_csv(tdir / "passk_curves.csv")
    want = curves.sort_values(["model", "k"])
    got = pd.DataFrame(curve_table(base, ks)).sort_values(["model", "k"])
    for col in ("pass", "low", "high"):
        _close(f"passk_curves.{col}", got[col], want[col], bad)
    # crossovers and the paired differences to the warm-up
    cross = json.loads((tdir / "crossover.json").read_text())
    diff = pd.read_csv(tdir / "passk_diff.csv")
    for name in ("early", "final"):
        ct = crossover_table(base["warmup"], base[name], ks)
        for key in ("crossover_k", "low", "high", "frac_within_grid"):
            _close(f"crossover.{name}.{key}", ct[key], cross[name][key], bad)
        mine = pd.DataFrame(ct["per_k"])
        theirs = diff[diff["model"] == name]
        for col in ("diff", "low", "high"):
            _close(f"passk_diff.{name}.{col}", mine[col], theirs[col], bad)
    # distinct correct solutions per problem, and the share of the solver's solutions
    held = pd.read_csv(tdir / "heldout_solutions.csv", dtype={"problem_id": str}).set_index("problem_id")
    distinct = pd.read_csv(tdir / "distinct.csv").set_index("model")
    for name, key in (("warmup", "warmup"), ("early", "early"), ("final", final)):
        d = counts[key]
        ns = held.loc[d["problem_id"], "n_solutions"].to_numpy()
        est, lo, hi = bootstrap_ci(d["distinct"].to_numpy(dtype=float), n_boot=N_BOOT)
        cov = bootstrap_ci(d["distinct"].to_numpy() / ns, n_boot=N_BOOT)
        r = distinct.loc[name]
        _close(f"distinct.{name}", [est, lo, hi, cov[0], (d["correct"] > 0).mean()],
               [r["distinct_correct"], r["low"], r["high"], r["coverage"], r["solved"]], bad)
    # the methods table: each run's pass@k, distinct solutions and crossover against the warm-up
    methods = pd.read_csv(tdir / "methods.csv")
    for _, r in methods.iterrows():
        name = eval_name(r["method"], int(r["seed"]))
        m = mats[name]
        _close(f"methods.{name}", [*m.mean(axis=0), counts[name]["distinct"].mean(),
                                   crossover_k(ks, (m - base["warmup"]).mean(axis=0))],
               [*(r[f"pass@{k}"] for k in ks), r["distinct_correct"], r["crossover_k"]], bad)
    if set(methods["method"]) - set(method_list(b)):
        bad.append(f"methods.csv has rows of methods the budget does not run: {set(methods['method'])}")
    # the relay, from its per-problem counts
    if (tdir / "relay_problems.csv").is_file():
        rp = pd.read_csv(tdir / "relay_problems.csv")
        got = pass_k_table(rp["n"], rp["early_correct"], rp["relay_correct"], rp["final_correct"], seed=0)
        want = pd.read_csv(tdir / "relay_passk.csv")
        for col in ("early", "relay", "final", "diff", "diff_low", "diff_high"):
            _close(f"relay_passk.{col}", got[col], want[col], bad)
    # the support table: expected problems gained, lost and kept per pair of models, at every k
    if (tdir / "support.csv").is_file():
        support = pd.read_csv(tdir / "support.csv")
        rel = pd.read_csv(tdir / "relay_problems.csv", dtype={"problem_id": str}) if (
            tdir / "relay_problems.csv").is_file() else None
        cfg = SupportConfig(eval_dir=tdir)
        for (a, z), want in support.groupby(["from", "to"], sort=False):
            pa, pz = (_support_matrix(x, counts, rel, final) for x in (a, z))
            kk = k_grid(int(min(pa[0].min(), pz[0].min())))
            got = pd.DataFrame(support_rows(passk_matrix(*pa, kk), passk_matrix(*pz, kk), kk, n_boot=cfg.n_boot,
                                            seed=cfg.seed))
            for col in ("gained", "gained_low", "gained_high", "lost", "lost_low", "lost_high", "kept", "net",
                        "net_low", "net_high"):
                _close(f"support.{a}->{z}.{col}", got[col], want[col], bad)
    return bad


def _support_matrix(model: str, counts: dict[str, pd.DataFrame], relay: pd.DataFrame | None, final: str):
    """(n, correct) per problem of a support table's model, problems in id order as ``tsanalysis support`` reads
    them (the relay's from its per-problem results)."""
    if model == "relay":
        d = relay.sort_values("problem_id")
        return d["n"].to_numpy(), d["relay_correct"].to_numpy()
    d = counts[final if model == "final" else model]
    return d["n"].to_numpy(), d["correct"].to_numpy()


def tamper(doc: Path, into: Path) -> tuple[list[str], bool]:
    """Copy ``doc`` and its tables into ``into``, flip one problem of the final on-policy checkpoint (all of its
    samples correct if they were not, else none) and add a point of pass@1 to the methods table's first row; return
    (``recompute``'s mismatches, whether the re-rendered page differs). Shows that both checks can fail; a miniature
    page: ``_tamper_miniature``."""
    if writer(figure_dir(doc) / "tables") == "demo.miniature":
        return _tamper_miniature(doc, into)
    copy = Path(into) / doc.name
    shutil.copyfile(doc, copy)
    tdir = figure_dir(copy) / "tables"
    shutil.copytree(figure_dir(doc) / "tables", tdir)
    pp = pd.read_csv(tdir / "per_problem.csv", dtype={"problem_id": str})
    row = pp.index[pp["model"] == eval_name("onpolicy", 0)][0]
    pp.loc[row, "correct"] = 0 if pp.loc[row, "correct"] == pp.loc[row, "n"] else pp.loc[row, "n"]
    pp.to_csv(tdir / "per_problem.csv", index=False)
    bad = recompute(tdir)
    methods = pd.read_csv(tdir / "methods.csv")
    methods.loc[0, "pass@1"] += 0.01
    methods.to_csv(tdir / "methods.csv", index=False)
    return bad, rerender(copy) != generated_part(copy.read_text())


# ------------------------------------------------------------------------------------------------------------
# docs/miniature.md (demo.miniature): the page renders from methods.csv, which recomputes from the per-problem counts
# ------------------------------------------------------------------------------------------------------------
def writer(tdir: Path) -> str:
    """The module that wrote a tables folder (``page.json``'s ``writer``; the premise pages' records predate it)."""
    rec = json.loads((Path(tdir) / "page.json").read_text())
    return rec["writer"] if "writer" in rec else "demo.premise"


# what ``tamper`` must make ``recompute`` report, by writer: prefixes of its mismatches
TAMPER_FINDS = {"demo.premise": ("passk_curves.pass", "methods.onpolicy-seed0"),
                "demo.miniature": ("methods.addition.onpolicy.avg", "page.addition.On-policy (DAPO).mean")}


def _shown(what: str, cell: list[float], want: list[float], bad: list[str], *, digits: int = 1) -> None:
    """A cell's numbers against the values they must show at ``digits`` decimals (percentages already scaled)."""
    tol = 0.5 * 10 ** -digits + 1e-9
    if len(cell) != len(want) or any(abs(a - b) > tol for a, b in zip(cell, want)):
        bad.append(f"{what}: the page shows {cell} but the counts give {[round(x, digits + 3) for x in want]}")


def _same(what: str, got: float, want: float, bad: list[str]) -> None:
    if not (math.isnan(got) and math.isnan(want)) and not math.isclose(got, want, rel_tol=0, abs_tol=1e-12):
        bad.append(f"{what}: recomputed {want} but the table says {got}")


def _recompute_miniature(tdir: Path) -> list[str]:
    """``methods.csv`` from the per-problem counts (avg@n: ``contracts.passk.summarize``) and ``runs.csv``, and every
    number of the tables of the page rendered from the folder from the same counts: the mean over seeds with its
    95 % t-interval (``demo.miniature.t_interval``, t975), the per-seed values, the paired difference to on-policy
    with its t-interval, the seeds and the costs."""
    record = miniature.read_page_record(tdir)
    seeds = record["seeds"]
    pp = miniature.read_table(tdir, miniature.PER_PROBLEM)
    runs = miniature.read_table(tdir, miniature.RUNS)
    methods = miniature.read_table(tdir, miniature.METHODS_CSV)
    page = parse_page(miniature.render(tdir, record=record))
    bad: list[str] = []
    for _, b, table, baseline in miniature.sections(record):
        avg = {m: summarize(d["n"].to_numpy(), d["correct"].to_numpy(), ks=[1])["avg"]
               for m, d in pp[pp["task"] == b.task].groupby("model")}
        cost = runs[runs["task"] == b.task].set_index("run")
        rows = methods[methods["task"] == b.task].set_index("run")
        base = next(s for s in table if s.name == baseline)
        main = table is miniature.TABLE
        t = page.table("Held-out avg@n" if main else "Code (Table 2's rows)")
        scored = {"warmup"} & set(avg) | {run_name(s, i) for s in table for i in range(seeds)} & set(avg)
        if set(rows.index) != scored:
            bad.append(f"methods.{b.task}: rows {sorted(rows.index)}, but the scored runs are {sorted(scored)}")
        warm = "supervised warm-up (no RL)"
        if "warmup" in rows.index:
            _same(f"methods.{b.task}.warmup.avg", rows.loc["warmup", "avg"], avg["warmup"], bad)
        _shown(f"page.{b.task}.{warm}.mean", t.nums(warm, "mean"), [100 * avg["warmup"]] if "warmup" in avg else [],
               bad)
        for spec in table:
            title = miniature.label(spec.name, b) if main else miniature.CODE_LABELS[spec.name]
            vals, diffs, walls, cpus, toks = [], [], [], [], []
            for seed in range(seeds):
                rn = run_name(spec, seed)
                if rn not in avg:
                    continue
                other = avg.get(run_name(base, seed))
                diff = avg[rn] - other if other is not None and spec.name != baseline else math.nan
                c = cost.loc[rn] if rn in cost.index else None
                wall, tok = (0.0, 0.0) if c is None else (float(c["train_wall_s"]), float(c["tokens_generated"]))
                cpu = math.nan if c is None else float(c["train_cpu_s"])
                vals.append(avg[rn])
                diffs += [] if math.isnan(diff) else [diff]
                walls.append(wall)
                toks.append(tok)
                cpus += [] if math.isnan(cpu) else [cpu]
                if rn in rows.index:
                    r = rows.loc[rn]
                    for col, want in (("avg", avg[rn]), ("diff", diff), ("train_wall_s", wall), ("train_cpu_s", cpu),
                                      ("tokens_generated", tok)):
                        _same(f"methods.{b.task}.{spec.name}.{col} ({rn})", float(r[col]), want, bad)
            where = f"page.{b.task}.{title}"
            if not vals:
                _shown(f"{where}.mean", t.nums(title, "mean"), [], bad)
                continue
            mean, hw = t_interval(vals)
            _shown(f"{where}.mean", t.nums(title, "mean"), [100 * mean] + ([] if hw is None else [100 * hw]), bad)
            _shown(f"{where}.seeds", t.nums(title, "seeds"), [len(vals), seeds], bad, digits=0)
            _shown(f"{where}.per seed", t.nums(title, "per seed"), [100 * v for v in vals], bad)
            want = []
            if diffs:
                dm, dhw = t_interval(diffs)
                want = [100 * dm] + ([] if dhw is None else [100 * dhw]) + [len(diffs)]
            _shown(f"{where}.vs on-policy", t.nums(title, "vs on-policy"), want, bad)
            _shown(f"{where}.train wall s", t.nums(title, "train wall s"), [sum(walls) / len(walls)], bad, digits=0)
            _shown(f"{where}.train CPU s", t.nums(title, "train CPU s"), [sum(cpus) / len(cpus)] if cpus else [], bad,
                   digits=0)
            _shown(f"{where}.tokens", t.nums(title, "tokens generated"), [sum(toks) / len(toks)], bad, digits=0)
    return bad


def _tamper_miniature(doc: Path, into: Path) -> tuple[list[str], bool]:
    """``tamper`` of a miniature page: flip one problem of on-policy seed 0 (addition) in ``per_problem.csv``, then
    add a point of avg@n to that run's row of ``methods.csv``."""
    copy = Path(into) / doc.name
    shutil.copyfile(doc, copy)
    tdir = figure_dir(copy) / "tables"
    shutil.copytree(figure_dir(doc) / "tables", tdir)
    pp = miniature.read_table(tdir, miniature.PER_PROBLEM)
    row = pp.index[(pp["task"] == "addition") & (pp["model"] == "onpolicy")][0]
    pp.loc[row, "correct"] = 0 if pp.loc[row, "correct"] == pp.loc[row, "n"] else pp.loc[row, "n"]
    pp.to_csv(tdir / miniature.PER_PROBLEM, index=False)
    bad = recompute(tdir)
    methods = miniature.read_table(tdir, miniature.METHODS_CSV)
    methods.loc[(methods["task"] == "addition") & (methods["run"] == "onpolicy"), "avg"] += 0.01
    methods.to_csv(tdir / miniature.METHODS_CSV, index=False)
    return bad, rerender(copy) != generated_part(copy.read_text())
