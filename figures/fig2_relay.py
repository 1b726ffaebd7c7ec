"""Figure 2: pass@k of relay inference minus final-only inference, against k (paper §3.1).

Input: the ``relay_passk`` table of ``tsanalysis relay`` (columns k, diff, diff_low, diff_high, …; pass@k as a
fraction), one per benchmark. Plotted in percentage points: y = 100 · diff, the band = 100 · [diff_low,
diff_high] (paired percentile bootstrap over problems, 95 %).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, NullLocator

from .style import COLORS, color_cycle, figure_style, new_figure

__all__ = ["plot_relay_passk"]


def plot_relay_passk(passk: pd.DataFrame | Mapping[str, pd.DataFrame], *, title: str | None = None) -> Figure:
    """One line per benchmark: 100·(pass@k relay − pass@k final-only) vs k (log2 axis), shaded bootstrap interval,
    zero line. ``passk``: a relay_passk table or {benchmark: table}."""
    tables = {"relay − final": passk} if isinstance(passk, pd.DataFrame) else dict(passk)
    if not tables:
        raise ValueError("plot_relay_passk needs at least one relay_passk table")
    with figure_style():
        fig, axes = new_figure(figsize=(6.4, 4.0))
        ax = axes[0, 0]
        ks: set[int] = set()
        for i, (name, df) in enumerate(tables.items()):
            df = df.sort_values("k")
            k = df["k"].to_numpy(dtype=float)
            c = color_cycle(i)
            ax.fill_between(k, 100 * df["diff_low"].to_numpy(float), 100 * df["diff_high"].to_numpy(float),
                            color=c, alpha=0.18, linewidth=0)
            ax.plot(k, 100 * df["diff"].to_numpy(float), marker="o", color=c, label=name)
            ks.update(int(x) for x in k)
        ax.axhline(0.0, color=COLORS["zero"], linewidth=0.9, linestyle="--", zorder=1)
        ax.set_xscale("log", base=2)
        ticks = sorted(ks)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xlabel("k (samples per problem)")
        ax.set_ylabel("pass@k: relay − final only\n(percentage points)")
        ax.set_title(title or "Relay inference (early checkpoint's prefix, final continues)\nvs the final checkpoint alone",
                     loc="left")
        lo = min(np.nanmin(100 * d["diff_low"].to_numpy(float)) for d in tables.values())
        hi = max(np.nanmax(100 * d["diff_high"].to_numpy(float)) for d in tables.values())
        if np.isfinite(lo) and np.isfinite(hi):   # keep the zero line inside the view
            pad = 0.08 * max(hi - lo, 1e-9)
            ax.set_ylim(min(lo, 0.0) - pad, max(hi, 0.0) + pad)
        fig.legend(loc="outside lower center", ncols=min(len(tables), 5), title="benchmark (shaded: 95 % bootstrap interval)",
                   title_fontsize=9)
    return fig
