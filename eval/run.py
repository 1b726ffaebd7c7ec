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
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import zlib
from pathlib import Path
from typing import Callable, Sequence

from eval.benchmarks import BENCHMARKS, get_benchmark
from eval.benchmarks.base import Benchmark, Problem, Verdict
from contracts.jsonl import iter_jsonl
from eval.samples import append_row, check_settings, read_samples, repair
from scoring.templates import TEMPLATES, render_prompt

__all__ = ["EvalUsageError", "run_eval", "format_report", "main", "model_name", "grade_responses",
           "evaluate_samples", "evaluate_model"]

GRADE_TIMEOUT_S = 10.0   # hard per-item limit for math grading (math-verify takes ~2 ms on normal answers)

Log = Callable[[str], None]


class EvalUsageError(ValueError):
    """``run_eval`` was asked something that cannot run (nothing to do, an unknown benchmark, a flag combination
    that does not apply); raised before any model is loaded. The command line exits with the message."""


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
        return [[bench.grade(r, p) for r in rs] for p, rs in zip(problems, responses)], None, 0
    if bench.kind == "code":
        from concurrent.futures import ThreadPoolExecutor

        from scoring.pool import default_workers
        jobs = [(p, r) for p, rs in zip(problems, responses) for r in rs]
        with ThreadPoolExecutor(max_workers=default_workers()) as ex:
            flat = list(ex.map(lambda job: bench.grade(job[1], job[0]), jobs))
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
            items.append((apply, qwen_item, r, p.gold, multi, unit))   # the cross-check
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
        else:
            timeouts += mv.status == "timeout"
            verdicts[pi][si] = Verdict(False, "timeout" if mv.status == "timeout" else "wrong_answer",
                                       extract_answer(responses[pi][si]), mv.detail)
        qwen[pi][si] = bool(qw.value) if qw.status == "ok" else False
    return verdicts, qwen, timeouts


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
    """The scores of one sample file (None when it holds no rows); for math it also rewrites the disagreements."""
    from eval.metrics import counts, summarize
    rows = read_samples(path)
    if not rows:
        return None
    _, n, c = counts(rows)
    s = summarize(n, c, ks=[1])
    report = {"model": name, "benchmark": bench.name, "kind": bench.kind, "path": path,
              "problems": s["problems"], "n_min": s["n_min"], "n_max": s["n_max"], "avg": s["avg"],
              "avg_ci": tuple(s["avg_ci"]), "grading_timeouts": None, "disagreement_rate": None,
              "disagreements": None}
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
    return msg


# ---------------------------------------------------------------------------------------------------------------
# the two sources of responses: a samples file, or a model

def _prepare(path: Path, problems: list[Problem], settings: dict) -> list[Problem]:
    """Repair the file, check its settings, return the problems still to do."""
    done_rows = repair(path)
    check_settings(path, done_rows, settings)
    done = {r["problem_id"] for r in done_rows}
    return [p for p in problems if p.id not in done]


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
                     progress: bool = False, log: Log = _print) -> dict | None:
    """Grade responses produced elsewhere; append to ``out_dir/name/<benchmark>.jsonl``. ``problems``: all of the
    benchmark's (ids in the file are checked against them); ``limit``: grade only the first ``limit`` of them.
    Returns the file's report (``format_report``; ``path`` is the sample file), None when it holds no rows."""
    given = read_samples_input(samples_file, problems)
    problems = [p for p in problems[:limit] if p.id in given]
    settings = {"model": name, "model_path": None, "benchmark": bench.name, "benchmark_version": bench.version,
                "n": None, "temperature": None, "top_p": None, "max_tokens": None, "template": template,
                "seed": None, "samples_file": Path(samples_file).name}
    path = out_dir / name / f"{bench.name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    todo = _prepare(path, problems, settings)
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
                   gpu_memory_utilization: float = 0.85, tensor_parallel_size: int = 1, progress: bool = True,
                   log: Log = _print) -> list[dict]:
    """Generate and grade every benchmark for one model. ``benches``: (benchmark, problems, settings) with the
    settings already checked against existing files (``_prepare``), so nothing expensive starts before errors.
    Returns one report per benchmark with rows (``format_report``), in ``benches`` order."""
    import torch

    from inference import load_policy, make_sampler, resolve_engine
    cuda = torch.cuda.is_available()
    engine = resolve_engine(engine, model_path=spec)
    if engine == "vllm":   # vLLM loads the weights itself from spec; the HF copy stays on the CPU
        model, tokenizer = load_policy(spec, device=None, dtype=dtype or "bfloat16")
        # the KV cache is sized for the longest prompt plus its budget, not the model's whole context
        longest = max((len(tokenizer(render_prompt(s["template"], p.question, tokenizer), add_special_tokens=False)
                           ["input_ids"]) + s["max_tokens"] for _, probs, s in benches for p in probs), default=1)
        sampler = make_sampler(model, tokenizer, engine="vllm", model_path=spec, sync_weights=False,
                               gpu_memory_utilization=gpu_memory_utilization, max_model_len=longest,
                               tensor_parallel_size=tensor_parallel_size, max_batch_size=chunk_sequences)
    else:
        model, tokenizer = load_policy(spec, device=device or ("cuda" if cuda else None),
                                       dtype=dtype or ("bfloat16" if cuda else None))
        sampler = make_sampler(model, tokenizer, engine="hf")
    try:
        return _generate_and_grade(sampler, tokenizer, name, benches, out_dir, seed=seed, pool=pool,
                                   chunk_sequences=chunk_sequences, progress=progress, log=log)
    finally:
        close = getattr(sampler, "close", None)
        if close is not None:
            close()   # the engine's memory goes back before the next model (or lm-eval) starts
        del sampler, model


