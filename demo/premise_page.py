"""``docs/premise.md`` from the premise regime's cached tables (``<out>/tables``, written by ``demo.premise``).

The page is rendered whole from the tables each time; the grid block (written by ``demo.premise_search``) and
the hand-written notes from ``NOTES_HEADING`` on are carried over from the existing page, and every number of the
notes is checked against the new tables (``demo.page_numbers``, with ``NOTES_SOURCES`` below for the derived and
cited ones): numbers that no longer match are logged and listed in a line under the heading.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from contracts.commands import pct, points
from contracts.files import atomic_write_json, atomic_write_text
from demo.common import MEASURED, PAGE_JSON, Log, code_commit, figure_dir, machine, relay_rows
from demo.miniature import t975, t_interval
from demo.endpoints import endpoint_table, render_endpoints
from demo.page_numbers import Cited, Derived, Page, Source, Table, mark, warning
from demo.premise_budget import (EXTENSION, METHODS, PREMISE, REDUCED, STAGES, TIMINGS, PremiseBudget, eval_name,
                                 method_list)
from demo.premise_stats import N_BOOT
from scoring.tasks import HELDOUT_SEED, countdown

NOTES_HEADING = "## Reading the numbers"       # from this heading on the page is written by hand and kept
GRID_START, GRID_END = "<!-- grid:start -->", "<!-- grid:end -->"   # demo.premise_search writes between these


# ------------------------------------------------------------------------------------------------------------
# where the notes' numbers come from that are not values of the tables (demo.page_numbers; checked on every write
# and by tests/demo/test_page_numbers.py)
# ------------------------------------------------------------------------------------------------------------
def _passk(p: Page) -> Table:
    return p.table("Does RL narrow the policy?")


def _methods(p: Page) -> Table:
    return p.table("Methods table")


def _one_solution_percent(p: Page, point: str) -> float:
    """Share of a grid point's held-out problems with one solution, from the task at the setting its row states."""
    setting = p.table("Grid searched").cell(point, "setting", model="warmup")
    m = re.match(r"(\d+) numbers 1\.\.(\d+), target (\d+)\.\.(\d+);", setting)
    assert m, f"grid point {point}: setting {setting!r} does not state numbers and targets"
    count, hi, lo_t, hi_t = map(int, m.groups())
    rows = countdown.make_examples(PREMISE.heldout, seed=HELDOUT_SEED, min_numbers=count, max_numbers=count,
                                   min_number=1, max_number=hi, min_target=lo_t, max_target=hi_t)
    return 100 * float(np.mean([r["n_solutions"] == 1 for r in rows]))


_RUN = "`python -m demo --premise` at commit eac852d"


def _per_seed(p: Page) -> dict[str, np.ndarray]:
    """{method: pass@K per training seed} from the page's "pass@K per seed:" line."""
    line = next(x for x in p.sentences if re.match(r"pass@\d+ per seed: ", x))
    out = {}
    for part in line.split(":", 1)[1].split(";"):
        name, vals = part.strip().rstrip(".").split(" ", 1)
        out[name] = np.array([float(v) for v in vals.split(",")])
    return out


def _bonferroni(p: Page, method: str | None = None) -> list[float]:
    """The Bonferroni-adjusted 95 % t-interval of ``method``'s pass@K − on-policy's (paired by seed) over every
    method of the per-seed line (``render_simultaneous``'s, from the page); ``method`` None: [the per-comparison
    level %, t, seeds]."""
    seeds = _per_seed(p)
    base = seeds.pop("onpolicy")
    m, n = len(seeds), len(base)
    t = simultaneous_t(n - 1, m)
    if method is None:
        return [100 * (1 - 0.05 / m), t, n]
    d = seeds[method] - base
    hw = t * float(np.std(d, ddof=1)) / math.sqrt(n)
    return [float(d.mean()) - hw, float(d.mean()) + hw]


_BONFERRONI = "the methods' pass@K minus on-policy's per seed (the page's per-seed line), Bonferroni over its methods"
_MATCHED = "vs on-policy at matched pass@1"


def _matched_bonferroni(p: Page, method: str | None = None) -> list[float]:
    """The Bonferroni-adjusted interval of a method's pass@K at matched pass@1 minus on-policy's, over the methods of
    the *Along training* table that have one (mean ± t half-width there, widened by t_{1 − 0.05/(2m)} / t_{0.975});
    ``method`` (its row label) None: [the per-comparison level %, m]."""
    t = p.table("Along training")
    rows = [r for r in t.rows if "±" in r[t.col(_MATCHED)]]
    if method is None:
        return [100 * (1 - 0.05 / len(rows)), len(rows)]
    mean, hw = t.nums(method, _MATCHED)[:2]
    n = int(t.nums(method, "seeds reaching")[0])
    w = hw * simultaneous_t(n - 1, len(rows)) / t975(n - 1)
    return [mean - w, mean + w]


