"""The configs of the ``tsanalysis`` commands that read models or another command's files: ``RelayConfig``
(``tsanalysis relay``, ``tsanalysis.relay.run_relay(cfg)``), ``SupportConfig`` (``tsanalysis support``,
``tsanalysis.support.support_tables(cfg)``) and ``ScalingConfig`` (``tsanalysis scaling``,
``tsanalysis.scaling.scaling_tables(cfg)``).

Each is one validated dataclass on the machinery eval's ``EvalConfig`` and the trainer's ``Config`` use
(``contracts.config``): the command builds it from its flags (every field has one: ``--max-tokens 8`` is the
shorthand of ``max_tokens: 8``) over an optional ``--config FILE`` (a flat YAML mapping of the fields; unknown keys
are refused with a close match, values coerced to each field's type), then ``validate_relay`` / ``validate_support`` /
``validate_scaling`` check it before anything is read or loaded: a bad value is one line naming the flag and what to do (exit 2). A
config built in Python (the demo, the tests) goes through the same validation: ``run_relay`` and ``support_tables``
call it first. Each field's help text below is its one description: the commands' ``--help`` is generated from it
(``add_flags``), and choice fields are typed once as ``Literal`` (the engines from ``inference.names``, the templates
from ``scoring.templates``) and checked from that type. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field, fields
from typing import Literal, TypeVar

from contracts.config import choices, field_types, load
from contracts.passk import N_BOOT, SEED
from contracts.sampling import resolve_top_k
from inference.names import EngineName
from scoring.templates import TEMPLATES

from .errors import RelayError, UsageError

__all__ = ["RelayConfig", "SupportConfig", "ScalingConfig", "ComputeName", "TemplateName", "Dtype", "FIELDS_DOC", "RELAY_MODEL", "validate_relay",
           "validate_support", "validate_scaling", "relay_benchmark", "add_flags", "from_flags", "names", "pairs"]

FIELDS_DOC = "tsanalysis/config.py (or the command's --help)"
TemplateName = Literal[tuple(TEMPLATES)]   # the prompt templates, derived from their one table
Dtype = Literal["float32", "bfloat16", "float16"]
ComputeName = Literal["tokens", "wall"]   # scaling: generated + prefilled tokens, or training wall seconds
RELAY_MODEL = "relay"   # support: the model name of a relay folder's relay samples
C = TypeVar("C")


def _f(default, help: str, *flags: str, metavar: str | None = None):
    """A field with its help text and, for the command line, its flag names (default ``--<name>``) and metavar."""
    return field(default=default, metadata={"help": help, "flags": flags, "metavar": metavar})


@dataclass
class RelayConfig:
    """Relay inference (``tsanalysis.relay``): an early checkpoint writes a prefix, the final one continues."""

    # --- checkpoints and problems -------------------------------------------------------------------------------
    early: str | None = _f(None, "early checkpoint (a Hugging Face model directory, e.g. runs/NAME/checkpoints/step_N, "
                                 "or a hub id)", metavar="CKPT_A")
    final: str | None = _f(None, "final checkpoint", metavar="CKPT_B")
    matrix: str | None = _f(None, "instead of --early/--final: a training run folder; relay every ordered pair of its "
                                  "checkpoints (an earlier one writes, a later one continues) and write the matrix "
                                  "of pass@k gains over the continuer alone (tsanalysis.relay_matrix)",
                            metavar="RUN_DIR")
    checkpoints: list[str] | None = _f(None, "with --matrix: the steps to relay, e.g. 0,100,200 (default: every "
                                             "checkpoints/step_N of the run; the best link is not a step of its own)",
                                       metavar="STEP,...")
    benchmark: str | None = _f(None, "benchmark name from scoring.benchmarks (one: a relay folder holds one "
                                     "benchmark): its problems, grader and default template (--benchmark: the old "
                                     "spelling, still accepted)", "--benchmarks", "--benchmark", metavar="NAME")
    problems: str | None = _f(None, "problems file (JSONL) read by the benchmark's loader instead of its default "
                                    "problems", metavar="FILE")
    limit: int | None = _f(None, "only the first K problems", metavar="K")
    template: TemplateName | None = _f(None, "prompt template (default: the benchmark's)")
    # --- sampling -----------------------------------------------------------------------------------------------
    n: int = _f(64, "samples per problem (relay and final-only each)")
    cut: float = _f(0.5, "prefix = first floor(cut*len) tokens of the early response, cut in [0, 1]")
    max_tokens: int | None = _f(None, "response budget (default: the benchmark's)")
    temperature: float = _f(1.0, "sampling temperature, >= 0 (0 is greedy)")
    top_p: float = _f(1.0, "nucleus sampling, in (0, 1]")
    top_k: int = _f(0, "keep the k most likely tokens before top-p; 0 or -1: off (default; recorded as 0)")
    seed: int = _f(0, "sampling seed (each chunk of problems draws from its own, derived from this one)")
    batch_problems: int = _f(8, "problems per generate call (n samples each); part of the sampling seed")
    # --- engine and output --------------------------------------------------------------------------------------
    engine: EngineName = _f("auto", "rollout engine; the resolved one and the dtype (the final checkpoint's) are "
                                    "recorded in relay_settings.json, and a resume with others is refused")
    out: str | None = _f(None, "output folder (default results/analysis/<final run>/relay/<tag>/)", metavar="DIR")
    allow_unisolated: bool = _f(False, "a code benchmark: grade even where the sandbox is not fully isolated (not "
                                       "root, no unshare: programs then run as this user, outside a jail); refused "
                                       "otherwise (exit 2)")


@dataclass
class SupportConfig:
    """Support dynamics over an ``eval.run`` results folder (``tsanalysis.support``)."""

    # --- what is compared ---------------------------------------------------------------------------------------
    eval_dir: str | None = _f(None, "python -m eval.run's --out folder (<model>/<benchmark>.jsonl)", metavar="DIR")
    models: list[str] | None = _f(None, "models to compare, earlier to later (default: every model folder by name; "
                                        "'relay' places the --relay folder)", metavar="A,B,...")
    benchmarks: list[str] | None = _f(None, "only these benchmarks", metavar="a,b")
    relay: str | None = _f(None, "a tsanalysis relay folder: its relay samples are one more model, 'relay'",
                           metavar="DIR")
    # --- likelihood ---------------------------------------------------------------------------------------------
    likelihood: bool = _f(False, "score each model's correct samples under every loadable model (needs the "
                                 "checkpoints)")
    paths: dict[str, str] | None = _f(None, "model folders for --likelihood (default: the model_path the results "
                                            "record)", metavar="A=PATH,...")
    likelihood_samples: int = _f(8, "correct samples scored per problem and model", metavar="N")
    batch_tokens: int = _f(4096, "likelihood: padded tokens per forward batch")
    device: str | None = _f(None, "likelihood: torch device of the scoring models (default: cuda if available)")
    dtype: Dtype | None = _f(None, "likelihood: dtype the scoring models load in (default: the checkpoint's)")
    # --- estimators and output ----------------------------------------------------------------------------------
    n_boot: int = _f(N_BOOT, "bootstrap resamples of every interval")
    seed: int = _f(SEED, "bootstrap seed")
    out: str | None = _f(None, "output folder (default results/analysis/<eval dir>/support/)", metavar="DIR")


@dataclass
class ScalingConfig:
    """Score against compute of a run's checkpoints, fitted with ScaleRL's sigmoid (``tsanalysis.scaling``)."""

    # --- the points: checkpoints of runs scored by eval.run, or a table -----------------------------------------
    run: list[str] | None = _f(None, "run folders written by trainer.train (their metrics.jsonl gives each "
                                     "checkpoint's compute); one method and seed each, read from the folder name "
                                     "<method>-seed<N>", metavar="RUN_DIR,...")
    eval_dir: str | None = _f(None, "python -m eval.run's --out folder holding the checkpoints' scores "
                                    "(<model>/<benchmark>.jsonl)", metavar="DIR")
    models: list[str] | None = _f(None, "per run, the prefix of its checkpoints' model folders, each named "
                                        "<prefix>-step<N> (N optimizer steps; default: the run's folder name)",
                                  metavar="PREFIX,...")
    checkpoints: dict[str, str] | None = _f(None, "more model folders and their steps, e.g. warmup=0 (the warm-up "
                                                  "every run starts from: R0) or a run's final model "
                                                  "onpolicy-seed0=40; a name of one run's folder goes to that "
                                                  "run, any other to every run", metavar="NAME=STEP,...")
    points: str | None = _f(None, "instead of runs: a CSV of scored checkpoints (columns method, seed, step, pass@1, "
                                  "pass@k, k and the compute columns tokens_generated, tokens_prefilled or "
                                  "train_wall_s; demo.premise's training_curve.csv)", metavar="FILE.csv")
    benchmarks: list[str] | None = _f(None, "only these benchmarks of the eval folder", metavar="a,b")
    # --- the fit --------------------------------------------------------------------------------------------------
    compute: ComputeName = _f("tokens", "compute axis: tokens (generated + prefilled, summed over the steps "
                                        "before the checkpoint) or wall (training seconds, time/step_s)")
    k: int | None = _f(None, "the k of the pass@k fit (default: the largest k every checkpoint's samples allow; a "
                             "points table: its k)")
    n_boot: int = _f(N_BOOT, "bootstrap resamples of every interval")
    seed: int = _f(SEED, "bootstrap seed")
    out: str | None = _f(None, "output folder (default results/analysis/<run, eval dir or points file>/scaling/)",
                         metavar="DIR")


def _flag(cls, name: str) -> str:
    """The command-line name of a field (its first flag)."""
    meta = {f.name: f.metadata for f in fields(cls)}[name]
    return (meta.get("flags") or ("--" + name.replace("_", "-"),))[0]


def _check_choices(cfg, error: type[Exception]) -> None:
    """A config built in Python skips ``build``'s coercion: its ``Literal`` fields are checked here."""
    cls = type(cfg)
    for f in fields(cfg):
        try:
            allowed = choices(cls, f.name)
        except ValueError:
            continue
        value = getattr(cfg, f.name)
        optional = type(None) in typing.get_args(field_types(cls)[f.name])
        if value not in allowed and not (value is None and optional):
            raise error(f"{_flag(cls, f.name)}: {f.name} must be one of {', '.join(map(str, allowed))}; "
                        f"got {value!r}")


