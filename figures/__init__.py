"""Plotting functions for the paper's figures: DataFrames in (the tables ``tsanalysis`` caches), Figure out.

    from figures import load, plot_positions
    fig = plot_positions(load.positions_by_run("results/analysis"))

``python -m figures.make_all DIR`` regenerates every figure whose inputs exist under DIR (see ``make_all``).
"""

from .fig2_relay import plot_relay_passk
from .fig3_positions import plot_positions
from .fig4_seeded_positions import plot_mismatch, plot_seeded_positions
from .fig5_truncation import plot_truncation_tokens
from .lemma4 import plot_zero_adv
from .style import apply_style, figure_style

__all__ = ["plot_relay_passk", "plot_positions", "plot_seeded_positions", "plot_mismatch", "plot_truncation_tokens",
           "plot_zero_adv", "apply_style", "figure_style"]
