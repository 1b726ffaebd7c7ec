"""Score checkpoints on benchmarks: ``python -m eval.run --model PATH_OR_ID --benchmarks aime24,math500 ...``

For every model and benchmark: render each problem with the prompt template, sample n completions per problem
(``inference``; one completion per prompt, the prompt repeated n times), decode, grade, and append one line
per problem to ``<out>/<model>/<benchmark>.jsonl`` (format: ``eval.samples``). Problems already in the file are
skipped, so an interrupted run resumes where it stopped; a file written with other settings is an error.
Math answers are graded by math-verify in a process pool with a hard per-item timeout, and cross-checked by the
Qwen-style grader (disagreements go to ``<benchmark>.disagreements.jsonl``). At the end the leaderboard of
everything under ``--out`` is printed and written (``eval.leaderboard``).

Library: ``run_eval(models, benchmarks, out=..., ...)`` does all of that and RETURNS the per-model, per-benchmark
reports (``format_report`` renders one as the line the command prints) and the leaderboard; ``main`` is the
command line over it (argument parsing, printing).

``--samples FILE`` grades completions produced elsewhere (JSON lines ``{"problem_id": ..., "responses": [...]}``;
``--model`` is then only the name). ``--lm-eval-tasks`` also runs lm-evaluation-harness tasks
(``eval.lm_eval_bridge``); their main metric joins the same leaderboard.

Generation defaults are the benchmark's (math: n=32, temperature 0.6, top-p 0.95, 4096 new tokens, template
qwen-math; tasks: n=8, temperature 1.0, 64 tokens, template raw); each flag overrides them for all benchmarks.
Generation is seeded per chunk of problems from ``--seed`` and the chunk's problem ids.

Every result line's settings record the data (``settings["data"]``: the benchmark's ``describe`` — files, release,
dates, dataset version or hash — the problem count and a sha256 fingerprint of the problems); a resumed file must
have the same. ``--lcb-release``, ``--lcb-start-date``, ``--lcb-end-date`` select LiveCodeBench's problems.

Samples that could not be graded (``grader_error``: the grader crashed, its sandbox could not run; ``timeout``:
math-verify's hard limit) are never scored: they are kept in the files with that verdict, counted in the report
and the leaderboard, excluded from every score, and graded again by the next run over the same file. When any
remain, ``run_eval`` does not write the leaderboard and the command exits 3, unless ``--allow-ungraded``.
Bad input (a malformed file, an unknown id, a missing model) ends the command with a message naming the file and
line, exit status 1, before anything is written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
import zlib
from pathlib import Path
from typing import Callable, Sequence

from eval.benchmarks import BENCHMARKS, get_benchmark
from eval.benchmarks.base import GRADER_ERROR, UNGRADED_VERDICTS, Benchmark, Problem, Verdict
from contracts.jsonl import iter_jsonl
from eval.leaderboard import graded_rows
from eval.samples import append_row, check_settings, read_samples, repair
from scoring.templates import TEMPLATES, render_prompt

__all__ = ["EvalUsageError", "EvalInputError", "EXIT_INPUT_ERROR", "EXIT_UNGRADED", "run_eval", "format_report",
           "main", "model_name", "grade_responses", "evaluate_samples", "evaluate_model", "data_settings",
           "check_model"]

GRADE_TIMEOUT_S = 10.0   # hard per-item limit for math grading (math-verify takes ~2 ms on normal answers)

Log = Callable[[str], None]


EXIT_INPUT_ERROR = 1   # usage or input error: a message, no traceback, nothing written
EXIT_UNGRADED = 3      # everything ran, but some samples could not be graded (see --allow-ungraded)


class EvalUsageError(ValueError):
    """``run_eval`` was asked something that cannot run (nothing to do, an unknown benchmark, a flag combination
    that does not apply); raised before any model is loaded. The command line exits with the message."""


class EvalInputError(ValueError):
    """An input is wrong: a malformed problems or samples file (the message names FILE:LINE), duplicate problem ids,
    a missing model, results written with other settings or other data. Raised before anything is written for
    that input; the command line exits with the message."""


class _CommandError(SystemExit, ValueError):
    """What ``main`` raises for a usage or input error: exits with the message and status 1 (no traceback); still a
    ValueError for callers of ``main`` that catch those."""


def _print(msg: str) -> None:
    print(msg, flush=True)


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


def _gold_for_file(gold):
    """The gold as stored in the samples file: JSON values up to 2,000 characters (code test suites are omitted)."""
    try:
        text = json.dumps(gold)
    except (TypeError, ValueError):
        return None
    return gold if len(text) <= 2000 else None


# ---------------------------------------------------------------------------------------------------------------
# grading

def grade_responses(bench: Benchmark, problems: Sequence[Problem], responses: Sequence[Sequence[str]], *,
                    pool=None, progress: bool = False) -> tuple[list[list[Verdict]], list[list[bool]] | None, int]:
    """Verdicts per problem and sample; for math also the Qwen-style verdicts and the number of timeouts.

    Math goes through ``pool`` (an ``scoring.pool.WorkerPool(apply)``); code is graded on threads (each
    sandbox call is its own isolated subprocess with its own limits); task rewards are instantaneous, in this
    process.
    """
    if bench.kind == "task":
        return [[_graded(bench, r, p) for r in rs] for p, rs in zip(problems, responses)], None, 0
    if bench.kind == "code":
        from concurrent.futures import ThreadPoolExecutor

        from scoring.pool import default_workers
        jobs = [(p, r) for p, rs in zip(problems, responses) for r in rs]
        with ThreadPoolExecutor(max_workers=default_workers()) as ex:
            flat = list(ex.map(lambda job: _graded(bench, job[1], job[0]), jobs))
        out, i = [], 0
        for rs in responses:
            out.append(flat[i:i + len(rs)])
            i += len(rs)
        return out, None, 0
    from scoring.math import extract_answer
    from scoring.pool import WorkerPool, apply, qwen_item
    items, where = [], []
    for pi, (p, rs) in enumerate(zip(problems, responses)):
        multi, unit = bool(p.meta.get("multiple_answer", False)), p.meta.get("unit")
        for si, r in enumerate(rs):
            items.append((apply, bench.grade, r, p))   # math-verify (mathbench.grade_problem), the score
            items.append((apply, qwen_item, r, p.gold, multi, unit, bench.name))   # the cross-check
            where.append((pi, si))
    own = pool is None
    pool = pool or WorkerPool(apply, timeout=GRADE_TIMEOUT_S)
    try:
        results = pool.map(items, progress=progress, desc=f"grade {bench.name}")
    finally:
        if own:
            pool.close()
    verdicts = [[None] * len(rs) for rs in responses]
    qwen = [[False] * len(rs) for rs in responses]
    timeouts = 0
    for j, (pi, si) in enumerate(where):
        mv, qw = results[2 * j], results[2 * j + 1]
        if mv.status == "ok":
            verdicts[pi][si] = mv.value
        else:   # the grader's own time limit, or its worker crashed / raised: not graded, never a wrong answer
            timeouts += mv.status == "timeout"
            verdicts[pi][si] = Verdict(False, "timeout" if mv.status == "timeout" else GRADER_ERROR,
                                       extract_answer(responses[pi][si]), mv.detail[-2000:])
        qwen[pi][si] = bool(qw.value) if qw.status == "ok" else False
    return verdicts, qwen, timeouts


def _graded(bench: Benchmark, response: str, problem: Problem) -> Verdict:
    """``bench.grade``, with a failure of the grader itself (its sandbox could not start or overran its budget, the
    expected outputs could not be computed, any exception) recorded as ``grader_error``, never as a score."""
    try:
        return bench.grade(response, problem)
    except Exception as e:
        return Verdict(False, GRADER_ERROR, None, f"{type(e).__name__}: {e}"[:2000])


def _row(problem: Problem, prompt: str, responses, verdicts, qwen, finish, settings) -> dict:
    row = {"problem_id": problem.id, "prompt": prompt, "gold": _gold_for_file(problem.gold),
           "responses": list(responses), "answers": [v.answer for v in verdicts],
           "verdicts": [v.verdict for v in verdicts], "correct": [bool(v.correct) for v in verdicts],
           "finish_reasons": list(finish) if finish is not None else None, "settings": settings}
    if qwen is not None:
        row["correct_qwen"] = list(qwen)
    return row


def write_disagreements(path: Path) -> tuple[float, int] | None:
    """Rewrite ``<benchmark>.disagreements.jsonl`` from a math sample file; (rate, rows) or None (not math)."""
    from scoring.qwen import disagreements
    rows = read_samples(path)
    if not rows or "correct_qwen" not in rows[0]:
        return None
    rate, dis = disagreements(rows)
    out = path.with_name(path.stem + ".disagreements.jsonl")
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for d in dis:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    os.replace(tmp, out)
    return rate, len(dis)


def _report(name: str, bench: Benchmark, path: Path, timeouts: int) -> dict | None:
    """The scores of one sample file (None when it holds no rows); for math it also rewrites the disagreements.
    Ungraded samples are counted (``ungraded``, ``ungraded_problems``: problems with no graded sample) and left out
    of every score."""
    from eval.metrics import counts, summarize
    all_rows = read_samples(path)
    if not all_rows:
        return None
    rows, ungraded, empty = graded_rows(all_rows)
    report = {"model": name, "benchmark": bench.name, "kind": bench.kind, "path": path,
              "problems": 0, "n_min": 0, "n_max": 0, "avg": float("nan"), "avg_ci": (float("nan"), float("nan")),
              "grading_timeouts": None, "disagreement_rate": None, "disagreements": None,
              "ungraded": ungraded, "ungraded_problems": empty}
    if rows:
        _, n, c = counts(rows)
        s = summarize(n, c, ks=[1])
        report.update(problems=s["problems"], n_min=s["n_min"], n_max=s["n_max"], avg=s["avg"],
                      avg_ci=tuple(s["avg_ci"]))
    if bench.kind == "math":
        report["grading_timeouts"] = timeouts
        dis = write_disagreements(path)
        if dis is not None:
            report["disagreement_rate"], report["disagreements"] = dis
    return report


def format_report(report: dict) -> str:
    """One report as the line ``python -m eval.run`` prints:
    ``<benchmark>: avg@n = A [lo, hi] over P problems`` (+ math: timeouts and the grader disagreement)."""
    r = report
    lo, hi = r["avg_ci"]
    msg = (f"{r['benchmark']}: avg@{r['n_min'] if r['n_min'] == r['n_max'] else 'n'} = {r['avg']:.4f} "
           f"[{lo:.4f}, {hi:.4f}] over {r['problems']} problems")
    if r["grading_timeouts"] is not None:
        msg += f"; grading timeouts this run: {r['grading_timeouts']}"
    if r["disagreement_rate"] is not None:
        msg += (f"; math-verify vs Qwen-style disagreement {r['disagreement_rate']:.2%} "
                f"({r['disagreements']} samples)")
    if r.get("ungraded"):
        msg += (f"; NOT GRADED: {r['ungraded']} samples (grader errors / grader timeouts; excluded from the score"
                + (f", {r['ungraded_problems']} problems left with none" if r.get("ungraded_problems") else "")
                + "; a rerun grades them again)")
    return msg


# ---------------------------------------------------------------------------------------------------------------
# the two sources of responses: a samples file, or a model

def _prepare(path: Path, problems: list[Problem], settings: dict) -> list[Problem]:
    """Repair the file, check its settings and its data, return the problems still to do (nothing is created)."""
    done_rows = repair(path)
    check_settings(path, done_rows, settings)
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


def _regrade(path: Path, bench: Benchmark, problems: list[Problem], pool, log: Log) -> int:
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
    tmp = path.with_suffix(".regrade.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            append_row(f, row)
    os.replace(tmp, path)
    n = sum(len(sis) for _, sis in where)
    left = sum(v.verdict in UNGRADED_VERDICTS for vs in verdicts for v in vs)
    log(f"{bench.name}: graded again {n} samples an earlier run could not grade ({left} still not graded)")
    return n


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


def evaluate_samples(name: str, bench: Benchmark, problems: list[Problem], samples_file: str, out_dir: Path, *,
                     template: str, limit: int | None = None, pool=None, chunk_problems: int = 16,
                     progress: bool = False, log: Log = _print, data: dict | None = None) -> dict | None:
    """Grade responses produced elsewhere; append to ``out_dir/name/<benchmark>.jsonl``. ``problems``: all of the
    benchmark's (ids in the file are checked against them); ``limit``: grade only the first ``limit`` of them.
    Returns the file's report (``format_report``; ``path`` is the sample file), None when it holds no rows."""
    given = read_samples_input(samples_file, problems)
    problems = [p for p in problems[:limit] if p.id in given]
    settings = {"model": name, "model_path": None, "benchmark": bench.name, "benchmark_version": bench.version,
                "n": None, "temperature": None, "top_p": None, "max_tokens": None, "template": template,
                "seed": None, "samples_file": Path(samples_file).name, "data": data}
    path = out_dir / name / f"{bench.name}.jsonl"
    todo = _prepare(path, problems, settings)
    _regrade(path, bench, problems, pool, log)
    path.parent.mkdir(parents=True, exist_ok=True)
    timeouts = 0
    from tqdm.auto import tqdm
    bar = tqdm(total=len(todo), desc=f"grade {name} {bench.name}", disable=not progress)
    with open(path, "a", encoding="utf-8") as f:
        for start in range(0, len(todo), chunk_problems):
            chunk = todo[start:start + chunk_problems]
            responses = [given[p.id][0] for p in chunk]
            verdicts, qwen, t = grade_responses(bench, chunk, responses, pool=pool)
            timeouts += t
            for i, p in enumerate(chunk):
                append_row(f, _row(p, render_prompt(template, p.question), responses[i], verdicts[i],
                                   None if qwen is None else qwen[i], given[p.id][1], settings))
            bar.update(len(chunk))
    bar.close()
    report = _report(name, bench, path, timeouts)
    if report is not None:
        log(format_report(report))
    return report