def _at_least_one(cfg, names: tuple[str, ...], error: type[Exception]) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise error(f"{_flag(type(cfg), name)} must be >= 1, got {value}")


def relay_benchmark(benchmark: str | None) -> str:
    """The relay's one benchmark name; RelayError when none is given or several are (a relay folder holds one)."""
    if benchmark is None:
        raise RelayError("relay needs --benchmarks NAME (its problems, grader and template); --problems FILE then "
                         "replaces the benchmark's problems with the file's, read by that benchmark's loader")
    if "," in benchmark:
        raise RelayError(f"--benchmarks {benchmark}: the relay takes one benchmark (a relay folder holds one); run it "
                         f"once per benchmark, each with its own --out")
    return benchmark


def validate_relay(cfg: RelayConfig) -> None:
    """Every check a relay config can fail without reading a file or loading a model; RelayError naming the flag
    and what to do. ``run_relay`` calls it first."""
    if cfg.matrix is not None:
        if cfg.early is not None or cfg.final is not None:
            raise RelayError(f"--matrix {cfg.matrix} relays every pair of the run's checkpoints: give it without "
                             f"--early and --final (--checkpoints STEP,... chooses the steps)")
        steps = [str(x).removeprefix("step_") for x in cfg.checkpoints or ()]
        if any(not x.isdigit() for x in steps):
            raise RelayError(f"--checkpoints {','.join(map(str, cfg.checkpoints))}: each must be a step of the run "
                             f"(a whole number, e.g. 100, or step_000100)")
        if len({int(x) for x in steps}) != len(steps):
            raise RelayError(f"--checkpoints {','.join(map(str, cfg.checkpoints))} names a step twice")
    elif cfg.checkpoints is not None:
        raise RelayError("--checkpoints chooses the steps of --matrix RUN_DIR; give --matrix, or relay two "
                         "checkpoints with --early and --final")
    elif cfg.early is None or cfg.final is None:
        raise RelayError("relay needs --early CKPT_A and --final CKPT_B (the two checkpoints; early: and final: in a "
                         "--config file)")
    if not 0.0 <= cfg.cut <= 1.0:
        raise RelayError(f"--cut must lie in [0, 1], got {cfg.cut}")
    _at_least_one(cfg, ("n", "batch_problems", "limit"), RelayError)
    if not cfg.temperature >= 0:   # NaN too
        raise RelayError(f"--temperature must be >= 0, got {cfg.temperature} (0 is greedy)")
    if not 0 < cfg.top_p <= 1:
        raise RelayError(f"--top-p must lie in (0, 1], got {cfg.top_p}")
    try:
        resolve_top_k(cfg.top_k)
    except ValueError as e:
        raise RelayError(f"--top-k: {e}") from None
    _at_least_one(cfg, ("max_tokens",), RelayError)
    _check_choices(cfg, RelayError)
    relay_benchmark(cfg.benchmark)


