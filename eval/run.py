"""Score checkpoints on benchmarks: ``python -m eval.run --model PATH_OR_ID --benchmarks aime24,math500 ...``

For every model and benchmark: render each problem with the prompt template, sample n completions per problem
(``inference``; one completion per prompt, the prompt repeated n times), decode, grade (``eval.grading``), and
append one line per problem to ``<out>/<model>/<benchmark>.jsonl`` (format: ``contracts.samples``). Problems already in
the file are skipped, so an interrupted run resumes where it stopped; a file written with other settings is an
error. Math answers are graded by math-verify in a process pool with a hard per-item timeout, and cross-checked by
the Qwen-style grader (disagreements go to ``<benchmark>.disagreements.jsonl``). At the end the leaderboard of
everything under ``out`` is printed and written (``eval.leaderboard``): the board ``python -m eval.leaderboard out``
writes, the same order (oldest results first) and the same baseline (``--baseline``, else the first model on the
board). One process writes a results file at a time: its lock (``.<benchmark>.jsonl.lock`` beside it,
``contracts.locks``) is taken before the file is read for a resume and held until the run ends.

Configuration: one ``eval.config.EvalConfig``, from a profile, a preset and the command line: ``python -m eval.run
--config eval/configs/paper_math.yaml --profile deepseek-r1-distill-qwen-1.5b --model PATH max_tokens=32768``.
Every field has a flag (``--max-tokens 8192`` is the shorthand of ``max_tokens=8192``); the preset overrides the
profile (a backbone's sampling settings, eval/configs/<profile>.yaml, each value with its source), the flags
override the preset, and ``key=value`` overrides override them all.

Library: ``run_eval(cfg)`` does all of that and RETURNS the per-model, per-benchmark reports
(``eval.report.format_report`` renders one as the line the command prints) and the leaderboard; ``main`` is the
command line over it (the config's layers, printing, exit status).

``--samples FILE`` grades completions produced elsewhere (JSON lines ``{"problem_id": ..., "responses": [...]}``;
``--model`` is then only the name). ``--lm-eval-tasks`` also runs lm-evaluation-harness tasks
(``eval.lm_eval_bridge``); their main metric joins the same leaderboard.

Generation defaults are the benchmark's (math: n=32, temperature 0.6, top-p 0.95, top-k off, 4096 new tokens,
template qwen-math; tasks: n=8, temperature 1.0, 64 tokens, template raw); each setting given (by a profile or the
command line) overrides them for all benchmarks. The paper fixes n (avg@32, §5.1), not the sampling settings
(docs/evaluation.md). Before any engine starts, each benchmark's longest rendered prompt plus ``max_tokens`` is
checked against the model's context (``inference.hub.model_context``: config.json's max_position_embeddings, as
vLLM reads it) and ``max_context``; a run that does not fit is refused (exit 2, one line with both numbers).
Sample j of a problem draws from its own seed (``seed``, the benchmark, the problem id and j), so the files do not
depend on the chunking or on how many engines share the work.

Every result line's settings record the data (``settings["data"]``: the benchmark's ``describe`` — files, release,
dates, dataset version or hash — the problem count and a sha256 fingerprint of the problems), the sampling
settings (``top_k`` among them: lines from before it was recorded read as off, 0) and the engine and
dtype the samples were generated in (``settings["engine"]``, ``settings["dtype"]``, resolved: vLLM runs in bfloat16
unless ``--dtype`` says otherwise, on a CPU too; ``eval.parallel.generation_dtype``); a resumed file must have the
same (lines from before engine and dtype were recorded are taken to match). ``--lcb-release``,
``--lcb-start-date``, ``--lcb-end-date`` select LiveCodeBench's problems.

Samples that could not be graded (``grader_error``: the grader crashed, its sandbox could not run; ``timeout``:
math-verify's hard limit, or the code graders' per-sample one) are never scored: they are kept in the files with
that verdict, counted in the report and the leaderboard, excluded from every score, and graded again by the next
run over the same file. When any remain, ``run_eval`` does not write the leaderboard and the command exits 3, unless
``--allow-ungraded``.
Bad input (a config value, a malformed file, an unknown id, a missing, damaged or wrong model folder, an --out that
is a file, no problems to score, an unknown --baseline or lm-eval task, a benchmark, task or model folder named
twice, a results file another process is writing, a code benchmark on a machine where the sandbox is not fully
isolated without ``--allow-unisolated``) ends the command with one line naming the
field or the file and line, exit status 2, before any model loads and before anything is written. A failure inside
the run is one line too, exit 1 (``THINKING_SEEDS_DEBUG=1`` prints its traceback); Ctrl-C exits 130 and SIGTERM
143, each with one line: the files keep every chunk written, and the same command resumes from them
(``contracts.commands``, the grammar every command shares). The report lines give rates as percentages
(``aime24: avg@32 43.1% [38.2, 48.0] over 30 problems``); the files keep fractions.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from pathlib import Path
from typing import Callable

from tqdm.auto import tqdm

from contracts.commands import EXIT_USAGE, run_command
from contracts.config import ConfigError
from contracts.jsonl import iter_jsonl
from contracts.samples import append_row, make_row
from scoring.benchmarks import get_benchmark
from scoring.benchmarks.base import Benchmark, Problem
from scoring.benchmarks.protocol import encode_prompts, sample_seed   # shared with the trainer's validation
from eval.config import PROFILES, EvalConfig, add_flags, flag_values, lcb_filters, load_eval_config, validate
from eval.grading import grade_responses, regrade, write_disagreements
from eval.inputs import (EvalInputError, check_results_path, data_settings, file_settings, load_problems, model_name,
                         prepare, read_samples_input, results_lock)
from eval.leaderboard import build_leaderboard, write_leaderboard
from eval.lm_eval_bridge import LM_EVAL_FILE, run_lm_eval, unknown_tasks
from eval.parallel import EngineSpec, Job, generation_dtype, make_generator
from inference.hub import ContextError, ModelSourceError, check_context, model_context, resolve_checked_model
from eval.report import file_report, format_report
from inference import load_tokenizer, resolve_engine
from scoring.math import MATH_MEMORY_MB
from scoring.pool import WorkerPool, apply
from scoring.sandbox import SandboxError, check_isolation
from scoring.templates import render_prompt

__all__ = ["EXIT_INPUT_ERROR", "EXIT_UNGRADED", "run_eval", "evaluate_samples", "evaluate_model", "build_parser",
           "parse_config", "main"]

Log = Callable[[str], None]

EXIT_INPUT_ERROR = EXIT_USAGE   # usage, config or input error: one line, no traceback, nothing written
EXIT_UNGRADED = 3      # everything ran, but some samples could not be graded (see --allow-ungraded)


class _CommandError(SystemExit, ValueError):
    """What ``main`` raises for a usage, config or input error, after printing its message: exit status 2 (no
    traceback); its text is the message, and it is still a ValueError for callers of ``main`` that catch those."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = EXIT_INPUT_ERROR


