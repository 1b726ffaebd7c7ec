"""Figure 5: tokens at the truncation points, entropy rule vs length-ratio rule (paper §6.2).

Input: the ``tokens`` table (rule, rank, label, count, share, category, rule_total; share = count / all cuts of
that rule) and the ``categories`` table (rule, category, share) of ``tsanalysis truncation``. One panel of
horizontal bars per rule (top tokens, share of that rule's cuts in %, coloured by category), and a panel of
stacked bars with each rule's category shares (the same colours).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .style import CATEGORY_COLORS, figure_style, mathtext_safe, new_figure

__all__ = ["plot_truncation_tokens", "RULE_ORDER"]

RULE_ORDER = ("entropy", "ratio")
RULE_TITLES = {"entropy": "entropy rule", "ratio": "length-ratio rule"}


def _rules(tokens: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(tokens["rule"]))
    return [r for r in RULE_ORDER if r in present] + sorted(r for r in present if r not in RULE_ORDER)


def plot_truncation_tokens(tokens: pd.DataFrame, categories: pd.DataFrame, top: int = 15) -> Figure:
    """Top-``top`` cut tokens per rule (rank 1 at the top) and category shares per rule."""
    rules = _rules(tokens)
    if not rules:
        raise ValueError("the truncation tokens table is empty")
    cats = list(CATEGORY_COLORS)
    cats += sorted(set(categories["category"]) - set(cats))
    n = min(top, int(tokens.groupby("rule").size().max()))
    with figure_style():
        fig, axes = new_figure(1, len(rules) + 1, figsize=(3.4 * len(rules) + 3.6, 0.27 * n + 1.9),
                               width_ratios=[1.0] * len(rules) + [1.05])
        for ax, rule in zip(axes[0], rules):
            d = tokens[tokens["rule"] == rule].sort_values("rank").head(top)
            y = np.arange(len(d))
            ax.barh(y, 100 * d["share"].to_numpy(float),
                    color=[CATEGORY_COLORS.get(c, "#999999") for c in d["category"]])
            ax.set_yticks(y)
            ax.set_yticklabels([mathtext_safe(str(s)) for s in d["label"]], fontfamily="DejaVu Sans Mono")
            ax.set_ylim(n - 0.5, -0.5)   # rank 1 on top; same row height in every panel
            ax.set_xlabel("share of the rule's cuts (%)")
            total = int(d["rule_total"].iloc[0]) if len(d) else 0
            ax.set_title(f"{RULE_TITLES.get(rule, rule)}\n(top {len(d)} of {total:,} cuts)", loc="left")
            ax.grid(axis="y", visible=False)
        ax = axes[0, -1]
        y = np.arange(len(rules))
        left = np.zeros(len(rules))
        for cat in cats:
            share = np.array([_share(categories, r, cat) for r in rules])
            ax.barh(y, 100 * share, left=100 * left, color=CATEGORY_COLORS.get(cat, "#999999"), label=cat,
                    edgecolor="white", linewidth=0.6)
            for yi, (lf, sh) in enumerate(zip(left, share)):
                if sh >= 0.08:   # label segments wide enough to hold the number
                    ax.text(100 * (lf + sh / 2), yi, f"{100 * sh:.0f}%", ha="center", va="center", fontsize=8.5,
                            color="white" if cat != "whitespace" else "black")
            left += share
        ax.set_yticks(y)
        ax.set_yticklabels([RULE_TITLES.get(r, r) for r in rules])
        ax.set_ylim(len(rules) - 0.5, -0.5)
        ax.set_xlim(0, 100)
        ax.set_xlabel("share of all cuts (%)")
        ax.set_title("token categories", loc="left")
        ax.grid(axis="y", visible=False)
        handles = [Patch(color=CATEGORY_COLORS.get(c, "#999999"), label=c) for c in cats]
        fig.legend(handles=handles, loc="outside lower center", ncols=len(cats), title="token category",
                   title_fontsize=9)
    return fig


def _share(categories: pd.DataFrame, rule: str, cat: str) -> float:
    v = categories.loc[(categories["rule"] == rule) & (categories["category"] == cat), "share"]
    return float(v.iloc[0]) if len(v) else 0.0
