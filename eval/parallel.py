"""Generation for ``eval.run`` in this process or in D engine processes (data parallelism across a node's GPUs).

``eval.run`` hands the engine a list of ``Job`` (one generate call: a chunk of problems, each prompt repeated n
times, with one seed per sample) and reads the results back in job order, whichever engine ran them:

* ``LocalGenerator``: one engine in this process (HF on ``--device``, or vLLM with ``--tensor-parallel-size``
  GPUs); jobs run one at a time as they are read, so a chunk is graded and written before the next is generated.
* ``ParallelGenerator``: ``--data-parallel-size D`` engine processes (``spawn``), process r on GPUs
  ``[r*t, (r+1)*t)`` of the visible ones (t = tensor-parallel size; ``CUDA_VISIBLE_DEVICES`` set before torch
  starts in the child), on a CPU machine with cores / D threads each. Jobs go to one shared queue, so a fast engine
  takes more chunks; the parent decodes, grades and writes each result as soon as every earlier job's is in, so
  grading overlaps generation and the files are written in the same order as with one engine.

A problem's completions depend only on the problem and its per-sample seeds (``Job.seeds``; both engines draw each
row from its own seed), so the result files of D engines equal those of one engine, whichever engine takes a
chunk and however problems are chunked. An engine process that fails to start or dies ends the run
with ``EngineWorkerError`` naming it; everything written before stays (the next run resumes there). Engines are
closed (their memory released) when the generator closes: after each model, before lm-eval starts.
"""

from __future__ import annotations

import os
import queue
import traceback
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from inference.hub import checkpoint_dtype
from scoring.pool import default_workers

__all__ = ["EngineSpec", "EngineWorkerError", "Job", "LocalGenerator", "ParallelGenerator", "generation_dtype",
           "gpu_groups", "make_generator"]

Result = list[tuple[list[int], str]]   # per sequence: token ids, finish reason


class EngineWorkerError(RuntimeError):
    """An engine process failed to start or died; the message names it and carries its error."""


@dataclass(frozen=True)
class EngineSpec:
    """Everything an engine process needs to build the same engine as this process would."""
    model: str                         # a model folder, or a hub id (eval.run passes its snapshot's folder)
    engine: str                        # hf | vllm (resolved)
    dtype: str | None = None
    device: str | None = None          # hf: torch device (default cuda when there is one)
    gpu_memory_utilization: float = 0.85
    tensor_parallel_size: int = 1
    max_model_len: int | None = None   # vLLM: the longest prompt + its budget (not the model's whole context)
    max_batch_size: int = 512


@dataclass(frozen=True)
class Job:
    key: int
    prompts: list[list[int]]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int = 0                         # 0: off (``inference.protocol.TOP_K_OFF``)
    seed: int | None = None                # one for the whole call (a row's draws then depend on its chunk) ...
    seeds: tuple[int, ...] | None = None   # ... or one per prompt (``Sampler.generate(seeds=...)``; eval.run's)


def generation_dtype(engine: str, dtype: str | None, model_dir: str | os.PathLike, *, cuda: bool | None = None
                     ) -> str:
    """The dtype ``engine`` (resolved: hf or vllm) generates in, the one ``build_sampler`` loads and a results file
    records. ``dtype`` given: that one ("auto": the checkpoint's, ``inference.hub.checkpoint_dtype``). Unset: vLLM
    bfloat16 on every machine (its CPU build too, even for a float32 checkpoint); the HF engine bfloat16 on a CUDA
    machine, else the checkpoint's. ``cuda``: whether CUDA is available (default: ask torch)."""
    if dtype is None:
        if cuda is None:
            import torch
            cuda = torch.cuda.is_available()
        if engine == "vllm" or cuda:
            return "bfloat16"
        dtype = "auto"
    return checkpoint_dtype(model_dir) if dtype == "auto" else dtype


def build_sampler(spec: EngineSpec):
    """The engine ``spec`` names, and its tokenizer. ``spec.model`` is a folder or a hub id (its snapshot in the
    cache: ``inference.hub``). vLLM loads the weights itself from that folder (this process holds only the model's
    skeleton); HF loads them onto ``device``. Both in ``generation_dtype``."""
    import torch

    from inference import load_policy, load_skeleton, load_tokenizer, make_sampler
    from inference.hub import local_model_dir
    cuda = torch.cuda.is_available()
    path = local_model_dir(spec.model, what="--model")
    dtype = generation_dtype(spec.engine, spec.dtype, path, cuda=cuda)
    if spec.engine == "vllm":
        tokenizer = load_tokenizer(path)
        model = load_skeleton(path, dtype=dtype)
        sampler = make_sampler(model, tokenizer, engine="vllm", model_path=path, sync_weights=False,
                               gpu_memory_utilization=spec.gpu_memory_utilization, max_model_len=spec.max_model_len,
                               tensor_parallel_size=spec.tensor_parallel_size, max_batch_size=spec.max_batch_size)
    else:
        model, tokenizer = load_policy(path, device=spec.device or ("cuda" if cuda else None), dtype=dtype)
        sampler = make_sampler(model, tokenizer, engine="hf")
    return sampler, tokenizer


