"""figures.make_all's input errors and failed writes (issue #38): one line each, the shared exit codes
(contracts.commands: 2 bad input, nothing written; 1 a failure inside the run), no traceback, and nothing already
written lost or half-written (PNGs go through a temporary file and os.replace).

A read-only folder is made with chmod where that binds (not as root); as root, and for a read-only file system or a
full disk met while writing, Figure.savefig (or the table writer) raises the OSError the file system would.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.figure import Figure

import figures.output
import tsanalysis.io
from figures.make_all import MAX_DPI, main
from tests.helpers.runs import PNG_MAGIC, make_row, write_run

REAL_SAVEFIG = Figure.savefig


@pytest.fixture
def runs(tmp_path) -> Path:
    """A folder holding one tiny on-policy run: make_all analyses it into runs/analysis and draws Figure 3 and
    Lemma 4 (two PNGs, in that order)."""
    rows = {s: [make_row(step=s, prompt_id=f"q{i // 4}", sample_idx=i % 4, length=6, reward=float(i % 2))
                for i in range(8)] for s in range(2)}
    write_run(tmp_path / "runs" / "tiny", rows)
    return tmp_path / "runs"


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())} if folder.is_dir() else {}


@pytest.mark.parametrize("dpi", ["0", "-3", str(MAX_DPI + 1)])
def test_dpi_out_of_range_is_one_line_and_nothing_is_written(runs, tmp_path, capsys, dpi):
    assert main([str(runs), "--out", str(tmp_path / "png"), "--dpi", dpi]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: --dpi {dpi}: ") and "--dpi 150" in line
    assert not (tmp_path / "png").exists() and not (runs / "analysis").exists()   # refused before the analysis


def test_an_out_folder_that_is_a_file_or_not_writable_is_refused_before_anything_is_written(runs, tmp_path, capsys,
                                                                                           monkeypatch):
    (tmp_path / "a-file").write_text("x")
    assert main([str(runs), "--out", str(tmp_path / "a-file" / "png")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"--out {tmp_path / 'a-file' / 'png'}: " in line and "is a file, not a folder" in line
    assert "choose a folder you can write (--out DIR)" in line
    # a folder this user cannot write (os.access says so on a read-only file system, for root too)
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(figures.output.os, "access", lambda p, mode: False if Path(p) == ro else real_access(p, mode))
    assert main([str(runs), "--out", str(ro / "png")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == (f"error: --out {ro / 'png'}: '{ro}' is not writable by this user; choose a folder you can write "
                    f"(--out DIR)")
    assert not (runs / "analysis").exists() and not any(ro.iterdir())
    # --results that cannot be written: refused before the first table is computed
    monkeypatch.setattr(figures.output.os, "access",
                        lambda p, mode: False if Path(p) == runs else real_access(p, mode))
    assert main([str(runs), "--out", str(tmp_path / "png")]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: --results {runs / 'analysis'}: '{runs}' is not writable")
    assert not (runs / "analysis").exists() and not (tmp_path / "png").exists()


def _chmod_binds(folder: Path) -> bool:
    """Whether a folder chmod'ed 555 refuses this process a new file (not for root, os.geteuid() == 0, unless it
    runs without CAP_DAC_OVERRIDE)."""
    try:
        (folder / "probe").write_text("x")
    except PermissionError:
        return True
    (folder / "probe").unlink()
    return False


def test_a_chmod_read_only_out_folder_is_refused(runs, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if not _chmod_binds(ro):
            pytest.skip(f"chmod does not bind here (euid {os.geteuid()}): the test above covers it with os.access")
        assert main([str(runs), "--out", str(ro)]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert line.startswith(f"error: --out {ro}: ") and "not writable" in line
        assert not any(ro.iterdir()) and not (runs / "analysis").exists()
    finally:
        ro.chmod(0o755)


def test_a_read_only_file_system_met_while_writing_is_bad_input(runs, tmp_path, capsys, monkeypatch):
    out = tmp_path / "png"
    assert main([str(runs), "--out", str(out), "--dpi", "20"]) == 0
    before = _files(out)
    assert sorted(before) == ["fig3_positions.png", "lemma4_zero_adv.png"]
    capsys.readouterr()

    def read_only(self, fname, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(fname))

    monkeypatch.setattr(Figure, "savefig", read_only)
    assert main([str(runs), "--out", str(out), "--dpi", "30"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line == (f"error: --out {out}: cannot be written (Read-only file system); choose a folder you can write "
                    f"(--out DIR)")
    assert _files(out) == before   # the figures of the first call are untouched


def test_a_full_disk_mid_write_is_one_line_exit_1_and_keeps_every_file_whole(runs, tmp_path, capsys, monkeypatch):
    out = tmp_path / "png"
    assert main([str(runs), "--out", str(out), "--dpi", "20"]) == 0
    before = _files(out)
    capsys.readouterr()
    calls = []

    def disk_fills(self, fname, *args, **kwargs):   # the first PNG fits, the second fills the disk half-way
        calls.append(Path(fname))
        if len(calls) == 1:
            return REAL_SAVEFIG(self, fname, *args, **kwargs)
        Path(fname).write_bytes(PNG_MAGIC + b"half a figure")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", disk_fills)
    assert main([str(runs), "--out", str(out), "--dpi", "40"]) == 1
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert line.startswith(f"error: no space left on device while writing {out}: free space there or set another "
                           f"output folder; every table and figure written before it is kept")
    assert f"wrote {out / 'fig3_positions.png'}" in captured.out
    # written through a temporary sibling: the first figure is the new one, whole; the second the old one, whole
    assert all(p.parent == out and p.name.startswith(".") and ".tmp-" in p.name for p in calls)
    after = _files(out)
    assert sorted(after) == sorted(before)   # no temporary file left behind
    assert after["lemma4_zero_adv.png"] == before["lemma4_zero_adv.png"]
    assert after["fig3_positions.png"] != before["fig3_positions.png"] and after["fig3_positions.png"][:8] == PNG_MAGIC
    # THINKING_SEEDS_DEBUG=1: the same line after the traceback, still exit 1
    calls.clear()
    monkeypatch.setenv("THINKING_SEEDS_DEBUG", "1")
    assert main([str(runs), "--out", str(out), "--dpi", "40"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: no space left on device")


def test_a_full_disk_while_writing_the_tables_names_the_results_folder(runs, tmp_path, capsys, monkeypatch):
    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tsanalysis.io, "write_results", disk_full)
    assert main([str(runs), "--out", str(tmp_path / "png")]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: no space left on device while writing {runs / 'analysis'}: ")
    assert not (tmp_path / "png").exists()


def test_a_figure_that_cannot_be_rendered_is_reported_and_the_others_drawn(runs, tmp_path, capsys, monkeypatch):
    calls = []

    def too_large(self, fname, *args, **kwargs):   # the first figure (Figure 3) cannot be rendered
        calls.append(fname)
        if len(calls) == 1:
            raise ValueError("Image size of 99999x99999 pixels is too large")
        return REAL_SAVEFIG(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", too_large)
    out = tmp_path / "png"
    assert main([str(runs), "--out", str(out), "--dpi", "20"]) == 1
    printed = capsys.readouterr().out
    assert "FAILED fig3_positions: ValueError: Image size" in printed
    assert f"wrote {out / 'lemma4_zero_adv.png'}" in printed and sorted(_files(out)) == ["lemma4_zero_adv.png"]


def test_the_notebook_folder_is_printed(runs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)   # results/analysis/<run> (the tsanalysis default) is looked up from here
    assert main([str(runs), "--dpi", "20"]) == 0
    assert f"notebooks: python -m figures.notebook NAME {runs}  " in capsys.readouterr().out
    # the recipes' layout: tables under --results ROOT (elsewhere), which the notebooks are then pointed at
    copy = shutil.copytree(runs / "tiny", tmp_path / "other" / "tiny", ignore=shutil.ignore_patterns("analysis"))
    root = tmp_path / "results" / "analysis"
    assert main([str(copy.parent), "--results", str(root), "--out", str(tmp_path / "png2"), "--dpi", "20"]) == 0
    assert f"notebooks: python -m figures.notebook NAME {root}  " in capsys.readouterr().out


@pytest.mark.slow   # starts two processes
def test_as_a_user_starts_them_make_all_and_the_notebook_runner_say_one_line(runs, tmp_path):
    """`python -m figures.make_all` and `python -m figures.notebook`, each with bad input: one line, exit 2."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("THINKING_SEEDS_DEBUG", None)
    cases = {"make_all": ([sys.executable, "-m", "figures.make_all", str(runs), "--dpi", "0"], "error: --dpi 0: "),
             "notebook": ([sys.executable, "-m", "figures.notebook", "fig9"], "error: no notebook 'fig9'; give one of")}
    procs = {name: subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True) for name, (cmd, _) in cases.items()}
    for name, p in procs.items():
        _, err = p.communicate(timeout=120)
        assert p.returncode == 2 and _one_error_line(err).startswith(cases[name][1]), (name, err)
    assert not (runs / "analysis").exists() and not (runs / "figures").exists()