def evaluate_model(spec: str, name: str, benches: list[tuple[Benchmark, list[Problem], dict]], out_dir: Path, *,
                   engine: str, seed: int, pool=None, chunk_sequences: int = 512, device=None, dtype=None,
                   gpu_memory_utilization: float = 0.85, tensor_parallel_size: int = 1, data_parallel_size: int = 1,
                   progress: bool = True, log: Log = _print) -> list[dict]:
    """Generate and grade every benchmark for one model. ``benches``: (benchmark, problems, settings) with the
    settings already checked against existing files (``_prepare``), so nothing expensive starts before errors.
    ``data_parallel_size`` engines (``eval.parallel``), each on ``tensor_parallel_size`` GPUs, share the chunks.
    Returns one report per benchmark with rows (``format_report``), in ``benches`` order."""
    from inference import load_tokenizer, resolve_engine
    from eval.parallel import EngineSpec, make_generator
    engine = resolve_engine(engine, model_path=spec)
    tokenizer = load_tokenizer(spec)
    work = []   # per benchmark: the problems still to do, their prompts and token ids (tokenized once)
    for bench, problems, settings in benches:
        path = out_dir / name / f"{bench.name}.jsonl"
        todo = _prepare(path, problems, settings)
        _regrade(path, bench, problems, pool, log)
        prompts = [render_prompt(settings["template"], p.question, tokenizer) for p in todo]
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in prompts]
        work.append((bench, settings, path, todo, prompts, ids))
    # the KV cache is sized for the longest prompt plus its budget, not the model's whole context
    longest = max((len(x) + w[1]["max_tokens"] for w in work for x in w[5]), default=1)
    espec = EngineSpec(model=spec, engine=engine, dtype=dtype, device=device,
                       gpu_memory_utilization=gpu_memory_utilization, tensor_parallel_size=tensor_parallel_size,
                       max_model_len=longest, max_batch_size=chunk_sequences)
    # no engine starts when everything is already written; it is closed (memory released) before the next model
    with (make_generator(espec, data_parallel_size) if any(w[3] for w in work) else contextlib.nullcontext()) as gen:
        return _generate_and_grade(gen, tokenizer, name, work, seed=seed, pool=pool,
                                   chunk_sequences=chunk_sequences, progress=progress, log=log)


