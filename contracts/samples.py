"""The sample file: ``results/eval/<model>/<benchmark>.jsonl``, written by ``eval.run`` (and, in the same layout,
by the trainer's validation), read by ``eval`` (the leaderboard, the report, regrading), ``tsanalysis`` (support,
and a relay folder's ``results.jsonl`` through the same reader) and the demo. Its fields, its row writer and its
reader live here, below all of them, so a reader never imports the writer's package.

One JSON line per problem (docs/architecture.md; ``FIELDS``): ``problem_id``, ``prompt``, ``gold``, ``responses``
(n strings), ``answers`` (extracted), ``verdicts``, ``correct`` (list of bool), ``finish_reasons``, ``settings``;
math benchmarks add ``correct_qwen`` (the Qwen-style grader's verdicts, for the disagreement report).

Lines are appended and flushed one problem at a time, so a crash loses at most the line being written. On
reading, a last line without its newline or not parseable as JSON is such a half-written line: ``repair``
cuts the file back to the last complete line. A malformed line anywhere else is corruption and raises. Appending
to a file whose lines were written with other settings is refused (``check_settings``, through the one
"written with other settings" check, ``contracts.settings``).

Every reader keys samples by (problem, sample): sample j of a problem is the j-th entry of its row, so a row is
the key (``problem_id``) of its n samples and a second row of the same problem repeats all n keys. Such a row (two
writers appended the same problems, before ``eval.run`` took a lock per results file, ``contracts.locks``) is
dropped with a warning that names the file and the lines: each problem counts once, from its first line (a file's
lines share their settings, checked on every append, so the first is as good a draw as the second; counting both
would weigh the problem twice and shrink the bootstrap intervals over a P that is not the number of problems). Not
an error: one damaged file should not keep a leaderboard of everything else from being written, and the next
``eval.run`` of that model and benchmark removes the duplicates from the file (``repair``, run by the writer that
holds the file's lock).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Callable

from contracts.files import atomic_write_jsonl
from contracts.settings import check_settings as check_recorded

__all__ = ["FIELDS", "OPTIONAL_FIELDS", "CHECKED_SETTINGS", "GENERATION_SETTINGS", "read_samples", "repair",
           "unique_rows", "append_row", "make_row", "check_settings"]

Warn = Callable[[str], None]


def warn_stderr(message: str) -> None:
    """The default of every reader's ``warn``: ``warning: <message>`` on stderr."""
    print(f"warning: {message}", file=sys.stderr, flush=True)

# the fields of every line, in the order make_row writes them; OPTIONAL_FIELDS: those only some lines carry
FIELDS = ("problem_id", "prompt", "gold", "responses", "answers", "verdicts", "correct", "finish_reasons", "settings")
OPTIONAL_FIELDS = ("correct_qwen",)   # math benchmarks: the Qwen-style cross-check's verdicts

# settings that must match for new lines to be appended to an existing file (timing may differ)
CHECKED_SETTINGS = ("model", "model_path", "benchmark", "benchmark_version", "n", "temperature", "top_p", "top_k",
                    "max_tokens", "template", "seed", "samples_file")
# how the samples were generated (the resolved engine, hf or vllm, and its dtype; None for a --samples file): one
# file holds one engine's samples in one precision. Lines written before these were recorded say nothing about
# them; they are taken to match this run (defaults: this run's values), since refusing them could be wrong.
GENERATION_SETTINGS = ("engine", "dtype")


def _scan(path: Path) -> tuple[list[dict], int, bool, list[int]]:
    """(rows, byte offset just after the last complete good line, whether a partial last line was found, the
    1-based line of each row)."""
    data = path.read_bytes()
    rows, offset, lineno, lines = [], 0, 0, []
    while offset < len(data):
        end = data.find(b"\n", offset)
        lineno += 1
        last = end < 0 or data[end + 1:].strip() == b""
        chunk = data[offset:] if end < 0 else data[offset:end]
        if not chunk.strip():
            if end < 0:
                break
            offset = end + 1
            continue
        try:
            row = json.loads(chunk)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            if last:   # a line cut by a crash: drop it
                return rows, offset, True, lines
            raise ValueError(f"{path}:{lineno}: malformed sample line ({e}); the file is corrupt — delete it "
                             f"or choose a new --out") from None
        if end < 0:    # complete JSON but no newline: the crash hit between the object and its newline
            return rows, offset, True, lines
        rows.append(row)
        lines.append(lineno)
        offset = end + 1
    return rows, offset, False, lines


def _key(row: dict) -> tuple[str, object] | None:
    """A row's key: (problem id, its ``sample`` index) for a row of one sample (a disagreements file's), (problem id,
    None) for a row that holds all of a problem's samples; None for a row without a problem id (its reader refuses
    it)."""
    if "problem_id" not in row:
        return None
    return str(row["problem_id"]), row.get("sample")


