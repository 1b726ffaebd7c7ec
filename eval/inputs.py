"""What an evaluation reads and checks before any model is loaded: the benchmark's problems (and the data settings
every result line records), a user's samples file, and an existing results file's settings. The model's files and
context are checked where every entry point checks them, ``inference.hub`` (``resolve_checked_model``,
``check_context``).

Every failure is an ``EvalInputError`` whose message names the file (and line, or problem) and what to do; the
command line prints it as one line and exits 2, before anything is written for that input. A results file another
process is writing is one too (``results_lock``: one writer per results file, ``contracts.locks``), naming the
holder.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from contracts.jsonl import iter_jsonl
from contracts.locks import Lock, LockHeld, acquire, lock_file
from contracts.samples import check_settings, repair
from scoring.benchmarks.base import Benchmark, Problem
from scoring.benchmarks.protocol import generation_settings


__all__ = ["EvalInputError", "model_name", "fingerprint", "data_settings", "load_problems", "read_samples_input",
           "file_settings", "check_results_path", "results_lock", "prepare"]


class EvalInputError(ValueError):
    """An input is wrong: a malformed problems or samples file (the message names FILE:LINE), duplicate problem ids,
    a missing model, results written with other settings or other data. Raised before anything is written for
    that input; the command line exits with the message."""


def model_name(spec: str) -> str:
    """Folder name for a model: ``runs/x/checkpoints/step_000100`` -> ``x-step_000100``; a hub id
    ``Qwen/Qwen2.5-Math-7B`` -> ``Qwen__Qwen2.5-Math-7B``; otherwise the last path component."""
    p = Path(spec)
    if p.exists():
        parts = p.resolve().parts
        if re.fullmatch(r"step_\d+", parts[-1]) and len(parts) >= 3 and parts[-2] == "checkpoints":
            return f"{parts[-3]}-{parts[-1]}"
        return parts[-1]
    return spec.strip("/").replace("/", "__")


def fingerprint(problems: Sequence[Problem]) -> str:
    """sha256 of the problems as loaded (ids, question texts, gold): the data's version, whatever its source."""
    def stable(x):
        if isinstance(x, (set, frozenset)):
            return sorted(repr(v) for v in x)
        return repr(x)

    h = hashlib.sha256()
    for p in problems:
        h.update(json.dumps([p.id, p.question, p.gold], sort_keys=True, default=stable).encode("utf-8", "replace"))
        h.update(b"\n")
    return h.hexdigest()


def data_settings(bench: Benchmark, problems: Sequence[Problem], path, filters: dict) -> dict:
    """What every result line records of the data: the benchmark's own description (``Benchmark.describe``:
    files, release, dataset version...) or the path given, the problem count and a fingerprint (``sha256``)."""
    if bench.describe is not None:
        src = bench.describe(list(problems), path, **filters)
    else:
        src = {"path": str(Path(path).resolve()) if path is not None else None}
        if path is None:
            src["default"] = f"the benchmark's default source (THINKING_SEEDS_DATA={os.environ.get('THINKING_SEEDS_DATA')})"
    return {**src, "problems": len(problems), "sha256": fingerprint(problems)}


def load_problems(bench: Benchmark, problems, filters: dict) -> list[Problem]:
    """The benchmark's problems (from the file ``problems``, else its default source); loader errors (a malformed
    line names FILE:LINE) become EvalInputError, and duplicate problem ids are refused."""
    try:
        probs = bench.load(problems, **filters) if problems else bench.load(**filters)
    except (ValueError, OSError, RuntimeError) as e:
        raise EvalInputError(f"{bench.name}: {e}") from None
    seen, dup = set(), []
    for p in probs:
        if p.id in seen:
            dup.append(p.id)
        seen.add(p.id)
    if dup:
        raise EvalInputError(f"{bench.name}: duplicate problem ids {sorted(set(dup))[:5]} in "
                             f"{problems or 'the default data'}; every problem needs its own id")
    if not probs:   # nothing to score is an error, not an empty leaderboard
        chosen = ", ".join(f"{k}={v}" for k, v in filters.items() if v is not None)
        raise EvalInputError(f"{bench.name}: no problems in {problems or 'the default data'}"
                             + (f" with the selection {chosen}; widen the selection" if chosen else
                                "; give a problems file with at least one problem"))
    return probs


