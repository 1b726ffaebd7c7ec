"""Evaluation configuration: one validated dataclass, ``EvalConfig``; YAML presets are flat overrides of its fields.

``python -m eval.run`` builds it from five layers, each overriding the one before: the field defaults, a model's
profile (``--profile NAME``: ``eval/configs/NAME.yaml``, one of ``PROFILES``), a preset (``--config
eval/configs/NAME.yaml``), the flags (every field has one: ``--max-tokens 3072`` is the shorthand of
``max_tokens=3072``), then ``key=value`` overrides. A profile holds a backbone's sampling settings (template,
temperature, top-p, top-k, budget, context), each line with its source; the paper states avg@32 (§5.1) but none of
them, so they come from the model cards, the model's config.json and the paper's training caps (docs/evaluation.md
has the table). ``load_eval_config`` is that merge; ``run_eval(cfg)`` validates
the result (``validate``) before any data or model is read. Each field's help text below is its one description:
the command's ``--help`` is generated from it. Choice fields are typed once as ``Literal`` (the engine names come
from ``inference.names``, the templates from ``scoring.templates``) and checked from that type.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

from contracts.config import ConfigError, build, choices, field_types, parse_overrides, read_preset
from scoring.benchmarks import BENCHMARKS
from eval.parallel import gpu_groups, visible_gpus
from inference.names import EngineName
from scoring.grading import GRADE_TIMEOUT_S
from scoring.templates import TEMPLATES

__all__ = ["EvalConfig", "ConfigError", "TemplateName", "ModelDtype", "ProfileName", "PROFILES", "profile_path",
           "validate", "load_eval_config", "add_flags", "flag_values", "lcb_filters", "FIELDS_DOC"]

FIELDS_DOC = "eval/config.py (or python -m eval.run --help)"
TemplateName = Literal[tuple(TEMPLATES)]   # the prompt templates, derived from their one table
ModelDtype = Literal["auto", "float32", "bfloat16", "float16"]   # auto: the checkpoint's (eval.parallel)
# the backbones' evaluation profiles: name -> the hub id it is written for; the values, each with its source, are in
# eval/configs/<name>.yaml (a flat preset of EvalConfig fields)
PROFILES = {"qwen2.5-math-7b": "Qwen/Qwen2.5-Math-7B",
            "deepseek-r1-distill-qwen-1.5b": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B",
            "qwen3-4b-thinking-2507": "Qwen/Qwen3-4B-Thinking-2507"}
ProfileName = Literal[tuple(PROFILES)]
CONFIGS = Path(__file__).resolve().parent / "configs"


def profile_path(name: str) -> Path:
    """The preset file of profile ``name`` (``eval/configs/<name>.yaml``)."""
    return CONFIGS / f"{name}.yaml"


def _f(default, help: str, **flag):
    """A field with its help text (and, for the command line, ``flag``: its name, ``repeat`` for append flags)."""
    kw = {"default_factory": list} if default == [] else {"default": default}
    return field(metadata={"help": help, **flag}, **kw)


@dataclass
class EvalConfig:
    # --- what is scored -----------------------------------------------------------------------------------------
    models: list[str] = _f([], "model directory or hub id (repeatable); with --samples, only the name of the results "
                               "folder", flag="--model", repeat=True)
    names: list[str] | None = _f(None, "results folder name per --model (default: derived from the path, see "
                                       "eval.inputs.model_name)", flag="--name", repeat=True)
    benchmarks: list[str] = _f([], f"comma-separated, from: {', '.join(BENCHMARKS)}")
    samples: str | None = _f(None, "grade these completions instead of generating (one benchmark)")
    problems: str | None = _f(None, "problems file (JSONL) instead of the default source (one benchmark)")
    limit: int | None = _f(None, "only the first K problems of each benchmark")
    lcb_release: str | None = _f(None, "LiveCodeBench release tag, its files and its contest-date window in either "
                                       "source form (default v6: 2025-02-01..2025-05-01 inclusive, the problems "
                                       "added in release_v6; release_vN, vN, vA_vB, release_latest, or 'all' for "
                                       "every file given, whole; scoring/benchmarks/livecodebench.py)")
    lcb_start_date: str | None = _f(None, "LiveCodeBench: first contest date, YYYY-MM-DD (inclusive)")
    lcb_end_date: str | None = _f(None, "LiveCodeBench: last contest date, YYYY-MM-DD (inclusive)")
    # --- generation: unset (null) = the profile's, else the benchmark's default (math: n 32, temperature 0.6, top-p
    # 0.95, top-k off, 4096 tokens, template qwen-math; tasks: n 8, temperature 1.0, 64 tokens, template raw); a
    # value applies to every benchmark
    profile: ProfileName | None = _f(None, "a backbone's sampling settings (eval/configs/NAME.yaml, each value with "
                                           "its source); --config, the flags and key=value override it")
    n: int | None = _f(None, "samples per problem (default: the benchmark's; math 32)")
    temperature: float | None = _f(None, "sampling temperature (default: the benchmark's)")
    top_p: float | None = _f(None, "nucleus sampling (default: the benchmark's)")
    top_k: int | None = _f(None, "keep the k most likely tokens, before top-p (as vLLM and transformers do); 0 or -1: "
                                 "off, recorded as 0 (default: the benchmark's: off)")
    max_tokens: int | None = _f(None, "max new tokens per sample (default: the benchmark's)")
    max_context: int | None = _f(None, "prompt + max_tokens may not exceed this many tokens; a run that would is "
                                       "refused before anything is generated (default: the model's context, "
                                       "config.json's max_position_embeddings; a larger value is capped by it)")
    template: TemplateName | None = _f(None, "prompt template (default: the benchmark's; math qwen-math, tasks raw)")
    seed: int = _f(0, "generation seed (each sample draws from its own seed, derived from this one)")
    # --- engine -------------------------------------------------------------------------------------------------
    engine: EngineName = _f("auto", "auto: vLLM on a GPU (on a CPU from 200M parameters), else hf")
    device: str | None = _f(None, "torch device for the hf engine (default: cuda if available)")
    dtype: ModelDtype | None = _f(None, "dtype the samples are generated in, recorded in the results file (a resume "
                                        "must match). Unset: bfloat16 with vllm on every machine (its CPU build too, "
                                        "even for a float32 checkpoint) and with hf on a GPU; hf on a CPU: the "
                                        "checkpoint's (config.json's dtype, float32 if none). auto: the "
                                        "checkpoint's with either engine")
    gpu_memory_utilization: float = _f(0.85, "vLLM engine's GPU memory share")
    tensor_parallel_size: int = _f(1, "vLLM: shard each model over this many GPUs of the node (a 7B model fits "
                                      "one; a 32B needs 2+)")
    data_parallel_size: int = _f(1, "engines, each on --tensor-parallel-size GPUs of the node, sharing the problems "
                                    "(a CPU machine: processes sharing its cores); results equal one engine's")
    chunk_sequences: int = _f(512, "sequences per generate call (problems per chunk = this // n); results are "
                                   "written per chunk")
    # --- grading ------------------------------------------------------------------------------------------------
    grade_timeout: float = _f(GRADE_TIMEOUT_S, "hard per-answer math grading limit in seconds (a hung grader "
                                               "process is killed)")
    workers: int | None = _f(None, "grading processes (default: the usable cores // LOCAL_WORLD_SIZE, "
                                 "scoring.pool.workers_per_rank; THINKING_SEEDS_GRADE_WORKERS overrides)")
    allow_ungraded: bool = _f(False, "write the leaderboard and exit 0 even when some samples could not be graded "
                                     "(grader errors or grader timeouts; they are still excluded from the scores "
                                     "and counted)")
    allow_unisolated: bool = _f(False, "code benchmarks: grade even where the sandbox is not fully isolated (not "
                                       "root, no unshare: programs then run as this user, outside a jail, and can "
                                       "read its files); refused otherwise (exit 2)")
    # --- lm-evaluation-harness ----------------------------------------------------------------------------------
    lm_eval_tasks: list[str] = _f([], "lm-evaluation-harness tasks, comma-separated")
    lm_eval_include_path: str | None = _f(None, "folder of local lm-eval task YAMLs (offline)")
    lm_eval_limit: int | None = _f(None, "lm-eval: examples per task")
    # --- output -------------------------------------------------------------------------------------------------
    out: str = _f("results/eval", "results root: <out>/<model>/<benchmark>.jsonl and the leaderboard")
    baseline: str | None = _f(None, "the model the leaderboard's paired comparisons are against (default: the "
                                    "first model on the board, oldest results first, as python -m eval.leaderboard "
                                    "chooses; on a fresh --out the first --model)")
    progress: bool = _f(True, "progress bars")


def lcb_filters(cfg: EvalConfig) -> dict:
    """LiveCodeBench's selection as loader keyword arguments (``lcb_release='all'``: every file, ``release=None``)."""
    out = {k: v for k, v in (("release", cfg.lcb_release), ("start_date", cfg.lcb_start_date),
                             ("end_date", cfg.lcb_end_date)) if v is not None}
    if out.get("release") == "all":
        out["release"] = None
    return out