def unique_rows(path: str | os.PathLike, rows: list[dict], lines: list[int]) -> tuple[list[dict], str | None]:
    """(the rows with each key's first line only, None or the warning naming the file and the lines dropped). A row
    is keyed by (problem, sample) (``_key``): a second row of a problem repeats the keys of all its samples."""
    first: dict[tuple, int] = {}
    kept, dropped = [], []
    for row, line in zip(rows, lines, strict=True):
        key = _key(row)
        if key is None:
            kept.append(row)
        elif key in first:
            dropped.append((key, line, first[key]))
        else:
            first[key] = line
            kept.append(row)
    if not dropped:
        return rows, None
    (pid, sample), line, at = dropped[0]
    what = f"problem {pid!r}" + (f" sample {sample}" if sample is not None else "")
    more = f" and {len(dropped) - 1} more (lines {', '.join(str(x[1]) for x in dropped[1:6])}" + (
        ", ..." if len(dropped) > 6 else "") + ")" if len(dropped) > 1 else ""
    return kept, (f"{path}: {len(dropped)} duplicate row{'s' if len(dropped) > 1 else ''} of problems already in "
                  f"the file, dropped (each problem counts once, from its first line): {what} at line {line}, first "
                  f"at line {at}{more}; two writers appended the same problems")


def read_samples(path: str | os.PathLike, *, warn: Warn = warn_stderr) -> list[dict]:
    """Complete rows of a sample file, one per problem (a half-written last line is ignored; a second row of a
    problem is dropped and ``warn`` gets one line naming the file and the lines: ``unique_rows``). The file is not
    modified."""
    path = Path(path)
    rows, _, _, lines = _scan(path)
    rows, why = unique_rows(path, rows, lines)
    if why is not None:
        warn(f"{why}; the next eval.run of this model and benchmark on this folder removes them from the file")
    return rows


def repair(path: str | os.PathLike, *, warn: Warn = warn_stderr) -> list[dict]:
    """Rows of a sample file, one per problem, cutting a half-written last line off the file so appends start
    clean, and removing a second row of a problem from the file (rewritten atomically; ``warn`` gets the line).
    Only the file's writer calls it, holding the file's lock (``contracts.locks``)."""
    path = Path(path)
    if not path.exists():
        return []
    rows, offset, partial, lines = _scan(path)
    if partial or offset != path.stat().st_size:
        with open(path, "r+b") as f:
            f.truncate(offset)
    kept, why = unique_rows(path, rows, lines)
    if why is not None:
        atomic_write_jsonl(path, kept)
        warn(f"{why}; removed from the file")
    return kept


def append_row(f, row: dict) -> None:
    """Write one problem's line and flush it (``f`` opened in text append mode)."""
    f.write(json.dumps(row, ensure_ascii=False) + "\n")
    f.flush()


def _added_defaults(have: dict) -> dict:
    """What a sampling setting recorded only from a later version stands for in a line without it: ``top_k`` was
    off (0) for every line generated here before it was recorded (those lines record a temperature), and None for a
    graded ``--samples`` line (its temperature is None too)."""
    return {"top_k": 0 if have.get("temperature") is not None else None}


def check_settings(path: str | os.PathLike, rows: list[dict], settings: dict) -> None:
    """``contracts.settings.SettingsMismatch`` (a ValueError) naming the file, the first problem whose line was
    written with other settings and each differing field (``CHECKED_SETTINGS``, then ``GENERATION_SETTINGS``), when
    there is one."""
    for row in rows:
        have, where = row.get("settings") or {}, f"{path} (problem {row.get('problem_id')!r})"
        check_recorded(have, settings, CHECKED_SETTINGS, where=where, defaults=_added_defaults(have),
                       fix="use a new --out directory, or delete the file to start over")
        old = {k: have.get(k, settings.get(k)) for k in GENERATION_SETTINGS}
        check_recorded(have, settings, GENERATION_SETTINGS, where=where,
                       defaults={k: settings.get(k) for k in GENERATION_SETTINGS},
                       fix=f"its samples would mix engines or precisions: use another --out, or the file's engine "
                           f"and dtype (--engine {old['engine']} --dtype {old['dtype']})")


def make_row(problem, prompt: str, responses, verdicts, qwen, finish, settings: dict) -> dict:
    """One problem's line: its responses with their verdicts (``qwen``: the cross-check's, math only; ``finish``:
    the finish reasons, None for completions produced elsewhere without them) and the run's settings.
    ``problem``: a ``scoring.benchmarks.base.Problem`` (its ``id`` and ``gold`` are read); ``verdicts``: its
    ``Verdict`` objects (``answer``, ``verdict``, ``correct``), one per response."""
    row = {"problem_id": problem.id, "prompt": prompt, "gold": _gold_for_file(problem.gold),
           "responses": list(responses), "answers": [v.answer for v in verdicts],
           "verdicts": [v.verdict for v in verdicts], "correct": [bool(v.correct) for v in verdicts],
           "finish_reasons": list(finish) if finish is not None else None, "settings": settings}
    if qwen is not None:
        row["correct_qwen"] = list(qwen)
    return row


def _gold_for_file(gold):
    """The gold as stored in the samples file: JSON values up to 2,000 characters (code test suites are omitted)."""
    try:
        text = json.dumps(gold)
    except (TypeError, ValueError):
        return None
    return gold if len(text) <= 2000 else None