def _paired_seeds(p: Page, a: str, b: str) -> list[float]:
    """Method a's pass@K minus method b's, paired by training seed (the page's per-seed line): mean, t half-width."""
    seeds = _per_seed(p)
    d = seeds[a] - seeds[b]
    return [float(d.mean()), t975(len(d) - 1) * float(np.std(d, ddof=1)) / math.sqrt(len(d))]


NOTES_SOURCES: tuple[Source, ...] = (
    Derived("pass@1 +3.5, pass@64 −2.5", "early − warm-up pass@k at k = 1 and the largest k",
            lambda p: [_passk(p).num(k, "early") - _passk(p).num(k, "warmup") for k in ("1", _passk(p).rows[-1][0])]),
    Cited("at position 1: 0.99 nats in step 1, 0.46 in step 50", "docs/premise/tables/entropy_positions.csv, position "
          "1 at steps 0 and 49 (premise_entropy.png draws it; tests/demo/test_pages.py reads it)"),
    Derived("57 % of problems with one solution", "point E's held-out split (scoring.tasks.countdown at the grid "
            "row's setting, seed HELDOUT_SEED, PREMISE.heldout problems)", lambda p: [_one_solution_percent(p, "E")]),
    Derived("(t = 4.30)", "t_{0.975, k−1} (demo.miniature.t975) for the methods table's k seeds",
            lambda p: [t975(int(_methods(p).num(METHODS["onpolicy"].paper, "seeds")) - 1)]),
    Derived("(each interval at 99.29 %, t = 11.77 over 3 seeds)", _BONFERRONI, lambda p: _bonferroni(p)),
    Derived("the entropy rule's is [−3.5, +17.2]", _BONFERRONI, lambda p: _bonferroni(p, "seeds_entropy")),
    Derived("LUFFY's [−7.5, +26.5]", _BONFERRONI, lambda p: _bonferroni(p, "luffy")),
    Derived("the ratio rule's [−11.3, +23.6]", _BONFERRONI, lambda p: _bonferroni(p, "seeds_ratio")),
    Cited("+5.7 ± 4.1 above on-policy's", "docs/exploration.md, table *Along training*, the ratio rule's \"vs "
          "on-policy at matched pass@1\" (these runs continued to 100 steps, commit e695b67)"),
    Cited("is right 95.8 % of the time and from a wrong one 2.0 %", "docs/mechanism.md, point 3n's cut depth "
          "0.4–0.6 (its tables: lift_by_depth.csv, from this page's seeds_entropy-seed0 run)"),
    Cited("two 4-number variants", "docs/mechanism.md's grid (points 4n and 4n-wide)"),
    Cited("matched comparisons ([-5.5, +16.9])", "docs/exploration.md's notes: Bonferroni over its 7 matched "
          "comparisons (demo.premise_page._matched_bonferroni on that page)"),
)