def _optional(name: str) -> bool:
    return type(None) in typing.get_args(field_types(EvalConfig)[name])


def validate(cfg: EvalConfig) -> None:
    """Every check a config can fail without reading data or loading a model; ConfigError naming the field (its
    flag and its value) and what to do. ``run_eval`` calls it first."""
    for f in fields(cfg):   # a config built in Python skips ``build``'s coercion: check the choices here too
        try:
            allowed = choices(EvalConfig, f.name)
        except ValueError:
            continue
        value = getattr(cfg, f.name)
        if value not in allowed and not (value is None and _optional(f.name)):
            raise ConfigError(f"config field '{f.name}' must be one of {', '.join(map(str, allowed))}; got {value!r}")
    models, benchmarks, tasks = cfg.models, cfg.benchmarks, cfg.lm_eval_tasks
    if not benchmarks and not tasks:
        raise ConfigError("nothing to do: give --benchmarks and/or --lm-eval-tasks (benchmarks and lm_eval_tasks are "
                          "both empty)")
    if not models:
        raise ConfigError("no model: give --model PATH_OR_ID (models: [...] in a config file)")
    unknown = [b for b in benchmarks if b not in BENCHMARKS]
    if unknown:
        raise ConfigError(f"benchmarks: unknown benchmark {unknown[0]!r}; choose from: {', '.join(BENCHMARKS)}")
    for key, names in (("benchmarks", benchmarks or []), ("lm_eval_tasks", tasks or [])):
        twice = next((x for i, x in enumerate(names) if x in names[:i]), None)
        if twice is not None:   # scored twice, appended twice to one results file
            raise ConfigError(f"--{key.replace('_', '-')} {','.join(names)}: names {twice!r} twice; list each once")
    if cfg.names is not None and len(cfg.names) != len(models):
        raise ConfigError(f"--name given {len(cfg.names)} times for {len(models)} --model (names and models must "
                          f"pair up)")
    if (cfg.samples or cfg.problems) and len(benchmarks) != 1:
        raise ConfigError(f"--samples and --problems apply to exactly one benchmark; pass a single --benchmarks NAME "
                          f"(benchmarks={benchmarks})")
    if cfg.samples and (len(models) != 1 or tasks):
        raise ConfigError("--samples grades one file: give exactly one --model NAME and no --lm-eval-tasks "
                          f"(models={models}, lm_eval_tasks={tasks})")
    for name in ("limit", "n", "max_tokens", "max_context", "workers", "lm_eval_limit", "chunk_sequences"):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1 ({name}={value})")
    if cfg.data_parallel_size < 1 or cfg.tensor_parallel_size < 1:
        raise ConfigError(f"--data-parallel-size and --tensor-parallel-size must be >= 1 (data_parallel_size="
                          f"{cfg.data_parallel_size}, tensor_parallel_size={cfg.tensor_parallel_size})")
    if cfg.temperature is not None and not cfg.temperature >= 0:   # NaN too
        raise ConfigError(f"--temperature must be >= 0 (temperature={cfg.temperature}); 0 is greedy")
    if cfg.top_p is not None and not 0 < cfg.top_p <= 1:
        raise ConfigError(f"--top-p must lie in (0, 1] (top_p={cfg.top_p})")
    if cfg.top_k is not None and cfg.top_k < -1:
        raise ConfigError(f"--top-k must be >= 1, or 0 (or -1) for off (top_k={cfg.top_k})")
    if not 0 < cfg.gpu_memory_utilization <= 1:
        raise ConfigError(f"--gpu-memory-utilization must lie in (0, 1] (gpu_memory_utilization="
                          f"{cfg.gpu_memory_utilization})")
    if cfg.grade_timeout <= 0:
        raise ConfigError(f"--grade-timeout must be > 0 seconds (grade_timeout={cfg.grade_timeout})")
    if cfg.samples and cfg.data_parallel_size > 1:
        raise ConfigError("--data-parallel-size spreads generation over engines; --samples generates nothing "
                          f"(data_parallel_size={cfg.data_parallel_size})")
    if cfg.data_parallel_size > 1:
        try:
            gpu_groups(cfg.data_parallel_size, cfg.tensor_parallel_size, visible_gpus())
        except ValueError as e:
            raise ConfigError(f"data_parallel_size: {e}") from None
    if tasks and cfg.top_k not in (None, 0, -1):
        raise ConfigError("--top-k is not passed to lm-eval tasks (the bridge takes temperature, top-p and the "
                          f"budget); run the lm-eval tasks in a separate call with top_k=0 (top_k={cfg.top_k}, "
                          f"lm_eval_tasks={tasks})")
    if tasks and cfg.n is not None:
        raise ConfigError("--n cannot be passed to lm-eval tasks (each task sets its own repeats); run the lm-eval "
                          f"tasks in a separate call without --n (n={cfg.n}, lm_eval_tasks={tasks})")
    filters = lcb_filters(cfg)
    if filters and "livecodebench" not in benchmarks:
        raise ConfigError("--lcb-release / --lcb-start-date / --lcb-end-date select LiveCodeBench problems; add "
                          "livecodebench to --benchmarks")
    if filters.get("release"):
        # imported here: the registry loads a benchmark's module only when it is used (scoring.benchmarks)
        from scoring.benchmarks.livecodebench import RELEASES
        if filters["release"] not in RELEASES:
            raise ConfigError(f"--lcb-release {filters['release']!r} is not a release; choose from "
                              f"{sorted(RELEASES)} or 'all' (lcb_release)")


