"""The premise figures (issue #16, paper §3): does on-policy RL narrow the policy in the miniature?

Inputs are the cached tables ``demo.premise`` writes under ``<out>/tables/`` (:func:`load_tables` reads them):

- ``passk_curves.csv``: model (warmup | early | final), k, pass, low, high (pass@k as a fraction, 95 % bootstrap
  interval over problems);
- ``passk_diff.csv``: model (early | final), k, diff, low, high (paired bootstrap of model − warm-up);
- ``crossover.json``: {model: {crossover_k, low, high, ...}} (``demo.premise_stats.crossover_table``);
- ``entropy_positions.csv``: step, position, entropy, tokens (on-policy rollouts of seed 0).
- ``seed_lift_by_depth.csv`` / ``seed_lift_by_age.csv``: ``tsanalysis seeds``'s lift bins of the ratio run
  (:func:`plot_seed_lift`).

The relay figure is ``figures.fig2_relay.plot_relay_passk`` on ``relay_passk.csv``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .style import COLORS, RULE_COLORS, figure_style, log2_k_axis, new_figure

__all__ = ["load_tables", "plot_passk_curves", "plot_entropy", "plot_seed_lift", "plot_frontier", "MODEL_COLORS",
           "MODEL_LABELS"]

MODEL_COLORS = {"warmup": "#555555", "early": "#E69F00", "final": "#0072B2"}
MODEL_LABELS = {"warmup": "supervised warm-up", "early": "on-policy, early checkpoint",
                "final": "on-policy, final checkpoint"}


def load_tables(out: str | os.PathLike) -> dict:
    """{name: DataFrame or dict} of every table under ``<out>/tables`` (``<out>`` itself when it is that folder)."""
    from .load import resolve_dir

    root = resolve_dir(out)
    if (root / "tables").is_dir():
        root = root / "tables"
    if not (root / "passk_curves.csv").is_file():   # the first table the premise writes and every figure reads
        raise FileNotFoundError(f"no premise tables under '{out}' (they are in <out>/tables/): point "
                                f"THINKING_SEEDS_RESULTS at the --out folder of `python -m demo` or `python -m demo "
                                f"--premise` (runs/demo, runs/premise), or write them: `python -m demo --premise "
                                f"--out {out}`")
    tables = {}
    for f in sorted(root.iterdir()):
        if f.suffix == ".csv":
            tables[f.stem] = pd.read_csv(f)
        elif f.suffix == ".json":
            tables[f.stem] = json.loads(f.read_text())
    print(f"premise tables from {root}: {', '.join(sorted(tables))}")
    return tables


def _fmt_k(x: float) -> str:
    return "> grid" if math.isinf(x) else f"{x:.1f}"


def plot_passk_curves(curves: pd.DataFrame, diff: pd.DataFrame | None = None,
                      crossover: Mapping | None = None, *, title: str | None = None) -> Figure:
    """(a) pass@k against k for warm-up / early / final with 95 % bands; (b) the paired difference of each RL
    checkpoint to the warm-up (percentage points) with the crossover k (where final − warm-up turns <= 0) and its
    bootstrap interval marked."""
    with figure_style():
        ncols = 1 if diff is None else 2
        fig, axes = new_figure(1, ncols, figsize=(6.2 * ncols, 4.3))
        ax = axes[0, 0]
        for name in [m for m in MODEL_COLORS if m in set(curves["model"])]:
            d = curves[curves["model"] == name].sort_values("k")
            k = d["k"].to_numpy(float)
            c = MODEL_COLORS[name]
            ax.fill_between(k, 100 * d["low"], 100 * d["high"], color=c, alpha=0.18, linewidth=0)
            ax.plot(k, 100 * d["pass"], marker="o", color=c, label=MODEL_LABELS[name])
        log2_k_axis(ax, curves["k"])
        ax.set_ylabel("pass@k on the held-out split (%)")
        ax.set_title("(a) pass@k (unbiased estimator; 95 % bootstrap over problems)", loc="left")
        ax.legend(loc="lower right")
        if diff is not None:
            ax = axes[0, 1]
            for name in ("early", "final"):
                d = diff[diff["model"] == name].sort_values("k")
                if d.empty:
                    continue
                k = d["k"].to_numpy(float)
                c = MODEL_COLORS[name]
                ax.fill_between(k, 100 * d["low"], 100 * d["high"], color=c, alpha=0.18, linewidth=0)
                ax.plot(k, 100 * d["diff"], marker="o", color=c, label=f"{name} − warm-up")
            ax.axhline(0.0, color=COLORS["zero"], linewidth=0.9, linestyle="--", zorder=1)
            log2_k_axis(ax, diff["k"])
            ax.set_ylabel("pass@k minus the warm-up's (points)")
            cx = (crossover or {}).get("final")
            sub = "(b) RL checkpoint − warm-up (paired)"
            if cx is not None:
                kmin, kmax = float(diff["k"].min()), float(diff["k"].max())
                est, lo, hi = cx["crossover_k"], cx["low"], cx["high"]
                if math.isfinite(est) and est > kmin:
                    ax.axvline(est, color=MODEL_COLORS["final"], linewidth=1.2, linestyle=":")
                    ax.axvspan(max(lo, kmin), min(hi, kmax) if math.isfinite(hi) else kmax,
                               color=MODEL_COLORS["final"], alpha=0.08, linewidth=0)
                    sub += f"\nfinal falls below the warm-up at k = {est:.1f} [{_fmt_k(lo)}, {_fmt_k(hi)}]"
                elif math.isinf(est):
                    sub += f"\nno crossover up to k = {int(kmax)} (95 %: [{_fmt_k(lo)}, {_fmt_k(hi)}])"
                else:
                    sub += "\nfinal never above the warm-up"
            ax.set_title(sub, loc="left")
            ax.legend(loc="best")
        if title:
            fig.suptitle(title)
    return fig


def plot_entropy(entropy: pd.DataFrame, *, max_lines: int = 5, title: str | None = None) -> Figure:
    """(a) mean policy entropy per response position for a few training steps (first to last); (b) the token-mean
    entropy of each step's on-policy rollouts against the step."""
    import matplotlib as mpl

    with figure_style():
        fig, axes = new_figure(1, 2, figsize=(12.0, 4.0))
        if entropy.empty:   # no group with mixed rewards was trained on: no entropy was recorded
            for ax in axes[0]:
                ax.text(0.5, 0.5, "no trained tokens: no entropy recorded", ha="center", va="center",
                        transform=ax.transAxes)
            return fig
        steps = sorted(entropy["step"].unique())
        pick = sorted({steps[int(round(i))] for i in np.linspace(0, len(steps) - 1, min(max_lines, len(steps)))})
        cmap = mpl.colormaps["viridis"]
        ax = axes[0, 0]
        for i, s in enumerate(pick):
            d = entropy[(entropy["step"] == s) & (entropy["tokens"] >= 20)].sort_values("position")
            ax.plot(d["position"], d["entropy"], color=cmap(i / max(1, len(pick) - 1)), label=f"step {s + 1}")
        ax.set_xlabel("response position (token)")
        ax.set_ylabel("mean entropy (nats)")
        ax.set_title("(a) entropy by position (positions with >= 20 tokens)", loc="left")
        ax.legend(loc="upper right", title="RL step")
        ax = axes[0, 1]
        w = entropy.assign(w=entropy["entropy"] * entropy["tokens"]).groupby("step")[["w", "tokens"]].sum()
        ax.plot(w.index + 1, w["w"] / w["tokens"], color=COLORS["entropy"], marker=".")
        ax.set_xlabel("RL step")
        ax.set_ylabel("token-mean entropy (nats)")
        ax.set_title("(b) entropy of the on-policy rollouts over training", loc="left")
        if title:
            fig.suptitle(title)
    return fig


