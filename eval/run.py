"""Score checkpoints on benchmarks: ``python -m eval.run --model PATH_OR_ID --benchmarks aime24,math500 ...``

For every model and benchmark: render each problem with the prompt template, sample n completions per problem
(``inference``; one completion per prompt, the prompt repeated n times), decode, grade, and append one line
per problem to ``<out>/<model>/<benchmark>.jsonl`` (format: ``eval.samples``). Problems already in the file are
skipped, so an interrupted run resumes where it stopped; a file written with other settings is an error.
Math answers are graded by math-verify in a process pool with a hard per-item timeout, and cross-checked by the
Qwen-style grader (disagreements go to ``<benchmark>.disagreements.jsonl``). At the end the leaderboard of
everything under ``--out`` is printed and written (``eval.leaderboard``).

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
from typing import Sequence

from eval.benchmarks import BENCHMARKS, get_benchmark
from eval.benchmarks.base import Benchmark, Problem, Verdict
from contracts.jsonl import iter_jsonl
from eval.samples import append_row, check_settings, read_samples, repair
from scoring.templates import TEMPLATES, render_prompt

__all__ = ["main", "model_name", "grade_responses", "evaluate_samples", "evaluate_model"]

GRADE_TIMEOUT_S = 10.0   # hard per-item limit for math grading (math-verify takes ~2 ms on normal answers)


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


def _report(bench: Benchmark, path: Path, timeouts: int) -> None:
    from eval.metrics import counts, summarize
    rows = read_samples(path)
    if not rows:
        return
    _, n, c = counts(rows)
    s = summarize(n, c, ks=[1])
    lo, hi = s["avg_ci"]
    msg = (f"{bench.name}: avg@{s['n_min'] if s['n_min'] == s['n_max'] else 'n'} = {s['avg']:.4f} "
           f"[{lo:.4f}, {hi:.4f}] over {s['problems']} problems")
    if bench.kind == "math":
        msg += f"; grading timeouts this run: {timeouts}"
        dis = write_disagreements(path)
        if dis is not None:
            msg += f"; math-verify vs Qwen-style disagreement {dis[0]:.2%} ({dis[1]} samples)"
    print(msg, flush=True)


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
                     progress: bool = False) -> Path:
    """Grade responses produced elsewhere; append to ``out_dir/name/<benchmark>.jsonl``. ``problems``: all of the
    benchmark's (ids in the file are checked against them); ``limit``: grade only the first ``limit`` of them."""
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
    _report(bench, path, timeouts)
    return path


def evaluate_model(spec: str, name: str, benches: list[tuple[Benchmark, list[Problem], dict]], out_dir: Path, *,
                   engine: str, seed: int, pool=None, chunk_sequences: int = 512, device=None, dtype=None,
                   gpu_memory_utilization: float = 0.85, progress: bool = True) -> None:
    """Generate and grade every benchmark for one model. ``benches``: (benchmark, problems, settings) with the
    settings already checked against existing files (``_prepare``), so nothing expensive starts before errors."""
    from tqdm.auto import tqdm

    import torch

    from inference import load_policy, make_sampler, resolve_engine
    cuda = torch.cuda.is_available()
    engine = resolve_engine(engine)
    if engine == "vllm":   # vLLM loads the weights itself; the HF copy stays on the CPU in bf16
        model, tokenizer = load_policy(spec, device=None, dtype=dtype or "bfloat16")
        sampler = make_sampler(model, tokenizer, engine="vllm",
                               gpu_memory_utilization=gpu_memory_utilization)
    else:
        model, tokenizer = load_policy(spec, device=device or ("cuda" if cuda else None),
                                       dtype=dtype or ("bfloat16" if cuda else None))
        sampler = make_sampler(model, tokenizer, engine="hf")
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
        _report(bench, path, timeouts)


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


