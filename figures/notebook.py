"""Run a notebook of ``notebooks/`` without a Jupyter front end:  ``python -m figures.notebook NAME [RESULTS_DIR]``.

Every cell of ``notebooks/NAME.ipynb`` runs in the ``python3`` kernel (ipykernel, installed with the package's dev
extra; nbclient drives it) with ``notebooks/`` as its working directory and ``THINKING_SEEDS_RESULTS`` set to
RESULTS_DIR. The committed notebook is not modified; written to ``--out`` (default ``RESULTS_DIR/notebooks/``):

- ``NAME.ipynb``: the executed copy, with its outputs (any notebook viewer shows it);
- ``NAME.png`` (``NAME-2.png``, ... when it shows several): every figure the notebook displayed;

and their paths are printed. NAME: a notebook's name with or without ``.ipynb``, or the start of one name
(``fig3``, ``lemma4``), or the path of a notebook file. RESULTS_DIR (default ``$THINKING_SEEDS_RESULTS``, else
``runs/demo``, what ``make demo`` writes): the folder the notebooks search for their tables, the DIR given to
``python -m figures.make_all`` or its ``--results ROOT`` (make_all prints which); a relative path is tried from the
working directory, then from the repository root. ``--set KEY=VALUE`` (repeatable) overrides a variable of the
notebook's parameters cell (VALUE read as a Python literal, else as text): ``--set RUN=seeds-ratio``,
``--set 'FIG3_RUNS={"onpolicy": "a", "minibatch": "b"}'``.

An interactive front end: ``.venv/bin/pip install jupyterlab``, then
``THINKING_SEEDS_RESULTS=runs/demo .venv/bin/jupyter lab notebooks/`` (notebooks/README.md).

Exit status (``contracts.commands``): 0; 2 for bad input, one ``error:`` line, nothing written: an unknown notebook,
RESULTS_DIR not a folder, an ``--out`` that cannot be written, a ``--set`` the parameters cell does not have, or
tables the notebook needs that are not under RESULTS_DIR (the loader's message, naming the ``tsanalysis`` command
that writes them); 1 when a cell failed otherwise: one line with the cell and its error, and the executed copy,
with the cell's traceback, is written (``THINKING_SEEDS_DEBUG=1`` prints that traceback too).
"""

from __future__ import annotations

import argparse
import ast
import base64
import os
import sys
import traceback
from pathlib import Path
from typing import Callable, Sequence

from contracts.commands import (DEBUG_ENV, EXIT_CODES_HELP, EXIT_FAILURE, EXIT_OK, debug, failure_line, one_line,
                                run_command)

from .load import DEFAULT_RESULTS, REPO, RESULTS_ENV, resolve_dir
from .output import InputError, WriteFailed, check_writable, write_bytes, writing

__all__ = ["NOTEBOOKS", "NotebookFailed", "find_notebook", "results_folder", "parse_settings", "run_notebook",
           "main"]

NOTEBOOKS = REPO / "notebooks"
KERNEL = "python3"
TIMEOUT_S = 600            # per cell
# a cell that raised one of these did not find its tables: the folder given is the problem (bad input, exit 2)
MISSING = ("MissingResults", "FileNotFoundError")


class NotebookFailed(Exception):
    """A cell raised: its error type and message (``ename``, ``evalue``) and its traceback (``trace``)."""

    def __init__(self, notebook: str, cell: int | None, ename: str, evalue: str, trace: str = ""):
        where = f"{notebook}, cell {cell}" if cell is not None else notebook
        super().__init__(f"{where}: {ename}: {one_line(evalue)}")
        self.notebook, self.cell, self.ename, self.evalue, self.trace = notebook, cell, ename, evalue, trace


def find_notebook(name: str) -> Path:
    """The notebook NAME names (see the module docstring); InputError listing the notebooks when none or several."""
    path = Path(name).expanduser()
    if path.suffix == ".ipynb" and path.is_file():
        return path
    stem = path.name.removesuffix(".ipynb")
    names = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))
    if stem in names:
        return NOTEBOOKS / f"{stem}.ipynb"
    hits = [n for n in names if n.startswith(stem)] if stem else []
    if len(hits) == 1:
        return NOTEBOOKS / f"{hits[0]}.ipynb"
    what = f"'{name}' names {len(hits)} notebooks ({', '.join(hits)})" if hits else f"no notebook '{name}'"
    raise InputError(f"error: {what}; give one of: {', '.join(names)}")


def results_folder(given: str | None) -> Path:
    """RESULTS_DIR as an absolute folder (the kernel runs in notebooks/): as given from the working directory, else
    from the repository root; InputError when it is not a folder."""
    raw = given if given is not None else (os.environ.get(RESULTS_ENV, "").strip() or DEFAULT_RESULTS)
    path = resolve_dir(raw)
    if not path.is_dir():
        origin = "" if given is not None else (f" (from {RESULTS_ENV})" if os.environ.get(RESULTS_ENV, "").strip()
                                               else " (the default)")
        hint = "run `make demo` first, or give " if given is None and raw == DEFAULT_RESULTS else "give "
        raise InputError(f"error: RESULTS_DIR {raw}{origin} is not a folder; {hint}the folder `python -m "
                         f"figures.make_all` was given or its --results ROOT")
    return path.resolve()


def parse_settings(items: Sequence[str]) -> dict[str, object]:
    """``KEY=VALUE`` items → {KEY: value}: VALUE as a Python literal when it is one, else as text."""
    out: dict[str, object] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise InputError(f"error: --set {item!r}: expected NAME=VALUE, e.g. --set RUN=seeds-ratio")
        try:
            out[key] = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            out[key] = text.strip()
    return out