def load_eval_config(path=None, overrides=(), flags: dict | None = None) -> EvalConfig:
    """The config of one command: defaults < the profile (``profile``: eval/configs/<name>.yaml) < the preset at
    ``path`` < ``flags`` (field -> value, as ``flag_values`` gives them) < ``overrides`` (``key=value`` strings).
    The profile is the one named by the highest layer that names one. Each layer is checked on its own first, so an
    error names where the bad value came from (the file, or the command line). Not yet ``validate``d."""
    layers: list[dict] = []
    if path:
        preset = read_preset(path, where="eval/configs/")
        build(EvalConfig, preset, source=str(path), fields_doc=FIELDS_DOC)
        layers.append(preset)
    for layer in (flags or {}, parse_overrides(overrides)):
        build(EvalConfig, layer, source="command line", fields_doc=FIELDS_DOC)
        layers.append(layer)
    values: dict = {}
    name = build(EvalConfig, {k: v for layer in layers for k, v in layer.items() if k == "profile"}).profile
    if name is not None:
        profile = read_preset(profile_path(name), where="eval/configs/")
        if "profile" in profile:
            raise ConfigError(f"{profile_path(name)}: a profile cannot name another profile (profile: "
                              f"{profile['profile']})")
        build(EvalConfig, profile, source=str(profile_path(name)), fields_doc=FIELDS_DOC)
        values.update(profile)
    for layer in layers:
        values.update(layer)
    return build(EvalConfig, values, fields_doc=FIELDS_DOC)


