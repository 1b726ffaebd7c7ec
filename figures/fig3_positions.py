"""Figure 3: mean entropy and clipped tokens per relative-position bin, per run (paper §3.2).

Input: the ``bins`` table of ``tsanalysis positions`` (series ``all`` is used): a token at index t of a response
of length L falls in bin floor(n_bins · t / L); ``entropy_mean`` (nats) per bin; ``clip_low_per_1e4`` and
``clip_high_per_1e4`` = clipped tokens per 10^4 tokens that entered the policy loss. Clipping is drawn as
stacked bars: low clip (Â < 0, r < 1 − ε_low) at the bottom, high clip (Â > 0, r > 1 + ε_high) on top, so a
bar's height is the total ``clip_per_1e4``. A run without a clipped token (one update per batch: every ratio is 1)
says "no clipped tokens" in its clipping panel, and the legend names the clip colours only when some bar is drawn.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .style import CLIP_COLORS, ENTROPY_COLOR, figure_style

__all__ = ["plot_positions", "POSITION_XLABEL", "CLIP_YLABEL", "ENTROPY_YLABEL", "NO_CLIPS"]

POSITION_XLABEL = "relative position in the response (t / L)"
ENTROPY_YLABEL = "mean entropy (nats)"
CLIP_YLABEL = "clipped tokens per 10⁴ loss tokens"
NO_CLIPS = "no clipped tokens"   # what a clipping panel says when it has no bar to draw


def _series(bins: pd.DataFrame, series: str) -> pd.DataFrame:
    d = bins[bins["series"] == series] if "series" in bins.columns else bins
    if d.empty:
        raise ValueError(f"the positions table has no rows of series '{series}'")
    return d.sort_values("bin")


def bin_centers(d: pd.DataFrame) -> np.ndarray:
    return (d["pos_lo"].to_numpy(float) + d["pos_hi"].to_numpy(float)) / 2


def format_position_axis(ax: Axes, d: pd.DataFrame) -> None:
    edges = np.unique(np.concatenate([d["pos_lo"].to_numpy(float), d["pos_hi"].to_numpy(float)]))
    ax.set_xlim(edges[0], edges[-1])
    step = max(1, int(np.ceil((len(edges) - 1) / 5)))   # at most ~6 labelled ticks
    ax.set_xticks(edges[::step])
    ax.set_xticklabels([f"{x:.0%}" for x in edges[::step]])
    ax.set_xlabel(POSITION_XLABEL)


def has_clips(d: pd.DataFrame) -> bool:
    """Whether any bin of the table has a clipped token (a rate above 0; NaN: a bin without loss tokens)."""
    return bool(np.nansum(d["clip_low_per_1e4"].to_numpy(float)) + np.nansum(d["clip_high_per_1e4"].to_numpy(float))
                > 0)


def say_no_clips(ax: Axes) -> None:
    """The clipping panel's text when it has no bar: said, not an empty panel under a legend of clip colours."""
    ax.text(0.5, 0.5, NO_CLIPS, ha="center", va="center", transform=ax.transAxes, color="#555555")


def draw_clip_bars(ax: Axes, d: pd.DataFrame, *, offset: float = 0.0, width_frac: float = 0.8,
                   color_low: str = CLIP_COLORS["low"], color_high: str = CLIP_COLORS["high"],
                   hatch_low: str | None = None, edge: str | None = None) -> None:
    """Stacked bars per bin: low clip below, high clip on top (NaN rates, i.e. bins without loss tokens, are
    left empty; a table without a clipped token draws bars of height 0: ``has_clips`` tells)."""
    x = bin_centers(d) + offset
    w = width_frac * float(np.min(d["pos_hi"].to_numpy(float) - d["pos_lo"].to_numpy(float)))
    low = d["clip_low_per_1e4"].to_numpy(float)
    high = d["clip_high_per_1e4"].to_numpy(float)
    ax.bar(x, low, width=w, color=color_low, hatch=hatch_low, edgecolor=edge, linewidth=0.5 if edge else 0)
    ax.bar(x, high, width=w, bottom=np.nan_to_num(low), color=color_high, edgecolor=edge,
           linewidth=0.5 if edge else 0)


def plot_positions(bins_by_run: Mapping[str, pd.DataFrame] | pd.DataFrame, *, series: str = "all") -> Figure:
    """Two panels per run (rows = runs): mean entropy by relative-position bin (line), clipped tokens per 10^4
    loss tokens by bin (stacked bars: low, high). ``bins_by_run``: {label: positions bins table}, e.g. the paper's
    (a) on-policy without and (b) with mini-batching; a single table is drawn as one row."""
    runs = {"": bins_by_run} if isinstance(bins_by_run, pd.DataFrame) else dict(bins_by_run)
    if not runs:
        raise ValueError("plot_positions needs at least one positions table")
    n = len(runs)
    with figure_style():
        fig = Figure(figsize=(9.0, 3.0 * n + 0.4), layout="constrained")
        rows = fig.subfigures(n, 1, squeeze=False)[:, 0]
        first, clipped = None, False
        for sub, (label, bins) in zip(rows, runs.items()):
            d = _series(bins, series)
            ax_e, ax_c = sub.subplots(1, 2)
            x = bin_centers(d)
            ax_e.plot(x, d["entropy_mean"].to_numpy(float), marker="o", color=ENTROPY_COLOR, label="mean entropy")
            ax_e.set_ylabel(ENTROPY_YLABEL)
            draw_clip_bars(ax_c, d)
            if has_clips(d):
                clipped = True
            else:
                say_no_clips(ax_c)
            ax_c.set_ylabel(CLIP_YLABEL)
            ax_c.set_ylim(bottom=0)
            for ax in (ax_e, ax_c):
                format_position_axis(ax, d)
            ax_e.set_title("entropy", loc="left")
            ax_c.set_title("clipping", loc="left")
            if label:
                sub.suptitle(label, x=0.01, ha="left", fontweight="bold", fontsize=10.5)
            if first is None:
                first = ax_e
        handles = [first.lines[0]]
        if clipped:   # no clip colours for bars that are not drawn
            handles += [Patch(color=CLIP_COLORS["low"], label="low clip (Â<0, r<1−ε_low)"),
                        Patch(color=CLIP_COLORS["high"], label="high clip (Â>0, r>1+ε_high)")]
        fig.legend(handles=handles, loc="outside lower center", ncols=3)
    return fig
