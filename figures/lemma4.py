"""Lemma 4: zero-advantage and all-wrong groups under i.i.d. binary rewards, and what runs show.

Left panel: D(p) = p^G + (1−p)^G (solid) and (1−p)^G = 1 − pass@G (dashed) against the success probability p,
one colour per G, from the ``lemma4`` table of ``tsanalysis zero-adv --p … --G …`` (several G values may be
concatenated: the table has a G column); Monte Carlo points (``zero_adv_sim`` ± ``zero_adv_se``) when the table
holds them (at most ~20 per G are drawn so the curve stays visible).

Right panel (when ``by_step`` is given, the ``by_step`` table of ``tsanalysis zero-adv RUN_DIR``): the observed
fraction of zero-advantage groups per step (± binomial s.e.) and the fraction Lemma 4 predicts from each prompt's
other groups (leave-group-out unbiased estimator, ``zero_adv_pred``), per group kind (on-policy vs seeded).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from .style import KIND_COLORS, color_cycle, figure_style, new_figure

__all__ = ["plot_zero_adv", "KIND_LABELS"]

KIND_LABELS = {"on_policy": "on-policy groups", "seeded": "seeded groups"}
MAX_SIM_POINTS = 21


def _thin(d: pd.DataFrame, n: int = MAX_SIM_POINTS) -> pd.DataFrame:
    step = int(np.ceil(len(d) / n)) if len(d) > n else 1
    return d.iloc[::step]


def plot_zero_adv(lemma4: pd.DataFrame, by_step: pd.DataFrame | None = None) -> Figure:
    """D(p) and (1−p)^G vs p for each G in ``lemma4`` (with simulated points if present); optionally observed vs
    predicted zero-advantage fraction per step and group kind from a run's ``by_step`` table."""
    two = by_step is not None and len(by_step) > 0
    with figure_style():
        fig, axes = new_figure(1, 2 if two else 1, figsize=(10.5 if two else 5.6, 4.0))
        ax = axes[0, 0]
        Gs = sorted(int(g) for g in lemma4["G"].unique())
        for i, G in enumerate(Gs):
            d = lemma4[lemma4["G"] == G].sort_values("p")
            c = color_cycle(i)
            mk = "o" if len(d) < 12 else ""
            p = d["p"].to_numpy(float)
            ax.plot(p, d["zero_adv"].to_numpy(float), color=c, marker=mk, label=f"G = {G}")
            ax.plot(p, d["all_wrong"].to_numpy(float), color=c, marker=mk, linestyle="--", linewidth=1.3)
            if "zero_adv_sim" in d.columns and d["zero_adv_sim"].notna().any():
                s = _thin(d[d["zero_adv_sim"].notna()])
                ax.errorbar(s["p"].to_numpy(float), s["zero_adv_sim"].to_numpy(float),
                            yerr=s["zero_adv_se"].to_numpy(float) if "zero_adv_se" in s else None, fmt="o",
                            markersize=3.5, color=c, markerfacecolor="white", capsize=0, linewidth=0.8)
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("success probability p of one response")
        ax.set_ylabel("probability per group of G")
        ax.set_title("Lemma 4 (i.i.d. binary rewards)", loc="left")
        style = [Line2D([], [], color="#444444", label="zero advantage D(p) = pᴳ + (1−p)ᴳ"),
                 Line2D([], [], color="#444444", linestyle="--", label="all wrong (1−p)ᴳ = 1 − pass@G")]
        if "zero_adv_sim" in lemma4.columns and lemma4["zero_adv_sim"].notna().any():
            style.append(Line2D([], [], color="#444444", marker="o", markerfacecolor="white", linestyle="",
                                label="simulated D (± s.e.)"))
        g_handles = [h for h in ax.lines if not h.get_label().startswith("_")]
        # legends below the panel: they never cover the curves
        ax.legend(handles=g_handles + style, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2,
                  fontsize=8.5)
        if two:
            ax = axes[0, 1]
            kinds = [k for k in ("on_policy", "seeded") if k in set(by_step["kind"])]
            kinds += sorted(set(by_step["kind"]) - set(kinds))
            for i, kind in enumerate(kinds):
                d = by_step[by_step["kind"] == kind].sort_values("step")
                c = KIND_COLORS.get(kind, color_cycle(i + 3))
                x = d["step"].to_numpy(float)
                obs = d["zero_adv_obs"].to_numpy(float)
                se = d["zero_adv_obs_se"].to_numpy(float)
                ax.fill_between(x, obs - se, obs + se, color=c, alpha=0.15, linewidth=0)
                ax.plot(x, obs, color=c, marker="o", label=f"{KIND_LABELS.get(kind, kind)}: observed")
                ax.plot(x, d["zero_adv_pred"].to_numpy(float), color=c, marker="x", linestyle="--",
                        label=f"{KIND_LABELS.get(kind, kind)}: Lemma 4 prediction")
            ax.set_ylim(-0.02, 1.02)
            ax.set_xlabel("training step")
            ax.set_ylabel("zero-advantage groups (fraction)")
            ax.set_title("observed vs predicted from the prompt's other groups", loc="left")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(handles=list(ax.lines), loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2,
                      fontsize=8.5)
    return fig
