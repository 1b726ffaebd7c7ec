"""JSONL reading shared by the benchmark loaders and the samples reader: streamed, gzip when the name ends in
``.gz``, blank lines skipped, and every error names the file and the 1-based line."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Iterator


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; ValueError ``FILE:LINE: ...`` for malformed JSON or a line
    that is not a JSON object."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
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
