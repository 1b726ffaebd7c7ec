"""Run lm-evaluation-harness tasks on a checkpoint; their main metric joins our leaderboard.

``run_lm_eval(model, tasks, out_dir)`` calls ``lm_eval.simple_evaluate`` (the ``hf`` backend, or ``vllm`` when the
engine is vLLM on a GPU) and writes the result dict, without per-sample logs, to ``<out_dir>/lm_eval.json``;
``eval.leaderboard.lm_eval_entries`` turns it into leaderboard rows (task, main metric, ±1.96 stderr, count).
``include_path`` points lm-eval at a folder of local task YAMLs (offline use). lm-eval is imported lazily:
``pip install thinking-seeds[lmeval]``.

Sampling flags of ``eval.run`` reach lm-eval as its ``gen_kwargs`` (they override the tasks' generation settings
for generate-until tasks; log-likelihood tasks do not sample): ``temperature`` (and ``do_sample``),
``top_p``, ``max_tokens`` as ``max_gen_toks``. ``--n`` has no lm-eval equivalent (each task sets its own repeats):
``eval.run`` refuses it together with lm-eval tasks.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
from pathlib import Path
from typing import Sequence

from contracts.files import atomic_write_text

__all__ = ["run_lm_eval", "gen_kwargs", "task_manager", "unknown_tasks", "LM_EVAL_FILE"]

LM_EVAL_FILE = "lm_eval.json"


def _jsonable(x):
    """The result dict with anything json cannot hold turned into strings (numpy scalars, dtypes, callables)."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def gen_kwargs(*, temperature: float | None = None, top_p: float | None = None,
               max_tokens: int | None = None) -> dict | None:
    """lm-eval ``gen_kwargs`` for the given sampling flags (None when none is given: the tasks' own settings)."""
    kw: dict = {}
    if temperature is not None:
        kw["temperature"] = float(temperature)
        kw["do_sample"] = temperature > 0
    if top_p is not None:
        kw["top_p"] = float(top_p)
    if max_tokens is not None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        kw["max_gen_toks"] = int(max_tokens)
    return kw or None


def _import_lm_eval():
    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise ImportError("--lm-eval-tasks needs lm-evaluation-harness: pip install 'thinking-seeds[lmeval]'") from None
    return lm_eval, TaskManager


@functools.lru_cache(maxsize=4)
def task_manager(include_path: str | None = None):
    """lm-eval's index of its tasks (and those under ``include_path``), built once per process and include path:
    it parses every task YAML, several seconds that ``unknown_tasks`` and ``run_lm_eval`` then share. Offline."""
    _, TaskManager = _import_lm_eval()
    return TaskManager(include_path=include_path) if include_path else TaskManager()


def unknown_tasks(tasks: Sequence[str], *, include_path: str | None = None) -> list[str]:
    """The names in ``tasks`` lm-eval does not know: no task, group or tag of that name in its index
    (``task_manager``), not a task YAML file, not a glob pattern matching some. Checked before any model loads:
    lm-eval itself finds an unknown name only after it has loaded the model (and ``eval.run`` runs lm-eval after
    generating every benchmark). ImportError when lm-eval is not installed."""
    names = [t for t in tasks if not os.path.exists(t)]
    if not names:
        return []
    tm = task_manager(include_path)
    known = set(tm.all_tasks)
    return [t for t in names if t not in known and not (any(c in t for c in "*?[") and tm.match_tasks([t]))]


def run_lm_eval(model: str, tasks: Sequence[str], out_dir: str | os.PathLike, *, include_path: str | None = None,
                limit: int | None = None, device: str | None = None, engine: str = "auto", seed: int = 0,
                batch_size: int | str = 8, num_fewshot: int | None = None, temperature: float | None = None,
                top_p: float | None = None, max_tokens: int | None = None, n: int | None = None) -> dict:
    """Evaluate ``model`` (a directory or hub id) on lm-eval ``tasks``; write and return the results dict.
    ``temperature``, ``top_p``, ``max_tokens`` go to lm-eval's ``gen_kwargs``; ``n`` is refused (ValueError)."""
    if n is not None:
        raise ValueError("lm-eval has no per-call sample count: each task sets its own repeats; drop n")
    extra = gen_kwargs(temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    lm_eval, _ = _import_lm_eval()
    import torch
    cuda = torch.cuda.is_available()
    use_vllm = engine == "vllm" or (engine == "auto" and cuda and importlib.util.find_spec("vllm") is not None)
    if use_vllm:
        backend, model_args = "vllm", {"pretrained": model, "dtype": "auto", "gpu_memory_utilization": 0.8}
    else:
        if importlib.util.find_spec("accelerate") is None:   # lm-eval's hf backend imports it
            raise ImportError("lm-eval's hf backend needs accelerate: pip install accelerate")
        backend, model_args = "hf", {"pretrained": model, "dtype": "bfloat16" if cuda else "float32"}
    tm = task_manager(include_path)
    results = lm_eval.simple_evaluate(model=backend, model_args=model_args, tasks=list(tasks), task_manager=tm,
                                      limit=limit, device=device or ("cuda" if cuda else "cpu"),
                                      batch_size=batch_size, num_fewshot=num_fewshot, log_samples=False,
                                      random_seed=seed, numpy_random_seed=seed, torch_random_seed=seed,
                                      fewshot_random_seed=seed, gen_kwargs=extra)
    if results is None:   # non-zero ranks under distributed lm-eval return None
        return {}
    results = _jsonable({k: v for k, v in results.items() if k != "samples"})
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if (out / LM_EVAL_FILE).is_file():   # keep tasks of earlier runs; this run's tasks replace theirs
        old = json.loads((out / LM_EVAL_FILE).read_text(encoding="utf-8"))
        for key in ("results", "n-samples", "configs", "versions", "n-shot", "higher_is_better"):
            if isinstance(old.get(key), dict) and isinstance(results.get(key), dict):
                results[key] = {**old[key], **results[key]}
    atomic_write_text(out / LM_EVAL_FILE, json.dumps(results, indent=1))
    return results
