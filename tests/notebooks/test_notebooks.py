"""notebooks/: every notebook reads one folder, THINKING_SEEDS_RESULTS (default runs/demo), and runs headless the
documented way (notebooks/README.md: ``python -m figures.notebook NAME [RESULTS_DIR]``) against the folder
``python -m figures.make_all`` says it wrote the tables to, in both layouts the docs give: the DIR it was given
(tables in DIR/analysis/, as the demo writes them) and the recipes' ``--results results/analysis``, given as a
relative THINKING_SEEDS_RESULTS (tests/e2e/test_demo.py runs them again against the quick demo's output).

The synthetic runs are those of tests/helpers/runs.py (plus relay tables where ``tsanalysis relay`` puts them).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import nbformat
import pytest

from figures import load
from figures.make_all import build_parser as make_all_parser
from figures.make_all import main as make_all_main
from figures.notebook import build_parser as notebook_parser
from figures.notebook import main as notebook_main
from tests.helpers.runs import PNG_MAGIC, synthetic_relay, synthetic_runs
from tsanalysis.cli import build_parser as tsanalysis_parser

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
EXPECTED = ["fig2_relay", "fig3_entropy_clip_positions", "fig4_seeded_positions", "fig5_truncation_tokens",
            "lemma4_zero_advantage"]
# notebooks over other cached tables, each executed and checked by its own test (with the old variable they read)
OTHER = {"premise": ("tests/demo/test_premise.py", "THINKING_SEEDS_PREMISE"),
         "support": ("tests/tsanalysis/test_support.py", "THINKING_SEEDS_SUPPORT"),
         "scaling": ("tests/tsanalysis/test_scaling.py", None),
         "relay_matrix": ("tests/figures/test_relay_matrix.py", None)}


def _code(name: str) -> list:
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    return [c for c in nb.cells if c.cell_type == "code"]


def test_the_notebooks_are_there_and_committed_without_outputs_and_read_one_variable():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == sorted(EXPECTED + list(OTHER))
    for name in EXPECTED + list(OTHER):
        code = _code(name)
        assert all(not c.outputs and c.execution_count is None for c in code), f"{name} has outputs committed"
        first = code[0]
        assert "parameters" in first.metadata.get("tags", []) and "THINKING_SEEDS_RESULTS" in first.source
        assert "default runs/demo" in first.source and "notebooks/README.md" in first.source
        # one variable: the folder comes from figures.load.results_dir (THINKING_SEEDS_RESULTS), nothing else reads
        # the environment
        assert "os.environ" not in "\n".join(c.source for c in code), name
        legacy = OTHER[name][1] if name in OTHER else None
        call = f'results_dir(legacy="{legacy}")' if legacy else "results_dir()"
        assert f"RESULTS_DIR = {call}" in first.source, name
    for name in EXPECTED:
        # notebooks only load and plot: every code line is a parameter, an import, a load call, a plot call or fig
        body = "\n".join(c.source for c in _code(name)[1:])
        assert "load." in body and "plot_" in body and "for " not in body and "def " not in body


def test_one_variable_and_the_old_ones_still_read_with_a_note(monkeypatch, capsys):
    for name in ("THINKING_SEEDS_RESULTS", "THINKING_SEEDS_PREMISE", "THINKING_SEEDS_SUPPORT_BENCHMARK"):
        monkeypatch.delenv(name, raising=False)
    assert load.results_dir() == load.results_dir(legacy="THINKING_SEEDS_PREMISE") == "runs/demo"
    assert load.deprecated_env("THINKING_SEEDS_SUPPORT_BENCHMARK", instead="set BENCHMARK") is None
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("THINKING_SEEDS_PREMISE", "old/place")
    assert load.results_dir(legacy="THINKING_SEEDS_PREMISE") == "old/place"
    assert capsys.readouterr().err == ("note: THINKING_SEEDS_PREMISE is deprecated and will not be read in a later "
                                       "version; set THINKING_SEEDS_RESULTS instead (read this time)\n")
    monkeypatch.setenv("THINKING_SEEDS_RESULTS", "new/place")   # the one variable wins
    assert load.results_dir(legacy="THINKING_SEEDS_PREMISE") == "new/place" == load.results_dir()
    assert capsys.readouterr().err == ("note: THINKING_SEEDS_PREMISE is deprecated and not read: "
                                       "THINKING_SEEDS_RESULTS=new/place is\n")


def _commands(text: str) -> list[str]:
    return [m for m in re.findall(r"`([^`]+)`", text)
            if m.startswith(("tsanalysis ", "python -m figures.make_all ", "python -m figures.notebook "))]


def test_every_command_a_notebook_or_a_figure_loader_suggests_parses():
    """The commands the notebooks' text and the loaders' errors suggest are accepted by the real parsers (the Lemma 4
    notebook suggested `tsanalysis zero-adv --p ...`, which tsanalysis rejects)."""
    suggested = []
    for p in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(p, as_version=4)
        suggested += _commands("\n".join(c.source for c in nb.cells if c.cell_type == "markdown"))
    suggested += [how.split("  (")[0] for how in load.HOW_TO.values()]
    assert any(c.startswith("tsanalysis zero-adv --p 0,") for c in suggested)
    parsers = {"tsanalysis": tsanalysis_parser, "python -m figures.make_all": make_all_parser,
               "python -m figures.notebook": notebook_parser}
    for command in suggested:
        prog = next(k for k in parsers if command.startswith(k + " "))
        argv = shlex.split(command[len(prog):])
        try:
            parsers[prog]().parse_args(argv)
        except SystemExit as e:
            pytest.fail(f"{command!r} is rejected by {prog} (exit {e.code})")


# ---- executed the documented way -------------------------------------------------------------------------------
def _runs(root: Path) -> Path:
    synthetic_runs(root)
    return root


@pytest.fixture(scope="module")
def demo_layout(tmp_path_factory) -> Path:
    """`python -m figures.make_all DIR`: tables in DIR/analysis/, the notebooks pointed at DIR (the demo's layout)."""
    root = _runs(tmp_path_factory.mktemp("nbdemo") / "demo")
    synthetic_relay(root)
    assert make_all_main([str(root), "--dpi", "20"]) == 0
    return root


@pytest.fixture(scope="module")
def recipe_layout(tmp_path_factory) -> Path:
    """docs/recipes.md: tsanalysis relay wrote results/analysis/<run>/relay/<tag>/, then `python -m figures.make_all
    runs --results results/analysis --out results/figures` from the same working directory."""
    cwd = tmp_path_factory.mktemp("nbrecipe")
    _runs(cwd / "runs")
    synthetic_relay(cwd / "results" / "analysis")
    mp = pytest.MonkeyPatch()
    mp.chdir(cwd)
    try:
        assert make_all_main(["runs", "--results", "results/analysis", "--out", "results/figures", "--dpi", "20"]) == 0
    finally:
        mp.undo()
    assert not (cwd / "runs" / "analysis").exists()   # every table went to the one place given
    return cwd


def _check_run(name: str, out: Path, results: Path, captured: str):
    copy, png = out / f"{name}.ipynb", out / f"{name}.png"
    assert f"wrote {copy}" in captured and f"wrote {png}" in captured
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000
    nb = nbformat.read(copy, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if o.output_type in ("display_data", "execute_result") and "image/png" in o.data]
    assert len(images) == 1, f"{name}: expected one figure, got {len(images)}"
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    if name != "lemma4_zero_advantage" or "run '" in printed:
        assert str(results.resolve()) in printed   # the loaders said which result folders they used


@pytest.mark.slow   # executes a notebook in a kernel
@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_runs_on_the_folder_make_all_was_given(name, demo_layout, capsys, monkeypatch):
    monkeypatch.delenv("THINKING_SEEDS_RESULTS", raising=False)
    before = (NOTEBOOKS / f"{name}.ipynb").read_bytes()
    capsys.readouterr()
    assert notebook_main([name, str(demo_layout)]) == 0
    _check_run(name, demo_layout / "notebooks", demo_layout, capsys.readouterr().out)
    assert (NOTEBOOKS / f"{name}.ipynb").read_bytes() == before   # the committed notebook is not modified


@pytest.mark.slow   # executes a notebook in a kernel
@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_runs_on_the_recipes_results_folder(name, recipe_layout, tmp_path, capsys, monkeypatch):
    """THINKING_SEEDS_RESULTS=results/analysis, relative to where make_all ran (5 of these 7 failed there before)."""
    monkeypatch.chdir(recipe_layout)
    monkeypatch.setenv("THINKING_SEEDS_RESULTS", "results/analysis")
    assert notebook_main([name, "--out", str(tmp_path / "nb")]) == 0
    _check_run(name, tmp_path / "nb", recipe_layout / "results" / "analysis", capsys.readouterr().out)


@pytest.mark.slow   # executes a notebook in a kernel
def test_a_folder_without_the_tables_is_one_line_and_nothing_is_written(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert notebook_main(["fig4", str(empty)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: fig4_seeded_positions.ipynb, cell 4: MissingResults: no positions results of a run "
                   f"with seeded responses under {empty}; write them with: tsanalysis positions RUN_DIR (a Thinking "
                   f"Seeds run, seed_loss state+action)")
    assert not any(empty.iterdir())


@pytest.mark.slow   # executes a notebook in a kernel
def test_a_failing_cell_is_exit_1_and_the_executed_copy_keeps_the_traceback(demo_layout, tmp_path, capsys):
    out = tmp_path / "nb"
    assert notebook_main(["fig5", str(demo_layout), "--out", str(out), "--set", "TOP='many'"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: fig5_truncation_tokens.ipynb, cell 4: TypeError: ") and len(err.splitlines()) == 1
    assert f"the executed copy, with the cell's traceback, is {out / 'fig5_truncation_tokens.ipynb'}" in err
    nb = nbformat.read(out / "fig5_truncation_tokens.ipynb", as_version=4)
    assert "TOP = 'many'" in nb.cells[2].source and "injected-parameters" in nb.cells[2].metadata["tags"]
    assert any(o.output_type == "error" for c in nb.cells if c.cell_type == "code" for o in c.outputs)


@pytest.mark.slow   # executes a notebook in a kernel
def test_the_default_folder_is_runs_demo(tmp_path, capsys, monkeypatch):
    """No RESULTS_DIR and no variable: runs/demo (what `make demo` writes), from the working directory."""
    monkeypatch.delenv("THINKING_SEEDS_RESULTS", raising=False)
    monkeypatch.chdir(tmp_path)
    if (load.REPO / "runs" / "demo").exists():
        pytest.skip("this checkout has a runs/demo, which the default falls back on")
    assert notebook_main(["lemma4"]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: RESULTS_DIR runs/demo (the default) is not a folder; run `make demo` first, or give the folder "
        "`python -m figures.make_all` was given or its --results ROOT")
    (tmp_path / "runs" / "demo").mkdir(parents=True)   # there, but without tables: the kernel looked in it
    assert notebook_main(["lemma4"]) == 2
    err = capsys.readouterr().err
    assert "MissingResults: no Lemma 4 tables (lemma4) under" in err and str(tmp_path / "runs" / "demo") in err, err