# docs/exploration.md (the premise regime with other rows): its notes' derived numbers
EXPLORATION_SOURCES: tuple[Source, ...] = (
    Derived("after Bonferroni ([+10.1, +14.6])", _BONFERRONI, lambda p: _bonferroni(p, "passk")),
    Derived("Clip-Cov's [-31.6, +4.0]", _BONFERRONI, lambda p: _bonferroni(p, "clip_cov")),
    Derived("KL-Cov's [-30.1, +9.5]", _BONFERRONI, lambda p: _bonferroni(p, "kl_cov")),
    Derived("but not after Bonferroni ([-0.6, +3.9])", _BONFERRONI, lambda p: _bonferroni(p, "restart_fr3e")),
    Derived("(each interval at 99.29 % over 7:", "the *Along training* table's methods with a matched difference",
            lambda p: _matched_bonferroni(p)),
    Derived("Clip-Cov [-26.1, -3.7]", "Bonferroni over the matched comparisons (_matched_bonferroni)",
            lambda p: _matched_bonferroni(p, METHODS["clip_cov"].paper)),
    Derived("KL-Cov [-29.3, -5.7]", "Bonferroni over the matched comparisons (_matched_bonferroni)",
            lambda p: _matched_bonferroni(p, METHODS["kl_cov"].paper)),
    Derived("over the 7 matched comparisons ([-5.5, +16.9])", "Bonferroni over the matched comparisons",
            lambda p: [*_matched_bonferroni(p)[1:], *_matched_bonferroni(p, METHODS["seeds_ratio"].paper)]),
    Derived("pass@64 +4.5 ± 6.9 at the budget", "the ratio rule's pass@K minus the FR3E-like restart's per seed "
            "(the page's per-seed line), Student t", lambda p: _paired_seeds(p, "seeds_ratio", "restart_fr3e")),
    Cited("+3.4 ± 14.6 (commit b544d47)", "this page as measured at commit b544d47, table *Along training*, the ratio "
          "rule's \"vs on-policy at matched pass@1\" (git show b544d47:docs/exploration.md)"),
)
# docs/power.md (issue #40 item 2: the premise regime with 8 training seeds and the endpoints)
POWER_SOURCES: tuple[Source, ...] = (
    Cited("+4.5 ± 6.9", "docs/exploration.md's notes: the ratio rule's pass@64 minus the FR3E-like restart's per seed "
          "at the budget, 3 seeds (_paired_seeds on that page)"),
    Cited("at the relay's cut is 93.8 points", "docs/mechanism.md, point 3n's carry at cut depth 0.4–0.6 (its tables: "
          "lift_by_depth.csv)"),
    Cited("states up to 7 updates old", "the seed refresh interval T = 8 of the Regime section: a seed is written "
          "0 to T − 1 updates before it is continued"),
    Cited("in 1 seed of 8 within 100 steps", "the Endpoints table's E2 row of Thinking Seeds (state): 1 seed (7 left "
          "out), --extend-to 100"),
)
PAGE_SOURCES = {"premise.md": NOTES_SOURCES, "exploration.md": EXPLORATION_SOURCES, "power.md": POWER_SOURCES}


_pct = partial(pct, unit="", missing="")   # a table cell or a number whose text says %: contracts.commands.pct


def _kx(x: float) -> str:
    return f"> {'grid'}" if math.isinf(x) else f"{x:.1f}"


def _mean_t(vals: Sequence[float], scale: float = 100.0, signed: bool = False, digits: int = 1) -> str:
    vals = [float(v) for v in vals]
    if not vals:
        return ""
    m, hw = t_interval(vals)
    f = f"{'+' if signed else ''}.{digits}f"
    return f"{format(scale * m, f)}" + ("" if hw is None else f" ± {format(scale * hw, f'.{digits}f')}")


SUPPORT_PAIRS = (("warmup", "early"), ("warmup", "final"), ("final", "relay"), ("warmup", "relay"))


def render_support(support: pd.DataFrame, k: int) -> list[str]:
    """Issue #26's support table at one k: per ordered pair, the expected problems the later model gained, lost
    and kept against the earlier one (``tsanalysis support``; paired bootstrap intervals over problems)."""
    d = support[support["k"] == k]
    problems = int(d["problems"].max()) if len(d) else 0
    lines = [f"| at k = {k}, of {problems} problems | gained [95% CI] | lost [95% CI] | kept | net [95% CI] |",
             "|---|---|---|---:|---|"]
    for a, z in SUPPORT_PAIRS:
        r = d[(d["from"] == a) & (d["to"] == z)]
        if r.empty:
            continue
        r = r.iloc[0]
        lines.append(f"| {a} → {z} | {r['gained']:.1f} [{r['gained_low']:.1f}, {r['gained_high']:.1f}] | "
                     f"{r['lost']:.1f} [{r['lost_low']:.1f}, {r['lost_high']:.1f}] | {r['kept']:.1f} | "
                     f"{r['net']:+.1f} [{r['net_low']:+.1f}, {r['net_high']:+.1f}] |")
    return lines


def support_reading(support: pd.DataFrame, k: int) -> str:
    """One sentence from the support table: what the final checkpoint lost against the warm-up at k, and what the
    relay regained against the final checkpoint."""
    d = support[support["k"] == k].set_index(["from", "to"])
    if ("warmup", "final") not in d.index:
        return ""
    wf = d.loc[("warmup", "final")]
    text = (f"At k = {k} the final checkpoint lost {wf['lost']:.1f} [{wf['lost_low']:.1f}, {wf['lost_high']:.1f}] "
            f"problems the warm-up solved and gained {wf['gained']:.1f} [{wf['gained_low']:.1f}, "
            f"{wf['gained_high']:.1f}]")
    if ("final", "relay") in d.index:
        fr = d.loc[("final", "relay")]
        text += (f"; the relay regained {fr['gained']:.1f} [{fr['gained_low']:.1f}, {fr['gained_high']:.1f}] "
                 f"problems the final checkpoint does not solve, and lost {fr['lost']:.1f} [{fr['lost_low']:.1f}, "
                 f"{fr['lost_high']:.1f}] it does")
    return text + " (expected counts from each problem's unbiased pass@k)."


