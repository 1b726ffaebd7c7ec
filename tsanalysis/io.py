"""Reading runs and writing analysis results (the IO layer between ``tsanalysis.core`` and the CLI).

Reading goes through ``contracts.records`` (the one definition of the rollout schema): a run's files are listed
and every selected file's schema is checked against the needed columns BEFORE any work starts, then the rows are
streamed file by file in record batches (bounded memory; nothing here reads a whole run into one table).

Writing: every command writes one folder (default ``results/analysis/<run-name>/<command>/``) holding each
result table as ``<table>.parquet`` and ``<table>.csv`` and a ``settings.json`` (command, resolved arguments,
run directory, selected steps, package version). Each file is written atomically (``contracts.files``);
``settings.json`` is written last, so its presence marks a complete result folder.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from contracts import records
from contracts.files import atomic_path, atomic_write_json

__all__ = ["RecordsError", "select_steps", "check_run", "missing_columns", "iter_batches", "list_column",
           "scalar_column",
           "token_lengths", "run_name", "default_out", "write_results", "RESULTS_ROOT"]

RecordsError = records.RecordsError
RESULTS_ROOT = Path("results") / "analysis"
BATCH_ROWS = 512   # rows per streamed record batch (a row holds whole per-token lists)


def select_steps(run_dir: str | os.PathLike, steps: tuple[int | None, int | None] | None) -> list[tuple[int, Path]]:
    """(step, path) of the run's rollout files inside the half-open range ``steps``; a clear error if none."""
    all_steps = records.list_steps(run_dir)   # raises for a missing directory / rollouts folder / no files
    lo, hi = steps if steps is not None else (None, None)
    sel = [(s, p) for s, p in all_steps if (lo is None or s >= lo) and (hi is None or s < hi)]
    if not sel:
        have = f"{all_steps[0][0]}..{all_steps[-1][0]}"
        raise RecordsError(f"'{run_dir}': no rollout files in steps [{lo}, {hi}) (the run has steps {have})")
    return sel


def check_run(run_dir: str | os.PathLike, steps, columns: Sequence[str]) -> list[tuple[int, Path]]:
    """Select the files and validate each one's schema (footer only) for ``columns``; errors name the file."""
    sel = select_steps(run_dir, steps)
    for _, path in sel:
        try:
            schema = pq.read_schema(path)
        except (OSError, pa.ArrowInvalid) as e:
            raise RecordsError(f"{path}: not a readable Parquet file ({e})") from None
        records.validate_schema(schema, str(path), columns)
    return sel


def missing_columns(path: str | os.PathLike, names: Sequence[str]) -> list[str]:
    """The ``names`` a rollout file does not have (footer only): a column added after the file was written."""
    try:
        have = set(pq.read_schema(path).names)
    except (OSError, pa.ArrowInvalid) as e:
        raise RecordsError(f"{path}: not a readable Parquet file ({e})") from None
    return [n for n in names if n not in have]


def iter_batches(run_dir: str | os.PathLike, *, columns: Sequence[str], steps=None,
                 batch_rows: int = BATCH_ROWS) -> Iterator[tuple[int, Path, pa.RecordBatch]]:
    """Yield (step, path, record batch) over the selected files, streaming (``records.iter_file_batches``)."""
    for step, path in check_run(run_dir, steps, columns):
        for batch in records.iter_file_batches(path, columns=columns, batch_size=batch_rows):
            yield step, path, batch


def _column(batch: pa.RecordBatch, name: str):
    idx = batch.schema.get_field_index(name)
    assert idx >= 0, f"column {name!r} was not requested"
    return batch.column(idx)


def list_column(batch: pa.RecordBatch, name: str, *, dtype=np.float64, fill=np.nan) -> tuple[np.ndarray, np.ndarray]:
    """A list<...> column → (flat values [sum T_i], offsets [N+1]); a null list counts as empty; null elements
    become ``fill``."""
    arr = _column(batch, name)
    if pa.types.is_null(arr.type):   # an all-null column written without a type
        return np.zeros(0, dtype=dtype), np.zeros(len(arr) + 1, dtype=np.int64)
    lens = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    offsets = np.zeros(len(arr) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    flat = arr.flatten()   # respects slicing, skips null lists
    if flat.null_count:
        flat = pc.fill_null(flat, fill)
    return flat.to_numpy(zero_copy_only=False).astype(dtype, copy=False), offsets


def scalar_column(batch: pa.RecordBatch, name: str, *, fill=None) -> np.ndarray:
    """A scalar column → numpy (nulls replaced by ``fill`` when given, else kept as None/NaN)."""
    arr = _column(batch, name)
    if fill is not None and arr.null_count:
        arr = pc.fill_null(arr, fill)
    return arr.to_numpy(zero_copy_only=False)


def token_lengths(batch: pa.RecordBatch, names: Sequence[str], path) -> np.ndarray:
    """Per-response token counts, checking that the per-token columns ``names`` agree (error names file and row)."""
    ref = None
    for name in names:
        arr = _column(batch, name)
        lens = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        if ref is None:
            ref, ref_name = lens, name
        elif not np.array_equal(lens, ref):
            row = int(np.flatnonzero(lens != ref)[0])
            raise RecordsError(f"{path}: per-token column '{name}' has {lens[row]} values in row {row} but "
                               f"'{ref_name}' has {ref[row]}; per-token lists must align with response_ids")
    return ref


def run_name(path: str | os.PathLike) -> str:
    """A run's name: the run folder for runs/<run>, runs/<run>/checkpoints/step_N, or any other path."""
    p = Path(path).resolve()
    if p.parent.name == "checkpoints":
        return p.parent.parent.name
    return p.name


def default_out(name: str, command: str, *, root: str | os.PathLike | None = None) -> Path:
    return Path(root if root is not None else RESULTS_ROOT) / name / command


def _jsonable(x):
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating,)):
        return float(x)
    if isinstance(x, (Path,)):
        return str(x)
    if isinstance(x, (tuple, set)):
        return list(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"settings value of type {type(x).__name__} is not JSON-serialisable")


def write_results(out_dir: str | os.PathLike, tables: dict[str, pd.DataFrame], settings: dict) -> list[Path]:
    """Write ``<name>.parquet`` + ``<name>.csv`` per table, then ``settings.json``; returns the paths written."""
    from . import __version__

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, df in tables.items():
        assert isinstance(df, pd.DataFrame), f"table {name!r} is not a DataFrame"
        pq_path, csv_path = out / f"{name}.parquet", out / f"{name}.csv"
        with atomic_path(pq_path) as tmp:
            df.to_parquet(tmp, index=False)
        with atomic_path(csv_path) as tmp:
            df.to_csv(tmp, index=False)
        written += [pq_path, csv_path]
    full = {"version": __version__, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            **settings, "tables": sorted(tables)}
    atomic_write_json(out / "settings.json", full, sort_keys=True, default=_jsonable)
    written.append(out / "settings.json")
    return written
