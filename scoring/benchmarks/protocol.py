"""The scoring protocol ``eval.run`` and the trainer's validation share, so that validating a checkpoint during
training gives exactly the scores ``python -m eval.run --model <that checkpoint>`` gives with the same settings.

- ``generation_settings``: a benchmark's generation defaults (``Benchmark.generation``, ``default_template``) with
  the settings given (not None) over them: what "the benchmark's default" means everywhere;
- ``encode_prompts``: a problem's prompt text (``scoring.templates.render_prompt``) and its token ids
  (``tokenizer(text, add_special_tokens=False)``, the one tokenization rule, docs/architecture.md);
- ``sample_seed``: sample j of a problem draws from its own seed, a function of the run's seed, the benchmark, the
  problem id and j, so the samples do not depend on chunking, on how many engines or ranks share the problems, or on
  which process draws them;
- ``grade_responses``: the batch grading of a benchmark's responses (``scoring.grading.grade_batch``: math-verify in
  a process pool with its hard per-item limit plus the Qwen-style cross-check, code in worker processes with a hard
  per-sample limit, ``CODE_GRADE_TIMEOUT_S``, tasks inline);
- ``graded_counts`` and ``scores``: samples a grader could not grade (``UNGRADED_VERDICTS``) are counted and left
  out, never scored; avg@n and pass@k over what is left (``contracts.passk``).

No torch and no file IO here: the callers generate, write and log.
"""

from __future__ import annotations

import atexit
import threading
import zlib
from typing import Sequence

import numpy as np

from contracts.passk import avg_at_n, k_grid, pass_at_k
from contracts.sampling import TOP_K_OFF, resolve_top_k
from scoring.benchmarks.base import UNGRADED_VERDICTS, Benchmark, Problem, Verdict
from scoring.grading import grade_batch
from scoring.math import extract_answer
from scoring.pool import WorkerPool, apply, qwen_verdict
from scoring.templates import render_prompt

__all__ = ["CODE_GRADE_TIMEOUT_S", "GENERATION_KEYS", "SAMPLE_KEYS", "generation_settings", "encode_prompts",
           "sample_seed", "grade_responses", "graded_indices", "graded_row", "graded_counts", "scores"]

GENERATION_KEYS = ("n", "temperature", "top_p", "top_k", "max_tokens")

# The hard limit on grading one code response, a backstop: the sandbox limits each program itself, and the grader's
# own work on what a program wrote is bounded (scoring.sandbox.host.parse_json, protocol.decode_tagged); this limit
# catches whatever is left (a grader bug, a sandbox that never returns), so a sample can be ungraded but nothing
# hangs. It sits above the longest legitimate grade: EvalPlus ~900 s (its canonical solution's 600 s, then two
# parts and two checks of ~60 s each), LiveCodeBench (6 + 1) s x tests + 22 s, i.e. up to ~500 tests.
CODE_GRADE_TIMEOUT_S = 3600.0


def generation_settings(bench: Benchmark, *, n: int | None = None, temperature: float | None = None,
                        top_p: float | None = None, top_k: int | None = None, max_tokens: int | None = None,
                        template: str | None = None) -> dict:
    """``{"n", "temperature", "top_p", "top_k", "max_tokens", "template"}``: the benchmark's defaults (math: 32
    samples at temperature 0.6, top-p 0.95, 4096 tokens, template qwen-math; the embedded tasks: 8 at 1.0, 64 tokens,
    raw; top-k off where a benchmark names none) with every value given (not None) over them; ``top_k`` resolved
    (``contracts.sampling.resolve_top_k``: -1 is recorded as 0, off)."""
    out = {"top_k": TOP_K_OFF, **bench.generation}
    for key, val in zip(GENERATION_KEYS, (n, temperature, top_p, top_k, max_tokens)):
        if val is not None:
            out[key] = val
    out["top_k"] = resolve_top_k(out["top_k"])
    return {**{k: out[k] for k in GENERATION_KEYS}, "template": template or bench.default_template}