def _settings_for(bench: Benchmark, args, spec: str, name: str) -> dict:
    gen = dict(bench.generation)
    for key, val in (("n", args.n), ("temperature", args.temperature), ("top_p", args.top_p),
                     ("max_tokens", args.max_tokens)):
        if val is not None:
            gen[key] = val
    if gen["n"] < 1 or gen["max_tokens"] < 1:
        raise ValueError(f"--n and --max-tokens must be >= 1 (got n={gen['n']}, max_tokens={gen['max_tokens']})")
    model_path = str(Path(spec).resolve()) if Path(spec).exists() else spec
    return {"model": name, "model_path": model_path, "benchmark": bench.name, "benchmark_version": bench.version,
            "n": gen["n"], "temperature": gen["temperature"], "top_p": gen["top_p"], "max_tokens": gen["max_tokens"],
            "template": args.template or bench.default_template, "seed": args.seed, "samples_file": None}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    names = [b.strip() for b in args.benchmarks.split(",") if b.strip()]
    lm_tasks = [t.strip() for t in args.lm_eval_tasks.split(",") if t.strip()]
    if not names and not lm_tasks:
        raise SystemExit("nothing to do: give --benchmarks and/or --lm-eval-tasks")
    if args.name is not None and len(args.name) != len(args.model):
        raise SystemExit(f"--name given {len(args.name)} times for {len(args.model)} --model")
    if (args.samples or args.problems) and len(names) != 1:
        raise SystemExit("--samples and --problems apply to exactly one benchmark; pass a single --benchmarks NAME")
    if args.samples and (len(args.model) != 1 or lm_tasks):
        raise SystemExit("--samples grades one file: give exactly one --model NAME and no --lm-eval-tasks")
    try:
        benches = [get_benchmark(b) for b in names]
    except ValueError as e:
        raise SystemExit(str(e)) from None
    out = Path(args.out)
    models = [(spec, (args.name[i] if args.name else model_name(spec))) for i, spec in enumerate(args.model)]

    # load problems and check existing files before any model is loaded
    loaded: list[tuple[Benchmark, list[Problem]]] = []
    for bench in benches:
        problems = bench.load(args.problems) if args.problems else bench.load()
        if args.limit is not None and not args.samples:   # with --samples, ids are checked against all problems
            problems = problems[:args.limit]
        loaded.append((bench, problems))

    from scoring.pool import WorkerPool, apply
    pool = WorkerPool(apply, timeout=args.grade_timeout, workers=args.workers) if any(
        b.kind == "math" for b in benches) else None
    try:
        if args.samples:
            (bench, problems), (spec, name) = loaded[0], models[0]
            evaluate_samples(name, bench, problems, args.samples, out, template=args.template or
                             bench.default_template, limit=args.limit, pool=pool, progress=not args.no_progress)
        else:
            plans = []
            for spec, name in models:
                plan = []
                for bench, problems in loaded:
                    settings = _settings_for(bench, args, spec, name)
                    path = out / name / f"{bench.name}.jsonl"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    _prepare(path, problems, settings)   # raises on a settings mismatch, before any model loads
                    plan.append((bench, problems, settings))
                plans.append((spec, name, plan))
            for spec, name, plan in plans:
                if plan:
                    evaluate_model(spec, name, plan, out, engine=args.engine, seed=args.seed, pool=pool,
                                   chunk_sequences=args.chunk_sequences, device=args.device, dtype=args.dtype,
                                   gpu_memory_utilization=args.gpu_memory_utilization,
                                   progress=not args.no_progress)
                if lm_tasks:
                    from eval.lm_eval_bridge import run_lm_eval
                    run_lm_eval(spec, lm_tasks, out / name, include_path=args.lm_eval_include_path,
                                limit=args.lm_eval_limit, device=args.device, engine=args.engine, seed=args.seed)
    finally:
        if pool is not None:
            pool.close()

    from eval.leaderboard import build_leaderboard, write_leaderboard
    board = build_leaderboard(out)
    print(write_leaderboard(board, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
