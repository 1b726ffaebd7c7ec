"""The report of one results file (``<out>/<model>/<benchmark>.jsonl``) and the line ``python -m eval.run`` prints.

``file_report`` reads the file's scores (avg@n over every graded sample, earlier runs' included, with its bootstrap
interval; ungraded samples counted and left out); ``format_report`` renders it as one line. Pure of generation and
grading: the caller passes this run's grading timeouts and the math disagreement rate (``eval.grading``).
"""

from __future__ import annotations

from pathlib import Path

from contracts.commands import pct
from contracts.samples import read_samples
from scoring.benchmarks.base import Benchmark
from eval.leaderboard import graded_rows
from eval.metrics import counts, summarize

__all__ = ["file_report", "format_report"]


def file_report(name: str, bench: Benchmark, path: Path, *, timeouts: int,
                disagreement: tuple[float, int] | None = None) -> dict | None:
    """The scores of one sample file (None when it holds no rows): ``{"model", "benchmark", "kind", "path",
    "problems", "n_min", "n_max", "avg", "avg_ci", "grading_timeouts", "disagreement_rate", "disagreements",
    "ungraded", "ungraded_problems"}``. Ungraded samples are counted (``ungraded``; ``ungraded_problems``: problems
    with no graded sample) and left out of every score. ``timeouts``: this run's math grading timeouts (recorded for
    math only); ``disagreement``: (rate, samples) of the math cross-check, or None."""
    all_rows = read_samples(path)
    if not all_rows:
        return None
    rows, ungraded, empty = graded_rows(all_rows)
    report = {"model": name, "benchmark": bench.name, "kind": bench.kind, "path": path,
              "problems": 0, "n_min": 0, "n_max": 0, "avg": float("nan"), "avg_ci": (float("nan"), float("nan")),
              "grading_timeouts": None, "disagreement_rate": None, "disagreements": None,
              "ungraded": ungraded, "ungraded_problems": empty}
    if rows:
        _, n, c = counts(rows)
        s = summarize(n, c, ks=[1])
        report.update(problems=s["problems"], n_min=s["n_min"], n_max=s["n_max"], avg=s["avg"],
                      avg_ci=tuple(s["avg_ci"]))
    if bench.kind == "math":
        report["grading_timeouts"] = timeouts
        if disagreement is not None:
            report["disagreement_rate"], report["disagreements"] = disagreement
    return report


def format_report(report: dict) -> str:
    """One report as the line ``python -m eval.run`` prints, rates in percent (``contracts.commands.pct``):
    ``<benchmark>: avg@n A% [lo, hi] over P problems`` (+ math: timeouts and the grader disagreement)."""
    r = report
    lo, hi = r["avg_ci"]
    msg = (f"{r['benchmark']}: avg@{r['n_min'] if r['n_min'] == r['n_max'] else 'n'} {pct(r['avg'])} "
           f"[{pct(lo, unit='')}, {pct(hi, unit='')}] over {r['problems']} problems")
    if r["grading_timeouts"] is not None:
        msg += f"; grading timeouts this run: {r['grading_timeouts']}"
    if r["disagreement_rate"] is not None:
        msg += (f"; math-verify vs Qwen-style disagreement {pct(r['disagreement_rate'])} "
                f"({r['disagreements']} samples)")
    if r.get("ungraded"):
        msg += (f"; NOT GRADED: {r['ungraded']} samples (grader errors / grader timeouts; excluded from the score"
                + (f", {r['ungraded_problems']} problems left with none" if r.get("ungraded_problems") else "")
                + "; a rerun grades them again)")
    return msg
