"""Regenerate every figure whose input tables exist:  ``python -m figures.make_all DIR [--out DIR] [options]``.

DIR is searched recursively and may be

- a **results tree**: tsanalysis result folders anywhere below it (``results/analysis``, ``results/analysis/<run>``,
  a copied tree); nothing is computed except the pure Lemma 4 table when none is there;
- a **run directory** (``runs/<run>/``, it holds ``rollouts/``) or a **folder of runs** (``runs/``,
  ``runs/demo-quick/``): every run below DIR is analysed in-process first, with the same functions and output
  layout as the ``tsanalysis`` CLI — ``positions`` and ``zero-adv`` for every run, ``truncation`` and ``mismatch``
  for runs with seeded responses. A run's analysis is *reused* instead when an up-to-date result folder exists:
  same command and run directory, computed over all steps, settings.json newer than the run's newest rollout
  file; such folders are looked for under DIR, under the results root and in ``results/analysis/<run>/`` (the
  CLI's default output, relative to the working directory). ``--recompute`` ignores them.

Computed tables go to ``--results ROOT`` as ``ROOT/<run>/<command>/`` (default ROOT: ``DIR/analysis`` when DIR
holds runs, else DIR itself), so a demo folder ends up self-contained: ``DIR/analysis`` (tables) and
``DIR/figures`` (PNGs), and the notebooks can point at DIR. The pure Lemma 4 table needs no data: when none is
found it is computed (p = 0, 0.01, …, 1; G = 2, 4, 8, 16; 10 000 simulated groups per p; seed 0) and cached in
``ROOT/lemma4/zero-adv/``.

Relay results (Figure 2) come from ``tsanalysis relay`` (it needs checkpoints and a GPU-sized budget, so it is
never run here); they are picked up when they lie under DIR, ROOT or ``results/analysis/<run>/``.

Which run feeds which figure is decided by ``figures.load`` (from each run's config.yaml: algorithm,
mini_batches_per_step, seed_loss, seed_rule); override with

    --fig3 onpolicy=RUN_A,minibatch=RUN_B   --fig4 RUN_C   --fig5 entropy=RUN_D,ratio=RUN_E
    --lemma4 RUN   --mismatch RUN            (RUN: a run name or a run directory)

Output: ``fig2_relay.png``, ``fig3_positions.png``, ``fig4_seeded_positions.png``, ``fig5_truncation_tokens.png``,
``lemma4_zero_adv.png``, ``mismatch.png`` in ``--out`` (default ``DIR/figures/``) at ``--dpi`` (150; 1 to
1200). Each PNG is written whole or not at all (``figures.output``): a figure of an earlier call stays as it was
until its new version is complete. The paths written are printed, each skipped figure with the tsanalysis command
that would produce its inputs, and last the folder the notebooks read the same tables from (``notebooks/README.md``:
``python -m figures.notebook NAME FOLDER``, or ``THINKING_SEEDS_RESULTS=FOLDER``): DIR when the tables are under
it, else the results root.

Exit status (``contracts.commands``): 0; 2 for bad input, with one ``error:`` line and nothing written: DIR not a
folder, ``--dpi`` out of range, an ``--out`` or ``--results`` folder this user cannot write (checked before the
first thing is computed; a read-only file system met later is said the same way); 1 when a figure failed or an
explicitly requested run was not found (``FAILED`` lines), or for a failure inside the run, one line: a full disk
is ``error: no space left on device while writing FOLDER: ...``, and every table and figure written before it is
kept, whole (the same command reuses the tables and redraws the figures). 130 Ctrl-C, 143 SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import numbers
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from contracts.commands import EXIT_CODES_HELP, EXIT_FAILURE, EXIT_OK, debug, failure_line, run_command

from . import load
from .fig2_relay import plot_relay_passk
from .fig3_positions import plot_positions
from .fig4_seeded_positions import plot_mismatch, plot_seeded_positions
from .fig5_truncation import plot_truncation_tokens
from .lemma4 import plot_zero_adv
from .output import InputError, WriteFailed, check_writable, save_png, writing
from .style import DPI, use_headless_backend

__all__ = ["FIGURES", "RUN_COMMANDS", "MAX_DPI", "InputError", "WriteFailed", "find_runs", "analyse_run",
           "ensure_lemma4", "make_all", "parse_mapping", "main"]

RUN_COMMANDS = ("positions", "zero-adv", "truncation", "mismatch")
LEMMA4_P = np.round(np.linspace(0.0, 1.0, 101), 2)
LEMMA4_G = (2, 4, 8, 16)
LEMMA4_SIMULATE = 10_000
MAX_DPI = 1200   # a 12-inch figure is 14 400 pixels wide there; far above, the renderer's buffer fills the memory


# ---- one drawing function per output file: loader (figures.load) → plotting function ------------------------
def _fig2(folders, sel, log):
    return plot_relay_passk(load.relay_passk(folders, log=log))


def _fig3(folders, sel, log):
    return plot_positions(load.positions_by_run(folders, sel.get("fig3"), log=log))


def _fig4(folders, sel, log):
    bins, takeover = load.seeded_positions(folders, sel.get("fig4"), log=log)
    return plot_seeded_positions(bins, takeover)


def _fig5(folders, sel, log):
    tokens, categories = load.truncation_tokens(folders, sel.get("fig5"), log=log)
    return plot_truncation_tokens(tokens, categories)


def _lemma4(folders, sel, log):
    lemma4, by_step = load.zero_adv(folders, sel.get("lemma4"), log=log)
    return plot_zero_adv(lemma4, by_step)


def _mismatch(folders, sel, log):
    relative, relative_to = load.mismatch(folders, sel.get("mismatch"), log=log)
    return plot_mismatch(relative, relative_to=relative_to)


# output file stem → how to draw it from the result folders and the user's run choices
FIGURES: dict[str, Callable] = {"fig2_relay": _fig2, "fig3_positions": _fig3, "fig4_seeded_positions": _fig4,
                                "fig5_truncation_tokens": _fig5, "lemma4_zero_adv": _lemma4, "mismatch": _mismatch}


# ---- runs → result tables --------------------------------------------------------------------------------------
def find_runs(root: str | Path) -> list[Path]:
    """Run directories under ``root`` (``root`` included): folders whose ``rollouts/`` holds step files."""
    runs = []
    for dirpath, dirnames, _ in os.walk(root):
        if "rollouts" in dirnames and any(Path(dirpath, "rollouts").glob("step_*.parquet")):
            runs.append(Path(dirpath))
        dirnames[:] = sorted(d for d in dirnames if d not in load.PRUNE_DIRS)
    return sorted(runs)


def _newest_rollout(run_dir: Path) -> float:
    return max(p.stat().st_mtime for p in (run_dir / "rollouts").glob("step_*.parquet"))


_NEEDED = {"positions": "bins", "zero-adv": "by_step", "truncation": "tokens", "mismatch": "relative"}


def _up_to_date(folders: Sequence[load.ResultFolder], run_dir: Path, command: str) -> load.ResultFolder | None:
    key = str(run_dir.resolve())
    newest = _newest_rollout(run_dir)
    ok = [f for f in folders if f.command == command and _NEEDED[command] in f.tables
          and f.run_dir is not None and str(f.run_dir) == key and f.mtime >= newest
          and (f.settings.get("steps") or {}).get("range") is None]
    return max(ok, key=lambda f: f.mtime) if ok else None


def _compute(run_dir: Path, command: str):
    from tsanalysis import tables

    if command == "positions":
        return tables.positions_tables(run_dir), {"bins": 10, "loss_tokens_only": False}
    if command == "zero-adv":
        return tables.zero_adv_tables(run_dir), {}
    if command == "truncation":
        return tables.truncation_tables(run_dir), {"top": 30}
    if command == "mismatch":
        return tables.mismatch_tables_for_run(run_dir), {"bins": 10, "width": 64, "thresholds": [0.01, 0.1, 1.0],
                                                         "relative_to": "seed"}
    raise AssertionError(f"unknown command {command!r}")


def _write(out_dir: Path, results_root: Path, tables, settings: dict) -> load.ResultFolder:
    from tsanalysis import io as tio

    with writing(results_root, "--results"):
        tio.write_results(out_dir, tables, settings)   # each file whole, settings.json last (tsanalysis.io)
    return load.ResultFolder(out_dir, json.loads((out_dir / "settings.json").read_text()))


def analyse_run(run_dir: Path, results_root: Path, cached: Sequence[load.ResultFolder], *, recompute: bool = False,
                log: Callable[[str], None] = print) -> dict[str, load.ResultFolder]:
    """The run's result folders per command: reused when up to date, else computed into results_root/<run>/."""
    from tsanalysis import io as tio

    run_dir = Path(run_dir)
    name = tio.run_name(run_dir)
    out: dict[str, load.ResultFolder] = {}
    for command in RUN_COMMANDS:
        if command in ("truncation", "mismatch") and "positions" in out:
            if int(out["positions"].table("takeover")["seeded_responses"].iloc[0]) == 0:
                continue   # no seeded responses: no truncation points, no seed tokens
        hit = None if recompute else _up_to_date(cached, run_dir, command)
        if hit is not None:
            log(f"  {name} {command}: up to date ({hit.path})")
            out[command] = hit
            continue
        check_writable(results_root, "--results")   # before the first table is computed, not after
        t0 = time.perf_counter()
        try:
            tables, args = _compute(run_dir, command)
        except tio.RecordsError as e:
            log(f"  {name} {command}: not computed ({e})")
            continue
        selected = [s for s, _ in tio.select_steps(run_dir, None)]
        settings = {"command": command, "args": {"run_dir": str(run_dir), "steps": None, **args},
                    "run_dir": str(run_dir.resolve()), "steps": {"range": None, "selected": selected},
                    "written_by": "figures.make_all"}
        out[command] = _write(results_root / name / command, results_root, tables, settings)
        log(f"  {name} {command}: computed in {time.perf_counter() - t0:.1f} s → {out[command].path}")
    return out


