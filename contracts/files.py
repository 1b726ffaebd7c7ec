"""Atomic writes: a reader (or a resumed run) never sees half a file.

Every writer goes through a temporary file in the same folder (``.<name>.tmp-<pid>``, so two processes never share
one) and ``os.replace``, which is atomic on POSIX; appends to a JSONL log flush and fsync each line, and a reader
of such a log repairs a half-written last line (``contracts.samples.repair``).
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

__all__ = ["temporary_path", "atomic_path", "atomic_write_text", "atomic_write_json", "atomic_write_jsonl",
           "append_jsonl", "append_jsonl_rows"]


def temporary_path(path: str | os.PathLike) -> Path:
    """The temporary sibling ``path`` is written to before the rename (hidden, per process)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path to write ``path`` through (any writer: parquet, safetensors, ``open``); it replaces
    ``path`` when the block ends without an exception and is removed when one is raised."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def atomic_write_json(path: str | os.PathLike, obj, *, indent: int | None = 2, sort_keys: bool = False,
                      default=None) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, default=default,
                                              ensure_ascii=False) + "\n")


def atomic_write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    """Rows as JSON lines, written whole or not at all."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return Path(path)


def append_jsonl(path: str | os.PathLike, obj: dict, *, fsync: bool = True) -> None:
    """Append one JSON line and flush it (and fsync: a crash right after still leaves the line on disk)."""
    append_jsonl_rows(path, [obj], fsync=fsync)


def append_jsonl_rows(path: str | os.PathLike, rows: Iterable[dict], *, fsync: bool = True) -> None:
    """Append JSON lines, one per row, with one flush and one fsync for all of them (a crash mid-way leaves at most
    one torn last line, which ``contracts.samples.repair`` cuts off)."""
    with open(path, "a", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        f.flush()
        if fsync:
            os.fsync(f.fileno())