def encode_prompts(template: str, problems: Sequence[Problem], tokenizer) -> tuple[list[str], list[list[int]]]:
    """Each problem's prompt text and its token ids (no special tokens added: the template spells them out)."""
    texts = [render_prompt(template, p.question, tokenizer) for p in problems]
    return texts, [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def sample_seed(seed: int, bench_name: str, problem_id: str, j: int) -> int:
    """The sampling seed of sample ``j`` of problem ``problem_id`` (CRC-32 of ``"seed:benchmark:id:j"``)."""
    return zlib.crc32(f"{seed}:{bench_name}:{problem_id}:{j}".encode())


def grade_responses(bench: Benchmark, problems: Sequence[Problem], responses: Sequence[Sequence[str]], *,
                    pool=None, progress: bool = False, code_timeout_s: float = CODE_GRADE_TIMEOUT_S
                    ) -> tuple[list[list[Verdict]], list[list[bool]] | None, int]:
    """Verdicts per problem and sample; for math also the Qwen-style verdicts and the number of timeouts.

    One ``scoring.grading.grade_batch`` call per batch: math in ``pool`` (a ``scoring.pool.WorkerPool(apply)``
    with the hard per-item timeout; one with ``GRADE_TIMEOUT_S`` is made and closed when None), the score and the
    cross-check of every sample in one pass; code in a pool of worker processes kept between batches, each sample
    killed past ``code_timeout_s`` (its ``timeout``: a grader that cannot finish never hangs the run, and a thread
    could not be stopped); task rewards in this process. A grader's failure is already the sample's ``timeout`` /
    ``grader_error`` verdict there; a failed cross-check counts as not correct.
    """
    sizes = [len(rs) for rs in responses]
    if bench.kind == "task":
        flat = grade_batch(bench.grade, [(r, p) for p, rs in zip(problems, responses) for r in rs], mode="inline",
                           progress=progress, desc=f"grade {bench.name}")
        return _per_problem(flat, sizes), None, 0
    if bench.kind == "code":
        items = [(bench.grade, r, p) for p, rs in zip(problems, responses) for r in rs]
        with _CODE_LOCK:
            flat = grade_batch(apply, items, mode="process", pool=_code_pool(code_timeout_s), progress=progress,
                               desc=f"grade {bench.name}")
        return _per_problem(flat, sizes), None, 0
    items = []
    for p, rs in zip(problems, responses):
        multi, unit = bool(p.meta.get("multiple_answer", False)), p.meta.get("unit")
        for r in rs:
            items.append((bench.grade, r, p))                                   # math-verify: the score
            items.append((qwen_verdict, r, p.gold, multi, unit, bench.name))    # the Qwen-style cross-check
    got = grade_batch(apply, items, mode="process", pool=pool, answer_of=lambda it: extract_answer(it[1]),
                      progress=progress, desc=f"grade {bench.name}")
    verdicts = got[0::2]
    timeouts = sum(v.verdict == "timeout" for v in verdicts)
    return _per_problem(verdicts, sizes), _per_problem([bool(v.correct) for v in got[1::2]], sizes), timeouts


_CODE_POOL: WorkerPool | None = None
_CODE_LOCK = threading.Lock()   # one batch at a time through the shared pool


def _code_pool(timeout_s: float) -> WorkerPool:
    """The code graders' pool, kept between batches (its workers keep their caches: EvalPlus's expected outputs, the
    sandbox's probe); made again when the limit changes; closed at exit."""
    global _CODE_POOL
    if _CODE_POOL is None or _CODE_POOL.timeout != float(timeout_s):
        if _CODE_POOL is not None:
            _CODE_POOL.close()
        _CODE_POOL = WorkerPool(apply, timeout=timeout_s)
        atexit.register(_CODE_POOL.close)
    return _CODE_POOL


def _per_problem(flat: list, sizes: list[int]) -> list[list]:
    out, i = [], 0
    for k in sizes:
        out.append(flat[i:i + k])
        i += k
    return out


def graded_indices(verdicts: Sequence[str | None]) -> list[int]:
    """The samples a grader graded: every index whose verdict is not in ``UNGRADED_VERDICTS`` (the one rule by which
    eval's reports, the leaderboard, validation and ``tsanalysis support`` leave a sample out, never a score)."""
    return [i for i, v in enumerate(verdicts) if v not in UNGRADED_VERDICTS]


# a results line's per-sample lists, kept aligned when ungraded samples are left out
SAMPLE_KEYS = ("responses", "answers", "verdicts", "correct", "finish_reasons", "correct_qwen")


def graded_row(row: dict) -> dict | None:
    """A results line with only its graded samples (``graded_indices``), every per-sample list kept aligned; the
    row itself when all are graded, None when none is."""
    verdicts = row.get("verdicts") or [None] * len(row["correct"])
    keep = graded_indices(verdicts)
    if len(keep) == len(row["correct"]):
        return row
    if not keep:
        return None
    out = dict(row)
    for key in SAMPLE_KEYS:
        if isinstance(row.get(key), list) and len(row[key]) == len(row["correct"]):
            out[key] = [row[key][i] for i in keep]
    return out


def graded_counts(verdicts: Sequence[Sequence[str]], correct: Sequence[Sequence[bool]]
                  ) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(graded samples per problem, correct among them, ungraded samples, problems left with none graded) for the
    problems that kept at least one graded sample (``graded_indices``)."""
    n, c, ungraded, empty = [], [], 0, 0
    for vs, cs in zip(verdicts, correct):
        keep = [bool(cs[i]) for i in graded_indices(vs)]
        ungraded += len(cs) - len(keep)
        if not keep:
            empty += 1
            continue
        n.append(len(keep))
        c.append(sum(keep))
    return np.array(n, dtype=np.int64), np.array(c, dtype=np.int64), ungraded, empty


def scores(verdicts: Sequence[Sequence[str]], correct: Sequence[Sequence[bool]]) -> dict:
    """One benchmark's scores from its samples' verdicts: ``{"problems", "n_min", "avg", "pass": {k: value},
    "ungraded", "ungraded_problems"}``. ``avg`` is avg@n, the mean over problems of c_i / n_i (graded samples only);
    ``pass`` the unbiased pass@k for every k of ``k_grid(n_min)`` (none is defined beyond the fewest graded samples
    of a problem). With no graded sample at all, ``avg`` is NaN and ``pass`` empty."""
    n, c, ungraded, empty = graded_counts(verdicts, correct)
    out = {"problems": int(n.size), "n_min": int(n.min()) if n.size else 0, "avg": float("nan"), "pass": {},
           "ungraded": ungraded, "ungraded_problems": empty}
    if n.size:
        out["avg"] = float(avg_at_n(n, c).mean())
        out["pass"] = {k: float(pass_at_k(n, c, k).mean()) for k in k_grid(int(n.min()))}
    return out