# ---------------------------------------------------------------------------------------------------------------
# the flags: one per field, a shorthand of key=value

def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per field (``--max-tokens`` for ``max_tokens``; ``--model``/``--name`` repeat; a true-by-default
    bool is ``--no-<name>``), with the field's help, its choices and its default. Flags not given are absent from
    the parsed namespace (``argparse.SUPPRESS``), so they override the preset only when given."""
    types_ = field_types(EvalConfig)
    for f in fields(EvalConfig):
        meta, tp = f.metadata, types_[f.name]
        flag = meta.get("flag") or "--" + f.name.replace("_", "-")
        help = meta["help"]
        kw: dict = {"dest": f.name, "default": argparse.SUPPRESS}
        if tp is bool:
            if f.default:
                flag, help = "--no-" + f.name.replace("_", "-"), f"no {help}"
            kw["action"] = "store_false" if f.default else "store_true"
        else:
            try:
                opts = choices(EvalConfig, f.name)
                kw["metavar"] = "{" + ",".join(map(str, opts)) + "}"
            except ValueError:
                kw["metavar"] = f.name.upper() if f.name not in ("models", "names") else f.name[:-1].upper()
            if meta.get("repeat"):
                kw["action"] = "append"
            elif typing.get_origin(tp) is list:
                kw["type"] = _csv
            if f.default not in (None, dataclasses.MISSING) and "default" not in help:
                help += f" (default: {f.default})"
        parser.add_argument(flag, help=help, **kw)


def flag_values(args: argparse.Namespace) -> dict:
    """The fields the command line's flags set (only those given)."""
    names = {f.name for f in fields(EvalConfig)}
    return {k: v for k, v in vars(args).items() if k in names}