def _which_final(curves: pd.DataFrame, relay: pd.DataFrame | None, K: int) -> str:
    """Which samples of the final checkpoint the support table uses, and how far they are from the relay table's."""
    text = ("\"final\" in this table is the evaluation's samples of the final checkpoint (the pass@k table "
            "above)")
    if relay is None or K not in set(relay["k"]):
        return text + "."
    ev = float(curves[(curves["model"] == "final") & (curves["k"] == K)]["pass"].iloc[0])
    own = float(relay[relay["k"] == K]["final"].iloc[0])
    return (text + f"; the relay table's \"final only\" is the relay run's own draw of the same model: pass@{K} "
            f"{_pct(ev)} % here against {_pct(own)} % there ({points(ev - own)} points, two independent samples "
            "of one model), so relay − final reads differently in the two tables by that much.")


def render_seed_lift(summary: pd.DataFrame | None, run: str) -> list[str]:
    """Issue #26's restart values in a few lines (``tsanalysis seeds``'s summary of the ratio run)."""
    if summary is None or summary.empty:
        return [f"No seed-lift tables: the records of `{run}` carry no `source_correct` (written before the trainer "
                "recorded it; train the run again)."]
    r = summary.iloc[0]
    rescued = ("" if not r["all_wrong_fresh"] else
               f"; of the {int(r['all_wrong_fresh'])} prompts whose fresh group was all wrong, the seeds rescued "
               f"{int(r['rescued'])} ({_pct(r['rescued_share'])} % [{_pct(r['rescued_low'])}, "
               f"{_pct(r['rescued_high'])}])")
    steps = int(r["seeded_steps"])
    return [f"Over {steps} seeded step{'s' if steps != 1 else ''} of `{run}` ({int(r['lift_groups'])} prompt groups), the "
            f"continuations' value from the seeds minus the fresh group's value of the same prompt (the G responses "
            f"the refresh step wrote, graded whole): **{points(r['lift_mean'])} points [{points(r['lift_low'])}, "
            f"{points(r['lift_high'])}]** (value {_pct(r['value_seeded'])} vs {_pct(r['value_fresh'])} %)"
            f"{rescued}. Zero-advantage groups: {_pct(r['zero_adv_seeded'])} % of the seeded groups, "
            f"{_pct(r['zero_adv_fresh'])} % of their fresh groups. The lift mixes restarting from the seed with the "
            "updates since the refresh (`contracts.seed_lift`)."]


# what the page reads besides analyse's tables, copied into the tables folder (``collect_inputs``) so that the
# folder alone renders the page: a page's committed ``<page>/tables/`` is re-rendered by tests/demo/test_pages.py
INPUTS = {"warmup_summary.json": Path("warmup") / "warmup_summary.json", "stages.json": Path(STAGES),
          "timings.json": Path(TIMINGS), "extension.json": Path(EXTENSION)}


def collect_inputs(out: Path) -> Path:
    """Copy what ``render_page`` reads besides the tables into ``out/tables`` (the held-out split as
    ``heldout_solutions.csv``: each problem's number of solutions); returns the tables folder."""
    tdir = out / "tables"
    tdir.mkdir(parents=True, exist_ok=True)
    for name, src in INPUTS.items():
        if (out / src).is_file():
            shutil.copyfile(out / src, tdir / name)
        else:
            (tdir / name).unlink(missing_ok=True)
    held = [json.loads(x) for x in (out / "data" / "heldout.jsonl").read_text().splitlines()]
    pd.DataFrame({"problem_id": [r["id"] for r in held], "n_solutions": [r["n_solutions"] for r in held]}).to_csv(
        tdir / "heldout_solutions.csv", index=False)
    return tdir


