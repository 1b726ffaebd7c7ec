"""Support dynamics between checkpoints (``tsanalysis support``): pass@k, problems gained / lost, answer diversity.

Inputs are the tables ``tsanalysis support`` writes (:func:`load_support` reads a result folder):

- ``passk``: benchmark, model, k, problems, pass, low, high (fractions, 95 % bootstrap over problems);
- ``support``: benchmark, from, to, k, problems, gained / lost / kept / neither (expected problem counts) with
  ``_low``/``_high``, net, retention, discovery (``tsanalysis.core.support``);
- ``crossover``: benchmark, from, to, crossover_k, low, high (``inf``: beyond the grid);
- ``diversity``: benchmark, model, metric (distinct_correct | distinct_answers | answer_entropy), mean, low, high.

:func:`plot_support` draws one benchmark: (a) pass@k against k per model with the crossover of each pair marked,
(b) expected problems gained (solid) and lost (dashed) per pair against k, (c) the diversity means per model.
Not part of ``figures.make_all`` (which regenerates the paper's Figures 2–5 from runs), as the premise figures
are not: this analysis reads ``eval.run`` folders.
"""

from __future__ import annotations

import math
import os
from typing import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .style import COLORS, color_cycle, figure_style, log2_k_axis, new_figure

__all__ = ["SUPPORT_TABLES", "load_support", "plot_support"]

SUPPORT_TABLES = ("passk", "support", "crossover", "problems", "diversity", "diversity_pairs", "likelihood")
METRIC_LABELS = {"distinct_correct": "distinct correct answers", "distinct_answers": "distinct answers",
                 "answer_entropy": "answer entropy (nats)"}


def load_support(path: str | os.PathLike) -> dict[str, pd.DataFrame]:
    """{table: DataFrame} of the newest ``tsanalysis support`` result folder under ``path`` (the folder itself
    or any tree above it); prints which folder it read. FileNotFoundError saying how to write one."""
    from . import load

    root = load.resolve_dir(path)
    found = [f for f in load.find_results(root) if f.command == "support"]
    if not found:
        raise load.MissingResults(f"no tsanalysis support tables under '{path}'; write them there with: tsanalysis "
                                  f"support --eval-dir EVAL_DIR --models base,early,final --out {path}/analysis/"
                                  f"support (the demo's: --eval-dir runs/demo/eval --models warmup,early,"
                                  f"onpolicy-seed0), or point {load.RESULTS_ENV} at the folder holding them "
                                  f"(tsanalysis's default --out is results/analysis/<eval dir>/support/)")
    folder = max(found, key=lambda f: f.mtime)
    tables = {name: folder.table(name) for name in SUPPORT_TABLES if name in folder.tables}
    print(f"support tables from {folder.path}: {', '.join(sorted(tables))}")
    return tables


def plot_support(tables: Mapping[str, pd.DataFrame], *, benchmark: str | None = None,
                 title: str | None = None) -> Figure:
    """The three panels of one benchmark (the first one in the tables unless ``benchmark`` is given)."""
    support = tables["support"]
    bench = benchmark if benchmark is not None else str(sorted(support["benchmark"].unique())[0])
    passk = tables["passk"][tables["passk"]["benchmark"] == bench]
    sup = support[support["benchmark"] == bench]
    cross = tables.get("crossover")
    cross = cross[cross["benchmark"] == bench] if cross is not None else None
    div = tables.get("diversity")
    div = div[div["benchmark"] == bench] if div is not None and len(div) else None
    models = list(dict.fromkeys(passk["model"]))
    colors = {m: color_cycle(i) for i, m in enumerate(models)}
    with figure_style():
        ncols = 3 if div is not None and len(div) else 2
        fig, axes = new_figure(1, ncols, figsize=(5.4 * ncols, 4.3))
        ax = axes[0, 0]
        for m in models:
            d = passk[passk["model"] == m].sort_values("k")
            k = d["k"].to_numpy(float)
            ax.fill_between(k, 100 * d["low"], 100 * d["high"], color=colors[m], alpha=0.18, linewidth=0)
            ax.plot(k, 100 * d["pass"], marker="o", color=colors[m], label=m)
        notes = []
        for r in ([] if cross is None else cross.to_dict("records")):
            est = float(r["crossover_k"])
            kmin = float(passk["k"].min())
            if math.isfinite(est) and est > kmin:
                ax.axvline(est, color=colors.get(r["to"], COLORS["zero"]), linewidth=1.0, linestyle=":")
                hi = float(r["high"])
                notes.append(f"{r['to']} ≤ {r['from']} from k = {est:.1f} [{float(r['low']):.1f}, "
                             f"{hi:.1f}]" if math.isfinite(hi) else f"{r['to']} ≤ {r['from']} from k = {est:.1f}")
        log2_k_axis(ax, passk["k"])
        ax.set_ylabel("pass@k (%)")
        ax.set_title("(a) pass@k, 95 % bootstrap over problems" + ("".join(f"\n{n}" for n in notes[:3])), loc="left")
        ax.legend(loc="lower right")

        ax = axes[0, 1]
        for i, ((a, z), d) in enumerate(sup.groupby(["from", "to"], sort=False)):
            d = d.sort_values("k")
            k = d["k"].to_numpy(float)
            c = color_cycle(len(models) + i)
            for name, style in (("gained", "-"), ("lost", "--")):
                ax.fill_between(k, d[f"{name}_low"], d[f"{name}_high"], color=c, alpha=0.10, linewidth=0)
                ax.plot(k, d[name], linestyle=style, marker="o", color=c, label=f"{a} → {z}: {name}")
        log2_k_axis(ax, sup["k"])
        n_prob = int(sup["problems"].max()) if len(sup) else 0
        ax.set_ylabel(f"expected problems (of {n_prob})")
        ax.set_title("(b) problems gained and lost at k (paired bootstrap)", loc="left")
        ax.legend(loc="best", fontsize=8)

        if ncols == 3:
            ax = axes[0, 2]
            metrics = [m for m in METRIC_LABELS if m in set(div["metric"])]
            width = 0.8 / max(1, len(models))
            x = np.arange(len(metrics))
            for i, m in enumerate(models):
                d = div[div["model"] == m].set_index("metric").reindex(metrics)
                if d["mean"].isna().all():
                    continue
                err = np.vstack([d["mean"] - d["low"], d["high"] - d["mean"]]).clip(min=0)
                ax.bar(x + (i - (len(models) - 1) / 2) * width, d["mean"], width, yerr=err, color=colors[m],
                       label=m, capsize=2)
            ax.set_xticks(x)
            ax.set_xticklabels([METRIC_LABELS[m] for m in metrics], rotation=12)
            ax.set_ylabel("mean per problem")
            ax.set_title("(c) answer diversity per problem", loc="left")
            ax.legend(loc="best")
        fig.suptitle(title or f"support dynamics: {bench}")
    return fig