def validate_support(cfg: SupportConfig) -> None:
    """Every check a support config can fail without reading a file; UsageError naming the flag and what to do.
    ``support_tables`` calls it first."""
    if cfg.eval_dir is None:
        raise UsageError("support needs --eval-dir DIR (python -m eval.run's --out folder; eval_dir: in a --config "
                         "file)")
    order = list(cfg.models) if cfg.models else None
    if order is not None and len(set(order)) != len(order):
        raise UsageError(f"--models names a model twice: {','.join(order)}")
    if order and RELAY_MODEL in order and cfg.relay is None:
        raise UsageError(f"--models names {RELAY_MODEL}: give its folder with --relay DIR")
    _at_least_one(cfg, ("likelihood_samples", "batch_tokens", "n_boot"), UsageError)
    _check_choices(cfg, UsageError)


def validate_scaling(cfg: ScalingConfig) -> None:
    """Every check a scaling config can fail without reading a file; UsageError naming the flag and what to do.
    ``scaling_tables`` calls it first."""
    if cfg.points is not None and (cfg.run or cfg.eval_dir or cfg.models or cfg.checkpoints):
        raise UsageError("scaling reads either --points FILE.csv or --run RUN_DIR with --eval-dir DIR, not both")
    if cfg.points is None and (not cfg.run or cfg.eval_dir is None):
        raise UsageError("scaling needs --run RUN_DIR and --eval-dir DIR (the run's metrics.jsonl gives the compute, "
                         "eval.run's folder the scores), or --points FILE.csv (a table of scored checkpoints)")
    if cfg.models and len(cfg.models) != len(cfg.run or []):
        raise UsageError(f"--models gives {len(cfg.models)} prefixes for {len(cfg.run or [])} runs: one per run, in "
                         f"the order of --run")
    for name, step in (cfg.checkpoints or {}).items():
        if not str(step).isdigit():
            raise UsageError(f"--checkpoints {name}={step}: the step must be a whole number of optimizer steps "
                             f"(0: the warm-up)")
    _at_least_one(cfg, ("k", "n_boot"), UsageError)
    _check_choices(cfg, UsageError)