def page_record(out: Path, b: PremiseBudget, *, command: str, title: str | None, endpoints: bool = False) -> dict:
    """``page.json``: what ``render_page`` needs beyond the tables. The machine and commit are those that measured
    the runs (``measured.json``, written before the analysis stage), else this process's (a run folder from before
    they were recorded); ``written`` is now."""
    measured = json.loads((out / MEASURED).read_text()) if (out / MEASURED).is_file() else {}
    return {"command": command, "title": title, **({"endpoints": True} if endpoints else {}),
            "budget": dataclasses.asdict(b),
            "machine": measured.get("machine") or machine(threads=False),
            "commit": measured.get("commit") or code_commit(),
            "written": time.strftime("%Y-%m-%d %H:%M"), "out": "runs/premise" if _default_out(out) else str(out)}


def read_page_record(tdir: Path) -> tuple[PremiseBudget, dict]:
    """(the budget, the record) of a tables folder's ``page.json``."""
    rec = json.loads((Path(tdir) / PAGE_JSON).read_text())
    return PremiseBudget(**rec["budget"]), rec


def _json(tdir: Path, name: str) -> dict:
    return json.loads((tdir / name).read_text()) if (tdir / name).is_file() else {}


def render_page(tdir: Path, b: PremiseBudget, *, record: dict, doc: Path | None = None) -> str:
    """The page's generated part from the tables folder ``tdir`` alone (``collect_inputs`` put the rest there)
    and its ``page.json`` record (``page_record``)."""
    tdir = Path(tdir)
    command, title = record["command"], record.get("title")
    curves = pd.read_csv(tdir / "passk_curves.csv")
    diff = pd.read_csv(tdir / "passk_diff.csv")
    cross = json.loads((tdir / "crossover.json").read_text())
    distinct = pd.read_csv(tdir / "distinct.csv")
    methods = pd.read_csv(tdir / "methods.csv")
    ent = pd.read_csv(tdir / "entropy_positions.csv")
    relay = pd.read_csv(tdir / "relay_passk.csv") if (tdir / "relay_passk.csv").is_file() else None
    support = pd.read_csv(tdir / "support.csv") if (tdir / "support.csv").is_file() else None
    lift = pd.read_csv(tdir / "seed_lift_summary.csv") if (tdir / "seed_lift_summary.csv").is_file() else None
    wsum = _json(tdir, "warmup_summary.json")
    stages = _json(tdir, "stages.json")
    timings = _json(tdir, "timings.json")
    ks = sorted(curves["k"].unique())
    K = int(max(ks))
    held = pd.read_csv(tdir / "heldout_solutions.csv")
    ns = held["n_solutions"].to_numpy()
    doc = Path(doc) if doc is not None else COMMITTED_PAGE
    rel = os.path.relpath(figure_dir(doc), doc.parent)
    extension = _json(tdir, "extension.json") or None
    lines = [
        f"# {title or 'The premise in miniature: on-policy RL narrows the policy, and the relay'}",
        "",
        "Paper §3 / Figure 2: as on-policy RL sharpens the policy, reasoning states that earlier checkpoints reached "
        "disappear from its samples, so the final checkpoint's pass@k at large k falls while its pass@1 rises, and a "
        "relay (an early checkpoint writes the first half of a response, the final one continues) can beat the final "
        "checkpoint alone at large k. This page measures both on CPU with a 1M-parameter policy on the embedded "
        "countdown task, where most problems have several valid solution paths (the addition miniature of "
        "`docs/miniature.md` has one path per problem and showed no narrowing).",
        "",
        f"Regenerate: `{command}` (resumable: finished runs, graded problems and relay problems are skipped; "
        "the same command with `--write-only` rewrites this page from the cached tables; the figures and "
        "`notebooks/premise.ipynb` read the same tables under `<out>/tables/`). The grid that chose this regime: "
        "`python -m demo.premise_search` (section *Grid searched*). `python -m demo`, the main job (`demo.reduced`), "
        f"runs this regime with one training seed per method and the rows {', '.join(method_list(REDUCED))}, and its "
        "`summary.md` reads the same tables.",
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
        f"problems ({N_BOOT} resamples, seed 0; differences paired over the same problems) unless stated",
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
        lines.append(f"| {k} | " + " | ".join(cells) + f" | {points(d['diff'])} [{points(d['low'])}, "
                     f"{points(d['high'])}] |")
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
            "(`tsanalysis.relay`); interval: paired bootstrap over problems. \"final only\" here is the final "
            "checkpoint's own samples that the relay run draws beside its relay samples (same problems, same seeds "
            "scheme), not the evaluation's samples of the tables above and of the support table below; the two "
            "sets are independent draws of one model, so their pass@k differ by sampling noise.",
            "",
            f"![relay minus final]({rel}/premise_relay.png)",
            "",
            "| k | early % | relay % | final only % | relay − final, points [95% CI] |",
            "|---:|---:|---:|---:|---|",
        ]
        lines += relay_rows(relay)
        lines += ["", f"At k = {int(big['k'])}: relay − final = **{points(big['diff'])} points "
                      f"[{points(big['diff_low'])}, {points(big['diff_high'])}]**.", ""]
    if support is not None:
        lines += ["## What RL lost and the relay recovers, problem by problem (`tsanalysis support`)", "",
                  *render_support(support, K), "", support_reading(support, K), "",
                  _which_final(curves, relay, K), ""]
    lines += ["## Restart value of the seeds (`tsanalysis seeds`, Thinking Seeds ratio run, seed 0)", "",
              *render_seed_lift(lift, eval_name("seeds_ratio", 0)), ""]
    if lift is not None:
        lines += [f"![seed lift by cut depth and age]({rel}/premise_seed_lift.png)", ""]
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
    sim = render_simultaneous(methods, b, K)
    lines += [""] + sim if sim else []   # a blank line ends the methods table before the paragraph
    cov = methods.dropna(subset=["cov_selected_share"]) if "cov_selected_share" in methods else methods.iloc[:0]
    if len(cov):
        lines += ["Tokens the covariance rule touched (share of each update's loss tokens, mean over updates and "
                  "seeds; Clip-Cov zeroes their loss, KL-Cov penalises them): " + "; ".join(
                      f"{METHODS[m].paper} {100 * d['cov_selected_share'].mean():.2f} %"
                      for m, d in cov.groupby("method", sort=False)) + ".", ""]
    per_seed = methods.pivot_table(index="method", columns="seed", values=f"pass@{K}")
    lines += ["", f"pass@{K} per seed: " + "; ".join(
        f"{m} " + ", ".join(_pct(v) for v in per_seed.loc[m].dropna()) for m in method_list(b) if m in per_seed.index),
        ""]
    curve = pd.read_csv(tdir / "training_curve.csv") if (tdir / "training_curve.csv").is_file() else None
    matched = pd.read_csv(tdir / "matched_pass1.csv") if (tdir / "matched_pass1.csv").is_file() else None
    if curve is not None and matched is not None and len(curve) and curve["step"].nunique() > 2:
        lines += render_along_training(curve, matched, methods, b, K, rel, extension=extension)
    if record.get("endpoints") and matched is not None:   # the power study's fixed endpoints (issue #40 item 2)
        lines += render_endpoints(endpoint_table(methods, matched, K), K,
                                  {m: METHODS[m].paper for m in METHODS})
    total_w = sum(s.get("wall_s", 0) for s in stages.values())
    lines += ["## Cost", "", "| stage | wall s | CPU s | note |", "|---|---:|---:|---|"]
    for name, s in stages.items():
        lines.append(f"| {name} | {s['wall_s']:.0f} | {s['cpu_s']:.0f} | {s.get('note', '')} |")
    lines += [f"| **total** | {total_w:.0f} | {sum(s.get('cpu_s', 0) for s in stages.values()):.0f} | "
              f"{total_w / 60:.1f} minutes |", "",
              f"{record['machine']}; training used "
              f"{', '.join(sorted({str(t['threads']) for t in timings.values()})) or '?'} torch thread(s). Measured "
              f"with the code of commit {record['commit'] or '(unknown)'}; written {record['written']} from "
              f"`{record['out']}`; the tables behind every number are in `{rel}/tables/` "
              "(`tests/demo/test_pages.py` recomputes the page from them).", ""]
    return "\n".join(lines)


