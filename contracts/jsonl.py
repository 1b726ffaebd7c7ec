"""JSONL reading shared by the benchmark loaders, the trainer's data and the samples reader: streamed, gzip when the
name ends in ``.gz``, blank lines skipped, and every error names the file and the 1-based line. ``read_rows`` also
takes a JSON array of objects (a problems or training data file may be either) and says where each row is."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Iterator, NamedTuple


def _open(path: Path):
    return (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8")


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; ValueError ``FILE:LINE: ...`` for malformed JSON or a line
    that is not a JSON object."""
    path = Path(path)
    with _open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: malformed JSON line ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every object of a JSONL file (``iter_jsonl``'s errors: FILE:LINE)."""
    return [row for _, row in iter_jsonl(path)]


class Located(NamedTuple):
    """A row of a data file and where it is."""

    where: str     # FILE:LINE (1-based line of a JSONL file, blank lines counted), or FILE[i] for an array's item i
    number: int    # the 1-based line of a JSONL row, the 1-based position of an array's item
    row: dict


def _is_array(path: Path) -> bool:
    """Whether the file's first non-blank character is ``[`` (read a block at a time: files can be large)."""
    with _open(path) as f:
        while chunk := f.read(1 << 16):
            head = chunk.lstrip()
            if head:
                return head[0] == "["
    return False


def read_rows(path: str | os.PathLike, *, what: str = "file") -> list[Located]:
    """Every row of a JSONL file, or of a file holding one JSON array of objects (its first non-blank character is
    ``[``, whatever its name), with where each row is (``Located``); gzip when the name ends in ``.gz``.

    FileNotFoundError ``<what> FILE does not exist``; ValueError naming the file and line for malformed JSON
    (``FILE:LINE: malformed JSON line (...)`` in JSONL, ``FILE:LINE: malformed JSON (...)`` in an array) and for a
    row that is not a JSON object (``FILE:LINE: expected a JSON object, got list``, ``FILE[i]: expected a JSON array
    of objects, got str``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    if not _is_array(path):
        return [Located(f"{path}:{lineno}", lineno, row) for lineno, row in iter_jsonl(path)]
    with _open(path) as f:
        try:
            rows = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: malformed JSON ({e.msg} at column {e.colno})") from None
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise ValueError(f"{path}[{bad}]: expected a JSON array of objects, got {type(rows[bad]).__name__}")
    return [Located(f"{path}[{i}]", i + 1, row) for i, row in enumerate(rows)]
