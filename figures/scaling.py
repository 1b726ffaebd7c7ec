"""Score against compute with ScaleRL's fitted sigmoid (``tsanalysis scaling``, arXiv:2510.13786): does a method
move the asymptote A or only the efficiency (C_mid, B)?

Inputs are the tables ``tsanalysis scaling`` writes (:func:`load_scaling` reads a result folder):

- ``points``: benchmark, method, seed, step, model, compute, metric (pass@1 | pass@k), k, axis (tokens | wall),
  score (fractions; step 0, the warm-up, has compute 0);
- ``fits``: benchmark, method, seed (NA when pooled), fit (seed | pooled), metric, r0, A, C_mid, B with ``_low`` /
  ``_high``, rmse, status (ok | not identified | ...), note (``tsanalysis.scaling``).

:func:`plot_scaling` draws one benchmark, one panel per score: every seed's checkpoints as points on a log compute
axis, each method's fitted curve (pooled over its seeds where it has several, else its one seed's), and its
asymptote A as a dashed line where the fit identifies it (the legend says when it does not). The warm-up (C = 0)
has no place on a log axis: its score R0 is the curve's left end. Not part of ``figures.make_all`` (the paper's
Figures 2–5), as the support figures are not: this analysis reads ``eval.run`` folders or a points table.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from tsanalysis.core.scaling import curve

from .style import color_cycle, figure_style, new_figure

__all__ = ["SCALING_TABLES", "AXIS_LABELS", "find_scaling", "load_scaling", "plot_scaling"]

SCALING_TABLES = ("points", "fits")
AXIS_LABELS = {"tokens": "generated + prefilled tokens (log scale)", "wall": "training wall seconds (log scale)"}


def find_scaling(root: str | os.PathLike) -> list[Path]:
    """Every complete ``tsanalysis scaling`` result folder under ``root`` (``figures.load.find_results``)."""
    from .load import find_results

    return [f.path for f in find_results(root) if f.command == "scaling"]


def load_scaling(path: str | os.PathLike) -> dict[str, pd.DataFrame]:
    """{table: DataFrame} of the newest ``tsanalysis scaling`` result folder under ``path`` (the folder itself or
    any tree above it); prints which folder it read. MissingResults saying how to write one."""
    from . import load

    root = load.resolve_dir(path)
    found = find_scaling(root) if root.is_dir() else []
    if not found:
        raise load.MissingResults(f"no tsanalysis scaling tables under '{path}'; write them there with: tsanalysis "
                                  f"scaling --run RUN_DIR --eval-dir EVAL_DIR --checkpoints warmup=0 --out "
                                  f"{path}/analysis/scaling (or --points TABLE.csv, demo.premise's "
                                  f"tables/training_curve.csv), or point {load.RESULTS_ENV} at the folder holding "
                                  f"them (tsanalysis's default --out is results/analysis/<run>/scaling/)")
    folder = max(found, key=lambda p: (p / "settings.json").stat().st_mtime)
    tables = {name: load.read_table(folder, name) for name in SCALING_TABLES}
    print(f"scaling tables from {folder}: {', '.join(sorted(tables))}")
    return tables


def _curve_fit_of(fits: pd.DataFrame, method: str) -> pd.Series | None:
    """The fit drawn for a method: pooled over its seeds where there is one, else its first seed's."""
    d = fits[fits["method"] == method]
    d = d[d["fit"] == "pooled"] if (d["fit"] == "pooled").any() else d
    d = d[d["A"].notna()]
    return d.iloc[0] if len(d) else None


def _panel(ax, points: pd.DataFrame, fits: pd.DataFrame, metric: str, methods: list[str]) -> None:
    pts, fs = points[points["metric"] == metric], fits[fits["metric"] == metric]
    trained = pts[pts["compute"] > 0]
    lo, hi = float(trained["compute"].min()), float(trained["compute"].max())
    grid = np.geomspace(lo / 2, hi * 2, 200)
    for i, method in enumerate(methods):
        c = color_cycle(i)
        d = trained[trained["method"] == method]
        ax.scatter(d["compute"], 100 * d["score"], s=14, color=c, alpha=0.55, linewidths=0)
        f = _curve_fit_of(fs, method)
        if f is None:
            ax.plot([], [], color=c, label=f"{method}: no fit")
            continue
        ok = f["status"] == "ok"
        label = (f"{method}: A = {100 * f['A']:.1f} %, C_mid = {f['C_mid']:.3g}, B = {f['B']:.2f}" if ok else
                 f"{method}: asymptote not identified")
        ax.plot(grid, 100 * curve(grid, f["A"], f["C_mid"], f["B"], f["r0"]), color=c, label=label,
                linestyle="-" if ok else ":")
        if ok:
            ax.axhline(100 * f["A"], color=c, linewidth=1.0, linestyle="--")
    ax.set_xscale("log")
    ax.set_ylabel(f"{metric} (%)")
    ax.legend(loc="lower right", fontsize=8)


def plot_scaling(tables: Mapping[str, pd.DataFrame], *, benchmark: str | None = None,
                 title: str | None = None) -> Figure:
    """One panel per score (pass@1, pass@k) of one benchmark (the first in the tables unless ``benchmark``)."""
    points, fits = tables["points"], tables["fits"]
    bench = benchmark if benchmark is not None else str(points["benchmark"].iloc[0])
    points, fits = points[points["benchmark"] == bench], fits[fits["benchmark"] == bench]
    metrics = list(dict.fromkeys(points["metric"]))
    methods = list(dict.fromkeys(points["method"]))
    axis = str(points["axis"].iloc[0]) if "axis" in points and len(points) else "tokens"
    with figure_style():
        fig, axes = new_figure(1, len(metrics), figsize=(6.0 * len(metrics), 4.4))
        for j, metric in enumerate(metrics):
            ax = axes[0, j]
            _panel(ax, points, fits, metric, methods)
            ax.set_xlabel(AXIS_LABELS.get(axis, axis))
            ax.set_title(f"({chr(97 + j)}) {metric}: points of every seed, fitted curve, A dashed", loc="left")
        where = "" if bench == "-" else f"{bench}: "
        fig.suptitle(title or f"{where}score against compute, R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)")
    return fig