def simultaneous_t(df: int, m: int, level: float = 0.95) -> float:
    """The Student t quantile of a Bonferroni-adjusted two-sided interval: each of ``m`` intervals at level
    1 − (1 − level)/m, so all ``m`` cover together with probability >= ``level`` (scipy.stats.t)."""
    from scipy.stats import t as student_t
    return float(student_t.ppf(1 - (1 - level) / (2 * m), df))


def render_simultaneous(methods: pd.DataFrame, b: PremiseBudget, K: int) -> list[str]:
    """The methods' paired differences to on-policy with Bonferroni-adjusted 95 % t-intervals over the m methods
    compared (a difference called non-zero must exclude 0 here, not only in the table's per-comparison intervals)."""
    base = methods[methods["method"] == "onpolicy"].set_index("seed")
    rows = []
    for method in method_list(b):
        d = methods[(methods["method"] == method) & methods["seed"].isin(base.index)]
        if method == "onpolicy" or len(d) < 2:
            continue
        rows.append((method, [d[c].to_numpy() - base.loc[d["seed"], c].to_numpy() for c in ("pass@1", f"pass@{K}")]))
    if not rows:
        return []
    m = len(rows)
    lines = [f"Over the {m} comparisons with on-policy, Bonferroni-adjusted intervals (each at "
             f"{100 * (1 - 0.05 / m):.2f} %, all {m} together at >= 95 %; t = "
             f"{simultaneous_t(len(rows[0][1][0]) - 1, m):.2f} for {len(rows[0][1][0])} seeds):", "",
             f"| method | pass@1 vs on-policy [adjusted] | pass@{K} vs on-policy [adjusted] | excludes 0 |",
             "|---|---|---|---|"]
    for method, diffs in rows:
        cells, excl = [], []
        for v in diffs:
            mean, sd = float(np.mean(v)), float(np.std(v, ddof=1))
            hw = simultaneous_t(len(v) - 1, m) * sd / math.sqrt(len(v))
            cells.append(f"{points(mean)} [{points(mean - hw)}, {points(mean + hw)}]")
            excl.append(mean - hw > 0 or mean + hw < 0)
        said = [name for name, e in zip(("pass@1", f"pass@{K}"), excl) if e]
        lines.append(f"| {METHODS[method].paper} | {cells[0]} | {cells[1]} | {', '.join(said) or 'neither'} |")
    return lines + [""]


