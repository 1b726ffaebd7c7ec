"""Where does the continuation decide? The regime search of issue #40 item 1: ``python -m demo.mechanism``.

The premise regime (3-number countdown, ``docs/premise.md``) shows narrowing, but there the first half of a response
decides its outcome: the relay equals the early checkpoint and the seed lift is zero, so the miniature cannot test
why restarting from old states helps. This search scores task variants on the criteria the issue names, each point
one supervised warm-up, ONE on-policy run and ONE seeded run (``demo.premise``'s stages with one training seed):

1. **narrowing**: final − warm-up pass@1 with its interval above 0 and pass@K's below 0 (paired over problems);
2. **the relay beyond the early checkpoint**: relay − early at k = K (the early checkpoint writes half of each
   response, the final one continues) with a paired interval over problems; relay − final beside it;
3. **seed lift by cut depth**: the seeded run's continuations against their prompts' fresh groups, by the cut's
   depth in the source response (5 bins); its interval (groups resampled) excludes 0 in some bin after Holm's
   correction over the bins. The seeded run is Thinking Seeds with the entropy rule (``seeds_entropy``): its cuts
   span the whole response, where the ratio rule cuts every source at one depth. Beside it, per bin, the *carry*:
   P(continuation right | source right) − P(continuation right | source wrong), 1 where the prefix decides the
   outcome and 0 where the continuation does;
4. **a run fits the demo**: warm-up, on-policy run, relay and the seeded run's training within ``FITS_S`` seconds.

Beside the criteria, each point run here also relays the early checkpoint's prefixes to the *seeded* run's final
checkpoint (``SEEDED_RELAY``; the same early samples, the same seed): does training from old states restore the
current policy's continuation of them? Its endpoints, fixed before its first run (commit of this docstring): relay
(early → Thinking Seeds final) − relay (early → on-policy final) at k = 1, paired over problems, with k = 8 and 64
beside it and Holm over the table's rows. One training seed per method: the intervals are over problems only.

Each point runs in ``OUT/<point>/`` (resumable: finished runs, graded problems and relay problems are skipped);
``--premise DIR`` reads point ``3n`` from a finished ``demo.premise`` folder of the same task instead of running it.
``--doc docs/mechanism.md`` writes the page and its tables (``docs/mechanism/tables/``: ``grid.csv``,
``lift_by_depth.csv``, the per-problem counts behind the narrowing and relay columns); ``--write-only`` re-renders
the page from those tables; ``--add`` keeps the committed tables' other points (a point run in a later session
joins the grid). ``tests/demo/test_mechanism.py`` recomputes the page's numbers from them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from contracts.commands import EXIT_CODES_HELP, pct, points, run_command
from contracts.files import atomic_write_json, atomic_write_text
from contracts.passk import paired_bootstrap, pass_at_k
from demo.common import MEASURED, PAGE_JSON, DemoError, auto_threads, code_commit, figure_dir, machine
from demo.page_numbers import Cited, Source, mark, warning
from demo.premise import RELAY_TAG, run_premise
from demo.premise_budget import ADDED_FIELDS, MARKER, PREMISE, STAGES, TIMINGS, PremiseBudget, eval_name
from demo.premise_stats import N_BOOT, holm
from tsanalysis.core.seed_lift import cluster_bootstrap
from trainer.checkpoint import checkpoint_dir
from tsanalysis.config import RelayConfig
from tsanalysis.io import RecordsError, write_results
from tsanalysis.relay import run_relay
from tsanalysis.tables import seeds_tables

SEEDED = "seeds_entropy"   # its cuts span the response (the ratio rule cuts every source at one depth)
N_BINS = 5                 # depth bins of the seed lift
RELAY_CUT = 0.5            # demo.premise's relay: the early checkpoint writes this fraction of each response
FITS_S = 900.0             # "fits the demo": warm-up + on-policy + relay + the seeded run's training, 2 threads
TASK = ("numbers", "max_number", "min_target", "max_target", "search", "max_response_tokens")
SETTINGS = (*TASK, "warmup_steps")   # the grid's columns of a point's budget

TABLES = ("grid", "lift_by_depth", "per_problem", "relay_problems")   # the page's tables (tables/<name>.csv)
SEEDED_RELAY = "countdown-early-to-seeded-cut0.5"   # the early prefixes continued by the seeded run's final
RELAY_SEEDED = "relay_seeded"   # its table (tables/relay_seeded.csv): only points run with it
# name -> (budget overrides, why the point): every other setting is the premise budget's (demo.premise_budget)
POINTS: dict[str, tuple[dict, str]] = {
    "3n": ({}, "today's premise regime: 2 steps and the final expression, a cut at half leaves about one step"),
    # 4 numbers: the premise's 400 warm-up steps leave the 1M policy at 0.3 % pass@1 (loss 0.30; measured while
    # sizing this point), so these points warm up three times as long
    "4n": ({"numbers": 4, "max_number": 10, "min_target": 1, "max_target": 50, "max_response_tokens": 56,
            "warmup_steps": 1200},
           "3 steps: a cut at half leaves 1-2 steps and the final expression, more ways to go wrong after it"),
    "4n-wide": ({"numbers": 4, "max_number": 20, "min_target": 10, "max_target": 100, "max_response_tokens": 64,
                 "warmup_steps": 1200},
                "larger numbers and targets: more first steps lead nowhere (dead ends after the cut)"),
    # Stream of Search (arXiv 2404.03683) in miniature: 3n's problems, solver traces with 0-3 failed attempts
    # before the solving path (scoring.tasks.countdown's search), so a cut at half often lands before the path
    "3n-search": ({"search": 3, "max_response_tokens": 96, "warmup_steps": 1200},
                  "traces that explore and backtrack: after a cut the continuation still has to find the path"),
    # added after 3n-search's run left pass@64 at 100 % before and after RL (no room to narrow at k = 64): 4n's
    # harder problems with at most 2 detours, so that fewer samples find the path within their budget
    "4n-search": ({"numbers": 4, "max_number": 10, "min_target": 1, "max_target": 50, "search": 2,
                   "max_response_tokens": 104, "warmup_steps": 1200},
                  "4n's problems with 0-2 detours: search traces where pass@64 has room below 100 %"),
}

GRID_COLUMNS = ["point", "numbers", "max_number", "min_target", "max_target", "search", "max_response_tokens",
                "warmup_steps",
                "K",
                "warmup_pass1", "final_pass1", "warmup_passK", "final_passK",
                "pass1_diff", "pass1_low", "pass1_high", "passK_diff", "passK_low", "passK_high", "narrowed",
                "early_passK", "relay_passK", "relay_early_diff", "relay_early_low", "relay_early_high",
                "relay_early_p", "relay_final_diff", "relay_final_low", "relay_final_high", "relay_beyond_early",
                "lift_bins", "lift_bins_holm", "seed_lift_at_depth", "carry_at_relay_cut", "wall_s", "fits",
                "meets_all"]


def point_budget(name: str) -> PremiseBudget:
    """The premise budget with the point's task, one training seed, on-policy and the seeded run, no curve."""
    if name not in POINTS:
        raise DemoError(f"--points: unknown point {name!r}; choose from {', '.join(POINTS)}")
    return replace(PREMISE, name=f"mechanism-{name}", seeds=1, methods=f"onpolicy,{SEEDED}", curve_every=0,
                   **POINTS[name][0])


