"""Validation during training: the policy of a step scored on benchmarks, the way ``eval.run`` scores a checkpoint.

verl's ``trainer.test_freq`` / ``val_before_train`` and TRL's ``eval_strategy="steps"`` / ``eval_on_start``, with the
paper's protocol (§5.1): every ``val_every`` steps the run's own rollout engine (vLLM woken from sleep with the step's
weights, or the HF engine) samples ``val_n`` responses per problem of each of ``val_benchmarks``, graded by the graders
``eval.run`` uses; the checkpoint with the highest ``select_metric`` (default: the mean avg@n over the benchmarks, the
paper's "combined average on AIME24 and AIME25") is ``runs/<run>/checkpoints/best`` (``trainer.checkpoint``).

Equal to ``eval.run``: everything both need is defined once in ``scoring.benchmarks.protocol`` and called by both —
the settings (each ``val_*`` field unset means the benchmark's default, as each eval.run flag), the prompt text and
its token ids, one seed per sample (``sample_seed(val_seed, benchmark, problem id, j)``), the batch grading and the
scores. So ``python -m eval.run --model runs/<run>/checkpoints/step_N --benchmarks aime24,aime25 --seed <val_seed>``
(plus the ``val_*`` values set, as flags) writes the responses and verdicts validation wrote for step N, and reports
its avg@n (tests/trainer/test_validate.py checks this on CPU). The engine may differ in one way only: eval.run loads the
saved export (``export_dtype``), validation samples from the weights in the run's compute dtype, which are the same
numbers when the export dtype is the compute dtype (the default).

Which steps: step s (0-based, as ``save_every`` counts) when ``(s + 1) % val_every == 0``, and the last step; with
``val_before_train`` also the starting policy, before step 0, recorded as step -1 (``BEFORE``; a baseline: it has no
checkpoint of this run, so it is never the best). A validated step always saves its checkpoint, so the best names a
real folder.

Ranks: the problems are split into contiguous blocks, one per rank; each rank samples and grades its block and the
results are gathered. Every sample draws from its own seed, so the result does not depend on the world size.

Written: ``metrics.jsonl`` (and the tracker) gets, in the step's line, ``val/<bench>/avg@<n>``, ``val/<bench>/pass@<k>``
for k = 1, 2, 4, ... up to n (``contracts.passk.k_grid``), ``val/<bench>/ungraded`` (samples a grader could not
grade: counted, never scored), ``val/<bench>/truncated_frac``, ``val/select`` and ``val/seconds`` (the validation's
wall time, weight sync included); ``runs/<run>/validation/step_NNNNNN/<bench>.jsonl`` (``before/`` for step -1) one
line per problem, in eval's sample-file layout: problem id, prompt, gold, responses, extracted answers, verdicts,
correct, finish reasons, settings.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from contracts.files import atomic_write_jsonl
from inference.hub import config_context, context_overflow
from scoring.benchmarks import Benchmark, Problem, get_benchmark
from scoring.benchmarks.protocol import encode_prompts, grade_responses, sample_seed, scores
from scoring.grading import GRADE_TIMEOUT_S
from scoring.math import MATH_MEMORY_MB
from scoring.pool import WorkerPool, apply, workers_per_rank
from trainer.config import Config, val_settings
from trainer.fsdp import Dist, gather_objects_to_main, wait_for_generation
from trainer.rollout import rank_rows

__all__ = ["BEFORE", "VAL_DIR", "ValidationError", "BenchPlan", "Selection", "is_due", "selection", "load_plan",
           "encode", "engine_context", "samples_dir", "Validator"]

BEFORE = -1            # the step number of the validation before training (the starting policy)
VAL_DIR = "validation"


class ValidationError(ValueError):
    """Validation cannot run as configured (a benchmark's data is missing, a prompt does not fit the engine): the
    message says what to do. Raised before the first step."""


def is_due(step: int, *, val_every: int, total_steps: int) -> bool:
    """Whether step ``step`` (0-based) is validated: every ``val_every``-th step ((step + 1) % val_every == 0, the
    count ``save_every`` uses) and the last one; never with ``val_every`` 0."""
    return val_every > 0 and ((step + 1) % val_every == 0 or step == total_steps - 1)


@dataclass(frozen=True)
class Selection:
    """What ``checkpoints/best`` maximises: ``select_metric``, or for ``mean_avg`` the mean of ``avg_names``."""
    metric: str
    avg_names: tuple[str, ...]

    def value(self, metrics: dict) -> float | None:
        """The value in a metrics line; None when the line lacks it (or it is NaN: no sample could be graded)."""
        names = self.avg_names if self.metric == "mean_avg" else (self.metric,)
        got = [metrics.get(k) for k in names]
        if any(v is None or not math.isfinite(v) for v in got):
            return None
        return sum(got) / len(got)


def selection(cfg: Config) -> Selection:
    """The run's ``Selection`` (``select_metric``; for mean_avg, the avg@n names of ``val_benchmarks``)."""
    avg = tuple(f"val/{b}/avg@{val_settings(cfg, get_benchmark(b))['n']}" for b in cfg.val_benchmarks)
    return Selection(cfg.select_metric, avg)


@dataclass
class BenchPlan:
    """One benchmark's validation: its problems, settings and (after ``encode``) prompts."""
    bench: Benchmark
    problems: list[Problem]
    settings: dict
    prompts: list[str] = field(default_factory=list)
    ids: list[list[int]] = field(default_factory=list)


def load_plan(cfg: Config) -> list[BenchPlan]:
    """Each benchmark's problems (its default source, as ``eval.run`` without ``--problems``; the first
    ``val_limit``) and settings. ValidationError naming the benchmark when its data cannot be read."""
    plan = []
    for name in cfg.val_benchmarks:
        bench = get_benchmark(name)
        try:
            problems = bench.load()
        except (ValueError, OSError, RuntimeError, ImportError) as e:
            said = str(e) if str(e).startswith(f"{name}:") else f"{name}: {e}"
            raise ValidationError(f"val_benchmarks: {said}") from None
        if not problems:
            raise ValidationError(f"val_benchmarks: {name} has no problems in its default data")
        ids = [p.id for p in problems]
        if len(set(ids)) != len(ids):
            raise ValidationError(f"val_benchmarks: {name}: duplicate problem ids; every problem needs its own id")
        if cfg.val_limit:
            problems = problems[:cfg.val_limit]
        settings = {"benchmark": name, "benchmark_version": bench.version, **val_settings(cfg, bench),
                    "seed": cfg.val_seed, "problems": len(problems)}
        plan.append(BenchPlan(bench, problems, settings))
    return plan


def engine_context(cfg: Config, model, engine: str) -> int | None:
    """The longest prompt + response the rollout engine takes: vLLM's ``max_model_len`` (as
    ``trainer.rollout.make_rollout_engine`` sets it), else the model's context as eval reads it
    (``inference.hub.config_context``: max_position_embeddings and its kin, RoPE scaling; None: no limit known)."""
    if engine == "vllm":
        return cfg.vllm_max_model_len or cfg.max_prompt_tokens + cfg.max_response_tokens
    config = getattr(model, "config", None)
    found = config_context(config.to_dict()) if hasattr(config, "to_dict") else None
    return found[0] if found else None


def encode(plan: list[BenchPlan], tokenizer, *, context: int | None) -> None:
    """Render and tokenize every prompt (``scoring.benchmarks.protocol.encode_prompts``); ValidationError when the
    longest prompt plus ``max_tokens`` exceeds ``context`` (``inference.hub.context_overflow``, the comparison eval
    and the relay make), before the first step."""
    for bp in plan:
        bp.prompts, bp.ids = encode_prompts(bp.settings["template"], bp.problems, tokenizer)
        over = context_overflow({p.id: ids for p, ids in zip(bp.problems, bp.ids)}, bp.settings["max_tokens"], context)
        if over is not None:
            raise ValidationError(
                f"val_benchmarks: {bp.bench.name}'s longest prompt is {over.prompt_tokens} tokens (template "
                f"{bp.settings['template']}); with max_tokens {over.max_tokens} it needs {over.total} tokens, more "
                f"than the engine's {over.limit} (vllm_max_model_len, else max_prompt_tokens + max_response_tokens for "
                f"vLLM; the model's max_position_embeddings for hf): lower val_max_tokens to "
                f"{max(1, over.room)} or raise vllm_max_model_len")


def samples_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / VAL_DIR / ("before" if step == BEFORE else f"step_{step:06d}")


def _gold(gold):
    return gold if isinstance(gold, (str, int, float)) and len(str(gold)) <= 2000 else None


class Validator:
    """Scores the policy on the plan; ``validator(step)`` is collective (every rank calls it after the step's
    update): ``sync()`` gives the engine the weights, every rank samples and grades its block, and rank 0 gets the
    metrics ({} elsewhere, ``val/seconds`` the whole of it), after writing the step's sample files. ``close()`` ends
    the grading pool."""

    def __init__(self, cfg: Config, plan: list[BenchPlan], *, sampler, tokenizer, d: Dist, run_dir: Path, engine: str,
                 dtype: str, sync: Callable[[], None] = lambda: None):
        self.plan, self.sampler, self.tokenizer, self.d, self.run_dir = plan, sampler, tokenizer, d, Path(run_dir)
        self.sync = sync   # gives the engine the weights to score (collective; trainer.rollout.sync_rollout_weights)
        self.selection = selection(cfg)
        self.common = {"model": cfg.run_name, "engine": engine, "dtype": dtype}
        self._pool = None

    @property
    def pool(self) -> WorkerPool:
        """Math grading processes, made on first use: this rank's share of its node's cores
        (``scoring.pool.workers_per_rank``), eval's hard per-item limit."""
        if self._pool is None:
            self._pool = WorkerPool(apply, timeout=GRADE_TIMEOUT_S, workers=workers_per_rank(),
                                    memory_mb=MATH_MEMORY_MB)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __call__(self, step: int) -> dict:
        t0 = time.perf_counter()
        d = self.d
        self.sync()
        mine = self._sample_and_grade()
        wait_for_generation(d)   # the slowest rank's tail, on the patient group: not in the gather's collective
        merged: dict[tuple[int, int], dict] = {}
        for part in gather_objects_to_main(mine, d) or []:   # only rank 0 writes the rows and the metrics
            merged.update(part)
        if not d.is_main:
            return {}
        metrics = {}
        for b, bp in enumerate(self.plan):
            rows = [merged[(b, i)] for i in range(len(bp.problems))]
            metrics.update(self._bench_metrics(bp, rows))
            settings = {**self.common, **bp.settings, "step": step}
            atomic_write_jsonl(samples_dir(self.run_dir, step) / f"{bp.bench.name}.jsonl",
                               [{**r, "settings": settings} for r in rows])
        value = self.selection.value(metrics)
        if value is not None:
            metrics["val/select"] = value
        metrics["val/seconds"] = time.perf_counter() - t0
        return metrics

    def _sample_and_grade(self) -> dict[tuple[int, int], dict]:
        """This rank's block of every group of benchmarks that share generation settings (one generate call per
        group), decoded and graded: {(benchmark index, problem index): row}."""
        groups: dict[tuple, list[tuple[int, int]]] = {}
        for b, bp in enumerate(self.plan):
            s = bp.settings
            groups.setdefault((s["temperature"], s["top_p"], s["top_k"], s["max_tokens"]), []).extend(
                (b, i) for i in range(len(bp.problems)))
        out = {}
        for (temperature, top_p, top_k, max_tokens), items in groups.items():
            block = [items[k] for k in rank_rows(len(items), self.d.rank, self.d.world_size)]
            if not block:
                continue
            prompts, seeds = [], []
            for b, i in block:
                bp = self.plan[b]
                n, p = bp.settings["n"], bp.problems[i]
                prompts += [bp.ids[i]] * n
                seeds += [sample_seed(bp.settings["seed"], bp.bench.name, p.id, j) for j in range(n)]
            comps = self.sampler.generate(prompts, max_new_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                          top_k=top_k, seeds=seeds)
            at = 0
            texts, finish = {}, {}
            for b, i in block:
                n = self.plan[b].settings["n"]
                texts[(b, i)] = [self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
                                 for c in comps[at:at + n]]
                finish[(b, i)] = [c.finish_reason for c in comps[at:at + n]]
                at += n
            for b in sorted({b for b, _ in block}):
                bp = self.plan[b]
                idx = [i for bb, i in block if bb == b]
                probs = [bp.problems[i] for i in idx]
                verdicts, qwen, _ = grade_responses(bp.bench, probs, [texts[(b, i)] for i in idx],
                                                    pool=self.pool if bp.bench.kind == "math" else None)
                for k, i in enumerate(idx):
                    p = bp.problems[i]
                    row = {"problem_id": p.id, "prompt": bp.prompts[i], "gold": _gold(p.gold),
                           "responses": texts[(b, i)], "answers": [v.answer for v in verdicts[k]],
                           "verdicts": [v.verdict for v in verdicts[k]],
                           "correct": [bool(v.correct) for v in verdicts[k]], "finish_reasons": finish[(b, i)]}
                    if qwen is not None:
                        row["correct_qwen"] = list(qwen[k])
                    out[(b, i)] = row
        return out

    @staticmethod
    def _bench_metrics(bp: BenchPlan, rows: list[dict]) -> dict:
        name, n = bp.bench.name, bp.settings["n"]
        s = scores([r["verdicts"] for r in rows], [r["correct"] for r in rows])
        out = {f"val/{name}/avg@{n}": s["avg"]}
        out.update({f"val/{name}/pass@{k}": v for k, v in s["pass"].items()})
        finishes = [f for r in rows for f in r["finish_reasons"]]
        out[f"val/{name}/ungraded"] = s["ungraded"]
        out[f"val/{name}/truncated_frac"] = sum(f == "length" for f in finishes) / max(len(finishes), 1)
        return out