def render_along_training(curve: pd.DataFrame, matched: pd.DataFrame, methods: pd.DataFrame, b: PremiseBudget,
                          K: int, rel: str, *, extension: dict | None = None) -> list[str]:
    """Issue #25's two comparisons: each run's pass@K where its pass@1 reaches on-policy's final pass@1 (same
    training seed), and what each method spent (tokens generated, prefilled and trained; CPU seconds).
    ``extension`` (``<out>/extension.json``, ``--extend-to``): the runs continued past the budget to look for it."""
    steps = sorted(int(x) for x in curve["step"].unique() if x <= b.total_steps)
    if extension and extension.get("runs"):
        ext = extension["runs"]
        cont = sorted(ext, key=lambda r: (ext[r]["method"], ext[r]["seed"]))
        reach = (f"A run that had not reached it after {b.total_steps} steps was continued (`--extend-to "
                 f"{extension['extend_to']}`: the trainer's resume of a copy of the run, at the same constant learning "
                 f"rate, so its first {b.total_steps} steps are the table's run), its checkpoint scored every "
                 f"{b.curve_every} steps until its pass@1 reached the target or it had trained "
                 f"{extension['extend_to']} steps: {len(cont)} runs, "
                 + ", ".join(f"{r} to step {ext[r]['trained_to']}" for r in cont)
                 + ". The compute comparison below stays within the budget.")
    else:
        reach = f"A run that never reaches it within {b.total_steps} steps is counted, not extrapolated."
    lines = [
        "## Along training: pass@1 against pass@64, at matched pass@1 and matched compute".replace("64", str(K)),
        "",
        f"Every run's checkpoints after {', '.join(map(str, steps[1:]))} steps are scored like the final one "
        f"(n = {b.eval_n}, the same {b.heldout} problems; step 0 is the warm-up). At matched pass@1: a run's pass@{K} "
        "where its pass@1 first reaches the final pass@1 of on-policy with the same training seed (linear in pass@1 "
        "between the two checkpoints around the crossing; on-policy itself may reach its final value earlier), and "
        "the difference to on-policy's own value there, paired by seed (mean ± t half-width over the seeds that "
        f"reach it). {reach}",
        "",
        f"![pass@{K} against pass@1 and against generated tokens]({rel}/premise_frontier.png)",
        "",
        f"| method | seeds reaching on-policy's pass@1 | at step (per seed) | pass@{K} % at matched pass@1 | "
        f"vs on-policy at matched pass@1 | final pass@1 % |",
        "|---|---:|---|---|---|---|",
    ]
    for method in method_list(b):
        d = matched[matched["method"] == method]
        if d.empty:
            continue
        hit = d[d["reached"].astype(bool)]
        at = ", ".join("–" if not r["reached"] else f"{r['step']:.0f}" for _, r in d.iterrows())
        vs = hit["diff"].dropna()
        lines.append(f"| {METHODS[method].paper} | {len(hit)}/{len(d)} | {at} | "
                     f"{_mean_t(hit['pass@k']) if len(hit) else '–'} | "
                     f"{_mean_t(vs, signed=True) if method != 'onpolicy' and len(vs) else '–'} | "
                     f"{_mean_t(d['final_pass@1'])} |")
    lines += [
        "",
        "Compute per run (mean over training seeds): tokens the policy generated, context tokens the sampler was "
        "given (prompts, and the seeds a restart continues; `tokens/prefilled`), tokens the update trained on "
        "(`tokens/trained`), and the training run's CPU seconds (`timings.json`; scoring not included). At matched "
        f"compute: the run's pass@1 and pass@{K} and on-policy's (same seed), each read where its run had generated C "
        "tokens, C the smaller of the two runs' totals (linear between checkpoints; differences paired by seed). "
        f"Read the two together: at C a run that generates more per step has trained fewer steps, so its pass@{K} "
        "gains partly because it has sharpened less, which its pass@1 shows.",
        "",
        f"| method | generated (M) | prefilled (M) | trained (M) | train CPU s | pass@1 % at C | vs on-policy | "
        f"pass@{K} % at C | vs on-policy |",
        "|---|---:|---:|---:|---:|---|---|---|---|",
    ]
    for method in method_list(b):
        d = methods[methods["method"] == method]
        mm = matched[matched["method"] == method]
        if d.empty or "tokens_prefilled" not in d:
            continue
        other = method != "onpolicy"
        cells = []
        for at, diff in (("pass@1_at_compute", "diff1_at_compute"), ("pass@k_at_compute", "diff_at_compute")):
            vs = mm[diff].dropna()
            cells += [_mean_t(mm[at].dropna()), _mean_t(vs, signed=True) if other and len(vs) else "–"]
        lines.append(f"| {METHODS[method].paper} | {d['tokens_generated'].mean() / 1e6:.2f} | "
                     f"{d['tokens_prefilled'].mean() / 1e6:.2f} | {d['tokens_trained'].mean() / 1e6:.2f} | "
                     f"{d['train_cpu_s'].mean():.0f} | " + " | ".join(cells) + " |")
    return lines + [""]