# ---- the command line: one flag per field --------------------------------------------------------------------------
def names(text: str) -> list[str]:
    """A comma-separated list of names (argparse type)."""
    v = [x.strip() for x in text.split(",") if x.strip()]
    if not v:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return v


def pairs(text: str) -> dict[str, str]:
    """``NAME=PATH`` pairs separated by commas (argparse type)."""
    out = {}
    for part in names(text):
        key, sep, value = part.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise argparse.ArgumentTypeError(f"expected NAME=PATH pairs separated by commas, got {text!r}")
        out[key.strip()] = value.strip()
    return out


def _flag_type(tp):
    """The argparse ``type`` of a field's annotation (``Optional`` unwrapped); None for text."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    origin = typing.get_origin(tp)
    if origin is list:
        return names
    if origin is dict:
        return pairs
    return tp if tp in (int, float) else None


def add_flags(parser: argparse.ArgumentParser, cls) -> None:
    """One flag per field of ``cls`` with the field's help, its choices and its default, and ``--config FILE``.
    Flags not given are absent from the parsed namespace (``argparse.SUPPRESS``): they override the file only
    when given (``from_flags``)."""
    types_ = field_types(cls)
    for f in fields(cls):
        meta, tp = f.metadata, types_[f.name]
        help = meta["help"]
        kw: dict = {"dest": f.name, "default": argparse.SUPPRESS}
        if tp is bool:
            kw["action"] = "store_true"
        else:
            try:
                kw["choices"] = choices(cls, f.name)
            except ValueError:
                kw["metavar"] = meta.get("metavar") or f.name.upper()
                if (conv := _flag_type(tp)) is not None:
                    kw["type"] = conv
            if f.default not in (None, dataclasses.MISSING) and "default" not in help:
                help += f" (default: {f.default})"
        parser.add_argument(*(meta.get("flags") or ("--" + f.name.replace("_", "-"),)), help=help, **kw)
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="a YAML file of this command's fields (a flat mapping, each flag's name with _ for -, "
                             "e.g. 'max_tokens: 32'); the flags given override it")


def from_flags(cls: type[C], args: argparse.Namespace) -> C:
    """The config of one command: the defaults < ``--config FILE`` < the flags given. ``contracts.config.ConfigError``
    for an unknown key or a value of the wrong type (naming the file). Not yet validated."""
    given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    path = getattr(args, "config", None)
    return load(cls, os.fspath(path) if path else None, given, fields_doc=FIELDS_DOC)