def check_premise_folder(d: Path, name: str) -> None:
    """A ``--premise`` folder must be a finished demo.premise folder of the point's task."""
    f = d / MARKER
    if not f.is_file():
        raise DemoError(f"--premise {d}: no {MARKER} (not a demo.premise output folder)")
    got, want = json.loads(f.read_text()), asdict(point_budget(name))
    diff = [k for k in TASK if got.get(k, ADDED_FIELDS.get(k)) != want[k]]
    if diff:
        raise DemoError(f"--premise {d}: its task differs from point {name}'s in {', '.join(diff)}")
    for need in (d / "tables" / "per_problem.csv", d / "tables" / "relay_problems.csv",
                 d / "runs" / eval_name(SEEDED, 0)):
        if not need.exists():
            raise DemoError(f"--premise {d}: {need} is missing (run demo.premise to the end first)")


# --- statistics ---------------------------------------------------------------------------------------------
def lift_by_depth(seeds: pd.DataFrame, *, n_bins: int = N_BINS, n_boot: int = N_BOOT) -> pd.DataFrame:
    """Per depth bin of ``seeds`` (``tsanalysis.tables.seeds_tables``' per-seed table): the lift with interval and
    p-value (``tsanalysis.core.seed_lift.cluster_bootstrap``), Holm's adjusted p over the bins, and the carry
    (continuation success after a correct source minus after a wrong one)."""
    d = seeds[seeds["lift"].notna()].copy()
    d["depth_bin"] = np.minimum((n_bins * d["seed_len"].to_numpy()) // np.maximum(d["source_len"].to_numpy(), 1),
                                n_bins - 1)
    rows = []
    for b, g in d.groupby("depth_bin", sort=True):
        t = cluster_bootstrap(g["lift"].to_numpy(float), g["group"].to_numpy(), n_boot=n_boot)
        right, wrong = g[g["source_correct"] == 1.0], g[g["source_correct"] == 0.0]
        rows.append({"depth_bin": int(b), "depth_lo": b / n_bins, "depth_hi": (b + 1) / n_bins, "seeds": len(g),
                     "groups": int(g["group"].nunique()), **t,
                     "value_after_right": float(right["correct"].mean()) if len(right) else np.nan,
                     "value_after_wrong": float(wrong["correct"].mean()) if len(wrong) else np.nan,
                     "n_after_right": len(right), "n_after_wrong": len(wrong)})
    out = pd.DataFrame(rows)
    out["p_holm"] = holm(out["p"].to_numpy(float)) if len(out) else []
    out["carry"] = out["value_after_right"] - out["value_after_wrong"]
    return out