def _generate_and_grade(gen, tokenizer, name: str, work, *, seed: int, pool, chunk_sequences: int, progress: bool,
                        log: Log) -> list[dict]:
    from tqdm.auto import tqdm

    from eval.parallel import Job
    reports = []
    for bench, settings, path, todo, prompts, ids in work:
        path.parent.mkdir(parents=True, exist_ok=True)
        n = settings["n"]
        per_chunk = max(1, chunk_sequences // n)
        starts = list(range(0, len(todo), per_chunk))
        jobs = (Job(key=k, prompts=[x for x in ids[a:a + per_chunk] for _ in range(n)],
                    max_new_tokens=settings["max_tokens"], temperature=settings["temperature"],
                    top_p=settings["top_p"],
                    # sample j of a problem: its own seed, whatever chunk or engine process draws it
                    seeds=tuple(zlib.crc32(f"{seed}:{bench.name}:{p.id}:{j}".encode())
                                for p in todo[a:a + per_chunk] for j in range(n)))
                for k, a in enumerate(starts))
        timeouts = 0
        bar = tqdm(total=len(todo), desc=f"{name} {bench.name}", disable=not progress)
        t0 = time.perf_counter()
        with open(path, "a", encoding="utf-8") as f:
            for k, comps in (gen.run(jobs) if todo else ()):
                a = starts[k]
                chunk = todo[a:a + per_chunk]
                gen_s = time.perf_counter() - t0
                texts = [tokenizer.decode(tok, skip_special_tokens=True) for tok, _ in comps]
                responses = [texts[i * n:(i + 1) * n] for i in range(len(chunk))]
                finish = [[fr for _, fr in comps[i * n:(i + 1) * n]] for i in range(len(chunk))]
                verdicts, qwen, t = grade_responses(bench, chunk, responses, pool=pool)
                timeouts += t
                for i, p in enumerate(chunk):
                    append_row(f, _row(p, prompts[a + i], responses[i], verdicts[i],
                                       None if qwen is None else qwen[i], finish[i], settings))
                bar.update(len(chunk))
                bar.set_postfix(gen_tok_s=f"{sum(len(tok) for tok, _ in comps) / max(gen_s, 1e-9):.0f}")
                t0 = time.perf_counter()
        bar.close()
        report = _report(name, bench, path, timeouts)
        if report is not None:
            log(format_report(report))
            reports.append(report)
    return reports


# ---------------------------------------------------------------------------------------------------------------
# CLI

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.run", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", action="append", required=True,
                   help="model directory or hub id (repeatable); with --samples, only the name of the results folder")
    p.add_argument("--name", action="append", default=None,
                   help="results folder name per --model (default: derived from the path, see model_name)")
    p.add_argument("--benchmarks", default="", help=f"comma-separated, from: {', '.join(BENCHMARKS)}")
    p.add_argument("--n", type=int, default=None, help="samples per problem (default: the benchmark's; math 32)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=None, help="max new tokens per sample")
    p.add_argument("--template", default=None, choices=sorted(TEMPLATES),
                   help="prompt template (default: the benchmark's; math qwen-math, tasks raw)")
    p.add_argument("--out", default="results/eval", help="results root (default results/eval)")
    p.add_argument("--samples", default=None, help="grade these completions instead of generating (one benchmark)")
    p.add_argument("--problems", default=None, help="problems file (JSONL) instead of the default source "
                                                   "(one benchmark)")
    p.add_argument("--limit", type=int, default=None, help="only the first K problems of each benchmark")
    p.add_argument("--lcb-release", default=None,
                   help="LiveCodeBench release tag (default v6: the problems added in release_v6; release_vN, vN, "
                        "vA_vB, release_latest, or 'all' for every file given)")
    p.add_argument("--lcb-start-date", default=None, help="LiveCodeBench: first contest date, YYYY-MM-DD (inclusive)")
    p.add_argument("--lcb-end-date", default=None, help="LiveCodeBench: last contest date, YYYY-MM-DD (inclusive)")
    p.add_argument("--allow-ungraded", action="store_true",
                   help="write the leaderboard and exit 0 even when some samples could not be graded (grader "
                        "errors or grader timeouts; they are still excluded from the scores and counted)")
    p.add_argument("--seed", type=int, default=0, help="generation seed")
    p.add_argument("--engine", default="auto", choices=["auto", "hf", "vllm"])
    p.add_argument("--device", default=None, help="torch device for the hf engine (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="model dtype, e.g. bfloat16 (default: the checkpoint's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vLLM engine's GPU memory share")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="vLLM: shard each model over this many GPUs of the node (a 7B model fits one; a 32B needs 2+)")
    p.add_argument("--data-parallel-size", type=int, default=1,
                   help="engines, each on --tensor-parallel-size GPUs of the node, sharing the problems (a CPU "
                        "machine: processes sharing its cores); results equal one engine's")
    p.add_argument("--chunk-sequences", type=int, default=512,
                   help="sequences per generate call (problems per chunk = this // n); results are written per chunk")
    p.add_argument("--grade-timeout", type=float, default=GRADE_TIMEOUT_S,
                   help="hard per-answer math grading limit in seconds (a hung grader process is killed)")
    p.add_argument("--workers", type=int, default=None, help="grading processes (default: one per core)")
    p.add_argument("--lm-eval-tasks", default="", help="lm-evaluation-harness tasks, comma-separated")
    p.add_argument("--lm-eval-include-path", default=None, help="folder of local lm-eval task YAMLs (offline)")
    p.add_argument("--lm-eval-limit", type=int, default=None, help="lm-eval: examples per task")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _settings_for(bench: Benchmark, model_path: str, name: str, *, n, temperature, top_p, max_tokens, template,
                  seed, data: dict | None = None) -> dict:
    """A result file's settings. ``model_path``: what was scored (``ModelSource.identity``: the absolute folder, or
    ``owner/name@<commit>`` for a hub snapshot, so a resume with the same cached id matches)."""
    gen = dict(bench.generation)
    for key, val in (("n", n), ("temperature", temperature), ("top_p", top_p), ("max_tokens", max_tokens)):
        if val is not None:
            gen[key] = val
    if gen["n"] < 1 or gen["max_tokens"] < 1:
        raise EvalUsageError(f"--n and --max-tokens must be >= 1 (got n={gen['n']}, max_tokens={gen['max_tokens']})")
    return {"model": name, "model_path": model_path, "benchmark": bench.name, "benchmark_version": bench.version,
            "n": gen["n"], "temperature": gen["temperature"], "top_p": gen["top_p"], "max_tokens": gen["max_tokens"],
            "template": template or bench.default_template, "seed": seed, "samples_file": None, "data": data}


def check_model(spec: str):
    """Where the files of ``spec`` are (``inference.hub.ModelSource``): a saved model folder (with ``config.json``),
    or a hub id's snapshot in the Hugging Face cache (downloaded first where that is allowed; with
    ``HF_HUB_OFFLINE=1`` it must be cached). EvalInputError otherwise. Called before anything is written."""
    from inference.hub import ModelSourceError, resolve_model
    p = Path(spec).expanduser()
    if p.exists() and p.is_dir() and not (p / "config.json").is_file():
        raise EvalInputError(f"--model {spec}: {p} holds no config.json; give a saved model folder (e.g. "
                             f"runs/<name>/checkpoints/step_N) or a hub id")
    try:
        return resolve_model(str(p) if p.exists() else spec, what="--model")
    except ModelSourceError as e:
        raise EvalInputError(str(e)) from None


def _fingerprint(problems: Sequence[Problem]) -> str:
    """sha256 of the problems as loaded (ids, question texts, gold): the data's version, whatever its source."""
    import hashlib

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
    return {**src, "problems": len(problems), "sha256": _fingerprint(problems)}


def _load(bench: Benchmark, problems, filters: dict) -> list[Problem]:
    """The benchmark's problems; loader errors (a malformed line names FILE:LINE) become EvalInputError, and
    duplicate problem ids are refused."""
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
    return probs


def run_eval(models: Sequence[str], benchmarks: Sequence[str] = (), *, names: Sequence[str] | None = None,
             out: str | os.PathLike = "results/eval", n: int | None = None, temperature: float | None = None,
             top_p: float | None = None, max_tokens: int | None = None, template: str | None = None,
             samples: str | os.PathLike | None = None, problems: str | os.PathLike | None = None,
             limit: int | None = None, seed: int = 0, engine: str = "auto", device: str | None = None,
             dtype: str | None = None, gpu_memory_utilization: float = 0.85, tensor_parallel_size: int = 1,
             data_parallel_size: int = 1, chunk_sequences: int = 512, grade_timeout: float = GRADE_TIMEOUT_S,
             workers: int | None = None,
             lm_eval_tasks: Sequence[str] = (), lm_eval_include_path: str | None = None,
             lm_eval_limit: int | None = None, baseline: str | None = None, lcb_release: str | None = None,
             lcb_start_date: str | None = None, lcb_end_date: str | None = None, allow_ungraded: bool = False,
             progress: bool = True, log: Log = _print) -> dict:
    """Score every model on every benchmark (the module docstring); resumes from the sample files under ``out``.

    models: model directories or hub ids (with ``samples``: one name); names: their results folders (default
    ``model_name``); benchmarks: names from ``eval.benchmarks``; ``n``, ``temperature``, ``top_p``,
    ``max_tokens``, ``template``: override every benchmark's default; ``samples``: grade this file of
    completions instead of generating (one model, one benchmark); ``problems``: a problems file instead of the
    benchmark's (one benchmark); ``baseline``: the model the leaderboard's paired comparisons are against
    (default the first); ``lcb_release`` (``"all"``: every file), ``lcb_start_date``, ``lcb_end_date``:
    LiveCodeBench's selection. ``log`` receives one ``format_report`` line per (model, benchmark) as it finishes
    (and LiveCodeBench's selection when it is loaded).

    Returns ``{"reports": [...], "leaderboard": ..., "leaderboard_md": ..., "ungraded": k}``: one report per
    (model, sample-file benchmark) in the order scored, each ``{"model", "benchmark", "kind", "path", "problems",
    "n_min", "n_max", "avg", "avg_ci": (low, high), "grading_timeouts", "disagreement_rate", "disagreements",
    "ungraded", "ungraded_problems"}`` (``grading_timeouts`` and the disagreement fields None outside math;
    scores over every graded sample in the file, earlier runs' included), then the leaderboard of everything under
    ``out`` (``eval.leaderboard.build_leaderboard``) and its markdown, both also written there, and the number of
    samples of those files that could not be graded. When that is not 0 the leaderboard is NOT written (both are
    None) unless ``allow_ungraded``. Raises ``EvalUsageError`` / ``EvalInputError`` for requests that cannot run
    or bad inputs, before any model is loaded and before anything is written.
    """
    models, benchmarks, lm_tasks = list(models), list(benchmarks), list(lm_eval_tasks)
    if not benchmarks and not lm_tasks:
        raise EvalUsageError("nothing to do: give --benchmarks and/or --lm-eval-tasks")
    if names is not None and len(names) != len(models):
        raise EvalUsageError(f"--name given {len(names)} times for {len(models)} --model")
    if (samples or problems) and len(benchmarks) != 1:
        raise EvalUsageError("--samples and --problems apply to exactly one benchmark; pass a single --benchmarks NAME")
    if samples and (len(models) != 1 or lm_tasks):
        raise EvalUsageError("--samples grades one file: give exactly one --model NAME and no --lm-eval-tasks")
    if limit is not None and limit < 1:
        raise EvalUsageError(f"--limit must be >= 1, got {limit}")
    if data_parallel_size < 1 or tensor_parallel_size < 1:
        raise EvalUsageError(f"--data-parallel-size and --tensor-parallel-size must be >= 1, got "
                             f"{data_parallel_size} and {tensor_parallel_size}")
    if samples and data_parallel_size > 1:
        raise EvalUsageError("--data-parallel-size spreads generation over engines; --samples generates nothing")
    if data_parallel_size > 1:
        from eval.parallel import gpu_groups, visible_gpus
        try:
            gpu_groups(data_parallel_size, tensor_parallel_size, visible_gpus())
        except ValueError as e:
            raise EvalUsageError(str(e)) from None
    if lm_tasks and n is not None:
        raise EvalUsageError("--n cannot be passed to lm-eval tasks (each task sets its own repeats); run the "
                             "lm-eval tasks in a separate call without --n")
    try:
        benches = [get_benchmark(b) for b in benchmarks]
    except ValueError as e:
        raise EvalUsageError(str(e)) from None
    lcb_filters = {k: v for k, v in (("release", lcb_release), ("start_date", lcb_start_date),
                                     ("end_date", lcb_end_date)) if v is not None}
    if lcb_filters and "livecodebench" not in benchmarks:
        raise EvalUsageError("--lcb-release / --lcb-start-date / --lcb-end-date select LiveCodeBench problems; add "
                             "livecodebench to --benchmarks")
    if lcb_filters.get("release") == "all":
        lcb_filters["release"] = None
    if lcb_filters.get("release"):
        from eval.benchmarks.livecodebench import RELEASES
        if lcb_filters["release"] not in RELEASES:
            raise EvalUsageError(f"--lcb-release {lcb_filters['release']!r} is not a release; choose from "
                                 f"{sorted(RELEASES)} or 'all'")
    out = Path(out)
    if samples and not Path(samples).is_file():
        raise EvalInputError(f"--samples {samples}: no such file")
    # where each model's files are (a hub id: its cached snapshot), before anything is loaded or written
    sources = {} if samples else {spec: check_model(spec) for spec in models}
    pairs = [(spec, (names[i] if names else model_name(spec))) for i, spec in enumerate(models)]

    # load problems and check existing files before any model is loaded
    loaded: list[tuple[Benchmark, list[Problem], dict]] = []
    for bench in benches:
        filters = {k: v for k, v in lcb_filters.items() if k in bench.filters}
        probs = _load(bench, problems, filters)
        try:
            data = data_settings(bench, probs, problems, filters)
        except (ValueError, OSError) as e:
            raise EvalInputError(f"{bench.name}: {e}") from None
        if bench.name == "livecodebench":
            log(data.get("selection", ""))
        if limit is not None and not samples:   # with samples, ids are checked against all problems
            probs = probs[:limit]
        loaded.append((bench, probs, data))

    from scoring.pool import WorkerPool, apply
    pool = WorkerPool(apply, timeout=grade_timeout, workers=workers) if any(
        b.kind == "math" for b in benches) else None
    reports: list[dict] = []
    try:
        if samples:
            (bench, probs, data), (spec, name) = loaded[0], pairs[0]
            try:
                read_samples_input(samples, probs)   # file:line errors before anything is written
            except ValueError as e:
                raise EvalInputError(str(e)) from None
            try:
                report = evaluate_samples(name, bench, probs, samples, out,
                                          template=template or bench.default_template, limit=limit, pool=pool,
                                          progress=progress, log=log, data=data)
            except EvalInputError:
                raise
            except ValueError as e:   # a corrupt results file, results written with other settings
                raise EvalInputError(str(e)) from None
            reports += [report] if report is not None else []
        else:
            plans = []
            for spec, name in pairs:
                plan = []
                for bench, probs, data in loaded:
                    settings = _settings_for(bench, sources[spec].identity, name, n=n, temperature=temperature,
                                             top_p=top_p, max_tokens=max_tokens, template=template, seed=seed,
                                             data=data)
                    path = out / name / f"{bench.name}.jsonl"
                    try:
                        _prepare(path, probs, settings)   # raises on a settings mismatch, before any model loads
                    except EvalInputError:
                        raise
                    except ValueError as e:
                        raise EvalInputError(str(e)) from None
                    plan.append((bench, probs, settings))
                plans.append((spec, name, plan))
            for spec, name, plan in plans:
                if plan:
                    reports += evaluate_model(sources[spec].path, name, plan, out, engine=engine, seed=seed,
                                              pool=pool, chunk_sequences=chunk_sequences, device=device, dtype=dtype,
                                              gpu_memory_utilization=gpu_memory_utilization,
                                              tensor_parallel_size=tensor_parallel_size,
                                              data_parallel_size=data_parallel_size, progress=progress, log=log)
                if lm_tasks:
                    from eval.lm_eval_bridge import run_lm_eval
                    run_lm_eval(sources[spec].path, lm_tasks, out / name, include_path=lm_eval_include_path,
                                limit=lm_eval_limit, device=device, engine=engine, seed=seed,
                                temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    finally:
        if pool is not None:
            pool.close()

    ungraded = sum(r.get("ungraded") or 0 for r in reports)
    if ungraded and not allow_ungraded:
        return {"reports": reports, "leaderboard": None, "leaderboard_md": None, "ungraded": ungraded}
    from eval.leaderboard import build_leaderboard, write_leaderboard
    if not out.is_dir():
        return {"reports": reports, "leaderboard": None, "leaderboard_md": None, "ungraded": ungraded}
    board = build_leaderboard(out, baseline=baseline)
    return {"reports": reports, "leaderboard": board, "leaderboard_md": write_leaderboard(board, out),
            "ungraded": ungraded}


def main(argv: list[str] | None = None) -> int:
    """The command line over ``run_eval``: exit 0; 1 with a message for a usage or input error (nothing written);
    3 when some samples could not be graded and ``--allow-ungraded`` was not given (the leaderboard is not written)."""
    args = build_parser().parse_args(argv)
    try:
        result = run_eval(
            args.model, [b.strip() for b in args.benchmarks.split(",") if b.strip()], names=args.name, out=args.out,
            n=args.n, temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
            template=args.template, samples=args.samples, problems=args.problems, limit=args.limit, seed=args.seed,
            engine=args.engine, device=args.device, dtype=args.dtype,
            gpu_memory_utilization=args.gpu_memory_utilization, tensor_parallel_size=args.tensor_parallel_size,
            data_parallel_size=args.data_parallel_size,
            chunk_sequences=args.chunk_sequences,
            grade_timeout=args.grade_timeout, workers=args.workers,
            lm_eval_tasks=[t.strip() for t in args.lm_eval_tasks.split(",") if t.strip()],
            lm_eval_include_path=args.lm_eval_include_path, lm_eval_limit=args.lm_eval_limit,
            lcb_release=args.lcb_release, lcb_start_date=args.lcb_start_date, lcb_end_date=args.lcb_end_date,
            allow_ungraded=args.allow_ungraded, progress=not args.no_progress)
    except (EvalUsageError, EvalInputError) as e:
        raise _CommandError(f"error: {e}") from None
    if result["ungraded"] and not args.allow_ungraded:
        print(f"error: {result['ungraded']} samples could not be graded (grader errors or grader timeouts; see the "
              f"'NOT GRADED' lines above and the grader_error/timeout verdicts in the result files). The leaderboard "
              f"was not written. Fix the grader and run the same command again (it grades them again), or pass "
              f"--allow-ungraded to write the leaderboard without them.", file=sys.stderr, flush=True)
        return EXIT_UNGRADED
    if result["leaderboard_md"] is not None:
        print(result["leaderboard_md"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
