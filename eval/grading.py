"""Grading a benchmark's responses in batches (``grade_responses``, defined in ``scoring.benchmarks.protocol``, the
protocol the trainer's validation shares), grading again what an earlier run could not, and the disagreements file.

The batches go through the one batch grader, ``scoring.grading.grade_batch``. Math answers are graded by math-verify
(the score) in a process pool with a hard per-item timeout (``scoring.grading.GRADE_TIMEOUT_S`` unless
``--grade-timeout``), and cross-checked by the Qwen-style grader (``scoring.qwen``); the samples where the two
disagree are rewritten to ``<benchmark>.disagreements.jsonl`` beside the sample file. Code is graded in worker
processes with a hard limit per sample (``scoring.benchmarks.protocol.CODE_GRADE_TIMEOUT_S``; each sandbox call is
its own isolated subprocess with its own limits); task rewards are instantaneous, in this process. A grader that
fails (its worker died or overran the limit, its sandbox could not start, it raised) gives the ``timeout`` or
``grader_error`` verdict, never a score (``scoring.benchmarks.base.UNGRADED_VERDICTS``); ``regrade`` grades those
again from the responses stored in the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from contracts.files import atomic_write_jsonl
from contracts.samples import read_samples
from scoring.benchmarks.base import UNGRADED_VERDICTS, Benchmark, Problem
from scoring.benchmarks.protocol import grade_responses   # its one home, shared with the trainer's validation
from scoring.qwen import disagreements

__all__ = ["grade_responses", "regrade", "write_disagreements"]

Log = Callable[[str], None]


def regrade(path: Path, bench: Benchmark, problems: list[Problem], pool, log: Log) -> int:
    """Grade again the samples an earlier run could not grade (``UNGRADED_VERDICTS``), from the responses stored
    in the file, and rewrite it (atomically). Returns how many samples were graded again."""
    if not path.is_file():
        return 0
    rows = read_samples(path)
    by_id = {p.id: p for p in problems}
    where = [(ri, [si for si, v in enumerate(r.get("verdicts") or []) if v in UNGRADED_VERDICTS])
             for ri, r in enumerate(rows) if str(r["problem_id"]) in by_id]
    where = [(ri, sis) for ri, sis in where if sis]
    if not where:
        return 0
    probs = [by_id[str(rows[ri]["problem_id"])] for ri, _ in where]
    responses = [[rows[ri]["responses"][si] for si in sis] for ri, sis in where]
    verdicts, qwen, _ = grade_responses(bench, probs, responses, pool=pool)
    for k, (ri, sis) in enumerate(where):
        row = rows[ri]
        for j, si in enumerate(sis):
            v = verdicts[k][j]
            row["verdicts"][si], row["correct"][si], row["answers"][si] = v.verdict, bool(v.correct), v.answer
            if qwen is not None and "correct_qwen" in row:
                row["correct_qwen"][si] = bool(qwen[k][j])
    atomic_write_jsonl(path, rows)
    n = sum(len(sis) for _, sis in where)
    left = sum(v.verdict in UNGRADED_VERDICTS for vs in verdicts for v in vs)
    log(f"{bench.name}: graded again {n} samples an earlier run could not grade ({left} still not graded)")
    return n


def write_disagreements(path: Path) -> tuple[float, int] | None:
    """Rewrite ``<benchmark>.disagreements.jsonl`` from a math sample file; (rate, rows) or None (not math)."""
    rows = read_samples(path)
    if not rows or "correct_qwen" not in rows[0]:
        return None
    rate, dis = disagreements(rows)
    atomic_write_jsonl(path.with_name(path.stem + ".disagreements.jsonl"), dis)
    return rate, len(dis)