def passk_of(counts: pd.DataFrame, col: str, k: int) -> np.ndarray:
    return pass_at_k(counts["n"].to_numpy(), counts[col].to_numpy(), k)


def point_row(name: str, per_problem: pd.DataFrame, relay: pd.DataFrame, lift: pd.DataFrame, wall_s: float,
              settings: dict | None = None) -> dict:
    """The grid's row of one point from its per-problem counts (models warmup / early / final), the relay's
    per-problem counts and its lift-by-depth table: every criterion of the module docstring. ``settings``: the
    budget the folder was run with (its ``premise.json``; default the point's)."""
    b = settings or asdict(point_budget(name))
    K = int(per_problem["n"].min())
    by = {m: d.sort_values("problem_id").reset_index(drop=True) for m, d in per_problem.groupby("model")}
    assert all((by[m]["problem_id"].to_numpy() == by["warmup"]["problem_id"].to_numpy()).all() for m in by)
    row: dict = {"point": name, **{k: b.get(k, ADDED_FIELDS.get(k)) for k in SETTINGS}, "K": K}
    for k, tag in ((1, "1"), (K, "K")):
        w, f = passk_of(by["warmup"], "correct", k), passk_of(by["final"], "correct", k)
        p = paired_bootstrap(f, w, n_boot=N_BOOT)
        row.update({f"warmup_pass{tag}": float(w.mean()), f"final_pass{tag}": float(f.mean()),
                    f"pass{tag}_diff": p["diff"], f"pass{tag}_low": p["low"], f"pass{tag}_high": p["high"]})
    row["narrowed"] = bool(row["pass1_low"] > 0 and row["passK_high"] < 0)
    r = relay.sort_values("problem_id").reset_index(drop=True)
    re_, ea, fi = (passk_of(r, c, K) for c in ("relay_correct", "early_correct", "final_correct"))
    pe, pf = paired_bootstrap(re_, ea, n_boot=N_BOOT), paired_bootstrap(re_, fi, n_boot=N_BOOT)
    row.update({"early_passK": float(ea.mean()), "relay_passK": float(re_.mean()),
                "relay_early_diff": pe["diff"], "relay_early_low": pe["low"], "relay_early_high": pe["high"],
                "relay_early_p": pe["p_value"], "relay_final_diff": pf["diff"], "relay_final_low": pf["low"],
                "relay_final_high": pf["high"]})
    row["relay_beyond_early"] = bool(pe["low"] > 0 or pe["high"] < 0)
    sig = lift[(lift["p_holm"] < 0.05) & ((lift["low"] > 0) | (lift["high"] < 0))]
    row.update({"lift_bins": int((lift["p"] < 0.05).sum()), "lift_bins_holm": len(sig),
                "seed_lift_at_depth": bool(len(sig)), "wall_s": float(wall_s), "fits": bool(wall_s <= FITS_S)})
    mid = lift[(lift["depth_lo"] <= RELAY_CUT) & (RELAY_CUT < lift["depth_hi"])]   # the bin the relay cuts in
    row["carry_at_relay_cut"] = float(mid["carry"].iloc[0]) if len(mid) else np.nan
    row["meets_all"] = bool(row["narrowed"] and row["relay_beyond_early"] and row["seed_lift_at_depth"]
                            and row["fits"])
    return row


# --- one point's folder -------------------------------------------------------------------------------------
def point_wall(d: Path) -> float:
    """Warm-up, on-policy and relay stages (``stages.json``) plus the seeded run's training (``timings.json``)."""
    stages = json.loads((d / STAGES).read_text())
    timings = json.loads((d / TIMINGS).read_text()) if (d / TIMINGS).is_file() else {}
    wall = sum(stages[s]["wall_s"] for s in ("data + warm-up", "on-policy seed 0 + eval", "relay") if s in stages)
    return wall + timings.get(eval_name(SEEDED, 0), {}).get("wall_s", float("nan"))