def _print(msg: str) -> None:
    print(msg, flush=True)


def _finish(name: str, bench: Benchmark, path: Path, timeouts: int, log: Log) -> dict | None:
    """The report of a file just written (math: the disagreements file rewritten first), logged as its line."""
    dis = write_disagreements(path) if bench.kind == "math" else None
    report = file_report(name, bench, path, timeouts=timeouts, disagreement=dis)
    if report is not None:
        log(format_report(report))
    return report


# ---------------------------------------------------------------------------------------------------------------
# the two sources of responses: a samples file, or a model

_SURROGATE = re.compile("[\ud800-\udfff]")


def _read_given(path: str, problems: list[Problem]) -> dict[str, tuple[list[str], list | None]]:
    """``eval.inputs.read_samples_input``, and a ValueError ``FILE:LINE`` for a lone surrogate in a response or a
    finish reason (``"\\ud800"`` in the JSON: half of a UTF-16 pair, which a tool that cuts text in UTF-16 units
    writes). It is no character: the result files, UTF-8, cannot hold it, and the run crashed at its first write
    after grading, on every rerun; refused before anything is written, the file is the user's to mend."""
    given = read_samples_input(path, problems)
    if not any(_lone_surrogate(rs) or _lone_surrogate(fr) for rs, fr in given.values()):
        return given
    for lineno, row in iter_jsonl(path):   # (only then: find its line)
        for what, key in (("response", "responses"), ("finish reason", "finish_reasons")):
            hit = _lone_surrogate(row.get(key))
            if hit:
                i, m = hit
                raise ValueError(f"{path}:{lineno}: {what} {i + 1} holds a lone surrogate {m.group()!r} at character "
                                 f"{m.start() + 1} (half of a UTF-16 pair, not a character: the results are written "
                                 f"as UTF-8, which cannot hold it); replace it, e.g. with '\\ufffd', the replacement "
                                 f"character, and run again")
    raise AssertionError(f"{path}: a lone surrogate read from the file was not found on any of its lines")


