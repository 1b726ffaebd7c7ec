"""Rollout records: the one place that defines the per-response Parquet schema (docs/architecture.md).

The trainer writes ``runs/<run>/rollouts/step_NNNNNN.parquet`` every step; ``tsanalysis`` reads them back with
``read_rollouts`` / ``iter_rollout_batches``, which validate the schema so that dumps converted from other
trainers fail early with the column named.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

_f32 = pa.list_(pa.float32())
_i32 = pa.list_(pa.int32())
_bool = pa.list_(pa.bool_())

ROLLOUT_SCHEMA = pa.schema([
    ("run", pa.string()),
    ("step", pa.int64()),
    ("prompt_id", pa.string()),
    ("sample_idx", pa.int32()),
    ("variant", pa.string()),            # on_policy | seed | luffy_off | stale
    ("seed_step", pa.int64()),           # nullable: step of the policy that wrote the seed
    ("seed_len", pa.int32()),            # seed tokens at the start of the response (0 if none)
    ("trunc_rule", pa.string()),         # nullable: ratio | entropy | adaptive
    ("trunc_token_id", pa.int32()),      # nullable: the cached token at the cut
    ("trunc_token_text", pa.string()),   # nullable
    ("prompt_ids", _i32),
    ("response_ids", _i32),
    ("response_text", pa.string()),
    ("reward", pa.float32()),
    ("correct", pa.bool_()),             # the grader's verdict (pass), unshaped by overlong penalties
    ("verdict", pa.string()),            # what the grader said (scoring.verdict); grader_error/timeout: ungraded
    ("advantage", pa.float32()),
    ("logp_old", _f32),
    ("logp_behavior", _f32),             # nullable; NaN on non-seed tokens
    ("entropy", _f32),
    ("ratio", _f32),
    ("clipped_low", _bool),
    ("clipped_high", _bool),
    ("loss_mask", _bool),
    ("finish_reason", pa.string()),      # stop | length
    ("source_len", pa.int32()),          # nullable: seed rows, tokens of the cached response the seed was cut from
    ("source_correct", pa.bool_()),      # nullable: seed rows, the grader's verdict on that whole cached response
])
COLUMNS = tuple(ROLLOUT_SCHEMA.names)
# columns added after the first release: a file written without them still reads
OPTIONAL = ("verdict", "source_len", "source_correct")
PER_TOKEN = ("logp_old", "logp_behavior", "entropy", "ratio", "clipped_low", "clipped_high", "loss_mask")
VARIANTS = ("on_policy", "seed", "luffy_off", "stale")
_STEP_RE = re.compile(r"^step_(\d+)\.parquet$")


class RecordsError(ValueError):
    """A rollout file or run directory does not match the schema."""


def rollout_path(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / "rollouts" / f"step_{step:06d}.parquet"


def write_rollouts(rows: Sequence[dict], path: str | os.PathLike) -> None:
    """Write one step's rows atomically (temporary name, then rename)."""
    table = pa.Table.from_pylist(list(rows), schema=ROLLOUT_SCHEMA)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def validate_schema(schema: pa.Schema, source: str, columns: Sequence[str] | None = None) -> None:
    """Check that ``schema`` holds the needed columns with compatible types; name the file and column."""
    needed = [c for c in COLUMNS if c not in OPTIONAL] if columns is None else columns
    for name in needed:
        if name not in ROLLOUT_SCHEMA.names:
            raise RecordsError(f"{source}: unknown rollout column '{name}' requested")
        idx = schema.get_field_index(name)
        if idx < 0:
            raise RecordsError(f"{source}: missing column '{name}' (rollout schema: docs/architecture.md)")
        want, got = ROLLOUT_SCHEMA.field(name).type, schema.field(idx).type
        if not _compatible(want, got):
            raise RecordsError(f"{source}: column '{name}' has type {got}, expected {want}")


def _compatible(want: pa.DataType, got: pa.DataType) -> bool:
    if want == got or got == pa.null():
        return True
    if pa.types.is_list(want) or pa.types.is_large_list(want):
        return (pa.types.is_list(got) or pa.types.is_large_list(got)) and _compatible(want.value_type, got.value_type)
    numeric = (pa.types.is_integer, pa.types.is_floating)
    return any(f(want) and f(got) for f in numeric) or (pa.types.is_string(want) and pa.types.is_large_string(got))


def list_steps(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) for every rollout file of a run, sorted by step; a clear error for a bad directory."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RecordsError(f"run directory '{run_dir}' does not exist")
    roll = run_dir / "rollouts"
    if not roll.is_dir():
        raise RecordsError(f"'{run_dir}' has no rollouts/ folder: is it a run directory written by trainer.train?")
    steps = sorted((int(m.group(1)), p) for p in roll.iterdir() if (m := _STEP_RE.match(p.name)))
    if not steps:
        raise RecordsError(f"'{roll}' holds no step_NNNNNN.parquet files")
    return steps


def _select(steps: list[tuple[int, Path]], step_range: tuple[int | None, int | None] | None):
    if step_range is None:
        return steps
    lo, hi = step_range
    return [(s, p) for s, p in steps if (lo is None or s >= lo) and (hi is None or s < hi)]


def iter_rollout_batches(run_dir: str | os.PathLike, *, columns: Sequence[str] | None = None,
                         steps: tuple[int | None, int | None] | None = None,
                         batch_size: int = 4096) -> Iterator[pa.RecordBatch]:
    """Stream record batches over a run's rollout files (bounded memory); ``steps`` is a half-open [a, b)."""
    for _, path in _select(list_steps(run_dir), steps):
        yield from iter_file_batches(path, columns=columns, batch_size=batch_size)


def iter_file_batches(path: str | os.PathLike, *, columns: Sequence[str] | None = None,
                      batch_size: int = 4096) -> Iterator[pa.RecordBatch]:
    """Stream record batches of one rollout file, after checking its schema (errors name the file)."""
    pf = pq.ParquetFile(path)
    validate_schema(pf.schema_arrow, str(path), columns)
    yield from pf.iter_batches(batch_size=batch_size, columns=list(columns) if columns else None)


def read_rollouts(run_dir: str | os.PathLike, *, columns: Sequence[str] | None = None,
                  steps: tuple[int | None, int | None] | None = None) -> pa.Table:
    """Read (a column subset of) a run's rollouts into one table."""
    batches = list(iter_rollout_batches(run_dir, columns=columns, steps=steps))
    if not batches:
        raise RecordsError(f"no rollout rows in '{run_dir}' for steps {steps}")
    return pa.Table.from_batches(batches)


def parse_step_range(text: str | None) -> tuple[int | None, int | None] | None:
    """'a:b' → (a, b) half-open; 'a:' or ':b' leave a side open; None → all steps."""
    if text is None or text == "":
        return None
    if ":" not in text:
        s = int(text)
        return (s, s + 1)
    lo, hi = text.split(":", 1)
    try:
        return (int(lo) if lo else None, int(hi) if hi else None)
    except ValueError:
        raise ValueError(f"--steps expects 'a:b' with integers, got '{text}'") from None