def _default_out(out: Path) -> bool:
    """Whether ``out`` is the default ``runs/premise`` (of any checkout)."""
    return Path(out).parts[-2:] == ("runs", "premise")


COMMITTED_PAGE = Path(__file__).resolve().parents[1] / "docs" / "premise.md"


def write_page(out: Path, b: PremiseBudget, *, doc: Path, log: Log, command: str | None = None,
               title: str | None = None, endpoints: bool = False) -> str:
    """``doc`` from the cached tables; figures copied to the folder named after it (``figure_dir``); the grid
    block and the hand-written notes of an existing page are kept (a new page elsewhere takes them from the
    committed ``docs/premise.md``, so a page under ``runs/`` reads complete, its stale numbers marked)."""
    command = command or ("python -m demo --premise" + ("" if _default_out(out) else f" --out {out}"))
    tdir = collect_inputs(out)
    record = page_record(out, b, command=command, title=title, endpoints=endpoints)
    atomic_write_json(tdir / PAGE_JSON, record, indent=1)
    page = render_page(tdir, b, record=record, doc=doc)
    fig_dir = figure_dir(doc)
    fig_dir.mkdir(parents=True, exist_ok=True)
    for f in (out / "figures").glob("premise_*.png"):
        shutil.copyfile(f, fig_dir / f.name)
    # the tables beside the page (committed with it): the page's every number is recomputable from them
    if fig_dir.resolve() != tdir.parent.resolve():
        shutil.rmtree(fig_dir / "tables", ignore_errors=True)
        shutil.copytree(tdir, fig_dir / "tables")
    old = doc.read_text() if doc.is_file() else (COMMITTED_PAGE.read_text() if COMMITTED_PAGE.is_file() else "")
    grid = (old[old.index(GRID_START):old.index(GRID_END) + len(GRID_END)] if GRID_START in old and GRID_END in old
            else f"{GRID_START}\n(run `python -m demo.premise_search --write-grid` to fill this section)\n{GRID_END}")
    page = page.rstrip("\n") + "\n\n## Grid searched\n\n" + grid + "\n"
    if NOTES_HEADING in old:
        page += "\n" + old[old.index(NOTES_HEADING):]
    page, stale = mark(page, NOTES_HEADING, PAGE_SOURCES.get(doc.name, NOTES_SOURCES))
    if stale:
        log(warning(stale, doc=doc, heading=NOTES_HEADING, sources_in="demo/premise_page.py"))
    atomic_write_text(doc, page)
    log(f"wrote {doc}")
    return page