def _lone_surrogate(values) -> tuple[int, re.Match] | None:
    """(index, match) of the first string of ``values`` (a list; anything else holds none) with a lone surrogate."""
    for i, text in enumerate(values if isinstance(values, list) else []):
        m = _SURROGATE.search(text) if isinstance(text, str) else None
        if m:
            return i, m
    return None


def evaluate_samples(name: str, bench: Benchmark, problems: list[Problem], samples_file: str, out_dir: Path, *,
                     template: str, limit: int | None = None, pool=None, chunk_problems: int = 16,
                     progress: bool = False, log: Log = _print, data: dict | None = None) -> dict | None:
    """Grade responses produced elsewhere; append to ``out_dir/name/<benchmark>.jsonl``. ``problems``: all of the
    benchmark's (ids in the file are checked against them); ``limit``: grade only the first ``limit`` of them.
    Returns the file's report (``eval.report.file_report``; ``path`` is the sample file), None when it holds no
    rows."""
    given = _read_given(samples_file, problems)
    problems = [p for p in problems[:limit] if p.id in given]
    settings = {"model": name, "model_path": None, "benchmark": bench.name, "benchmark_version": bench.version,
                "n": None, "temperature": None, "top_p": None, "top_k": None, "max_tokens": None, "template": template,
                "seed": None, "samples_file": Path(samples_file).name, "engine": None, "dtype": None, "data": data}
    path = out_dir / name / f"{bench.name}.jsonl"
    todo = prepare(path, problems, settings)
    regrade(path, bench, problems, pool, log)
    path.parent.mkdir(parents=True, exist_ok=True)
    timeouts = 0
    bar = tqdm(total=len(todo), desc=f"grade {name} {bench.name}", disable=not progress)
    with open(path, "a", encoding="utf-8") as f:
        for start in range(0, len(todo), chunk_problems):
            chunk = todo[start:start + chunk_problems]
            responses = [given[p.id][0] for p in chunk]
            verdicts, qwen, t = grade_responses(bench, chunk, responses, pool=pool)
            timeouts += t
            for i, p in enumerate(chunk):
                append_row(f, make_row(p, render_prompt(template, p.question), responses[i], verdicts[i],
                                       None if qwen is None else qwen[i], given[p.id][1], settings))
            bar.update(len(chunk))
    bar.close()
    return _finish(name, bench, path, timeouts, log)