def ensure_lemma4(folders: Sequence[load.ResultFolder], results_root: Path, *,
                  log: Callable[[str], None] = print) -> list[load.ResultFolder]:
    """The folders plus a cached pure Lemma 4 table when none of them holds one."""
    if any(f.command == "zero-adv" and "lemma4" in f.tables for f in folders):
        return list(folders)
    import pandas as pd

    from tsanalysis.tables import lemma4_tables

    check_writable(results_root, "--results")
    table = pd.concat([lemma4_tables(LEMMA4_P, G, simulate=LEMMA4_SIMULATE, seed=0)["lemma4"] for G in LEMMA4_G],
                      ignore_index=True)
    settings = {"command": "zero-adv", "args": {"p": LEMMA4_P.tolist(), "G": list(LEMMA4_G),
                                                "simulate": LEMMA4_SIMULATE, "seed": 0},
                "written_by": "figures.make_all"}
    f = _write(results_root / "lemma4" / "zero-adv", results_root, {"lemma4": table}, settings)
    log(f"  lemma4: computed the pure Lemma 4 table → {f.path}")
    return [*folders, f]


# ---- the whole pipeline ----------------------------------------------------------------------------------------
def make_all(directory: str | Path, *, out: str | Path | None = None, results: str | Path | None = None,
             selection: dict | None = None, recompute: bool = False, dpi: int = DPI,
             log: Callable[[str], None] = print) -> dict:
    """Analyse runs (if any), then draw every figure whose inputs exist. Returns {"written": [paths],
    "skipped": {figure: reason}, "failed": {figure: error}, "notebooks": folder} (see the module docstring).
    Raises InputError for bad input (before anything is written) and WriteFailed when a write fails (a full disk;
    what was written before stays whole)."""
    root = Path(directory)
    if not root.is_dir():
        raise InputError(f"error: '{directory}' is not a directory: give a run, a folder of runs or a results tree")
    if isinstance(dpi, bool) or not isinstance(dpi, numbers.Integral) or not 1 <= dpi <= MAX_DPI:
        raise InputError(f"error: --dpi {dpi}: the resolution must be a whole number of dots per inch from 1 to "
                         f"{MAX_DPI}; give e.g. --dpi {DPI} (the default) or --dpi 300 for print")
    out_dir = Path(out) if out is not None else root / "figures"
    check_writable(out_dir, "--out")   # before anything is computed (--results: before the first table is)
    sel = dict(selection or {})
    runs = find_runs(root)
    results_root = Path(results) if results is not None else (root / "analysis" if runs else root)
    found: dict[Path, load.ResultFolder] = {}
    for base in [root, results_root, *(Path("results") / "analysis" / r.name for r in runs)]:
        found.update({f.path.resolve(): f for f in load.find_results(base)})
    folders = list(found.values())
    if runs:
        log(f"analysing {len(runs)} run(s) under {root} (tables in {results_root}/<run>/<command>/):")
        chosen: list[load.ResultFolder] = []
        for run in runs:
            chosen += analyse_run(run, results_root, folders, recompute=recompute, log=log).values()
        keys = {str(r.resolve()) for r in runs}
        folders = [f for f in folders if not (f.run_dir is not None and str(f.run_dir) in keys
                                              and f.command in RUN_COMMANDS and "lemma4" not in f.tables)] + chosen
    folders = ensure_lemma4(folders, results_root, log=log)

    with writing(out_dir, "--out"):
        out_dir.mkdir(parents=True, exist_ok=True)
    report = {"written": [], "skipped": {}, "failed": {}, "notebooks": notebook_folder(root, results_root, folders)}
    explicit = {"fig3_positions": "fig3", "fig4_seeded_positions": "fig4", "fig5_truncation_tokens": "fig5",
                "lemma4_zero_adv": "lemma4", "mismatch": "mismatch"}
    log("figures:")
    for name, draw in FIGURES.items():
        try:
            fig = draw(folders, sel, lambda m: log(f"  {m}"))
        except load.MissingResults as e:
            if sel.get(explicit.get(name, "")):   # the user asked for a run that is not there
                report["failed"][name] = str(e)
            else:
                report["skipped"][name] = str(e)
            continue
        except Exception as e:   # draw the other figures; report this one
            report["failed"][name] = f"{type(e).__name__}: {e}"
            continue
        path = out_dir / f"{name}.png"
        try:
            with writing(out_dir, "--out"):   # the folder refused: InputError; a full disk: WriteFailed
                save_png(fig, path, dpi=dpi)
        except (InputError, WriteFailed):   # the next figures would meet the same: stop, say what was written
            for p in report["written"]:
                log(f"wrote {p}")
            raise
        except Exception as e:   # this figure cannot be rendered at this size: report it, draw the others
            report["failed"][name] = f"{type(e).__name__}: {e}"
            continue
        report["written"].append(path)
    for p in report["written"]:
        log(f"wrote {p}")
    for name, why in report["skipped"].items():
        log(f"skipped {name}: {why}")
    for name, why in report["failed"].items():
        log(f"FAILED {name}: {why}")
    where = report["notebooks"]
    if where is not None:
        log(f"notebooks: python -m figures.notebook NAME {where}  (the notebooks read these tables from "
            f"{load.RESULTS_ENV}={where}; notebooks/README.md)")
    else:
        log(f"notebooks: the tables drawn lie both under {root} and elsewhere; give a notebook the folder that "
            f"holds its tables (python -m figures.notebook NAME FOLDER; notebooks/README.md)")
    return report