def plot_seed_lift(by_depth: pd.DataFrame, by_age: pd.DataFrame, *, title: str | None = None,
                   min_groups: int = 10) -> Figure:
    """Restart value of the seeds (issue #26, ``tsanalysis seeds``'s ``by_depth`` / ``by_age``): the mean lift of a
    seed's continuation over its prompt's fresh group (points; 95 % interval resampling groups) against (a) the cut
    depth, as a fraction of the source response, and (b) the seed's age, steps since the refresh that wrote it.
    Bins of fewer than ``min_groups`` prompt groups are left out (a ratio-rule run puts nearly every seed in one
    depth bin; a stray seed in another is no estimate), and the panel says how many."""
    few = {name: d["groups"] < min_groups if "groups" in d else pd.Series(False, index=d.index)
           for name, d in (("depth", by_depth), ("age", by_age))}
    dropped = {name: int(m.sum()) for name, m in few.items()}
    by_depth, by_age = by_depth[~few["depth"]], by_age[~few["age"]]
    with figure_style():
        fig, axes = new_figure(1, 2, figsize=(12.0, 4.0))
        for ax, d, x, xlabel, head in (
                (axes[0, 0], by_depth, (by_depth["depth_lo"] + by_depth["depth_hi"]) / 2 if len(by_depth) else [],
                 "cut depth (fraction of the source response kept as the seed)", "(a) lift by cut depth"),
                (axes[0, 1], by_age, by_age["age"] if len(by_age) else [], "seed age (RL steps since its refresh)",
                 "(b) lift by seed age")):
            ax.axhline(0.0, color=COLORS["zero"], linewidth=0.8)
            if len(d):
                y = 100 * d["lift_mean"].to_numpy()
                err = np.stack([y - 100 * d["lift_low"].to_numpy(), 100 * d["lift_high"].to_numpy() - y])
                ax.errorbar(x, y, yerr=err, color=RULE_COLORS["ratio"], marker="o", capsize=3)
            else:
                ax.text(0.5, 0.5, "no seeded rows", ha="center", va="center", transform=ax.transAxes)
            ax.set_xlabel(xlabel)
            ax.set_ylabel("continuation − fresh group, points")
            ax.set_title(head, loc="left")
            gone = dropped.get("depth" if ax is axes[0, 0] else "age", 0)
            if gone:
                ax.text(0.99, 0.02, f"{gone} bin{'s' if gone > 1 else ''} of < {min_groups} groups left out",
                        ha="right", va="bottom", fontsize=8, transform=ax.transAxes)
        if title:
            fig.suptitle(title)
    return fig


