"""One look for every figure: font sizes, colours per series / method / category, markers, and Figure creation.

Plotting functions build their Figure inside :func:`figure_style` (an ``rc_context``, so the caller's global
matplotlib settings are untouched) with :func:`new_figure`, which creates a plain ``matplotlib.figure.Figure``
(not registered with pyplot: no backend is needed, nothing is shown twice in a notebook, nothing leaks when a
script draws many figures). ``apply_style()`` sets the same rcParams globally, for interactive use.
``use_headless_backend()`` selects Agg when no display is available (``figures.make_all`` calls it).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

__all__ = ["RC", "COLORS", "SERIES_COLORS", "SERIES_MARKERS", "CLIP_COLORS", "KIND_COLORS", "CATEGORY_COLORS",
           "RULE_COLORS", "METHOD_COLORS", "PALETTE", "DPI", "apply_style", "figure_style", "new_figure",
           "color_cycle", "use_headless_backend", "mathtext_safe"]

DPI = 150   # PNG resolution used by make_all

RC = {
    "font.size": 10,
    "axes.titlesize": 10.5,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "figure.titlesize": 12,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.6,
    "lines.linewidth": 1.8,
    "lines.markersize": 5,
    "savefig.dpi": DPI,
    "figure.dpi": 100,
    "axes.axisbelow": True,
}

# qualitative palette (colour-blind safe: Okabe & Ito)
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]

# token series along the sequence (Figures 3 and 4)
SERIES_COLORS = {"all": "#555555", "seed": "#D55E00", "continuation": "#0072B2",
                 "seeded": "#555555", "seeded_continuation": "#0072B2"}
SERIES_MARKERS = {"all": "", "seed": "s", "continuation": "o", "seeded": "", "seeded_continuation": "o"}
SERIES_LABELS = {"all": "all tokens", "seed": "seed tokens", "continuation": "continuation tokens",
                 "seeded": "all tokens of seeded responses", "seeded_continuation": "continuation tokens"}
# which side of the clip was active
CLIP_COLORS = {"low": "#56B4E9", "high": "#CC79A7"}
ENTROPY_COLOR = "#009E73"
# group kinds (Lemma 4, observed runs)
KIND_COLORS = {"on_policy": "#0072B2", "seeded": "#D55E00"}
# truncation-token categories (Figure 5); keys = tsanalysis.core.truncation.CATEGORIES
CATEGORY_COLORS = {"discourse": "#0072B2", "digit": "#E69F00", "operator": "#D55E00", "latex": "#CC79A7",
                   "whitespace": "#BBBBBB", "other": "#777777"}
RULE_COLORS = {"entropy": "#009E73", "ratio": "#E69F00"}
# training methods (one colour per config `algorithm`)
METHOD_COLORS = {"dapo": "#0072B2", "seeds": "#D55E00", "luffy": "#009E73", "m2po": "#CC79A7"}

COLORS = {**SERIES_COLORS, "entropy": ENTROPY_COLOR, "clip_low": CLIP_COLORS["low"],
          "clip_high": CLIP_COLORS["high"], "zero": "#333333"}


def apply_style() -> None:
    """Set the figures' rcParams globally (interactive sessions); plotting functions do not need it."""
    matplotlib.rcParams.update(RC)


@contextmanager
def figure_style() -> Iterator[None]:
    """The figures' rcParams for the duration of a block (the caller's settings are restored afterwards)."""
    with matplotlib.rc_context(RC):
        yield


def new_figure(nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float], squeeze: bool = False,
               **subplot_kw) -> tuple[Figure, object]:
    """A constrained-layout Figure (not managed by pyplot) and its axes grid ([nrows, ncols] unless squeeze)."""
    fig = Figure(figsize=figsize, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=squeeze, **subplot_kw)
    return fig, axes


def color_cycle(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def use_headless_backend() -> None:
    """Use Agg unless a display (or a notebook backend) is available; call before pyplot is imported."""
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or os.environ.get("MPLBACKEND"):
        return
    matplotlib.use("Agg")


def mathtext_safe(text: str) -> str:
    """Escape '$' so matplotlib does not parse token texts such as '$' or '$$' as mathtext."""
    return text.replace("$", r"\$")


def log2_k_axis(ax, ks) -> None:
    """A pass@k x axis: log base 2, a tick at each k given (1, 2, 4, ...), labelled as integers."""
    ax.set_xscale("log", base=2)
    ticks = sorted({int(k) for k in ks})
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([str(t) for t in ticks])
    ax.set_xlabel("k (samples per problem)")