def _generate_and_grade(sampler, tokenizer, name: str, benches, out_dir: Path, *, seed: int, pool,
                        chunk_sequences: int, progress: bool, log: Log) -> list[dict]:
    from tqdm.auto import tqdm

    reports = []
    for bench, problems, settings in benches:
        path = out_dir / name / f"{bench.name}.jsonl"
        todo = _prepare(path, problems, settings)
        n, template = settings["n"], settings["template"]
        per_chunk = max(1, chunk_sequences // n)
        timeouts = 0
        bar = tqdm(total=len(todo), desc=f"{name} {bench.name}", disable=not progress)
        with open(path, "a", encoding="utf-8") as f:
            for start in range(0, len(todo), per_chunk):
                chunk = todo[start:start + per_chunk]
                prompts = [render_prompt(template, p.question, tokenizer) for p in chunk]
                ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in prompts]
                chunk_seed = zlib.crc32(f"{seed}:{bench.name}:{chunk[0].id}:{chunk[-1].id}".encode())
                t0 = time.perf_counter()
                comps = sampler.generate([x for x in ids for _ in range(n)], max_new_tokens=settings["max_tokens"],
                                         temperature=settings["temperature"], top_p=settings["top_p"], seed=chunk_seed)
                gen_s = time.perf_counter() - t0
                texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in comps]
                responses = [texts[i * n:(i + 1) * n] for i in range(len(chunk))]
                finish = [[c.finish_reason for c in comps[i * n:(i + 1) * n]] for i in range(len(chunk))]
                verdicts, qwen, t = grade_responses(bench, chunk, responses, pool=pool)
                timeouts += t
                for i, p in enumerate(chunk):
                    append_row(f, _row(p, prompts[i], responses[i], verdicts[i], None if qwen is None else qwen[i],
                                       finish[i], settings))
                bar.update(len(chunk))
                bar.set_postfix(gen_tok_s=f"{sum(len(c.token_ids) for c in comps) / max(gen_s, 1e-9):.0f}")
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
    p.add_argument("--seed", type=int, default=0, help="generation seed")
    p.add_argument("--engine", default="auto", choices=["auto", "hf", "vllm"])
    p.add_argument("--device", default=None, help="torch device for the hf engine (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="model dtype, e.g. bfloat16 (default: the checkpoint's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85, help="vLLM engine's GPU memory share")
    p.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="vLLM: shard each model over this many GPUs of the node (a 7B model fits one; a 32B needs 2+)")
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


def _settings_for(bench: Benchmark, spec: str, name: str, *, n, temperature, top_p, max_tokens, template,
                  seed) -> dict:
    gen = dict(bench.generation)
    for key, val in (("n", n), ("temperature", temperature), ("top_p", top_p), ("max_tokens", max_tokens)):
        if val is not None:
            gen[key] = val
    if gen["n"] < 1 or gen["max_tokens"] < 1:
        raise ValueError(f"--n and --max-tokens must be >= 1 (got n={gen['n']}, max_tokens={gen['max_tokens']})")
    model_path = str(Path(spec).resolve()) if Path(spec).exists() else spec
    return {"model": name, "model_path": model_path, "benchmark": bench.name, "benchmark_version": bench.version,
            "n": gen["n"], "temperature": gen["temperature"], "top_p": gen["top_p"], "max_tokens": gen["max_tokens"],
            "template": template or bench.default_template, "seed": seed, "samples_file": None}


def run_eval(models: Sequence[str], benchmarks: Sequence[str] = (), *, names: Sequence[str] | None = None,
             out: str | os.PathLike = "results/eval", n: int | None = None, temperature: float | None = None,
             top_p: float | None = None, max_tokens: int | None = None, template: str | None = None,
             samples: str | os.PathLike | None = None, problems: str | os.PathLike | None = None,
             limit: int | None = None, seed: int = 0, engine: str = "auto", device: str | None = None,
             dtype: str | None = None, gpu_memory_utilization: float = 0.85, tensor_parallel_size: int = 1,
             chunk_sequences: int = 512, grade_timeout: float = GRADE_TIMEOUT_S, workers: int | None = None, lm_eval_tasks: Sequence[str] = (),
             lm_eval_include_path: str | None = None, lm_eval_limit: int | None = None,
             baseline: str | None = None, progress: bool = True, log: Log = _print) -> dict:
    """Score every model on every benchmark (the module docstring); resumes from the sample files under ``out``.

    models: model directories or hub ids (with ``samples``: one name); names: their results folders (default
    ``model_name``); benchmarks: names from ``eval.benchmarks``; ``n``, ``temperature``, ``top_p``,
    ``max_tokens``, ``template``: override every benchmark's default; ``samples``: grade this file of
    completions instead of generating (one model, one benchmark); ``problems``: a problems file instead of the
    benchmark's (one benchmark); ``baseline``: the model the leaderboard's paired comparisons are against
    (default the first). ``log`` receives one ``format_report`` line per (model, benchmark) as it finishes.

    Returns ``{"reports": [...], "leaderboard": ..., "leaderboard_md": ...}``: one report per (model, sample-file
    benchmark) in the order scored, each ``{"model", "benchmark", "kind", "path", "problems", "n_min", "n_max",
    "avg", "avg_ci": (low, high), "grading_timeouts", "disagreement_rate", "disagreements"}`` (the last three
    None outside math; scores over every problem in the file, earlier runs' included), then the leaderboard of
    everything under ``out`` (``eval.leaderboard.build_leaderboard``) and its markdown, both also written there.
    Raises ``EvalUsageError`` for requests that cannot run, before any model is loaded.
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
    try:
        benches = [get_benchmark(b) for b in benchmarks]
    except ValueError as e:
        raise EvalUsageError(str(e)) from None
    out = Path(out)
    pairs = [(spec, (names[i] if names else model_name(spec))) for i, spec in enumerate(models)]

    # load problems and check existing files before any model is loaded
    loaded: list[tuple[Benchmark, list[Problem]]] = []
    for bench in benches:
        probs = bench.load(problems) if problems else bench.load()
        if limit is not None and not samples:   # with samples, ids are checked against all problems
            probs = probs[:limit]
        loaded.append((bench, probs))

    from scoring.pool import WorkerPool, apply
    pool = WorkerPool(apply, timeout=grade_timeout, workers=workers) if any(
        b.kind == "math" for b in benches) else None
    reports: list[dict] = []
    try:
        if samples:
            (bench, probs), (spec, name) = loaded[0], pairs[0]
            report = evaluate_samples(name, bench, probs, samples, out, template=template or bench.default_template,
                                      limit=limit, pool=pool, progress=progress, log=log)
            reports += [report] if report is not None else []
        else:
            plans = []
            for spec, name in pairs:
                plan = []
                for bench, probs in loaded:
                    settings = _settings_for(bench, spec, name, n=n, temperature=temperature, top_p=top_p,
                                             max_tokens=max_tokens, template=template, seed=seed)
                    path = out / name / f"{bench.name}.jsonl"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    _prepare(path, probs, settings)   # raises on a settings mismatch, before any model loads
                    plan.append((bench, probs, settings))
                plans.append((spec, name, plan))
            for spec, name, plan in plans:
                if plan:
                    reports += evaluate_model(spec, name, plan, out, engine=engine, seed=seed, pool=pool,
                                              chunk_sequences=chunk_sequences, device=device, dtype=dtype,
                                              gpu_memory_utilization=gpu_memory_utilization,
                                              tensor_parallel_size=tensor_parallel_size, progress=progress,
                                              log=log)
                if lm_tasks:
                    from eval.lm_eval_bridge import run_lm_eval
                    run_lm_eval(spec, lm_tasks, out / name, include_path=lm_eval_include_path,
                                limit=lm_eval_limit, device=device, engine=engine, seed=seed)
    finally:
        if pool is not None:
            pool.close()

    from eval.leaderboard import build_leaderboard, write_leaderboard
    board = build_leaderboard(out, baseline=baseline)
    return {"reports": reports, "leaderboard": board, "leaderboard_md": write_leaderboard(board, out)}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = run_eval(
            args.model, [b.strip() for b in args.benchmarks.split(",") if b.strip()], names=args.name, out=args.out,
            n=args.n, temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
            template=args.template, samples=args.samples, problems=args.problems, limit=args.limit, seed=args.seed,
            engine=args.engine, device=args.device, dtype=args.dtype,
            gpu_memory_utilization=args.gpu_memory_utilization, tensor_parallel_size=args.tensor_parallel_size,
            chunk_sequences=args.chunk_sequences,
            grade_timeout=args.grade_timeout, workers=args.workers,
            lm_eval_tasks=[t.strip() for t in args.lm_eval_tasks.split(",") if t.strip()],
            lm_eval_include_path=args.lm_eval_include_path, lm_eval_limit=args.lm_eval_limit,
            progress=not args.no_progress)
    except EvalUsageError as e:
        raise SystemExit(str(e)) from None
    print(result["leaderboard_md"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
