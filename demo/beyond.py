"""docs/beyond.md: the features beyond the paper measured on the miniature (issue #41 item 6).

    python -m demo.premise --out runs/beyond --methods onpolicy,seeds_ratio,onpolicy_lora,seeds_mixture
    tsanalysis relay --matrix runs/beyond/runs/onpolicy-seed0 --benchmarks countdown \\
        --problems runs/beyond/data/heldout.jsonl --max-tokens 40 --n 64 --template raw --out runs/beyond/matrix
    python -m demo.beyond --out runs/beyond --matrix runs/beyond/matrix --sync lora_sync.json --doc docs/beyond.md

``lora_sync.json`` is ``{"tiny:1m": side_run("1m", 16, "float32", 5, 1), "qwen2-0.5b": side_run("qwen2-0.5b", ...)}``
of ``perf.bench_lora_sync.side_run`` (vLLM's CPU build; each in a fresh interpreter).

Three measurements in the premise regime (countdown, ``tiny:1m``, the premise's warm-up and RL budget, 3 training
seeds per row), with the endpoints written into the page before the runs (``ENDPOINTS``):

1. **LoRA against full fine-tuning** (``onpolicy_lora``: rank 8 on the seven projections at 10x the lr, against
   ``onpolicy``) and **seeds from a mixture of past policies** (``seeds_mixture``: the last three refresh
   policies, against ``seeds_ratio``, which takes the newest alone): final pass@1 and pass@64 over the 200
   held-out problems, the difference paired by training seed, its Student t interval over the seeds and, for the
   four comparisons together, Holm-adjusted p-values and Bonferroni intervals;
2. **the relay matrix** of the on-policy run's checkpoints (``tsanalysis relay --matrix``) at k = 1 and k = 64;
3. **the adapter sync** to vLLM's CPU build against the full sync (``perf.bench_lora_sync``'s side run at
   ``tiny:1m`` and at a Qwen2 model with Qwen2.5-0.5B's shapes): bytes and median seconds per sync.

The page is generated whole from the tables folder (``render``): ``write`` copies what it needs beside the page
(``docs/beyond/tables/``: the methods' per-seed rows and per-problem counts, the matrix and its per-problem counts,
the sync measurements, the machine and commit) and ``tests/demo/test_beyond.py`` renders the page again from those
tables and recomputes every statistic from the counts (pass@k from per-problem counts, the matrix from its
per-problem counts, the intervals and Holm from the per-seed values).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from contracts.files import atomic_write_json, atomic_write_text
from demo.common import MEASURED
from demo.miniature import t975, t_interval
from demo.premise_page import simultaneous_t
from demo.premise_stats import holm

__all__ = ["ROWS", "COMPARISONS", "ENDPOINTS", "metrics_of", "paired_rows", "holm", "collect", "write", "read", "render",
           "main"]

ROWS = {"onpolicy": "On-policy DAPO, full fine-tuning",
        "onpolicy_lora": "On-policy DAPO, LoRA rank 8 (lr 10x)",
        "seeds_ratio": "Thinking Seeds, ratio 0.5 (state+action), seeds from the newest refresh policy",
        "seeds_mixture": "Thinking Seeds, ratio 0.5 (state+action), seeds from the last 3 refresh policies"}
COMPARISONS = (("onpolicy_lora", "onpolicy"), ("seeds_mixture", "seeds_ratio"))


def metrics_of(methods: pd.DataFrame) -> tuple[str, str]:
    """pass@1 and pass@K, K the largest k the methods table has (64 at the premise's n)."""
    K = max(int(c.split("@")[1]) for c in methods.columns if c.startswith("pass@"))
    return "pass@1", f"pass@{K}"

ENDPOINTS = """\
## Endpoints (written before the runs, in commit a188628)

- **LoRA**: does rank-8 LoRA on the seven projections at 10x the lr land within seed noise of full fine-tuning?
  Endpoints: final pass@1 and pass@64 (n = 64, 200 held-out problems), LoRA − full paired by training seed; "within
  noise" when the Bonferroni interval over the four comparisons includes 0. Cost: the trainer's CPU seconds per run,
  trainable parameters, and what a checkpoint writes.
- **Mixture seeds**: do seeds from the last three refresh policies (t, t − T, t − 2T, uniform) change Thinking
  Seeds' final pass@1 or pass@64 against seeds from the newest alone? Same statistics.
- **Relay matrix** (descriptive, one training seed): the gain of every ordered pair of the on-policy run's five
  checkpoints at k = 1 and k = 64, with paired bootstrap intervals over problems; the (first, last) cell is Figure 2.
- **Adapter sync**: bytes and median seconds per sync, adapter alone against every weight, at `tiny:1m` and at a
  0.5 B Qwen2 shape.
"""


# --- statistics (pure) --------------------------------------------------------------------------------------
def paired_rows(methods: pd.DataFrame) -> pd.DataFrame:
    """Per comparison (a, b) and metric: the per-seed differences a − b (paired by training seed), their mean, the
    95 % Student t interval, the two-sided one-sample t-test p, the Holm-adjusted p over all rows, and the
    Bonferroni interval (t quantile at 1 − 0.05 / (2 m), m the number of rows)."""
    rows = []
    for a, b in COMPARISONS:
        for metric in metrics_of(methods):
            x = methods[methods["method"] == a].set_index("seed")[metric]
            y = methods[methods["method"] == b].set_index("seed")[metric]
            seeds = sorted(set(x.index) & set(y.index))
            d = (x.loc[seeds] - y.loc[seeds]).to_numpy(float) * 100
            n = len(d)
            se = d.std(ddof=1) / np.sqrt(n) if n > 1 else np.nan
            p = float(stats.ttest_1samp(d, 0.0).pvalue) if n > 1 and se > 0 else (1.0 if n > 1 else np.nan)
            rows.append({"a": a, "b": b, "metric": metric, "seeds": n, "diff": float(d.mean()),
                         "half": t975(n - 1) * float(se) if n > 1 else np.nan, "se": float(se),
                         "p": p, "per_seed": " ".join(f"{v:+.1f}" for v in d)})
    out = pd.DataFrame(rows)
    m = len(out)
    out["p_holm"] = holm(out["p"].to_numpy(float))
    out["half_bonferroni"] = [simultaneous_t(n - 1, m) * se if n > 1 else np.nan
                              for n, se in zip(out["seeds"], out["se"])]
    return out


# --- tables -------------------------------------------------------------------------------------------------
def collect(out: Path, matrix_dir: Path, sync: Path) -> dict[str, object]:
    """The tables the page renders from, out of the run folder (``demo.premise``'s), the matrix folder and the sync
    measurements (JSON: {"tiny:1m": side_run's output, "qwen2-0.5b": ...})."""
    t = Path(out) / "tables"
    methods = pd.read_csv(t / "methods.csv")
    methods = methods[methods["method"].isin(ROWS)].reset_index(drop=True)
    models = {f"{m}-seed{s}" for m, s in zip(methods["method"], methods["seed"])}
    per_problem = pd.read_csv(t / "per_problem.csv")
    per_problem = per_problem[per_problem["model"].isin(models)].reset_index(drop=True)
    timings = json.loads((Path(out) / "timings.json").read_text())
    runs = pd.DataFrame([{"run": r, **{k: timings[r].get(k) for k in ("wall_s", "cpu_s", "threads", "load_1min")}}
                         for r in sorted(models) if r in timings])
    measured = json.loads((Path(out) / MEASURED).read_text())
    matrix_settings = json.loads((Path(matrix_dir) / "settings.json").read_text())["args"]
    return {"methods": methods, "per_problem": per_problem, "runs": runs,
            "matrix": pd.read_csv(Path(matrix_dir) / "matrix.csv"),
            "matrix_problems": pd.read_csv(Path(matrix_dir) / "matrix_problems.csv"),
            "lora_sync": json.loads(Path(sync).read_text()),
            "measured": {**measured, "matrix": {k: matrix_settings[k] for k in ("cut", "n", "max_tokens", "seed")}}}


def write(tables: dict, tdir: Path) -> None:
    tdir.mkdir(parents=True, exist_ok=True)
    for name, value in tables.items():
        if isinstance(value, pd.DataFrame):
            value.to_csv(tdir / f"{name}.csv", index=False)
        else:
            atomic_write_json(tdir / f"{name}.json", value, sort_keys=True)


def read(tdir: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for p in sorted(Path(tdir).iterdir()):
        if p.suffix == ".csv":
            out[p.stem] = pd.read_csv(p)
        elif p.suffix == ".json":
            out[p.stem] = json.loads(p.read_text())
    return out


# --- the page -----------------------------------------------------------------------------------------------
def _pm(mean: float, half: float) -> str:
    return f"{mean:.1f} ± {half:.1f}"


def _rows_table(methods: pd.DataFrame, runs: pd.DataFrame) -> list[str]:
    one, big = metrics_of(methods)
    timing = runs.set_index("run")
    lines = [f"| row | seeds | {one} % (per seed) | {big} % (per seed) | torch threads per seed | "
             "tokens generated / run |", "|---|---:|---|---|---|---:|"]
    for m, label in ROWS.items():
        d = methods[methods["method"] == m].sort_values("seed")
        if d.empty:
            continue
        cells = []
        for metric in (one, big):
            v = d[metric].to_numpy(float) * 100
            mean, half = t_interval(list(v))
            cells.append(f"{_pm(mean, np.nan if half is None else half)} ({', '.join(f'{x:.1f}' for x in v)})")
        wall = ", ".join(f"{timing.loc[f'{m}-seed{s}', 'threads']:.0f}" for s in d["seed"])
        lines.append(f"| {label} | {len(d)} | {cells[0]} | {cells[1]} | {wall} | {d['tokens_generated'].mean():,.0f} |")
    return lines


def _cost_reading(runs: pd.DataFrame) -> str:
    """Wall seconds compared only between runs of one seed trained at the same thread count (the rows' runs were
    trained at 2 threads by the premise sweep and at 1 by this one, under other loads: no other pair is fair)."""
    t = runs.set_index("run")
    parts = []
    for a, b in COMPARISONS:
        for s in range(10):
            ra, rb = f"{a}-seed{s}", f"{b}-seed{s}"
            if ra in t.index and rb in t.index and t.loc[ra, "threads"] == t.loc[rb, "threads"]:
                parts.append(f"{a} {t.loc[ra, 'wall_s']:.1f} s against {b} {t.loc[rb, 'wall_s']:.1f} s "
                             f"({t.loc[ra, 'wall_s'] / t.loc[rb, 'wall_s']:.2f}x, seed {s}, "
                             f"{t.loc[ra, 'threads']:.0f} thread{'s' if t.loc[ra, 'threads'] != 1 else ''})")
    if not parts:
        return "No pair of runs here was trained at the same thread count: their seconds are not compared."
    return ("Cost: the wall seconds of a run's last launch (`timings.json`), compared only between runs of one seed "
            "trained at the same thread count (the others differ in threads, load, or were resumed): "
            + "; ".join(parts) + ".")


def _paired_table(methods: pd.DataFrame) -> list[str]:
    p = paired_rows(methods)
    lines = ["| comparison | metric | difference, points (per seed) | 95 % t interval | p | Holm p | "
             f"Bonferroni interval (m = {len(p)}) |", "|---|---|---|---|---:|---:|---|"]
    for r in p.itertuples():
        lo, hi = r.diff - r.half, r.diff + r.half
        blo, bhi = r.diff - r.half_bonferroni, r.diff + r.half_bonferroni
        lines.append(f"| {r.a} − {r.b} | {r.metric} | {r.diff:+.1f} ({r.per_seed}) | [{lo:+.1f}, {hi:+.1f}] | "
                     f"{r.p:.3f} | {r.p_holm:.3f} | [{blo:+.2f}, {bhi:+.2f}] |")
    verdicts = []
    for r in p.itertuples():
        inside = r.diff - r.half_bonferroni <= 0 <= r.diff + r.half_bonferroni
        verdicts.append(f"{r.a} − {r.b} at {r.metric}: {'within seed noise' if inside else 'beyond seed noise'}")
    notes = []
    one, big = metrics_of(methods)
    for a, b in COMPARISONS:
        r1 = p[(p["a"] == a) & (p["metric"] == one)].iloc[0]
        rk = p[(p["a"] == a) & (p["metric"] == big)].iloc[0]
        if rk["diff"] - rk["half_bonferroni"] > 0 and r1["diff"] < 0:
            notes.append(f"{a}'s {one} is {r1['diff']:+.1f} points against {b} (uncorrected interval "
                         f"[{r1['diff'] - r1['half']:+.1f}, {r1['diff'] + r1['half']:+.1f}]), so part of its {big} "
                         f"difference may be less sharpening rather than wider support; compare at matched {one} "
                         f"(docs/premise.md's method) before reading it as breadth.")
    return lines + ["", "Read with the correction: " + "; ".join(verdicts) + ".", *([""] + notes if notes else [])]


def _matrix_table(matrix: pd.DataFrame, k: int) -> list[str]:
    d = matrix[matrix["k"] == k]
    steps = sorted(set(d["writer"]) | set(d["continuer"]))
    cols = steps[1:]
    lines = [f"| writer \\ continuer (k = {k}) | " + " | ".join(f"step {c}" for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for w in steps[:-1]:
        cells = []
        for c in cols:
            r = d[(d["writer"] == w) & (d["continuer"] == c)]
            if r.empty:
                cells.append("")
                continue
            r = r.iloc[0]
            star = "*" if r["gain_low"] > 0 or r["gain_high"] < 0 else ""
            cells.append(f"{100 * r['gain']:+.1f} [{100 * r['gain_low']:+.1f}, {100 * r['gain_high']:+.1f}]{star}")
        lines.append(f"| step {w} | " + " | ".join(cells) + " |")
    alone = d.drop_duplicates("continuer").set_index("continuer")["alone"]
    lines += ["", f"Each continuer alone at k = {k}: " + ", ".join(f"step {c} {100 * alone[c]:.1f} %" for c in cols)
              + "."]
    return lines


def _matrix_reading(matrix: pd.DataFrame) -> str:
    """What the k = 1 rows say: how far the continuer moves the relay's pass@1 given one writer's prefixes, against
    how far the continuers differ alone."""
    d = matrix[matrix["k"] == 1]
    spans = {w: 100 * (g["relay"].max() - g["relay"].min()) for w, g in d.groupby("writer") if len(g) > 1}
    alone = 100 * d.drop_duplicates("continuer")["alone"]
    if not spans:
        return ""
    w_max = max(spans, key=spans.get)
    K = int(matrix["k"].max())
    big = matrix[matrix["k"] == K]
    excl = big[(big["gain_low"] > 0) | (big["gain_high"] < 0)]
    cells = ", ".join(f"({w}, {c})" for w, c in zip(excl["writer"], excl["continuer"])) or "none"
    return (f"Reading the k = 1 rows: given one writer's prefixes, the continuers' relay pass@1 differ by at most "
            f"{spans[w_max]:.1f} points (writer step {w_max}), while the same continuers alone differ by "
            f"{alone.max() - alone.min():.1f} points: at k = 1 the continuation changes little of what the first half "
            f"decided. At k = {K} the cells whose interval excludes 0 are (writer, continuer) = {cells} of "
            f"{len(big)}.")


def _sync_table(sync: dict) -> list[str]:
    lines = ["| model | parameters | adapter (r 16) | full bytes / sync | adapter bytes / sync | bytes ratio | "
             "full ms / sync (median) | adapter ms / sync (median) | seconds ratio |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, s in sorted(sync.items(), key=lambda kv: kv[1]["params"]):
        fb, ab = s["full"]["bytes"][-1], s["lora"]["bytes"][-1]
        fs, ls = float(np.median(s["full"]["seconds"])), float(np.median(s["lora"]["seconds"]))
        lines.append(f"| `{name}` | {s['params']:,} | {s['adapter_params']:,} | {fb:,} | {ab:,} | {ab / fb:.3f} | "
                     f"{1e3 * fs:.1f} | {1e3 * ls:.1f} | {ls / fs:.3f} |")
    return lines


def render(tdir: Path, *, command: str = "python -m demo.beyond") -> str:
    """The whole page from the tables folder ``tdir`` alone."""
    t = read(tdir)
    methods, matrix, sync, measured = t["methods"], t["matrix"], t["lora_sync"], t["measured"]
    mx = measured["matrix"]
    lines = ["# Beyond the paper, measured on the miniature: LoRA RL, the relay matrix, mixture seeds", "",
             "Generated by `demo.beyond` from the tables in [beyond/tables/](beyond/tables/) "
             f"(`{command}`); `tests/demo/test_beyond.py` renders this page again from them and recomputes every "
             "statistic from the counts. The regime is the premise page's ([premise.md](premise.md): countdown, "
             "`tiny:1m`, its warm-up, 50 RL steps, 200 held-out problems scored at n = 64).", "",
             ENDPOINTS.rstrip(), "",
             "## LoRA and mixture seeds against their baselines (final checkpoints)", "",
             *_rows_table(methods, t["runs"]), "", _cost_reading(t["runs"]), "",
             "Mean ± 95 % Student t half-width over training seeds; the per-seed values in brackets. Paired by "
             "training seed (the same warm-up, data order and sampling seeds per seed; a thread count changes "
             "floating-point sums, not the data or the seeds). Holm's adjusted p and the Bonferroni interval "
             "(two decimals: it decides the reading) correct for the four comparisons:", "",
             *_paired_table(methods), "",
             "## The relay matrix of the on-policy run (training seed 0)", "",
             f"Every ordered pair of the run's checkpoints: the writer's response cut at {mx['cut']:g} of its length, "
             f"the continuer goes on (n = {mx['n']}, {mx['max_tokens']} tokens at most); each cell is the pass@k "
             "of the relay minus the continuer alone, in points, with a paired 95 % bootstrap interval over the "
             f"{int(matrix['problems'].iloc[0])} problems (`*`: the interval excludes 0). Step N is the checkpoint folder `step_N` (N + 1 steps "
             "trained); the (step 9, step 49) cell is Figure 2 (the premise page's relay).", ""]
    for k in (1, int(matrix["k"].max())):
        lines += [*_matrix_table(matrix, k), ""]
    lines += [_matrix_reading(matrix), ""]
    lines += [f"![the relay matrix at k = {int(matrix['k'].max())}](beyond/relay_matrix.png)", "",
              "## The adapter sync against the full sync (vLLM's CPU build)", "",
              *_sync_table(sync), "",
              "fp32 engines (4 bytes per element); seconds are the sync alone (the stream or the adapter folder "
              "written and added as a new `LoRARequest`, with the read-back check), one warm-up and five timed "
              "syncs per side. `qwen2-0.5b` is Qwen2.5-0.5B's shapes with random weights built from a config "
              "(`perf.bench_lora_sync.build_sized`).", "",
              "## Machine", "",
              f"Measured by commit `{measured['commit']}` on {measured['machine']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m demo.beyond", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="the demo.premise folder with the four rows")
    p.add_argument("--matrix", required=True, help="the tsanalysis relay --matrix output folder")
    p.add_argument("--sync", required=True, help="JSON of the sync measurements, {model: side_run output}")
    p.add_argument("--doc", default="docs/beyond.md")
    args = p.parse_args(argv)
    doc = Path(args.doc)
    tdir = doc.with_suffix("") / "tables"
    try:
        tables = collect(Path(args.out), Path(args.matrix), Path(args.sync))
    except FileNotFoundError as exc:
        print(f"error: {exc.filename}: no such file; write the inputs first (the commands in `python -m demo.beyond "
              f"--help`'s module doc: demo.premise with the four rows, tsanalysis relay --matrix, the sync JSON)",
              file=sys.stderr)
        return 2
    except (OSError, KeyError, ValueError) as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if tdir.exists():
        shutil.rmtree(tdir)
    write(tables, tdir)
    from figures.output import save_png
    from figures.relay_matrix import plot_relay_matrix
    save_png(plot_relay_matrix(tables["matrix"]), doc.with_suffix("") / "relay_matrix.png", dpi=120)
    atomic_write_text(doc, render(tdir))
    print(f"wrote: {doc}, {tdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