def _under(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def notebook_folder(root: Path, results_root: Path, folders: Sequence[load.ResultFolder]) -> Path | None:
    """The folder to point the notebooks at (``THINKING_SEEDS_RESULTS``): DIR when every result folder drawn from
    lies under it (a demo's folder, whose ``tables/`` the premise notebook reads too), else the results root when
    they all lie there, else None (they are spread over unrelated places)."""
    for where in (root, results_root):
        if all(_under(f.path, where) for f in folders):
            return where
    return None


def parse_mapping(text: str | None, *, flag: str) -> dict[str, str] | None:
    """'a=RUN_A,b=RUN_B' → {'a': 'RUN_A', 'b': 'RUN_B'}."""
    if text is None:
        return None
    out = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise argparse.ArgumentTypeError(f"{flag} expects role=RUN pairs separated by commas, got {text!r}")
        out[key.strip()] = value.strip()
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m figures.make_all", description=__doc__,
                                 epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("directory", metavar="RUN_OR_RESULTS_DIR",
                    help="a run (runs/<run>), a folder of runs, or a tree of tsanalysis results")
    ap.add_argument("--out", default=None, help="where the PNGs go (default DIR/figures/)")
    ap.add_argument("--results", default=None,
                    help="where computed tables go, as <root>/<run>/<command>/ (default DIR/analysis for runs, else DIR)")
    ap.add_argument("--fig3", default=None, metavar="onpolicy=RUN,minibatch=RUN",
                    help="runs of Figure 3's panels (other keys are used as panel labels)")
    ap.add_argument("--fig4", default=None, metavar="RUN", help="the seeded run of Figure 4")
    ap.add_argument("--fig5", default=None, metavar="entropy=RUN,ratio=RUN", help="one run per truncation rule")
    ap.add_argument("--lemma4", default=None, metavar="RUN", help="the run of the observed zero-advantage panel")
    ap.add_argument("--mismatch", default=None, metavar="RUN", help="the seeded run of the mismatch figure")
    ap.add_argument("--recompute", action="store_true", help="recompute run analyses even when cached ones are up to date")
    ap.add_argument("--dpi", type=int, default=DPI, help=f"resolution of the PNGs, 1 to {MAX_DPI} (default {DPI})")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        sel = {"fig3": parse_mapping(args.fig3, flag="--fig3"), "fig4": args.fig4,
               "fig5": parse_mapping(args.fig5, flag="--fig5"), "lemma4": args.lemma4, "mismatch": args.mismatch}
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    use_headless_backend()
    kept = ("every table and figure written before it is kept, whole; the same command reuses the tables and "
            "redraws the figures")

    def body() -> int:
        try:
            report = make_all(args.directory, out=args.out, results=args.results, selection=sel,
                              recompute=args.recompute, dpi=args.dpi)
        except WriteFailed as exc:   # a full disk (said as such, the folder named) or another error of the write
            if debug():
                traceback.print_exc()
            print(failure_line(exc.error, kept=kept, writing=str(exc.folder)), file=sys.stderr, flush=True)
            return EXIT_FAILURE
        return EXIT_FAILURE if report["failed"] else EXIT_OK

    return run_command(body, input_errors=(InputError,), resume=lambda: kept, kept=lambda: kept)


if __name__ == "__main__":
    sys.exit(main())