# one colour and marker per method of the premise table (the Okabe-Ito colours, then greys), on-policy first
_FRONTIER_COLORS = ("#0072B2", "#D55E00", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
                    "#777777", "#BBBBBB")
_FRONTIER_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def plot_frontier(curve: pd.DataFrame, *, labels: Mapping[str, str] | None = None,
                  title: str | None = None) -> Figure:
    """Issue #25's comparison along training (``training_curve`` of ``demo.premise``): every method's checkpoints,
    mean over its training seeds, from the warm-up (step 0) to the final one: (a) pass@k at the largest k against
    pass@1, the exploration / exploitation frontier (read a method's pass@k at on-policy's pass@1 across), and
    (b) pass@k against the tokens the policy generated so far (matched compute). Checkpoints past the budget
    (``past_budget``: a ``--extend-to`` continuation, which only some seeds have) are left out of the means."""
    labels = dict(labels or {})
    if "past_budget" in curve:
        curve = curve[~curve["past_budget"].astype(bool)]
    with figure_style():
        fig, axes = new_figure(1, 2, figsize=(12.0, 4.4))
        if curve.empty:
            for ax in axes[0]:
                ax.text(0.5, 0.5, "no scored checkpoints", ha="center", va="center", transform=ax.transAxes)
            return fig
        k = int(curve["k"].iloc[0])
        mean = (curve.groupby(["method", "step"], sort=False)
                .agg(p1=("pass@1", "mean"), pk=("pass@k", "mean"), gen=("tokens_generated", "mean"))
                .reset_index())
        methods = list(dict.fromkeys(["onpolicy", *curve["method"]]))
        methods = [m for m in methods if m in set(curve["method"])]
        for i, method in enumerate(methods):
            g = mean[mean["method"] == method].sort_values("step")
            style = {"color": _FRONTIER_COLORS[i % len(_FRONTIER_COLORS)],
                     "marker": _FRONTIER_MARKERS[i % len(_FRONTIER_MARKERS)], "markersize": 4,
                     "linewidth": 2.0 if method == "onpolicy" else 1.2, "label": labels.get(method, method)}
            axes[0, 0].plot(100 * g["p1"], 100 * g["pk"], **style)
            axes[0, 1].plot(g["gen"] / 1e6, 100 * g["pk"], **style)
        on = mean[mean["method"] == "onpolicy"].sort_values("step")
        if len(on):
            axes[0, 0].axvline(100 * on["p1"].iloc[-1], color=COLORS["zero"], linewidth=0.8, linestyle=":")
        axes[0, 0].set_xlabel("pass@1 %")
        axes[0, 0].set_title(f"(a) pass@{k} against pass@1 along training (dotted: on-policy's final pass@1)",
                             loc="left")
        axes[0, 1].set_xlabel("tokens generated by the policy so far (millions)")
        axes[0, 1].set_title(f"(b) pass@{k} against generated tokens", loc="left")
        for ax in axes[0]:
            ax.set_ylabel(f"pass@{k} % (mean over training seeds)")
        axes[0, 1].legend(fontsize=7, loc="best")
        if title:
            fig.suptitle(title)
    return fig
