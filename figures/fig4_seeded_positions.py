"""Figure 4: the per-position analysis of Figure 3 for a seeded state+action run (paper §6.1), and the seed-token
mismatch along the seed (beyond the paper; Proposition 2).

Figure 4 input: the ``bins`` table of ``tsanalysis positions`` on a Thinking Seeds run (positions normalised by
the final length; series ``seed`` = tokens t < seed_len and ``seeded_continuation`` = the rest, over seeded
responses only, ``seeded`` = both; tables written before those series existed fall back to ``continuation`` and
``all``, which also hold the refresh steps' unseeded responses) and its
``takeover`` table (takeover point = seed_len / final length over seeded responses). Seed and continuation are
told apart by colour and marker; the takeover point is a vertical line at its mean with a ±1 s.d. band.
Clipping rates are per 10^4 loss tokens *of that series in that bin*; without a clipped token in either series the
clipping panel says "no clipped tokens" and the legend names no clip style.

Mismatch input: the ``relative`` table of ``tsanalysis mismatch`` (bins of relative position within the seed,
or within the response with ``--relative-to response``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .fig3_positions import (CLIP_YLABEL, ENTROPY_YLABEL, _series, bin_centers, draw_clip_bars, format_position_axis,
                             has_clips, say_no_clips)
from .style import SERIES_COLORS, SERIES_LABELS, SERIES_MARKERS, color_cycle, figure_style, new_figure

__all__ = ["plot_seeded_positions", "plot_mismatch", "MISMATCH_QUANTITIES"]

TAKEOVER_COLOR = "#333333"


def _light(color: str, alpha: float = 0.45):
    return to_rgba(color, alpha)


def plot_seeded_positions(bins: pd.DataFrame, takeover: pd.DataFrame | None = None, *,
                          title: str | None = None) -> Figure:
    """Left: mean entropy per bin for seed, continuation (and all, thin grey) tokens. Right: clipped tokens per
    10^4 loss tokens per bin, seed and continuation side by side, each bar stacked low clip (hatched) + high clip.
    Both panels mark the takeover point (mean seed_len / final length, ±1 s.d.) when ``takeover`` is given."""
    with figure_style():
        fig, axes = new_figure(1, 2, figsize=(10.0, 3.9))
        ax_e, ax_c = axes[0]
        seeded_only = bool((bins["series"] == "seeded_continuation").any())
        whole, cont = ("seeded", "seeded_continuation") if seeded_only else ("all", "continuation")
        d_all = _series(bins, whole)
        ax_e.plot(bin_centers(d_all), d_all["entropy_mean"].to_numpy(float), color=SERIES_COLORS[whole],
                  linewidth=1.0, linestyle=":", label=SERIES_LABELS[whole])
        w = float(np.min(d_all["pos_hi"].to_numpy(float) - d_all["pos_lo"].to_numpy(float)))
        clipped = False
        for series, off in (("seed", -0.2 * w), (cont, 0.2 * w)):
            d = _series(bins, series)
            clipped = clipped or has_clips(d)
            c = SERIES_COLORS[series]
            ax_e.plot(bin_centers(d), d["entropy_mean"].to_numpy(float), color=c, marker=SERIES_MARKERS[series],
                      label=SERIES_LABELS[series])
            draw_clip_bars(ax_c, d, offset=off, width_frac=0.38, color_low=_light(c), color_high=c,
                           hatch_low="////", edge="white")
        if not clipped:
            say_no_clips(ax_c)
        ax_e.set_ylabel(ENTROPY_YLABEL)
        ax_c.set_ylabel(CLIP_YLABEL)
        ax_c.set_ylim(bottom=0)
        ax_e.set_title("entropy", loc="left")
        ax_c.set_title("clipping (per 10⁴ loss tokens of each series)", loc="left")
        for ax in (ax_e, ax_c):
            format_position_axis(ax, d_all)
            ax.set_xlabel("relative position in the final response (t / L)")
        handles = list(ax_e.lines)
        if takeover is not None and len(takeover) and np.isfinite(float(takeover["takeover_mean"].iloc[0])):
            m = float(takeover["takeover_mean"].iloc[0])
            s = float(takeover["takeover_std"].iloc[0])
            for ax in (ax_e, ax_c):
                if np.isfinite(s) and s > 0:
                    ax.axvspan(m - s, m + s, color=TAKEOVER_COLOR, alpha=0.08, linewidth=0, zorder=0)
                ax.axvline(m, color=TAKEOVER_COLOR, linestyle="--", linewidth=1.2, zorder=1)
            handles.append(Line2D([], [], color=TAKEOVER_COLOR, linestyle="--",
                                  label=f"takeover point (mean {m:.2f} ± {s:.2f} s.d.)"))
        if clipped:   # no clip styles for bars that are not drawn
            handles += [Patch(facecolor="white", edgecolor="#666666", hatch="////", label="low clip (hatched)"),
                        Patch(facecolor="#666666", label="high clip (solid)")]
        fig.legend(handles=handles, loc="outside lower center", ncols=3)
        if title:
            fig.suptitle(title)
    return fig


MISMATCH_QUANTITIES = {
    "per token": (("log_ratio_mean", "log π_old/π_b"), ("abs_log_ratio_mean", "|log π_old/π_b|"),
                  ("kl_k3_mean", "KL k3 estimate")),
    "accumulated over the seed up to t": (("cum_log_ratio_mean", "Σ log π_old/π_b"),
                                          ("cum_abs_log_ratio_mean", "Σ |log π_old/π_b|"),
                                          ("cum_kl_k3_mean", "Σ KL k3 (prefix KL)")),
}


def plot_mismatch(relative: pd.DataFrame, *, relative_to: str = "seed") -> Figure:
    """Behavior/current mismatch on seed tokens by relative position: per-token means (left) and running sums
    (right), in nats. ``relative_to``: what positions were normalised by ('seed' length or final 'response')."""
    d = relative.sort_values("bin")
    with figure_style():
        fig, axes = new_figure(1, 2, figsize=(10.0, 3.8))
        for ax, (panel, quantities) in zip(axes[0], MISMATCH_QUANTITIES.items()):
            for i, (col, label) in enumerate(quantities):
                ax.plot(bin_centers(d), d[col].to_numpy(float), marker="os^"[i], color=color_cycle(i),
                        linestyle=("-", "--", ":")[i], label=label)
            ax.axhline(0.0, color="#333333", linewidth=0.8, linestyle="--", zorder=1)
            format_position_axis(ax, d)
            ax.set_xlabel("relative position in the seed (t / seed length)" if relative_to == "seed"
                          else "relative position in the response (t / L), seed tokens only")
            ax.set_ylabel("nats")
            ax.set_title(panel, loc="left")
            ax.legend(loc="best")
        fig.suptitle("Seed tokens: current policy (π_old) vs the policy that wrote the seed (π_b)")
    return fig