def _run_job(sampler, job: Job) -> Result:
    comps = sampler.generate(job.prompts, max_new_tokens=job.max_new_tokens, temperature=job.temperature,
                             top_p=job.top_p, top_k=job.top_k, seed=job.seed, seeds=job.seeds)
    return [(list(c.token_ids), c.finish_reason) for c in comps]


def _close(sampler) -> None:
    close = getattr(sampler, "close", None)
    if close is not None:
        close()


class LocalGenerator:
    """One engine in this process; ``run`` generates each job when its result is read."""

    def __init__(self, spec: EngineSpec):
        self.sampler, self.tokenizer = build_sampler(spec)

    def run(self, jobs: Iterable[Job]) -> Iterator[tuple[int, Result]]:
        for job in jobs:
            yield job.key, _run_job(self.sampler, job)

    def close(self) -> None:
        if self.sampler is not None:
            _close(self.sampler)
            self.sampler = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def visible_gpus() -> list[str]:
    """The GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else every GPU torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    import torch
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def gpu_groups(data_parallel: int, tensor_parallel: int, gpus: Sequence[str]) -> list[list[str]] | None:
    """The GPUs of each engine process (None on a machine without GPUs); ValueError when there are too few."""
    if not gpus:
        return None
    need = data_parallel * tensor_parallel
    if need > len(gpus):
        raise ValueError(f"--data-parallel-size {data_parallel} x --tensor-parallel-size {tensor_parallel} needs "
                         f"{need} GPUs, but {len(gpus)} are visible ({','.join(gpus)}); lower one of them")
    return [list(gpus[r * tensor_parallel:(r + 1) * tensor_parallel]) for r in range(data_parallel)]


def _worker(rank: int, spec: EngineSpec, gpus: list[str] | None, threads: int, jobs, results) -> None:
    """An engine process: build the engine, then run jobs from the queue until the sentinel None."""
    if gpus is not None:   # before torch (and vLLM) see the GPUs
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import torch
        if gpus is None:
            torch.set_num_threads(threads)
        sampler, _ = build_sampler(spec)
    except BaseException:
        results.put(("error", rank, f"engine {rank} could not start:\n{traceback.format_exc(limit=8)}"))
        return
    results.put(("ready", rank, None))
    try:
        while True:
            job = jobs.get()
            if job is None:
                break
            results.put(("ok", job.key, _run_job(sampler, job)))
    except BaseException:
        results.put(("error", rank, f"engine {rank} failed:\n{traceback.format_exc(limit=8)}"))
    finally:
        _close(sampler)


class ParallelGenerator:
    """``data_parallel`` engine processes sharing one job queue (see the module doc)."""

    POLL_S = 2.0

    def __init__(self, spec: EngineSpec, data_parallel: int, *, gpus: Sequence[str] | None = None):
        import multiprocessing as mp
        if data_parallel < 2:
            raise ValueError("ParallelGenerator needs data_parallel >= 2 (use LocalGenerator for one engine)")
        from inference import load_tokenizer
        self.tokenizer = load_tokenizer(spec.model)
        groups = gpu_groups(data_parallel, spec.tensor_parallel_size, visible_gpus() if gpus is None else gpus)
        cores = default_workers()   # the usable cores
        ctx = mp.get_context("spawn")   # never fork a process that may hold CUDA or engine threads
        self.jobs, self.results = ctx.Queue(), ctx.Queue()
        self.procs = []
        for r in range(data_parallel):
            p = ctx.Process(target=_worker, name=f"eval-engine-{r}", daemon=True,
                            args=(r, spec, None if groups is None else groups[r],
                                  max(1, cores // data_parallel), self.jobs, self.results))
            p.start()
            self.procs.append(p)
        try:
            for _ in range(data_parallel):   # every engine up before any job goes out: start-up errors first
                kind, rank, msg = self._get()
                if kind == "error":
                    raise EngineWorkerError(msg)
        except BaseException:
            self.close()
            raise

    def _get(self):
        while True:
            try:
                return self.results.get(timeout=self.POLL_S)
            except queue.Empty:
                dead = [(i, p.exitcode) for i, p in enumerate(self.procs) if not p.is_alive()]
                if dead:
                    try:   # a last message (its error) may have arrived just before it exited
                        return self.results.get(timeout=self.POLL_S)
                    except queue.Empty:
                        i, code = dead[0]
                        raise EngineWorkerError(f"engine {i} died (exit code {code}) without a message; its "
                                                f"last chunk is lost, the chunks written before are kept: rerun "
                                                f"the same command to resume") from None

    def run(self, jobs: Iterable[Job]) -> Iterator[tuple[int, Result]]:
        order = []
        for job in jobs:
            self.jobs.put(job)
            order.append(job.key)
        ready: dict[int, Result] = {}
        for key in order:
            while key not in ready:
                kind, k, value = self._get()
                if kind == "error":
                    raise EngineWorkerError(value)
                ready[k] = value
            yield key, ready.pop(key)

    def close(self) -> None:
        try:   # jobs nobody will read (an error upstream): not generated
            while True:
                self.jobs.get_nowait()
        except (queue.Empty, OSError, ValueError):
            pass
        for p in self.procs:
            if p.is_alive():
                self.jobs.put(None)
        for p in self.procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
                p.join()
        self.procs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_generator(spec: EngineSpec, data_parallel: int = 1):
    return LocalGenerator(spec) if data_parallel <= 1 else ParallelGenerator(spec, data_parallel)
