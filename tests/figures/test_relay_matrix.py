"""figures/relay_matrix.py: the relay matrix heat map draws the table's gains (points), a ``*`` exactly where the
paired interval excludes 0, nothing where writer >= continuer; the loader finds the newest matrix folder; the notebook
draws it from the tables."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from figures.output import save_png
from figures.relay_matrix import load_relay_matrix, matrix_at, plot_relay_matrix
from tests.helpers.runs import PNG_MAGIC
from tsanalysis import io
from tsanalysis.relay_matrix import gain_table


def _matrix() -> pd.DataFrame:
    """Steps 0 < 10 < 20, 40 problems, n = 4: relay from step 0 into step 20 loses everything it had (a clear
    negative gain), the other cells are noise around 0."""
    rng = np.random.default_rng(0)
    rows = []
    for w, c in ((0, 10), (0, 20), (10, 20)):
        for p in range(40):
            alone = int(rng.integers(0, 5))
            relay = 0 if (w, c) == (0, 20) else int(np.clip(alone + rng.integers(-1, 2), 0, 4))
            rows.append({"writer": w, "continuer": c, "problem_id": str(p), "n": 4, "relay_correct": relay,
                         "alone_correct": alone if (w, c) != (0, 20) else 4})
    return gain_table(pd.DataFrame(rows))


def test_the_heat_map_shows_the_gains_and_marks_the_intervals(tmp_path):
    m = _matrix()
    gain, sig, k = matrix_at(m)
    assert k == 4 and list(gain.index) == [0, 10] and list(gain.columns) == [10, 20]
    assert np.isnan(gain.loc[10, 10]) and not sig.loc[10, 10]                  # no pair: writer >= continuer
    at4 = m[m["k"] == 4].set_index(["writer", "continuer"])
    assert gain.loc[0, 20] == pytest.approx(100 * at4.loc[(0, 20), "gain"]) == pytest.approx(-100.0)
    fig = plot_relay_matrix(m)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    want = []
    for w in (0, 10):
        for c in (10, 20):
            if w < c:
                r = at4.loc[(w, c)]
                star = "*" if r["gain_low"] > 0 or r["gain_high"] < 0 else ""
                want.append(f"{100 * r['gain']:+.1f}{star}")
    assert texts == want and "-100.0*" in texts
    assert [t.get_text() for t in ax.get_xticklabels()] == ["step 10", "step 20"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["step 0", "step 10"]
    assert "writer" in ax.get_ylabel() and "continuer" in ax.get_xlabel() and "pass@4" in ax.get_title(loc="left")
    cells = ax.collections[0].get_array()   # the masked cell (10, 10) is not drawn
    assert np.ma.count_masked(cells) == 1 and cells.compressed().tolist() == pytest.approx(
        [100 * at4.loc[p, "gain"] for p in ((0, 10), (0, 20), (10, 20))])
    # another k; a k the table does not have
    assert "pass@1" in plot_relay_matrix(m, k=1).axes[0].get_title(loc="left")
    with pytest.raises(ValueError, match=r"k=3 is not in the relay matrix \(its k: 1, 2, 4\)"):
        matrix_at(m, k=3)
    path = save_png(fig, tmp_path / "relay_matrix.png", dpi=50)
    assert path.read_bytes()[:8] == PNG_MAGIC


def _write(folder, matrix, *, run="r"):
    io.write_results(folder, {"matrix": matrix, "matrix_problems": pd.DataFrame({"x": [1]})},
                     {"command": "relay", "args": {"matrix": run}, "run_dir": run})


def test_the_loader_reads_the_newest_matrix_folder(tmp_path, capsys):
    from figures.load import MissingResults

    with pytest.raises(MissingResults, match="tsanalysis relay --matrix RUN_DIR"):
        load_relay_matrix(tmp_path)
    m = _matrix()
    _write(tmp_path / "a" / "old", m.assign(gain=0.0))
    _write(tmp_path / "a" / "new", m)
    newer = (tmp_path / "a" / "new" / "settings.json")
    old = (tmp_path / "a" / "old" / "settings.json").stat().st_mtime
    os.utime(newer, (old + 10, old + 10))
    got = load_relay_matrix(tmp_path)
    pd.testing.assert_frame_equal(got, m)
    assert f"relay matrix from {tmp_path / 'a' / 'new'}" in capsys.readouterr().out
    assert json.loads(newer.read_text())["tables"] == ["matrix", "matrix_problems"]


@pytest.mark.slow   # executes the notebook in a kernel
def test_the_notebook_draws_the_figure_from_the_tables(tmp_path, capsys, monkeypatch):
    import nbformat

    from figures.load import REPO
    from figures.notebook import main as notebook_main

    out = tmp_path / "results" / "analysis" / "run" / "relay-matrix" / "addition-cut0.5"
    _write(out, _matrix())
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    capsys.readouterr()
    assert notebook_main(["relay_matrix", str(tmp_path / "results"), "--out", str(tmp_path / "nb")]) == 0
    assert (tmp_path / "nb" / "relay_matrix.png").read_bytes()[:8] == PNG_MAGIC
    nb = nbformat.read(tmp_path / "nb" / "relay_matrix.ipynb", as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert str(out) in "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