def evaluate_model(spec: str, name: str, benches: list[tuple[Benchmark, list[Problem], dict]], out_dir: Path, *,
                   engine: str, seed: int, pool=None, chunk_sequences: int = 512, device=None, dtype=None,
                   gpu_memory_utilization: float = 0.85, tensor_parallel_size: int = 1, data_parallel_size: int = 1,
                   progress: bool = True, log: Log = _print) -> list[dict]:
    """Generate and grade every benchmark for one model. ``benches``: (benchmark, problems, settings) with the
    settings already checked against existing files (``eval.inputs.prepare``), so nothing expensive starts before
    errors. ``data_parallel_size`` engines (``eval.parallel``), each on ``tensor_parallel_size`` GPUs, share the
    chunks. Returns one report per benchmark with rows (``eval.report.file_report``), in ``benches`` order."""
    engine = resolve_engine(engine, model_path=spec)
    tokenizer = load_tokenizer(spec)
    work = []   # per benchmark: the problems still to do, their prompts and token ids (tokenized once)
    for bench, problems, settings in benches:
        path = out_dir / name / f"{bench.name}.jsonl"
        todo = prepare(path, problems, settings)
        regrade(path, bench, problems, pool, log)
        prompts, ids = encode_prompts(settings["template"], todo, tokenizer)
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
    reports = []
    for bench, settings, path, todo, prompts, ids in work:
        path.parent.mkdir(parents=True, exist_ok=True)
        n = settings["n"]
        per_chunk = max(1, chunk_sequences // n)
        starts = list(range(0, len(todo), per_chunk))
        jobs = (Job(key=k, prompts=[x for x in ids[a:a + per_chunk] for _ in range(n)],
                    max_new_tokens=settings["max_tokens"], temperature=settings["temperature"],
                    top_p=settings["top_p"], top_k=settings["top_k"],
                    # sample j of a problem: its own seed, whatever chunk or engine process draws it
                    seeds=tuple(sample_seed(seed, bench.name, p.id, j) for p in todo[a:a + per_chunk]
                                for j in range(n)))
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
                    append_row(f, make_row(p, prompts[a + i], responses[i], verdicts[i],
                                           None if qwen is None else qwen[i], finish[i], settings))
                bar.update(len(chunk))
                bar.set_postfix(gen_tok_s=f"{sum(len(tok) for tok, _ in comps) / max(gen_s, 1e-9):.0f}")
                t0 = time.perf_counter()
        bar.close()
        report = _finish(name, bench, path, timeouts, log)
        if report is not None:
            reports.append(report)
    return reports


# ---------------------------------------------------------------------------------------------------------------
# the library entry

def run_eval(cfg: EvalConfig, *, log: Log = _print) -> dict:
    """Score every model on every benchmark of ``cfg`` (the module docstring); resumes from the sample files under
    ``cfg.out``. ``log`` receives one ``format_report`` line per (model, benchmark) as it finishes (and
    LiveCodeBench's selection when it is loaded).

    Returns ``{"reports": [...], "leaderboard": ..., "leaderboard_md": ..., "ungraded": k, "lm_eval_files": [...]}``:
    one report per
    (model, sample-file benchmark) in the order scored, each ``{"model", "benchmark", "kind", "path", "problems",
    "n_min", "n_max", "avg", "avg_ci": (low, high), "grading_timeouts", "disagreement_rate", "disagreements",
    "ungraded", "ungraded_problems"}`` (``grading_timeouts`` and the disagreement fields None outside math;
    scores over every graded sample in the file, earlier runs' included), then the leaderboard of everything under
    ``out`` (``eval.leaderboard.build_leaderboard``) and its markdown, both also written there, and the number of
    samples of those files that could not be graded, and the lm-evaluation-harness result files written (with
    ``lm_eval_tasks``). When that is not 0 the leaderboard is NOT written (both are
    None) unless ``allow_ungraded``. Raises ``ConfigError`` (``eval.config.validate``) for a config that cannot run
    and ``EvalInputError`` for bad inputs, before any model is loaded and before anything is written.
    """
    validate(cfg)
    benches = [get_benchmark(b) for b in cfg.benchmarks]
    if any(b.kind == "code" for b in benches):   # their responses run in the sandbox: refused if not fully isolated
        try:
            check_isolation(allow_unisolated=cfg.allow_unisolated)
        except SandboxError as e:
            raise EvalInputError(str(e)) from None
    lcb = lcb_filters(cfg)
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise EvalInputError(f"--out {cfg.out}: is a file, not a results folder; choose another --out")
    if cfg.samples and not Path(cfg.samples).is_file():
        raise EvalInputError(f"--samples {cfg.samples}: no such file")
    # where each model's files are (a hub id: its cached snapshot), checked, before anything is loaded or written
    try:
        sources = {} if cfg.samples else {spec: resolve_checked_model(spec, what="--model") for spec in cfg.models}
    except ModelSourceError as e:
        raise EvalInputError(str(e)) from None
    pairs = [(spec, (cfg.names[i] if cfg.names else model_name(spec))) for i, spec in enumerate(cfg.models)]
    seen: dict[str, str] = {}
    for spec, name in pairs:   # two models into one folder would append to each other's files
        if name in seen:
            raise EvalInputError(
                f"--model {spec} is given twice; list each model once" if seen[name] == spec else
                f"--model {seen[name]} and --model {spec} would both write {out / name}; give each its own --name")
        seen[name] = spec
    if cfg.baseline is not None:   # the leaderboard's models: those already under out and this run's
        known = sorted({name for _, name in pairs} | ({d.name for d in out.iterdir() if d.is_dir()}
                                                       if out.is_dir() else set()))
        if cfg.baseline not in known:
            raise EvalInputError(f"--baseline {cfg.baseline!r} is not a model of this run or under {out}; choose "
                                 f"one of: {', '.join(known)}")
    if cfg.lm_eval_tasks:
        try:
            unknown = unknown_tasks(cfg.lm_eval_tasks, include_path=cfg.lm_eval_include_path)
        except ImportError as e:
            raise EvalInputError(str(e)) from None
        if unknown:
            raise EvalInputError(f"--lm-eval-tasks: lm-eval knows no task {', '.join(map(repr, unknown))}"
                                 + (f" (nor {cfg.lm_eval_include_path})" if cfg.lm_eval_include_path else "")
                                 + "; see `lm_eval ls tasks`, or give --lm-eval-include-path FOLDER of task YAMLs")

    # load problems and check existing files before any model is loaded
    loaded: list[tuple[Benchmark, list[Problem], dict]] = []
    for bench in benches:
        filters = {k: v for k, v in lcb.items() if k in bench.filters}
        probs = load_problems(bench, cfg.problems, filters)
        try:
            data = data_settings(bench, probs, cfg.problems, filters)
        except (ValueError, OSError) as e:
            raise EvalInputError(f"{bench.name}: {e}") from None
        if bench.name == "livecodebench":
            log(data.get("selection", ""))
        if cfg.limit is not None and not cfg.samples:   # with samples, ids are checked against all problems
            probs = probs[:cfg.limit]
        loaded.append((bench, probs, data))

    pool = WorkerPool(apply, timeout=cfg.grade_timeout, workers=cfg.workers, memory_mb=MATH_MEMORY_MB) if any(
        b.kind == "math" for b in benches) else None
    reports: list[dict] = []
    lm_files: list[Path] = []   # lm-evaluation-harness's result files this run writes
    locks = contextlib.ExitStack()   # one writer per results file: held until every file of this run is written

    def lock(path: Path) -> None:
        """Check the results file's path and take its lock (EvalInputError naming the holder when another process
        writes it), before the file is read for a resume or written."""
        check_results_path(path)
        held = locks.enter_context(results_lock(path))
        if held.stale:
            log(f"warning: {held.stale}")

    try:
        if cfg.samples:
            (bench, probs, data), (spec, name) = loaded[0], pairs[0]
            try:
                given = _read_given(cfg.samples, probs)   # file:line errors before anything is written
            except ValueError as e:
                raise EvalInputError(str(e)) from None
            if not any(p.id in given for p in probs[:cfg.limit]):
                raise EvalInputError(f"--samples {cfg.samples}: " + (
                    "holds no rows; give a file of JSON lines {\"problem_id\": ..., \"responses\": [...]}" if not
                    given else f"none of its {len(given)} problems is among the first {cfg.limit} (--limit)"))
            lock(out / name / f"{bench.name}.jsonl")
            report = evaluate_samples(name, bench, probs, cfg.samples, out,
                                      template=cfg.template or bench.default_template, limit=cfg.limit, pool=pool,
                                      progress=cfg.progress, log=log, data=data)
            reports += [report] if report is not None else []
        else:
            plans = []
            for spec, name in pairs:
                # the engine and the dtype the samples will be generated in (recorded, checked on a resume)
                engine = resolve_engine(cfg.engine, model_path=sources[spec].path)
                dtype = generation_dtype(engine, cfg.dtype, sources[spec].path)
                tokenizer, context = load_tokenizer(sources[spec].path), model_context(sources[spec].path)
                plan = []
                for bench, probs, data in loaded:
                    settings = file_settings(bench, sources[spec].identity, name, n=cfg.n,
                                             temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                             max_tokens=cfg.max_tokens, template=cfg.template, seed=cfg.seed,
                                             data=data, engine=engine, dtype=dtype)
                    # raises when another process writes the file, or on a settings mismatch, before any model loads
                    lock(out / name / f"{bench.name}.jsonl")
                    prepare(out / name / f"{bench.name}.jsonl", probs, settings)
                    # every prompt plus its budget fits the model's context (or the config's max_context): checked
                    # now, before any weights load, not found when a response runs past the last position
                    ids = {p.id: tokenizer(render_prompt(settings["template"], p.question, tokenizer),
                                           add_special_tokens=False)["input_ids"] for p in probs}
                    try:
                        check_context(f"--model {spec}: {bench.name}", ids, settings["max_tokens"], context,
                                      cap=cfg.max_context, where=str(Path(sources[spec].path) / "config.json"),
                                      hint="" if cfg.profile else f", or give the backbone's --profile "
                                                                  f"({', '.join(PROFILES)})")
                    except ContextError as e:
                        raise EvalInputError(str(e)) from None
                    plan.append((bench, probs, settings))
                if cfg.lm_eval_tasks:   # lm-evaluation-harness's result file: one writer too
                    lock(out / name / LM_EVAL_FILE)
                plans.append((spec, name, engine, dtype, plan))
            for spec, name, engine, dtype, plan in plans:
                if plan:
                    reports += evaluate_model(sources[spec].path, name, plan, out, engine=engine, seed=cfg.seed,
                                              pool=pool, chunk_sequences=cfg.chunk_sequences, device=cfg.device,
                                              dtype=dtype, gpu_memory_utilization=cfg.gpu_memory_utilization,
                                              tensor_parallel_size=cfg.tensor_parallel_size,
                                              data_parallel_size=cfg.data_parallel_size, progress=cfg.progress,
                                              log=log)
                if cfg.lm_eval_tasks:
                    lm_files.append(out / name / LM_EVAL_FILE)
                    run_lm_eval(sources[spec].path, cfg.lm_eval_tasks, out / name,
                                include_path=cfg.lm_eval_include_path, limit=cfg.lm_eval_limit, device=cfg.device,
                                engine=cfg.engine, seed=cfg.seed, temperature=cfg.temperature, top_p=cfg.top_p,
                                max_tokens=cfg.max_tokens)
    finally:
        if pool is not None:
            pool.close()
        locks.close()

    ungraded = sum(r.get("ungraded") or 0 for r in reports)
    if (ungraded and not cfg.allow_ungraded) or not out.is_dir():
        return {"reports": reports, "leaderboard": None, "leaderboard_md": None, "ungraded": ungraded,
                "lm_eval_files": lm_files}
    try:
        # the board python -m eval.leaderboard OUT writes: the same order (oldest results first) and baseline
        # (--baseline, else the first model on the board), so the two commands never disagree about one folder
        board = build_leaderboard(out, baseline=cfg.baseline)
    except ValueError as e:   # --baseline among no model with rows (checked against the folders above)
        raise EvalInputError(str(e)) from None
    for why in board["skipped"]:
        log(f"warning: leaderboard: {why}")
    return {"reports": reports, "leaderboard": board, "leaderboard_md": write_leaderboard(board, out),
            "ungraded": ungraded, "lm_eval_files": lm_files}


# ---------------------------------------------------------------------------------------------------------------
# CLI

EPILOG = """\
settings, each layer overriding the one before:
  the defaults of eval.config.EvalConfig < --profile NAME (eval/configs/NAME.yaml, a backbone's sampling settings)
  < --config FILE.yaml < the flags above < key=value overrides
  (a field's key is its flag without the dashes, with underscores: --max-tokens 3072 is max_tokens=3072;
  --model is models, --name names, --no-progress progress=false; lists as a,b or [a, b]; null for unset).
  Presets: eval/configs/.

exit status: 0; 2 for a usage, config or input error, or a results file another process is writing (one line
naming the field, the file or the holder; nothing written);
3 when some samples could not be graded and --allow-ungraded was not given (the leaderboard is not written);
1 a failure inside the run (one line; THINKING_SEEDS_DEBUG=1 prints the traceback); 130 Ctrl-C, 143 SIGTERM
(one line: the results written so far stay, the same command resumes from them)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.run", description=__doc__.split("\n\n")[0], epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=None, metavar="FILE.yaml",
                   help="a preset: a flat YAML mapping of config fields (eval/configs/*.yaml)")
    add_flags(p)
    p.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                   help="config field overrides; they win over the flags and the --config file")
    return p


def parse_config(argv: list[str] | None = None) -> EvalConfig:
    """The command line's config: ``--config FILE`` < flags < ``key=value`` (ConfigError; not yet validated)."""
    args = build_parser().parse_intermixed_args(argv)
    return load_eval_config(args.config, args.overrides, flag_values(args))


def written(cfg: EvalConfig, result: dict) -> str:
    """The command's last line: where this run wrote (each results file it scored, lm-evaluation-harness's result
    files, the leaderboard), or that it wrote nothing."""
    out = Path(cfg.out)
    files = [str(r["path"]) for r in result["reports"] if r.get("path")]
    files += [str(f) for f in result.get("lm_eval_files", [])]
    if result["leaderboard_md"] is not None:
        files.append(f"{out / 'leaderboard.md'} (.csv, .json)")
    return "wrote: " + ("; ".join(files) if files else f"nothing (no results under {out})")


def main(argv: list[str] | None = None) -> int:
    """The command line over ``run_eval`` (``contracts.commands``): exit 0; 2 with one line for a usage, config or
    input error (nothing written; raised as SystemExit(2), still a ValueError for callers that catch those); 3 when
    some samples could not be graded and ``--allow-ungraded`` was not given (the leaderboard is not written); 1 with
    one line for a failure inside the run; 130 on Ctrl-C and 143 on SIGTERM, with where the same command resumes."""
    state: dict = {}

    def body() -> int:
        try:
            cfg = state["cfg"] = parse_config(argv)
            result = run_eval(cfg)
        except (ConfigError, EvalInputError) as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            raise _CommandError(f"error: {e}") from None
        if result["ungraded"] and not cfg.allow_ungraded:
            print(f"error: {result['ungraded']} samples could not be graded (grader errors or grader timeouts; see "
                  f"the 'NOT GRADED' lines above and the grader_error/timeout verdicts in the result files). The "
                  f"leaderboard was not written. Fix the grader and run the same command again (it grades them "
                  f"again), or pass --allow-ungraded to write the leaderboard without them.", file=sys.stderr,
                  flush=True)
            print(written(cfg, result), flush=True)
            return EXIT_UNGRADED
        if result["leaderboard_md"] is not None:
            print(result["leaderboard_md"])
        print(written(cfg, result), flush=True)
        return 0

    def resume() -> str:
        cfg = state.get("cfg")
        if cfg is None:
            return "nothing was written"
        return (f"the results written so far are under {cfg.out}; the same command resumes there (problems "
                f"already in a results file are skipped)")

    def kept() -> str | None:
        cfg = state.get("cfg")
        return None if cfg is None else f"the results written so far are kept under {cfg.out} and the same command " \
                                        f"resumes there"

    return run_command(body, resume=resume, kept=kept)


if __name__ == "__main__":
    sys.exit(main())
