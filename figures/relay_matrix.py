"""The relay matrix as a heat map (``tsanalysis relay --matrix RUN_DIR``): which earlier checkpoint's prefixes help
which later checkpoint, and by how much.

Input: the ``matrix`` table of ``tsanalysis relay --matrix`` (``tsanalysis.relay_matrix``; :func:`load_relay_matrix`
reads the newest such result folder): one row per writer, continuer and k with relay, alone, gain = relay − alone
(pass@k fractions), gain_low, gain_high (the paired bootstrap interval over problems, 95 %).

:func:`plot_relay_matrix` draws one k (default the largest): rows the writer (the checkpoint whose response is cut
into a prefix), columns the continuer (the later checkpoint that continues it), each cell coloured and annotated with
the gain in percentage points (a diverging map centred at 0), a ``*`` where the interval excludes 0; the cells with
writer ≥ continuer are empty (no pair). Drawn with seaborn's ``heatmap`` in the house style (``figures.style``). The
cell (first writer, last continuer) is Figure 2 at that k. Not part of ``figures.make_all`` (the paper's Figures
2–5): the notebook ``notebooks/relay_matrix.ipynb`` draws it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from .style import figure_style, new_figure

__all__ = ["MATRIX_TABLE", "find_relay_matrix", "load_relay_matrix", "matrix_at", "plot_relay_matrix"]

MATRIX_TABLE = "matrix"
HOW_TO = "tsanalysis relay --matrix RUN_DIR --benchmarks NAME"


def find_relay_matrix(root: str | os.PathLike) -> list[Path]:
    """Every complete relay-matrix result folder under ``root`` (``figures.load.find_results``)."""
    from .load import find_results

    return [f.path for f in find_results(root) if f.command == "relay" and MATRIX_TABLE in f.tables]


def load_relay_matrix(path: str | os.PathLike) -> pd.DataFrame:
    """The ``matrix`` table of the newest relay-matrix result folder under ``path`` (the folder itself or any tree
    above it); prints which folder it read. MissingResults saying how to write one."""
    from . import load

    root = load.resolve_dir(path)
    found = find_relay_matrix(root) if root.is_dir() else []
    if not found:
        raise load.MissingResults(f"no relay matrix (tsanalysis relay --matrix) under '{path}'; write one there with: "
                                  f"{HOW_TO} --out {path}/analysis/relay-matrix, or point {load.RESULTS_ENV} at the "
                                  f"folder holding it (its default --out is results/analysis/<run>/relay-matrix/)")
    folder = max(found, key=lambda p: (p / "settings.json").stat().st_mtime)
    print(f"relay matrix from {folder}")
    return load.read_table(folder, MATRIX_TABLE)


def matrix_at(matrix: pd.DataFrame, k: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """(gain in points, interval excludes 0, k): two writer × continuer frames at ``k`` (default the largest k of
    the table), rows and columns every step of the table in ascending order, NaN / False where there is no pair.
    ValueError for a k the table does not have."""
    ks = sorted(int(x) for x in matrix["k"].unique())
    k = ks[-1] if k is None else int(k)
    if k not in ks:
        raise ValueError(f"k={k} is not in the relay matrix (its k: {', '.join(map(str, ks))})")
    d = matrix[matrix["k"] == k]
    writers, continuers = sorted(set(d["writer"])), sorted(set(d["continuer"]))
    gain = d.pivot(index="writer", columns="continuer", values="gain").reindex(index=writers, columns=continuers)
    excl = (d["gain_low"] > 0) | (d["gain_high"] < 0)
    sig = d.assign(sig=excl).pivot(index="writer", columns="continuer", values="sig")
    sig = sig.reindex(index=writers, columns=continuers).fillna(False).astype(bool)
    return 100 * gain, sig, k


def plot_relay_matrix(matrix: pd.DataFrame, *, k: int | None = None, title: str | None = None) -> Figure:
    """The heat map of the gains at ``k`` (see the module docstring); returns the Figure."""
    import seaborn as sns

    gain, sig, k = matrix_at(matrix, k)
    labels = gain.map(lambda v: "" if np.isnan(v) else f"{v:+.1f}").astype(str)
    labels = labels.where(~sig, labels + "*")
    lim = float(np.nanmax(np.abs(gain.to_numpy()))) if np.isfinite(gain.to_numpy()).any() else 0.0
    lim = max(lim, 1e-9)   # a matrix of zeros (the cut-0 control) still has a colour scale
    w, h = len(gain.columns), len(gain.index)
    with figure_style():
        fig, axes = new_figure(figsize=(max(5.6, 1.0 * w + 3.0), max(3.4, 0.7 * h + 2.0)))
        ax = axes[0, 0]
        sns.heatmap(gain, ax=ax, mask=gain.isna(), annot=labels.to_numpy(), fmt="", cmap="RdBu", center=0.0,
                    vmin=-lim, vmax=lim, linewidths=0.5, linecolor="white", square=False,
                    cbar_kws={"label": f"pass@{k} gain (points)"})
        ax.grid(False)
        ax.set_xticklabels([f"step {c}" for c in gain.columns], rotation=0)
        ax.set_yticklabels([f"step {r}" for r in gain.index], rotation=0)
        ax.set_xlabel("continuer (later checkpoint)")
        ax.set_ylabel("writer (earlier checkpoint, prefix)")
        ax.set_title(title or f"Relay matrix: pass@{k} of relay − the continuer alone\n"
                              f"(* 95 % paired bootstrap interval excludes 0)", loc="left")
    return fig