def read_samples_input(path: str | os.PathLike, problems: list[Problem]) -> dict[str, tuple[list[str], list | None]]:
    """``problem_id -> (responses, finish_reasons or None)`` from a user's samples file; every error names the
    file and line (malformed JSON, missing fields, unknown or repeated problem ids)."""
    path = Path(path)
    known = {p.id for p in problems}
    out: dict[str, tuple[list[str], list | None]] = {}
    for lineno, row in iter_jsonl(path):
        if "problem_id" not in row or "responses" not in row:
            raise ValueError(f"{path}:{lineno}: expected an object with 'problem_id' and 'responses'")
        pid = str(row["problem_id"])
        if pid not in known:
            raise ValueError(f"{path}:{lineno}: unknown problem_id {pid!r} for this benchmark "
                             f"(first known ids: {sorted(known)[:3]})")
        if pid in out:
            raise ValueError(f"{path}:{lineno}: problem_id {pid!r} appears twice")
        rs = row["responses"]
        if not isinstance(rs, list) or not rs or not all(isinstance(r, str) for r in rs):
            raise ValueError(f"{path}:{lineno}: 'responses' must be a non-empty list of strings")
        out[pid] = (rs, row.get("finish_reasons"))
    return out


def file_settings(bench: Benchmark, model_path: str, name: str, *, n, temperature, top_p, max_tokens, template,
                  seed, top_k=None, data: dict | None = None, engine: str | None = None, dtype: str | None = None
                  ) -> dict:
    """A generated result file's settings: the benchmark's generation defaults with the given values (not None)
    over them; ``top_k`` resolved (``contracts.sampling.resolve_top_k``: -1 is recorded as 0, off, which is also the
    default of a benchmark that names none). ``model_path``: what was scored (``ModelSource.identity``: the absolute
    folder, or ``owner/name@<commit>`` for a hub snapshot, so a resume with the same cached id matches). ``engine``
    and ``dtype``: the engine (hf, vllm) and the dtype the samples are generated in, resolved
    (``eval.parallel.generation_dtype``), not as asked ("auto")."""
    gen = generation_settings(bench, n=n, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
                              template=template)   # the one resolution, shared with the trainer's validation
    return {"model": name, "model_path": model_path, "benchmark": bench.name, "benchmark_version": bench.version,
            "n": gen["n"], "temperature": gen["temperature"], "top_p": gen["top_p"], "top_k": gen["top_k"],
            "max_tokens": gen["max_tokens"], "template": gen["template"], "seed": seed, "samples_file": None,
            "engine": engine,
            "dtype": dtype, "data": data}


def check_results_path(path: Path) -> None:
    """EvalInputError when the results file ``path`` cannot be one: its model folder is a file, or it is a folder."""
    if path.parent.exists() and not path.parent.is_dir():
        raise EvalInputError(f"{path.parent} is a file, not a results folder; move it away or choose another --out")
    if path.is_dir():
        raise EvalInputError(f"{path} is a folder, not a results file; move it away or choose another --out")


@contextmanager
def results_lock(path: Path) -> Iterator[Lock]:
    """The lock of the results file ``path`` for the block (``contracts.locks``: ``.<benchmark>.jsonl.lock`` beside
    it, made with its folders when missing and removed with them, when left empty, at the end): one ``eval.run``
    writes a results file at a time. EvalInputError naming the holder when another process writes it."""
    try:
        lock = acquire(lock_file(path), what=str(path), command="eval.run",
                       fix="wait for it to finish (or stop it), or write to another --out")
    except LockHeld as e:
        raise EvalInputError(str(e)) from None
    try:
        yield lock
    finally:
        lock.release()


def prepare(path: Path, problems: list[Problem], settings: dict) -> list[Problem]:
    """Repair the results file (a torn last line cut, a second row of a problem removed: ``contracts.samples.repair``;
    the caller holds the file's lock, ``results_lock``), check its settings and its data, return the problems still
    to do (nothing is created). EvalInputError for a corrupt file or one written with other settings or from other
    data."""
    check_results_path(path)
    try:
        done_rows = repair(path)
        check_settings(path, done_rows, settings)
    except ValueError as e:   # a corrupt results file (FILE:LINE), results written with other settings
        raise EvalInputError(str(e)) from None
    new = settings.get("data") or {}
    for row in done_rows:
        old = (row.get("settings") or {}).get("data")
        if isinstance(old, dict) and old.get("sha256") and new.get("sha256") and old["sha256"] != new["sha256"]:
            raise EvalInputError(
                f"{path} (problem {row.get('problem_id')!r}) was written from other data ({_data_line(old)}; this "
                f"run: {_data_line(new)}). Use a new --out directory, or delete the file to start over")
    done = {r["problem_id"] for r in done_rows}
    return [p for p in problems if p.id not in done]


def _data_line(d: dict) -> str:
    keep = {k: d[k] for k in ("selection", "release", "path", "problems") if d.get(k) is not None}
    return ", ".join(f"{k} {v}" for k, v in keep.items()) + f", sha256 {str(d.get('sha256'))[:12]}"