def read_point(name: str, d: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, float, dict]:
    """(per-problem counts of warmup / early / final, the relay's counts, lift by depth, wall seconds, the budget it
    ran with) of a finished point folder (or a demo.premise folder of the point's task)."""
    t = d / "tables"
    pp = pd.read_csv(t / "per_problem.csv", dtype={"problem_id": str})
    pp = pp[pp["model"].isin(["warmup", "early", eval_name("onpolicy", 0)])].replace(
        {"model": {eval_name("onpolicy", 0): "final"}})[["model", "problem_id", "n", "correct"]]
    relay = pd.read_csv(t / "relay_problems.csv", dtype={"problem_id": str})[
        ["problem_id", "n", "early_correct", "relay_correct", "final_correct"]]
    try:
        seeds = seeds_tables(d / "runs" / eval_name(SEEDED, 0), n_boot=10)["seeds"]
    except RecordsError as e:
        raise DemoError(f"point {name}: the seeded run's records give no lift ({e})") from None
    return pp.reset_index(drop=True), relay, lift_by_depth(seeds), point_wall(d), json.loads((d / MARKER).read_text())


def run_point(name: str, out: Path, *, log=print) -> Path:
    d = out / name
    b = point_budget(name)
    run_premise(b, d, log=lambda m: log(f"[{name}] {m}"))
    run_seeded_relay(d, b, log=lambda m: log(f"[{name}] {m}"))
    return d


def run_seeded_relay(d: Path, b: PremiseBudget, *, log=print) -> Path:
    """The point's relay again (its settings, the same early checkpoint and seed, so the same early samples) with
    the seeded run's final checkpoint continuing: ``analysis/relay/<SEEDED_RELAY>/`` (resumable)."""
    settings = json.loads((d / "analysis" / "relay" / RELAY_TAG / "relay_settings.json").read_text())
    rdir = d / "analysis" / "relay" / SEEDED_RELAY
    final = checkpoint_dir(d / "runs" / eval_name(SEEDED, 0), b.total_steps - 1)
    log(f"relay: early -> {SEEDED} final ({final})")
    fields = {f.name for f in dataclasses.fields(RelayConfig)}   # the settings also record what they derive (dtype)
    cfg = RelayConfig(**{**{k: v for k, v in settings.items() if k in fields}, "final": str(final), "out": str(rdir)})
    tables, rdir, got = run_relay(cfg, log=lambda m: log(f"  {m}"))
    write_results(rdir, tables, got)
    return rdir


def read_seeded_relay(d: Path) -> pd.DataFrame | None:
    """Per problem: the early samples' successes, the relay to on-policy's final and to the seeded run's final, and
    the seeded final alone; None for a folder without the seeded relay (a --premise folder, points run before it)."""
    f = d / "analysis" / "relay" / SEEDED_RELAY / "relay_problems.csv"
    if not f.is_file():
        return None
    on = pd.read_csv(d / "analysis" / "relay" / RELAY_TAG / "relay_problems.csv", dtype={"problem_id": str})
    se = pd.read_csv(f, dtype={"problem_id": str})
    m = on[["problem_id", "n", "early_correct", "relay_correct"]].merge(
        se[["problem_id", "n", "early_correct", "relay_correct", "final_correct"]], on="problem_id",
        suffixes=("", "_s"), validate="one_to_one")
    if not ((m["n"] == m["n_s"]).all() and (m["early_correct"] == m["early_correct_s"]).all()):
        raise DemoError(f"{f}: its early samples are not the on-policy relay's (other settings or seed); delete "
                        f"{f.parent} and rerun")
    return m.rename(columns={"relay_correct": "relay_onpolicy", "relay_correct_s": "relay_seeded",
                             "final_correct": "seeded_final"})[["problem_id", "n", "early_correct", "relay_onpolicy",
                                                                "relay_seeded", "seeded_final"]]


def seeded_relay_table(rs: pd.DataFrame, points: list[str], ks: tuple[int, ...]) -> pd.DataFrame:
    """Per point and k: relay to the seeded final − relay to on-policy's final (paired over problems), p Holm-adjusted
    over the table's rows; the seeded final alone beside it."""
    rows = []
    for name in points:
        r = rs[rs["point"] == name].sort_values("problem_id")
        if not len(r):
            continue
        for k in ks:
            on, se, fin = (passk_of(r, c, k) for c in ("relay_onpolicy", "relay_seeded", "seeded_final"))
            p = paired_bootstrap(se, on, n_boot=N_BOOT)
            rows.append({"point": name, "k": k, "relay_onpolicy": on.mean(), "relay_seeded": se.mean(),
                         "seeded_final": fin.mean(), "diff": p["diff"], "low": p["low"], "high": p["high"],
                         "p": p["p_value"]})
    out = pd.DataFrame(rows, columns=["point", "k", "relay_onpolicy", "relay_seeded", "seeded_final", "diff", "low",
                                      "high", "p"])
    out["p_holm"] = holm(out["p"].to_numpy()) if len(out) else []
    return out


