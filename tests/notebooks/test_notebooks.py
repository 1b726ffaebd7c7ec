"""notebooks/: every notebook runs headless against a synthetic results folder and shows its figure (tests/e2e/test_demo.py
runs them again against the quick demo's output).

The results folder is what ``python -m figures.make_all`` writes for the synthetic runs of tests/helpers/runs.py
(plus relay tables); THINKING_SEEDS_RESULTS points the notebooks' parameters cell at it.
"""

from __future__ import annotations

import base64
from pathlib import Path

import nbformat
import pytest

from figures.make_all import make_all
from tests.helpers.runs import PNG_MAGIC, synthetic_relay, synthetic_runs

pytestmark = pytest.mark.slow   # every test here executes a notebook in a kernel

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
EXPECTED = ["fig2_relay", "fig3_entropy_clip_positions", "fig4_seeded_positions", "fig5_truncation_tokens",
            "lemma4_zero_advantage"]
# notebooks over other cached tables, each executed and checked by its own test
OTHER = {"premise": "tests/demo/test_premise.py", "support": "tests/tsanalysis/test_support.py"}


def test_the_notebooks_are_there_and_committed_without_outputs():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(EXPECTED + list(OTHER))
    for name in OTHER:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        assert all(not c.outputs and c.execution_count is None for c in nb.cells if c.cell_type == "code"), name
    for name in EXPECTED:
        nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        nbformat.validate(nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), f"{name} has outputs committed"
        first = code[0]
        assert "parameters" in first.metadata.get("tags", []) and "THINKING_SEEDS_RESULTS" in first.source
        assert 'RESULTS_DIR = os.environ.get("THINKING_SEEDS_RESULTS", "runs/demo-quick")' in first.source
        # notebooks only load and plot: every code line is a parameter, an import, a load call, a plot call or fig
        body = "\n".join(c.source for c in code[1:])
        assert "load." in body and "plot_" in body and "for " not in body and "def " not in body


@pytest.fixture(scope="module")
def results_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nbresults") / "demo"
    synthetic_runs(root)
    synthetic_relay(root)
    report = make_all(root, log=lambda m: None)
    assert len(report["written"]) == 6, report
    return root


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_executes_and_shows_a_figure(name, results_dir, monkeypatch):
    from nbclient import NotebookClient

    monkeypatch.setenv("THINKING_SEEDS_RESULTS", str(results_dir))
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()   # raises CellExecutionError
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if o.output_type in ("display_data", "execute_result") and "image/png" in o.data]
    assert len(images) == 1, f"{name}: expected one figure, got {len(images)}"
    png = base64.b64decode(images[0].data["image/png"])
    assert png[:8] == PNG_MAGIC and len(png) > 5000
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    if name != "lemma4_zero_advantage" or "run '" in printed:
        assert str(results_dir) in printed   # the loaders said which result folders they used
