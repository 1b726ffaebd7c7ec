"""Leaderboard of every model under a results root: ``python -m eval.leaderboard results/eval``.

Reads ``<root>/<model>/<benchmark>.jsonl`` sample files (and ``<root>/<model>/lm_eval.json`` from the
lm-evaluation-harness bridge) and writes ``<root>/leaderboard.md``, ``<root>/leaderboard.csv`` and
``<root>/leaderboard.json``:

- avg@n per model and benchmark with its 95 % bootstrap interval over problems and the problem count beside it;
- the **average** (the paper's Table 1 column): the unweighted mean of the benchmarks' avg@n over one benchmark
  list, the same for every model (``--average aime24,aime25,...``; default: every sample-file benchmark that every
  model on the board has scored, named in the table's header), with a 95 % bootstrap interval that resamples
  problems within each benchmark (``contracts.passk.stratified_bootstrap_ci``). A model missing one of the listed
  benchmarks has no average (the cell names what is missing) rather than an average over fewer;
- pass@k for k = 1, 2, 4, ... n per model and benchmark;
- a paired bootstrap of each model against the baseline on shared problems, per benchmark and for the average
  (paired by problem id within each benchmark, ``contracts.passk.paired_stratified_bootstrap``);
- lm-eval tasks as extra columns: the task's main metric, ±1.96 standard errors, and the sample count (never in
  the average: they have no per-problem scores here);
- samples that could not be graded (verdict ``grader_error``, or ``timeout``: the grader's own limit) are left out
  of every number above and counted beside them ("N ungraded"), with a warning under the table;
- every sample is keyed by (problem, sample): a results file's second row of a problem (two writers appended the
  same problems) is dropped with a warning naming the file and the lines, so P is the number of problems and no
  interval resamples a problem twice (``contracts.samples``).

**Model order and the baseline.** ``--models A,B,C`` puts exactly those models on the board, in that order.
Without it, every model folder is on the board, oldest first: a folder's time is the oldest modification time
among its results files (ties by name). ``eval.run`` writes its ``--model`` list in order, so on a fresh ``--out``
this is the order the models were given; a folder whose files are rewritten later (a resume that grades again)
moves back, so pass ``--models`` or ``--baseline`` where the order matters. The baseline of the paired
comparisons is ``--baseline``, else the first model on the board.

The CSV is long-format: one row per (model, benchmark) with every number, then one ``average`` row per model; the
paired difference to the baseline sits in the same rows. The JSON holds the whole board as ``build_leaderboard``
returns it.
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
from contracts.files import atomic_path, atomic_write_json, atomic_write_text
from contracts.samples import read_samples
from scoring.benchmarks.protocol import graded_row
from eval.lm_eval_bridge import LM_EVAL_FILE
from eval.metrics import average, compare, compare_average, counts, summarize

__all__ = ["build_leaderboard", "write_leaderboard", "render_markdown", "average_line", "lm_eval_entries", "graded_rows",
           "main"]


def graded_rows(rows) -> tuple[list[dict], int, int]:
    """(rows with only their graded samples, ungraded samples, problems left with none graded): what scores are
    computed from (``scoring.benchmarks.protocol.graded_row``: the one rule, every per-sample list kept aligned)."""
    out, ungraded, empty = [], 0, 0
    for r in rows:
        g = graded_row(r)
        ungraded += len(r["correct"]) - (len(g["correct"]) if g is not None else 0)
        if g is None:
            empty += 1
        else:
            out.append(g)
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


def _result_rows(path: Path) -> tuple[list[dict], list[str]]:
    """(rows, warnings) of a results file: its rows one per problem (a duplicate row of a problem is dropped and
    named in a warning: ``contracts.samples.unique_rows``), or ([], [why]) for a file that is not one (malformed
    JSON, rows without the fields ``eval.run`` writes)."""
    said: list[str] = []
    try:
        rows = read_samples(path, warn=said.append)
    except (ValueError, OSError) as e:
        return [], [f"skipped {path}: {e}"]
    for i, r in enumerate(rows, start=1):
        if not (isinstance(r.get("correct"), list) and isinstance(r.get("settings"), dict) and "problem_id" in r):
            return [], [f"skipped {path}: not an eval.run results file (its row {i} lacks problem_id, correct or "
                        f"settings); move it out of the results folder"]
    return rows, said


def build_leaderboard(root: str | os.PathLike, *, baseline: str | None = None, models: list[str] | None = None,
                      average: list[str] | None = None) -> dict:
    """Scores of the model folders under ``root`` (the module docstring: order, baseline, average). Returns
    ``{"entries": [...], "models": [...], "benchmarks": [...], "average": {...}, "paired": [...], "baseline": name,
    "skipped": [...]}``; ``average`` is ``{"benchmarks": [...], "chosen": "given" | "shared", "models": {model:
    {"avg", "low", "high", "problems": [...]} or {"avg": None, "missing": [...]}}}`` and ``paired`` holds one row per
    (model, benchmark) and one per model with ``"benchmark": "average"`` (``problems``: the shared problems, summed
    over the average's benchmarks; ``problems_by_benchmark`` beside it).

    ``models``: exactly these model folders, in this order (default: all, oldest first). ``average``: the benchmark
    list of the average (default: every sample-file benchmark all the models have scored).

    A JSONL (or ``lm_eval.json``) file under a model folder that is not a results file (a stray copy, a malformed
    line) is left out, and ``skipped`` holds one line naming it and why: the caller prints it as a warning. Not an
    error: one stray file should not keep the board of everything else from being written, and the warning names
    it (a resume of that very file by ``eval.run`` still refuses a malformed one). A second row of a problem in a
    results file (two writers appended the same problems) is dropped, each problem counted once from its first line,
    and ``skipped`` holds the line naming the file and the lines (``contracts.samples.unique_rows``): no bootstrap
    here runs over a problem twice. ValueError for a ``baseline`` or one of ``models`` that is not among the models,
    and for an ``average`` benchmark no model has sample files of."""
    root = Path(root)
    entries, rows_by, skipped, written = [], {}, [], {}
    for d in sorted(x for x in root.iterdir() if x.is_dir()):
        for f in sorted(d.glob("*.jsonl")):
            if f.name.endswith(".disagreements.jsonl"):
                continue
            all_rows, said = _result_rows(f)
            skipped += said
            if not all_rows:
                continue
            written[d.name] = min(written.get(d.name, math.inf), f.stat().st_mtime)
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
                found = lm_eval_entries(d.name, json.loads((d / LM_EVAL_FILE).read_text()))
            except (ValueError, TypeError, AttributeError) as e:
                skipped.append(f"skipped {d / LM_EVAL_FILE}: not an lm-eval results file ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:120]})")
            else:
                entries += found
                if found:
                    written[d.name] = min(written.get(d.name, math.inf), (d / LM_EVAL_FILE).stat().st_mtime)
    found_models = sorted({e["model"] for e in entries}, key=lambda m: (written[m], m))
    if models is not None:
        unknown = [m for m in models if m not in found_models]
        if unknown or len(set(models)) != len(models) or not models:
            raise ValueError(f"--models {','.join(models)}: " + (
                f"no results of {unknown[0]!r} under {root}" if unknown else "names a model twice" if models else
                "names no model") + f"; choose from: {', '.join(sorted(found_models)) or '(none: no results yet)'}")
        entries = [e for e in entries if e["model"] in models]
        found_models = list(models)
    board_models = found_models
    benches = sorted({e["benchmark"] for e in entries}, key=lambda b: (b.startswith("lm:"), _order(b)))
    if baseline is not None and baseline not in board_models:
        raise ValueError(f"--baseline {baseline!r} is not among the models " + (
            f"given with --models ({', '.join(board_models)})" if models is not None else f"under {root}")
            + f"; choose one of: {', '.join(sorted(board_models)) if board_models else '(none: no results yet)'}")
    base = baseline or (board_models[0] if board_models else None)
    avg = _average(board_models, benches, rows_by, average, root)
    paired = []
    for m in board_models:
        if m == base:
            continue
        for b in benches:
            if (m, b) in rows_by and (base, b) in rows_by:
                try:
                    r = compare(rows_by[(m, b)], rows_by[(base, b)])
                except ValueError:   # no shared problems
                    continue
                paired.append({"model": m, "baseline": base, "benchmark": b, **r})
        if avg["benchmarks"] and avg["models"][m]["avg"] is not None and avg["models"][base]["avg"] is not None:
            try:
                r = compare_average([rows_by[(m, b)] for b in avg["benchmarks"]],
                                    [rows_by[(base, b)] for b in avg["benchmarks"]])
            except ValueError:   # a benchmark without shared problems: no paired average
                continue
            paired.append({"model": m, "baseline": base, "benchmark": "average", **r, "problems": sum(r["problems"]),
                           "problems_by_benchmark": r["problems"]})
    return {"entries": entries, "models": board_models, "benchmarks": benches, "average": avg, "paired": paired,
            "baseline": base, "skipped": skipped}


def _average(models: list[str], benches: list[str], rows_by: dict, given: list[str] | None, root: Path) -> dict:
    """The average column: its benchmark list (given, or every sample-file benchmark each model has scored rows of)
    and each model's mean with its interval (``eval.metrics.average``), or what the model is missing."""
    scored = [b for b in benches if not b.startswith("lm:") and any((m, b) in rows_by for m in models)]
    if given is not None:
        for b in given:
            if b.startswith("lm:"):
                raise ValueError(f"--average {','.join(given)}: {b} is an lm-eval task, which has no per-problem "
                                 f"scores to resample; list sample-file benchmarks only (choose from: "
                                 f"{', '.join(scored) or '(none)'})")
            if b not in scored:
                raise ValueError(f"--average {','.join(given)}: no model under {root} has scored {b!r}; choose from: "
                                 f"{', '.join(scored) or '(none: no sample files yet)'}")
        if len(set(given)) != len(given) or not given:
            raise ValueError(f"--average {','.join(given)}: " + ("names a benchmark twice" if given else
                             "names no benchmark") + f"; choose from: {', '.join(scored) or '(none)'}")
        chosen, names = "given", list(given)
    else:
        chosen, names = "shared", [b for b in scored if all((m, b) in rows_by for m in models)]
    per_model = {}
    for m in models:
        missing = [b for b in names if (m, b) not in rows_by]
        if not names or missing:
            per_model[m] = {"avg": None, "missing": missing}
            continue
        per_model[m] = average([rows_by[(m, b)] for b in names])
    return {"benchmarks": names, "chosen": chosen, "models": per_model}


def _order(bench: str) -> tuple:
    from scoring.benchmarks import BENCHMARKS
    names = list(BENCHMARKS)
    return (names.index(bench) if bench in names else len(names), bench)


def _pct(x) -> str:
    return "" if x is None else pct(x, unit="")   # the headers say %


def _average_cell(a: dict) -> str:
    if a["avg"] is None:
        return f"n/a (no {', '.join(a['missing'])})" if a.get("missing") else ""
    return f"{_pct(a['avg'])} [{_pct(a['low'])}, {_pct(a['high'])}]"


def average_line(board: dict) -> str:
    """What the average column is: its benchmarks, how they were chosen, how its interval is drawn."""
    avg = board["average"]
    if not avg["benchmarks"]:
        return ("average: none (no sample-file benchmark every model on the board has scored; `--average a,b` lists "
                "the benchmarks)")
    how = "as given by --average" if avg["chosen"] == "given" else "every benchmark all the models have; --average chooses"
    return (f"average: unweighted mean of avg@n over {', '.join(avg['benchmarks'])} ({how}); 95% CI: bootstrap over "
            f"problems within each benchmark")


def render_markdown(board: dict) -> str:
    entries = {(e["model"], e["benchmark"]): e for e in board["entries"]}
    benches, models = board["benchmarks"], board["models"]
    if not models:
        return "(no results)\n"
    lines = ["## avg@n, % (95% bootstrap CI over problems; P problems, n samples each)", "", average_line(board), "",
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
        cells.append(_average_cell(board["average"]["models"][m]))
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
        lines += ["", f"## paired bootstrap vs {board['baseline']} (avg@n difference, % points, 95% CI, p; the "
                      f"average: paired by problem within each benchmark)", "",
                  "| model | benchmark | shared P | diff | CI | p |", "|---|---|---|---|---|---|"]
        for p in board["paired"]:
            lines.append(f"| {p['model']} | {p['benchmark']} | {p['problems']} | {points(p['diff'])} | "
                         f"[{points(p['low'])}, {points(p['high'])}] | {p['p_value']:.3f} |")
    return "\n".join(lines) + "\n"


def write_leaderboard(board: dict, root: str | os.PathLike) -> str:
    """Write ``leaderboard.md``, ``leaderboard.csv`` and ``leaderboard.json`` under ``root`` (each whole or not at
    all); return the markdown (for printing)."""
    root = Path(root)
    md = render_markdown(board)
    atomic_write_text(root / "leaderboard.md", md)
    ks = sorted({k for e in board["entries"] for k in e["pass"]})
    paired = {(p["model"], p["benchmark"]): p for p in board["paired"]}

    def vs_base(model: str, bench: str) -> list:
        p = paired.get((model, bench))
        return ["", "", "", "", ""] if p is None else [p["baseline"], p["diff"], p["low"], p["high"], p["p_value"]]

    with atomic_path(root / "leaderboard.csv") as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["model", "benchmark", "source", "version", "problems", "n", "avg", "ci_low", "ci_high"]
                   + [f"pass@{k}" for k in ks] + ["ungraded", "baseline", "diff", "diff_low", "diff_high", "p_value"])
        for e in board["entries"]:
            w.writerow([e["model"], e["benchmark"], e["source"], e["version"], e["problems"], e["n"], e["avg"],
                        e["ci_low"], e["ci_high"]] + [e["pass"].get(k, "") for k in ks] + [e.get("ungraded", "")]
                       + vs_base(e["model"], e["benchmark"]))
        avg = board["average"]
        for m in board["models"]:
            a = avg["models"][m]
            if a["avg"] is None:
                continue
            w.writerow([m, "average", "samples", "+".join(avg["benchmarks"]), sum(a["problems"]), "", a["avg"],
                        a["low"], a["high"]] + [""] * len(ks) + [""] + vs_base(m, "average"))
    atomic_write_json(root / "leaderboard.json", {k: v for k, v in board.items() if k != "skipped"})
    return md


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    """The command line (``contracts.commands``): 0; 2 with one line for a root that is not a results folder, an
    unknown ``--baseline``, ``--models`` name or ``--average`` benchmark; 1 with one line for a failure while reading
    or writing."""
    p = argparse.ArgumentParser(prog="python -m eval.leaderboard", description=__doc__.split("\n\n")[0],
                                epilog=EXIT_CODES_HELP)
    p.add_argument("root", nargs="?", default="results/eval", help="results root (default results/eval)")
    p.add_argument("--models", type=_names, default=None, metavar="A,B,C",
                   help="exactly these model folders, in this order (default: all, oldest results first)")
    p.add_argument("--baseline", default=None,
                   help="model the paired comparisons are against (default: the first model on the board)")
    p.add_argument("--average", type=_names, default=None, metavar="B1,B2",
                   help="benchmarks of the average column (default: every benchmark all the models have scored)")
    args = p.parse_args(argv)

    def body() -> int:
        if not Path(args.root).is_dir():
            raise ValueError(f"{args.root} is not a directory of eval results (python -m eval.run writes them)")
        # ValueError: an unknown --baseline, --models name or --average benchmark
        board = build_leaderboard(args.root, baseline=args.baseline, models=args.models, average=args.average)
        for why in board["skipped"]:
            print(f"warning: {why}", file=sys.stderr, flush=True)
        print(write_leaderboard(board, args.root))
        return 0

    return run_command(body, input_errors=(ValueError,), resume=lambda: "the same command rebuilds the leaderboard")


if __name__ == "__main__":
    raise SystemExit(main())