# --- tables and page ----------------------------------------------------------------------------------------
def collect(points: dict[str, Path], tdir: Path, *, command: str, from_premise: frozenset = frozenset(),
            keep: Path | None = None) -> dict[str, pd.DataFrame]:
    """The page's tables from the points' folders, written to ``tdir`` (grid.csv, lift_by_depth.csv,
    per_problem.csv, relay_problems.csv, page.json). ``keep``: a tables folder whose other points stay, rows and
    provenance as they are (``--add``: a point run in another session joins the committed grid)."""
    grid, lifts, pps, relays, seeded, measured = [], [], [], [], [], {}
    commands = [command]
    if keep is not None:
        old = {k: pd.read_csv(keep / f"{k}.csv", dtype={"problem_id": str}) for k in (*TABLES, RELAY_SEEDED)
               if (keep / f"{k}.csv").is_file()}   # relay_seeded.csv: only where some point has a seeded relay
        old = {k: df[~df["point"].isin(points)] for k, df in old.items()}
        if len(old.get(RELAY_SEEDED, ())):
            seeded.append(old[RELAY_SEEDED])
        kept = old["grid"].reindex(columns=GRID_COLUMNS).fillna(ADDED_FIELDS)   # a column added since: its default
        grid.extend(kept.astype({k: type(v) for k, v in ADDED_FIELDS.items()}).to_dict("records"))
        lifts.append(old["lift_by_depth"])
        pps.append(old["per_problem"])
        relays.append(old["relay_problems"])
        rec = json.loads((keep / PAGE_JSON).read_text())
        measured = {p: m for p, m in rec["measured"].items() if p not in points}
        commands = [*rec.get("commands", [rec["command"]]), *([command] if points else [])]   # none: a re-render
        commands = list(dict.fromkeys(commands))   # a command rerun (resumed, or a new stage of it) is listed once
    for name, d in points.items():
        pp, relay, lift, wall, settings = read_point(name, d)
        grid.append(point_row(name, pp, relay, lift, wall, settings))
        lifts.append(lift.assign(point=name))
        pps.append(pp.assign(point=name))
        relays.append(relay.assign(point=name))
        rs = read_seeded_relay(d)
        if rs is not None:
            seeded.append(rs.assign(point=name))
        m = json.loads((d / MEASURED).read_text()) if (d / MEASURED).is_file() else {}
        measured[name] = {"machine": m.get("machine") or machine(threads=False),
                          "commit": m.get("commit") or code_commit(),
                          "from": "demo.premise" if name in from_premise else "demo.mechanism"}
    tables = {"grid": pd.DataFrame(grid, columns=GRID_COLUMNS),
              "lift_by_depth": _first(pd.concat(lifts, ignore_index=True), "point"),
              "per_problem": _first(pd.concat(pps, ignore_index=True), "point"),
              "relay_problems": _first(pd.concat(relays, ignore_index=True), "point")}
    if seeded:   # no point with a seeded relay (--premise folders): no table
        tables[RELAY_SEEDED] = _first(pd.concat(seeded, ignore_index=True), "point")
    tdir.mkdir(parents=True, exist_ok=True)
    for k, df in tables.items():
        df.to_csv(tdir / f"{k}.csv", index=False)
    atomic_write_json(tdir / PAGE_JSON, {"writer": "demo.mechanism", "command": commands[-1], "commands": commands,
                                         "measured": measured, "written": time.strftime("%Y-%m-%d %H:%M")}, indent=1)
    return tables


SMALL_K = (1, 8)   # the relay at small k: descriptive, added after 3n-search's pass@64 was 100 % for every model


def relay_small_k(relay: pd.DataFrame, points: list[str]) -> pd.DataFrame:
    """Per point and k of ``SMALL_K``: early, relay and final pass@k, relay − early and relay − final (paired bootstrap
    over problems), relay − early's p Holm-adjusted over this table's rows. Not a criterion: at k = 64 a point whose
    every model reaches 100 % cannot tell them apart (3n-search), so the table says what smaller k show."""
    rows = []
    for name in points:
        r = relay[relay["point"] == name].sort_values("problem_id")
        for k in SMALL_K:
            re_, ea, fi = (passk_of(r, c, k) for c in ("relay_correct", "early_correct", "final_correct"))
            pe, pf = paired_bootstrap(re_, ea, n_boot=N_BOOT), paired_bootstrap(re_, fi, n_boot=N_BOOT)
            rows.append({"point": name, "k": k, "early": ea.mean(), "relay": re_.mean(), "final": fi.mean(),
                         "re_diff": pe["diff"], "re_low": pe["low"], "re_high": pe["high"], "re_p": pe["p_value"],
                         "rf_diff": pf["diff"], "rf_low": pf["low"], "rf_high": pf["high"]})
    out = pd.DataFrame(rows)
    out["re_p_holm"] = holm(out["re_p"].to_numpy()) if len(out) else []
    return out


def grid_problems(tdir: Path) -> int:
    """Held-out problems per point (the fewest, should points differ)."""
    pp = pd.read_csv(tdir / "per_problem.csv", dtype={"problem_id": str})
    return int(pp[pp["model"] == "warmup"].groupby("point")["problem_id"].nunique().min())