def _parameters(nb) -> tuple[int, set[str]]:
    """Index of the parameters cell and the names it assigns."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            code = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
            names = {t.id for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Assign)
                     for t in node.targets if isinstance(t, ast.Name)}
            return i, names
    return -1, set()


def _inject(nb, settings: dict[str, object], name: str) -> None:
    """A cell after the parameters cell that sets ``settings`` (papermill's convention: tagged
    ``injected-parameters``); InputError for a name the parameters cell does not set."""
    import nbformat

    at, names = _parameters(nb)
    unknown = sorted(set(settings) - names)
    if unknown:
        raise InputError(f"error: --set {', '.join(unknown)}: not a parameter of {name}; its parameters cell sets "
                         f"{', '.join(sorted(names)) or 'nothing'}")
    cell = nbformat.v4.new_code_cell("\n".join(f"{k} = {v!r}" for k, v in settings.items()),
                                     metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(at + 1, cell)


def _images(nb) -> list[bytes]:
    return [base64.b64decode(o["data"]["image/png"]) for c in nb.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if o.get("output_type") in ("display_data", "execute_result")
            and "image/png" in o.get("data", {})]


def run_notebook(notebook: str | os.PathLike, results: str | os.PathLike, out: str | os.PathLike, *,
                 settings: dict[str, object] | None = None, timeout: int = TIMEOUT_S,
                 log: Callable[[str], None] = print) -> list[Path]:
    """Execute ``notebook`` against ``results`` and write the executed copy and its figures to ``out``; returns the
    paths written. NotebookFailed when a cell raised: nothing is written when it did not find its tables (MISSING),
    else the executed copy up to that cell is, to read the traceback in it. InputError / WriteFailed as
    ``figures.output`` says."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    path, out = Path(notebook), Path(out)
    check_writable(out, "--out")
    nb = nbformat.read(path, as_version=4)
    if settings:
        _inject(nb, settings, path.name)
    env = {**os.environ, RESULTS_ENV: str(results),
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    log(f"running {path.name} with {RESULTS_ENV}={results}")
    client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL, resources={"metadata": {"path": str(path.parent)}},
                            extra_arguments=["--IPKernelApp.log_level=ERROR"])   # not its TCP warning at every start
    failed = None
    try:
        client.execute(env=env)   # the kernel's environment: this one, the results folder and this checkout
    except CellExecutionError as exc:
        cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
        bad = [i for i, c in enumerate(cells, start=1) if c.cell_type == "code"
               and any(o.get("output_type") == "error" for o in c.get("outputs", []))]
        failed = NotebookFailed(path.name, bad[-1] if bad else None, exc.ename, exc.evalue, exc.traceback)
        if exc.ename in MISSING:
            raise failed from None
    stem = path.stem
    written = []
    with writing(out, "--out"):
        out.mkdir(parents=True, exist_ok=True)
        copy = out / f"{stem}.ipynb"
        write_bytes(copy, (nbformat.writes(nb) + "\n").encode("utf-8"))
        written.append(copy)
        for k, png in enumerate(_images(nb), start=1):
            written.append(write_bytes(out / (f"{stem}.png" if k == 1 else f"{stem}-{k}.png"), png))
    for p in written:
        log(f"wrote {p}")
    if failed is not None:
        raise failed
    return written


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m figures.notebook", description=__doc__, epilog=EXIT_CODES_HELP,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebook", metavar="NAME", help="a notebook of notebooks/ (fig2_relay, fig3, lemma4, premise, "
                                                     "support, ...) or the path of a notebook file")
    ap.add_argument("results", metavar="RESULTS_DIR", nargs="?", default=None,
                    help=f"the folder holding the tables (default ${RESULTS_ENV}, else {DEFAULT_RESULTS})")
    ap.add_argument("--out", default=None,
                    help="where the executed copy and the PNGs go (default RESULTS_DIR/notebooks/)")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                    help="override a variable of the parameters cell (repeatable)")
    ap.add_argument("--timeout", type=int, default=TIMEOUT_S, help=f"seconds per cell (default {TIMEOUT_S})")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        path = find_notebook(args.notebook)
        results = results_folder(args.results)
        settings = parse_settings(args.settings)
        out = Path(args.out) if args.out is not None else results / "notebooks"
        try:
            run_notebook(path, results, out, settings=settings, timeout=args.timeout)
        except NotebookFailed as exc:
            if exc.ename in MISSING:   # no tables under RESULTS_DIR: the message names the command that writes them
                raise InputError(f"error: {exc}") from None
            if debug():   # the cell's traceback (the runner's own says nothing more)
                print(exc.trace, file=sys.stderr, flush=True)
            print(f"error: {exc}; the executed copy, with the cell's traceback, is {out / path.stem}.ipynb (a "
                  f"failure inside the notebook; {DEBUG_ENV}=1 prints the traceback here)", file=sys.stderr, flush=True)
            return EXIT_FAILURE
        except WriteFailed as exc:
            if debug():
                traceback.print_exc()
            print(failure_line(exc.error, writing=str(exc.folder)), file=sys.stderr, flush=True)
            return EXIT_FAILURE
        return EXIT_OK

    return run_command(body, input_errors=(InputError,),
                       resume=lambda: "the committed notebook is unchanged; run the same command again")


if __name__ == "__main__":
    sys.exit(main())
