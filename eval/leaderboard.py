"""Leaderboard of every model under a results root: ``python -m eval.leaderboard results/eval``.

Reads ``<root>/<model>/<benchmark>.jsonl`` sample files (and ``<root>/<model>/lm_eval.json`` from the
lm-evaluation-harness bridge) and writes ``<root>/leaderboard.md`` and ``<root>/leaderboard.csv``:

- avg@n per model and benchmark with its 95 % bootstrap interval over problems and the problem count beside it,
  and the unweighted average over the model's sample-file benchmarks;
- pass@k for k = 1, 2, 4, ... n per model and benchmark;
- a paired bootstrap of each model against the baseline (the first model, or ``--baseline``) on shared problems;
- lm-eval tasks as extra columns: the task's main metric, ±1.96 standard errors, and the sample count;
- samples that could not be graded (verdict ``grader_error``, or ``timeout``: the grader's own limit) are left out
  of every number above and counted beside them ("N ungraded"), with a warning under the table.

The CSV is long-format: one row per (model, benchmark) with every number.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from pathlib import Path

from contracts.commands import EXIT_CODES_HELP, points, pct, run_command
from scoring.benchmarks.base import UNGRADED_VERDICTS
from eval.lm_eval_bridge import LM_EVAL_FILE
from eval.metrics import compare, counts, summarize
from eval.samples import read_samples

__all__ = ["build_leaderboard", "write_leaderboard", "lm_eval_entries", "graded_rows", "main"]


def graded_rows(rows) -> tuple[list[dict], int, int]:
    """(rows with only their graded samples, ungraded samples, problems left with none graded): what scores are
    computed from. A sample whose verdict is in ``UNGRADED_VERDICTS`` is never a score."""
    out, ungraded, empty = [], 0, 0
    for r in rows:
        verdicts = r.get("verdicts") or [None] * len(r["correct"])
        keep = [i for i, v in enumerate(verdicts) if v not in UNGRADED_VERDICTS]
        if len(keep) == len(r["correct"]):
            out.append(r)
            continue
        ungraded += len(r["correct"]) - len(keep)
        if not keep:
            empty += 1
            continue
        out.append(dict(r, correct=[r["correct"][i] for i in keep], verdicts=[verdicts[i] for i in keep]))
    return out, ungraded, empty

# lm-eval metric names in order of preference for "the task's main metric"
LM_EVAL_METRICS = ("exact_match", "acc_norm", "acc", "pass@1", "pass_at_1", "f1", "em", "bleu", "word_perplexity")


def lm_eval_entries(model: str, results: dict) -> list[dict]:
    """Leaderboard entries from an ``lm_eval.simple_evaluate`` result dict: per task its main metric (the first
    of ``LM_EVAL_METRICS`` present, first filter in file order), a ±1.96·stderr interval and the sample count."""
    out = []
    n_samples = results.get("n-samples", {})
    for task, res in results.get("results", {}).items():
        metrics = [k for k in res if "," in k and "_stderr," not in k and isinstance(res[k], (int, float))]
        if not metrics:
            continue
        key = next((k for name in LM_EVAL_METRICS for k in metrics if k.split(",")[0] == name), metrics[0])
        metric, filt = key.split(",", 1)
        value = float(res[key])
        stderr = res.get(f"{metric}_stderr,{filt}")
        stderr = float(stderr) if isinstance(stderr, (int, float)) and math.isfinite(float(stderr)) else None
        count = n_samples.get(task, {}).get("effective")
        out.append({"model": model, "benchmark": f"lm:{task}", "source": "lm-eval", "version": f"{metric},{filt}",
                    "problems": count, "n": None, "avg": value,
                    "ci_low": None if stderr is None else value - 1.96 * stderr,
                    "ci_high": None if stderr is None else value + 1.96 * stderr, "pass": {}})
    return out


def _result_rows(path: Path) -> tuple[list[dict], str | None]:
    """(rows, None) of a results file, or ([], why) for a file that is not one (malformed JSON, rows without the
    fields ``eval.run`` writes)."""
    try:
        rows = read_samples(path)
    except (ValueError, OSError) as e:
        return [], f"skipped {path}: {e}"
    for i, r in enumerate(rows, start=1):
        if not (isinstance(r.get("correct"), list) and isinstance(r.get("settings"), dict) and "problem_id" in r):
            return [], (f"skipped {path}: not an eval.run results file (its row {i} lacks problem_id, correct or "
                        f"settings); move it out of the results folder")
    return rows, None


def build_leaderboard(root: str | os.PathLike, *, baseline: str | None = None) -> dict:
    """Scores of every model folder under ``root``. Returns ``{"entries": [...], "models": [...],
    "benchmarks": [...], "averages": {model: (mean, count)}, "paired": [...], "baseline": name, "skipped": [...]}``.

    A JSONL (or ``lm_eval.json``) file under a model folder that is not a results file (a stray copy, a malformed
    line) is left out, and ``skipped`` holds one line naming it and why: the caller prints it as a warning. Not an
    error: one stray file should not keep the board of everything else from being written, and the warning names
    it (a resume of that very file by ``eval.run`` still refuses a malformed one). ValueError for a ``baseline``
    that is not among the models."""
    root = Path(root)
    entries, rows_by, skipped = [], {}, []
    for d in sorted(x for x in root.iterdir() if x.is_dir()):
        for f in sorted(d.glob("*.jsonl")):
            if f.name.endswith(".disagreements.jsonl"):
                continue
            all_rows, why = _result_rows(f)
            if why is not None:
                skipped.append(why)
            if not all_rows:
                continue
            rows, ungraded, _ = graded_rows(all_rows)
            versions = sorted({str(r["settings"].get("benchmark_version")) for r in all_rows})
            entry = {"model": d.name, "benchmark": f.stem, "source": "samples", "version": "/".join(versions),
                     "problems": 0, "n": None, "avg": None, "ci_low": None, "ci_high": None, "pass": {},
                     "ungraded": ungraded}
            if rows:
                _, n, c = counts(rows)
                s = summarize(n, c)
                entry.update(problems=s["problems"], n=s["n_min"] if s["n_min"] == s["n_max"] else
                             f"{s['n_min']}-{s['n_max']}", avg=s["avg"], ci_low=s["avg_ci"][0],
                             ci_high=s["avg_ci"][1], **{"pass": {k: v[0] for k, v in s["pass"].items()}})
                rows_by[(d.name, f.stem)] = rows
            entries.append(entry)
        if (d / LM_EVAL_FILE).is_file():
            try:
                entries += lm_eval_entries(d.name, json.loads((d / LM_EVAL_FILE).read_text()))
            except (ValueError, TypeError, AttributeError) as e:
                skipped.append(f"skipped {d / LM_EVAL_FILE}: not an lm-eval results file ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:120]})")
    models = sorted({e["model"] for e in entries})
    benches = sorted({e["benchmark"] for e in entries}, key=lambda b: (b.startswith("lm:"), _order(b)))
    averages = {}
    for m in models:
        vals = [e["avg"] for e in entries if e["model"] == m and e["source"] == "samples" and e["avg"] is not None]
        if vals:
            averages[m] = (sum(vals) / len(vals), len(vals))
    if baseline is not None and baseline not in models:
        raise ValueError(f"--baseline {baseline!r} is not among the models under {root}; choose one of: "
                         f"{', '.join(models) if models else '(none: no results yet)'}")
    base = baseline or (models[0] if models else None)
    paired = []
    for m in models:
        if m == base:
            continue
        for b in benches:
            if (m, b) in rows_by and (base, b) in rows_by:
                try:
                    r = compare(rows_by[(m, b)], rows_by[(base, b)])
                except ValueError:   # no shared problems
                    continue
                paired.append({"model": m, "baseline": base, "benchmark": b, **r})
    return {"entries": entries, "models": models, "benchmarks": benches, "averages": averages, "paired": paired,
            "baseline": base, "skipped": skipped}


def _order(bench: str) -> tuple:
    from scoring.benchmarks import BENCHMARKS
    names = list(BENCHMARKS)
    return (names.index(bench) if bench in names else len(names), bench)


def _pct(x) -> str:
    return "" if x is None else pct(x, unit="")   # the headers say %


def render_markdown(board: dict) -> str:
    entries = {(e["model"], e["benchmark"]): e for e in board["entries"]}
    benches, models = board["benchmarks"], board["models"]
    if not models:
        return "(no results)\n"
    lines = ["## avg@n, % (95% bootstrap CI over problems; P problems, n samples each)", "",
             "| model | " + " | ".join(benches) + " | average |", "|---" * (len(benches) + 2) + "|"]
    for m in models:
        cells = []
        for b in benches:
            e = entries.get((m, b))
            if e is None:
                cells.append("")
                continue
            ci = "" if e["ci_low"] is None else f" [{_pct(e['ci_low'])}, {_pct(e['ci_high'])}]"
            size = f"P={e['problems']}" + (f", n={e['n']}" if e["n"] is not None else "")
            if e.get("ungraded"):
                size += f", {e['ungraded']} ungraded"
            cells.append(f"{_pct(e['avg']) if e['avg'] is not None else 'n/a'}{ci} ({size})")
        avg = board["averages"].get(m)
        cells.append("" if avg is None else f"{_pct(avg[0])} ({avg[1]} benchmark{'s' * (avg[1] != 1)})")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    bad = [e for e in board["entries"] if e.get("ungraded")]
    if bad:
        lines += ["", "**Not graded** (grader errors or grader timeouts; left out of every number here; rerun "
                      "`python -m eval.run` on the same --out to grade them again): "
                  + ", ".join(f"{e['model']}/{e['benchmark']} {e['ungraded']} samples" for e in bad)]
    ks = sorted({k for e in board["entries"] for k in e["pass"]})
    if ks:
        lines += ["", "## pass@k, % (unbiased estimator, mean over problems)", "",
                  "| model | benchmark | P | n | " + " | ".join(f"pass@{k}" for k in ks) + " |",
                  "|---" * (len(ks) + 4) + "|"]
        for e in board["entries"]:
            if e["pass"]:
                lines.append(f"| {e['model']} | {e['benchmark']} | {e['problems']} | {e['n']} | "
                             + " | ".join(_pct(e["pass"].get(k)) for k in ks) + " |")
    if board["paired"]:
        lines += ["", f"## paired bootstrap vs {board['baseline']} (avg@n difference, % points, 95% CI, p)", "",
                  "| model | benchmark | shared P | diff | CI | p |", "|---|---|---|---|---|---|"]
        for p in board["paired"]:
            lines.append(f"| {p['model']} | {p['benchmark']} | {p['problems']} | {points(p['diff'])} | "
                         f"[{points(p['low'])}, {points(p['high'])}] | {p['p_value']:.3f} |")
    return "\n".join(lines) + "\n"


def write_leaderboard(board: dict, root: str | os.PathLike) -> str:
    """Write ``leaderboard.md`` and ``leaderboard.csv`` under ``root``; return the markdown (for printing)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    md = render_markdown(board)
    (root / "leaderboard.md").write_text(md, encoding="utf-8")
    ks = sorted({k for e in board["entries"] for k in e["pass"]})
    with open(root / "leaderboard.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["model", "benchmark", "source", "version", "problems", "n", "avg", "ci_low", "ci_high"]
                   + [f"pass@{k}" for k in ks] + ["ungraded"])
        for e in board["entries"]:
            w.writerow([e["model"], e["benchmark"], e["source"], e["version"], e["problems"], e["n"], e["avg"],
                        e["ci_low"], e["ci_high"]] + [e["pass"].get(k, "") for k in ks] + [e.get("ungraded", "")])
        for m, (avg, cnt) in board["averages"].items():
            w.writerow([m, "average", "samples", f"{cnt} benchmarks", "", "", avg, "", ""] + [""] * len(ks) + [""])
    return md


def main(argv: list[str] | None = None) -> int:
    """The command line (``contracts.commands``): 0; 2 with one line for a root that is not a results folder or an
    unknown ``--baseline``; 1 with one line for a failure while reading or writing."""
    p = argparse.ArgumentParser(prog="python -m eval.leaderboard", description=__doc__.split("\n\n")[0],
                                epilog=EXIT_CODES_HELP)
    p.add_argument("root", nargs="?", default="results/eval", help="results root (default results/eval)")
    p.add_argument("--baseline", default=None, help="model the paired comparisons are against (default: first)")
    args = p.parse_args(argv)

    def body() -> int:
        if not Path(args.root).is_dir():
            raise ValueError(f"{args.root} is not a directory of eval results (python -m eval.run writes them)")
        board = build_leaderboard(args.root, baseline=args.baseline)   # ValueError: an unknown --baseline
        for why in board["skipped"]:
            print(f"warning: {why}", file=sys.stderr, flush=True)
        print(write_leaderboard(board, args.root))
        return 0

    return run_command(body, input_errors=(ValueError,), resume=lambda: "the same command rebuilds the leaderboard")


if __name__ == "__main__":
    raise SystemExit(main())