def _first(df: pd.DataFrame, col: str) -> pd.DataFrame:
    return df[[col, *[c for c in df.columns if c != col]]]


def _pct(x: float) -> str:
    return pct(x, unit="")


def _ci(d: float, lo: float, hi: float) -> str:
    return f"{points(d)} [{points(lo)}, {points(hi)}]"


def _yes(x) -> str:
    return "**yes**" if bool(x) else "no"


def render(tdir: Path) -> str:
    """The page from its tables folder alone."""
    grid = pd.read_csv(tdir / "grid.csv")
    lift = pd.read_csv(tdir / "lift_by_depth.csv")
    rec = json.loads((tdir / PAGE_JSON).read_text())
    K = int(grid["K"].max())
    lines = [
        "# Where does the continuation decide? The regime search for the mechanism",
        "",
        "Issue #40 item 1. The premise regime (`docs/premise.md`) shows on-policy RL narrowing the policy, but there "
        "the first half of a countdown response decides its outcome: the relay equals the early checkpoint and the "
        "seed lift is zero, so it cannot test why restarting from old states helps. Each point below is one "
        "supervised warm-up, one on-policy run and one Thinking Seeds run (entropy rule: its cuts span the response) "
        "of a task variant, with every other setting the premise budget's (`demo/premise_budget.py`), scored on "
        f"{int(grid_problems(tdir))} held-out problems with n = {K}. The criteria were written before the runs "
        "(`demo/mechanism.py`):",
        "",
        f"1. **narrowing**: final − warm-up pass@1 with its 95 % interval above 0 and pass@{K}'s below 0 (paired "
        "over problems);",
        f"2. **relay beyond early**: relay − early at k = {K} with a paired interval excluding 0, of either sign "
        "(relay − final beside it): the final policy completing the early policy's half-responses reaches something "
        "other than what the early policy alone reaches;",
        "3. **seed lift at some depth**: in some of the 5 depth bins of the cut, the seeds' continuations differ "
        "from their prompts' fresh groups with an interval excluding 0 and Holm-adjusted p < 0.05 over the bins "
        "(groups resampled);",
        f"4. **fits**: the warm-up, the on-policy run, their scoring, the relay and the seeded run's training "
        f"within {FITS_S:.0f} s on 2 cores (`python -m demo` runs this much and two more trainings in about ten "
        "minutes).",
        "",
        "Regenerate: " + ", then ".join(f"`{c}`" for c in rec.get("commands", [rec["command"]])) + " (resumable); "
        "`python -m demo.mechanism --write-only --doc docs/mechanism.md` "
        "renders this page from `mechanism/tables/`, where `tests/demo/test_mechanism.py` recomputes the grid's "
        "narrowing and relay columns from the per-problem counts and the Holm step and verdicts from the lift table.",
        "",
        "## Grid",
        "",
        f"| point | task | pass@1 % warm-up → final | pass@{K} % warm-up → final | narrowing | "
        f"relay − early @{K} | relay − final @{K} | depth bins with lift (raw / Holm) | carry at the relay's cut | "
        "wall s | fits | all four |",
        "|---|---|---|---|---|---|---|---|---:|---:|---|---|",
    ]
    premise = {p for p, m in rec["measured"].items() if m.get("from") == "demo.premise"}
    for _, r in grid.iterrows():
        mark = " †" if r["point"] in premise else ""
        search = (f", search traces (0–{int(r['search'])} failed attempts)" if r.get("search", 0) > 0 else "")
        task = (f"{r['numbers']} numbers 1..{r['max_number']}, target {r['min_target']}..{r['max_target']}{search}, "
                f"≤ {r['max_response_tokens']} tokens, warm-up {r['warmup_steps']} steps")
        lines.append(
            f"| {r['point']} | {task} | {_pct(r['warmup_pass1'])} → {_pct(r['final_pass1'])} "
            f"({_ci(r['pass1_diff'], r['pass1_low'], r['pass1_high'])}) | {_pct(r['warmup_passK'])} → "
            f"{_pct(r['final_passK'])} ({_ci(r['passK_diff'], r['passK_low'], r['passK_high'])}) | "
            f"{_yes(r['narrowed'])} | {_ci(r['relay_early_diff'], r['relay_early_low'], r['relay_early_high'])} | "
            f"{_ci(r['relay_final_diff'], r['relay_final_low'], r['relay_final_high'])} | "
            f"{int(r['lift_bins'])} / {int(r['lift_bins_holm'])} of {int((lift['point'] == r['point']).sum())} | "
            f"{100 * r['carry_at_relay_cut']:.1f} | {r['wall_s']:.0f}{mark} | {_yes(r['fits'])}{mark} | "
            f"{_yes(r['meets_all'])} |")
    lines += ["", "Intervals: 95 % paired percentile bootstrap over problems (2000 resamples), in points. Carry at "
              f"the relay's cut: the carry (below) of the seeds cut in the depth bin holding {RELAY_CUT:g}, where the "
              "relay cuts; near 100 the final policy can only finish what the early one decided."]
    if premise:
        lines[-1] += (" † Read from a `demo.premise` folder (`--premise`): its wall seconds are that folder's "
                      "stages (with the curve checkpoints it scores and whatever else shared its cores), so they do "
                      "not measure the cost criterion; `python -m demo` runs this task's warm-up, on-policy run, "
                      "relay and two seeded runs in about ten to fifteen minutes (docs/performance.md).")
    small = relay_small_k(pd.read_csv(tdir / "relay_problems.csv", dtype={"problem_id": str}), list(grid["point"]))
    lines += ["", "## The relay at small k", "",
              f"Not one of the criteria: added after point 3n-search, where every model's pass@{K} is 100 % or nearly, "
              f"so k = {K} cannot tell them apart. The same relay samples at k = "
              + " and ".join(map(str, SMALL_K)) + " (paired bootstrap over problems; p of relay − early two-sided, "
              f"Holm over the table's {len(small)} rows).", "",
              "| point | k | early % | relay % | final % | relay − early | p (Holm) | relay − final |",
              "|---|---:|---:|---:|---:|---|---:|---|"]
    for _, r in small.iterrows():
        lines.append(f"| {r['point']} | {int(r['k'])} | {_pct(r['early'])} | {_pct(r['relay'])} | {_pct(r['final'])} | "
                     f"{_ci(r['re_diff'], r['re_low'], r['re_high'])} | {r['re_p_holm']:.3f} | "
                     f"{_ci(r['rf_diff'], r['rf_low'], r['rf_high'])} |")
    rs_file = tdir / f"{RELAY_SEEDED}.csv"
    rs = pd.read_csv(rs_file, dtype={"problem_id": str}) if rs_file.is_file() else pd.DataFrame()
    if len(rs):
        st = seeded_relay_table(rs, list(grid["point"]), (*SMALL_K, K))
        lines += ["", "## Does training from old states restore their continuation?", "",
                  "The early checkpoint's prefixes (the relay's, the same samples) continued by the Thinking Seeds "
                  f"run's final checkpoint ({SEEDED}) instead of on-policy's. Endpoints fixed before the run "
                  "(`demo/mechanism.py`): relay to Thinking Seeds − relay to on-policy at k = 1, with k = "
                  + " and ".join(map(str, (*SMALL_K[1:], K))) + " beside it; paired bootstrap over problems, p "
                  f"two-sided and Holm over the table's {len(st)} rows. One training seed per method: the intervals "
                  "say nothing of the spread between training seeds.", "",
                  "| point | k | relay → on-policy % | relay → Thinking Seeds % | Thinking Seeds final alone % | "
                  "difference | p (Holm) |", "|---|---:|---:|---:|---:|---|---:|"]
        for _, r in st.iterrows():
            lines.append(f"| {r['point']} | {int(r['k'])} | {_pct(r['relay_onpolicy'])} | {_pct(r['relay_seeded'])} | "
                         f"{_pct(r['seeded_final'])} | {_ci(r['diff'], r['low'], r['high'])} | {r['p_holm']:.3f} |")
    lines += ["",
              "## Seed lift and carry by cut depth", "",
              "Lift: a seed's continuation success minus its prompt's fresh-group success (points, 95 % interval with "
              "the prompt's seeds resampled together; p two-sided, Holm over the point's bins). Carry: continuation "
              "success after a correct source minus after a wrong one, 100 where the prefix decides the outcome and "
              "0 where the continuation does.", "",
              "| point | cut depth | seeds | lift | p | p (Holm) | right after right source % | right after wrong "
              "source % | carry |", "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for _, r in lift.iterrows():
        lines.append(f"| {r['point']} | {r['depth_lo']:.1f}–{r['depth_hi']:.1f} | {int(r['seeds'])} | "
                     f"{_ci(r['lift'], r['low'], r['high'])} | {r['p']:.3f} | {r['p_holm']:.3f} | "
                     f"{_pct(r['value_after_right'])} | {_pct(r['value_after_wrong'])} | {100 * r['carry']:.1f} |")
    met = grid[grid["meets_all"].astype(bool)]
    lines += ["", "## Verdict", ""]
    if len(met):
        lines.append(f"Points meeting all four criteria: {', '.join(met['point'])}.")
    else:
        lines.append("No point of this grid meets all four criteria at this scale; the premise regime stays the "
                     "demo's (issue #40 item 1: \"if no variant meets them at this scale, say so on the page with "
                     "the grid, and keep today's regime\").")
    lines += ["", "Measured: " + "; ".join(f"{p} at commit {m['commit']} on {m['machine']}"
                                           for p, m in rec["measured"].items()) + f"; written {rec['written']}."]
    return "\n".join(lines) + "\n"


NOTES_HEADING = "## Reading the grid"   # from this heading on the page is written by hand and kept
# the notes' numbers that are not values of the page (demo.page_numbers checks the rest against the page)
NOTES_SOURCES: tuple[Source, ...] = (
    Cited("left the policy at 0.3 % pass@1", "point 4n's first warm-up at the premise's 400 steps (loss 0.30), run "
          "while sizing the point at commit 11d1046 (POINTS' comment)"),
    Cited("Gandhi et al. 2024, arXiv 2404.03683", "Stream of Search (SoS): Learning to Search in Language"),
)


def write_page(doc: Path, tdir: Path, *, log=lambda m: print(m, file=sys.stderr)) -> str:
    """Render the page from ``tdir``, keeping a hand-written part from ``NOTES_HEADING`` on, its numbers checked
    against the new page (``demo.page_numbers.mark``: the stale ones are listed under the heading and logged)."""
    text = render(tdir)
    old = doc.read_text() if doc.is_file() else ""
    if NOTES_HEADING in old:
        text = text.rstrip("\n") + "\n\n" + old[old.index(NOTES_HEADING):]
        text, stale = mark(text, NOTES_HEADING, NOTES_SOURCES)
        if stale:
            log(warning(stale, doc=doc, heading=NOTES_HEADING, sources_in="demo/mechanism.py"))
    atomic_write_text(doc, text)
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.mechanism", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1] + "\n" + EXIT_CODES_HELP)
    p.add_argument("--out", default="runs/mechanism", help="the points' folders (default runs/mechanism)")
    p.add_argument("--points", default=",".join(POINTS), help=f"comma-separated, from {', '.join(POINTS)}")
    p.add_argument("--premise", default=None, metavar="DIR",
                   help="read point 3n from this finished demo.premise folder instead of running it")
    p.add_argument("--doc", default=None, help="write this page and its tables beside it (docs/mechanism.md)")
    p.add_argument("--write-only", action="store_true", help="only render --doc from its committed tables")
    p.add_argument("--add", action="store_true",
                   help="keep the other points of --doc's committed tables (a point run in a later session joins "
                        "the grid; --points names only the new ones)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: as python -m demo)")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = p.parse_args(argv)
    out = Path(args.out)

    def body() -> int:
        names = [n for n in args.points.split(",") if n]
        for n in names:
            point_budget(n)   # an unknown point: one line, exit 2, before anything runs
        if args.add:          # as early: nothing to add to
            if not args.doc:
                raise DemoError("--add needs --doc (the page whose committed tables the new points join)")
            if not (figure_dir(Path(args.doc)) / "tables" / "grid.csv").is_file():
                raise DemoError(f"--add: {figure_dir(Path(args.doc)) / 'tables' / 'grid.csv'} is missing (nothing "
                                f"to add to); run without --add")
        if args.write_only:
            if not args.doc:
                raise DemoError("--write-only needs --doc (the page to render from its tables)")
            tdir = figure_dir(Path(args.doc)) / "tables"
            if not (tdir / "grid.csv").is_file():
                raise DemoError(f"--write-only: {tdir / 'grid.csv'} is missing; run without --write-only first")
            write_page(Path(args.doc), tdir)
            return 0
        if args.premise:
            check_premise_folder(Path(args.premise), "3n")
        folders = {n: Path(args.premise) for n in names if n == "3n" and args.premise}
        if any(n not in folders for n in names):   # some point trains: set the threads as python -m demo does
            threads, why = (args.threads, "--threads") if args.threads else auto_threads()
            torch.set_num_threads(max(1, threads))
            print(f"torch threads: {threads} ({why})", flush=True)
        for n in names:
            folders[n] = folders.get(n) or run_point(n, out)
        folders = {n: folders[n] for n in names}
        if args.doc:
            doc = Path(args.doc)
            tdir = figure_dir(doc) / "tables"
            tmp = tdir.with_name(tdir.name + ".partial")   # the committed tables stay until the new ones are whole
            shutil.rmtree(tmp, ignore_errors=True)
            collect(folders, tmp, command="python -m demo.mechanism " + shlex.join(argv),
                    from_premise=frozenset(n for n in names if n == "3n" and args.premise),
                    keep=tdir if args.add else None)
            render(tmp)
            if tdir.is_dir():
                shutil.rmtree(tdir)
            tmp.rename(tdir)
            print(write_page(doc, tdir))
        else:
            for n, d in folders.items():
                print(json.dumps(point_row(n, *read_point(n, d)), default=str))
        return 0

    resume = f"finished points are kept in {out}/ and the same command resumes after them"
    return run_command(body, input_errors=(DemoError,), resume=lambda: resume, kept=lambda: resume)


if __name__ == "__main__":
    sys.exit(main())
