"""Relay inference (paper §3.1, Figure 2): an early checkpoint writes a response, it is cut, the final continues.

For every problem and each of n samples:

1. the EARLY checkpoint samples a response õ from the prompt;
2. the prefix is its first ``floor(cut · |õ|)`` tokens, where |õ| excludes a trailing EOS (so the prefix never
   holds the EOS; ``cut = 0`` gives an empty prefix, ``cut = 1`` the whole response without its EOS);
3. the FINAL checkpoint continues from prompt + prefix (relay response = prefix + continuation, within the same
   ``max_tokens`` budget as a final-only response: the continuation is cut at ``max_tokens − |prefix|``), so no
   row is longer than prompt + ``max_tokens``: that must fit both checkpoints' context (config.json's
   max_position_embeddings, ``inference.hub.model_context``), or the run is refused before any model loads;
4. independently, the final checkpoint samples n final-only responses from the prompt.

All three sets (early-only, relay, final-only) are graded with the benchmark's grader through the one batch grader
(``scoring.benchmarks.protocol.grade_responses``, the one ``eval.run`` and the trainer's validation use: math in a
process pool with a hard per-item limit, a grader that fails is ``timeout``/``grader_error`` and never correct), and
pass@k (unbiased estimator, ``contracts.passk``) is reported for k = 1, 2, 4, …, n with paired bootstrap intervals
of the relay − final-only difference over problems (Figure 2 plots that difference).

Sampling seeds are derived per chunk of problems (``batch_problems`` per generate call) from ``--seed`` and the
chunk's problem ids; the relay continuation and the final-only call of a chunk use the SAME seed, so with
``cut = 0`` the two calls are identical and give identical samples. With ``batch_problems = 1`` a resumed run
reproduces the uninterrupted one exactly; with larger chunks a resume may regroup problems (other seeds, same
distribution). The early and final checkpoints must share a tokenizer (same vocabulary and special ids):
token ids of the prefix are handed over as they are. The early phase runs first for all problems (its prefixes
are kept in ``prefixes.jsonl``), then the final checkpoint is loaded (with vLLM its weights are pushed into the
same engine, so both checkpoints must have the same architecture there). Both phases append one JSON line per
problem and skip problems already present, so an interrupted run resumes where it stopped. Each checkpoint is a
model folder or a hub id (read from its snapshot in the Hugging Face cache, ``inference.hub``; the settings record
``owner/name@<commit>``).

Output folder: ``prefixes.jsonl`` (early phase), ``results.jsonl`` (per problem), ``relay_settings.json`` (the
settings the JSONL files belong to, the resolved engine and the dtype the samples were generated in among them:
both checkpoints generate in the final checkpoint's dtype; ``contracts.settings.claim_folder``: a rerun with
different settings, another engine or dtype included, is refused, and so is a non-empty folder without that file;
a folder written before engine and dtype were recorded is taken to match, one written before top-k was recorded
reads as top-k off). Sampling is temperature, then top-k (``top_k``; 0 or -1: off), then top-p, in every phase.

``run_relay(cfg)`` takes one ``tsanalysis.config.RelayConfig`` and returns the tables ``relay_problems`` and
``relay_passk`` with their settings; its callers (the ``tsanalysis relay`` command, the demo) write them with
``tsanalysis.io.write_results`` (Parquet + CSV and ``settings.json``). It runs in phases, each its own function:
``_plan`` (resolve and check every input), ``_claim`` (the folder), ``_early_phase`` (the early checkpoint's
responses, cut into prefixes), ``_final_phase`` (``_continue``: the final checkpoint continues them and samples the
final-only responses; both graded by ``_Grader``), ``_tables`` (per problem, pass@k). Bad input raises
``RelayError`` (``tsanalysis.errors``; a ``UsageError``) before any model is loaded and before the output folder is
claimed: the config (``tsanalysis.config.validate_relay``: sampling values, one benchmark), the checkpoints' files
(``inference.hub.resolve_checked_model``: a training run folder is named with its newest checkpoint; missing weights
or tokenizer, a truncated safetensors file), the problems, an output path that is a file, the tokenizers, the
context. A folder claimed by a run whose first model then fails to load is removed again when it holds nothing
else. This module is a library: the command line is ``tsanalysis.cli``. ``tsanalysis.relay_matrix`` (``--matrix
RUN_DIR``: every ordered pair of a run's checkpoints) samples with the same pieces (``_prefix_records``,
``_relay_rows``, ``_Grader``, ``_prompt_ids``), so its cell (first, last) is this relay, sample for sample.

``--early`` and ``--final`` naming the same model (one folder, links resolved, or one hub snapshot) is a warning
before any model loads, not an error: the relay is then the model continuing its own prefixes, relay and final-only
sample one distribution, and their difference must be 0 up to sampling noise, a null control of the relay itself
(with ``cut`` 0 the two are identical samples); the settings record ``same_model``. Refusing it would forbid that
check; saying it at once keeps a mistyped --early from passing for Figure 2.
"""

from __future__ import annotations

import hashlib
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from contracts.files import append_jsonl_rows
from contracts.locks import LockHeld, hold, lock_file
from contracts.passk import bootstrap_ci, k_grid, paired_bootstrap, passk_matrix
from contracts.samples import repair
from contracts.sampling import resolve_top_k
from contracts.settings import SettingsMismatch, claim_folder

from . import io
from .config import RelayConfig, relay_benchmark, validate_relay
from .errors import RelayError

__all__ = ["RelayError", "cut_prefix", "tokenizer_mismatch", "check_same_tokenizer", "derive_seed", "pass_k_table",
           "run_relay"]

SETTINGS_FILE = "relay_settings.json"   # the settings the folder's JSONL files belong to (contracts.settings)
IDENTITY_KEYS = ("early", "final", "benchmark", "problems", "template", "n", "cut", "max_tokens", "temperature",
                 "top_p", "top_k", "seed", "batch_problems", "engine", "dtype")
# how the samples were generated (the resolved engine, hf or vllm, and the dtype): one folder holds one engine's
# samples in one precision, as an eval.run results file does (contracts.samples.GENERATION_SETTINGS). A folder written
# before they were recorded says nothing about them; it is taken to match (refusing it could be wrong).
GENERATION_KEYS = ("engine", "dtype")
# a sampling setting recorded from a later version, and what a folder written before stands for: top-k was off
ADDED_DEFAULTS = {"top_k": 0}


# ---- pure pieces -----------------------------------------------------------------------------------------------
def cut_prefix(token_ids: Sequence[int], cut: float, *, eos_ids: Sequence[int] = ()) -> list[int]:
    """The first ``floor(cut · L)`` tokens, L = length without a trailing EOS (the EOS never enters the prefix)."""
    if not 0.0 <= cut <= 1.0:
        raise RelayError(f"--cut must lie in [0, 1], got {cut}")
    ids = list(token_ids)
    L = len(ids) - 1 if ids and ids[-1] in set(eos_ids) else len(ids)
    m = math.floor(cut * L + 1e-9)   # 1e-9: 0.29 * 100 is 28.999999999999996 in floating point
    return ids[:m]


def tokenizer_mismatch(tok_a, tok_b) -> list[str]:
    """Differences between two tokenizers that would make token ids mean different things (empty: compatible)."""
    diffs = []
    va, vb = tok_a.get_vocab(), tok_b.get_vocab()
    if len(va) != len(vb):
        diffs.append(f"vocabulary sizes {len(va)} vs {len(vb)}")
    elif va != vb:
        bad = sorted(t for t in set(va) | set(vb) if va.get(t) != vb.get(t))
        diffs.append(f"{len(bad)} tokens map to different ids (e.g. {bad[:3]!r})")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        a, b = getattr(tok_a, name, None), getattr(tok_b, name, None)
        if a != b:
            diffs.append(f"{name} {a} vs {b}")
    sa, sb = sorted(getattr(tok_a, "all_special_ids", []) or []), sorted(getattr(tok_b, "all_special_ids", []) or [])
    if sa != sb:
        diffs.append(f"special ids {sa} vs {sb}")
    return diffs


def check_same_tokenizer(tok_a, tok_b, *, names=("early", "final")) -> None:
    diffs = tokenizer_mismatch(tok_a, tok_b)
    if diffs:
        raise RelayError(f"the {names[0]} and {names[1]} checkpoints have different tokenizers ({'; '.join(diffs)}); "
                         f"relay hands token ids from one model to the other, so both must share one tokenizer")


def derive_seed(seed: int, *parts: str) -> int:
    """A 31-bit seed from the base seed and strings (stable across runs, processes and Python versions)."""
    h = hashlib.sha256("\x1f".join([str(int(seed)), *parts]).encode()).hexdigest()
    return int(h[:8], 16) & 0x7FFFFFFF


def pass_k_table(n, early, relay, final, *, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """pass@k for k = 1, 2, 4, …, n of early-only, relay and final-only, and relay − final with paired intervals.

    n, early, relay, final: per-problem sample and correct counts ([P] each; n the same for the three sets).
    Columns: k, problems, early, early_low, early_high, relay, relay_low, relay_high, final, final_low,
    final_high, diff (relay − final), diff_low, diff_high, p_value. Percentile bootstrap over problems with a
    fixed seed (95 %).
    """
    n = np.asarray(n, dtype=np.int64)
    ks = k_grid(int(n.min()))
    per_problem = {name: passk_matrix(n, c, ks) for name, c in (("early", early), ("relay", relay), ("final", final))}
    rows = []
    for j, k in enumerate(ks):
        pk = {name: m[:, j] for name, m in per_problem.items()}
        row = {"k": k, "problems": int(n.size)}
        for name, v in pk.items():
            est, lo, hi = bootstrap_ci(v, n_boot=n_boot, seed=seed)
            row.update({name: est, f"{name}_low": lo, f"{name}_high": hi})
        pb = paired_bootstrap(pk["relay"], pk["final"], n_boot=n_boot, seed=seed)
        row.update({"diff": pb["diff"], "diff_low": pb["low"], "diff_high": pb["high"], "p_value": pb["p_value"]})
        rows.append(row)
    return pd.DataFrame(rows)


# ---- JSONL helpers ---------------------------------------------------------------------------------------------
def _read_jsonl(path: Path, log: Callable[[str], None] = print) -> dict[str, dict]:
    """problem_id -> record of a phase's file, repaired for the next append (``contracts.samples.repair``: a torn
    last line from an interrupted write is cut off and redone; a problem's second line, two relays appended to one
    folder, is dropped with a warning, its first line counting as for every sample file); a malformed line inside
    the file is a RelayError naming it."""
    try:
        rows = repair(path, warn=lambda m: log(f"warning: {m}"))
    except ValueError as e:
        raise RelayError(str(e)) from None
    return {str(r["problem_id"]): r for r in rows}


# ---- orchestration ---------------------------------------------------------------------------------------------
PREFIXES, RESULTS = "prefixes.jsonl", "results.jsonl"   # phase A's records, phase B's (one line per problem each)


def _free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _chunks(seq, size):
    for i in range(0, len(seq), size):
        yield seq[i:i + size]


@contextmanager
def _unclaimed_on_error(out_dir: Path, claimed: bool):
    """Undo this call's claim of ``out_dir`` when the block raises and nothing but the settings file is there yet,
    so a rerun with corrected arguments (other settings) is not refused by a folder that holds no results."""
    try:
        yield
    except BaseException:
        if claimed and {p.name for p in out_dir.iterdir()} <= {SETTINGS_FILE}:
            (out_dir / SETTINGS_FILE).unlink(missing_ok=True)
            out_dir.rmdir()
        raise


@dataclass
class _Plan:
    """What the phases share, resolved and checked before any model loads or the folder is claimed (``_plan``)."""

    cfg: RelayConfig
    sources: dict                 # "early" / "final" -> inference.hub.ModelSource (files checked)
    engine: str                   # the resolved engine: hf | vllm
    dtype: str                    # both checkpoints generate in the final one's
    top_k: int                    # resolved (0: off)
    bench: object                 # scoring.benchmarks.base.Benchmark
    problems: list                # the selected problems
    template: str
    max_tokens: int
    out_dir: Path
    tok: object                   # the final checkpoint's tokenizer (the early one's is the same)
    prompt_ids: dict[str, list[int]]   # problem id -> the rendered prompt's token ids

    @property
    def sampling(self) -> dict:
        """Every generate call's sampling: temperature, then top-k, then top-p."""
        return {"temperature": self.cfg.temperature, "top_p": self.cfg.top_p, "top_k": self.top_k}

    @property
    def engine_kw(self) -> dict:
        """vLLM's KV cache holds the longest prompt plus its budget (a relay row is prompt + prefix + continuation)."""
        if self.engine != "vllm":
            return {}
        return {"max_model_len": max(len(x) for x in self.prompt_ids.values()) + self.max_tokens,
                "model_path": self.sources["early"].path}

    @property
    def device(self) -> str | None:
        import torch

        return "cuda" if self.engine == "hf" and torch.cuda.is_available() else None

    @property
    def same_model(self) -> bool:
        """Whether --early and --final name one model (the same folder, links resolved, or the same hub snapshot)."""
        return self.sources["early"].identity == self.sources["final"].identity

    def identity(self) -> dict:
        """The settings the folder's JSONL files belong to (``IDENTITY_KEYS``); a checkpoint is its folder's absolute
        path, or owner/name@<commit> for a hub snapshot (the same on every resume from that cache)."""
        c = self.cfg
        return {"early": self.sources["early"].identity, "final": self.sources["final"].identity,
                "benchmark": self.bench.name, "problems": str(Path(c.problems).resolve()) if c.problems else None,
                "template": self.template, "n": c.n, "cut": c.cut, "max_tokens": self.max_tokens,
                "temperature": c.temperature, "top_p": c.top_p, "top_k": self.top_k, "seed": c.seed,
                "batch_problems": c.batch_problems, "engine": self.engine, "dtype": self.dtype}


def _load_problems(benchmark: str | None, problems: str | None, limit: int | None):
    from scoring.benchmarks import get_benchmark

    name = relay_benchmark(benchmark)   # given, and only one
    try:
        bench = get_benchmark(name)
    except (ValueError, ImportError) as e:
        raise RelayError(str(e)) from None
    if problems is not None and not Path(problems).is_file():
        raise RelayError(f"problems file '{problems}' does not exist")
    try:
        probs = bench.load(path=problems)
    except (ValueError, OSError, RuntimeError) as e:   # a malformed line names FILE:LINE
        raise RelayError(f"{name}: {e}") from None
    if limit is not None:
        probs = probs[:limit]
    if not probs:
        raise RelayError(f"no problems loaded from {problems or name}")
    ids = [str(p.id) for p in probs]
    if len(set(ids)) != len(ids):
        raise RelayError(f"problem ids are not unique in {problems or name}; resume and pairing need unique ids")
    return bench, probs


def _check_models(cfg: RelayConfig) -> dict:
    """"early" / "final" -> where its files are (a folder, or a hub id's snapshot in the Hugging Face cache), checked
    (``inference.hub.resolve_checked_model``: a run folder, missing weights or tokenizer, a truncated safetensors)."""
    from inference.hub import ModelSourceError, resolve_checked_model

    sources = {}
    for name, spec in (("early", cfg.early), ("final", cfg.final)):
        try:
            sources[name] = resolve_checked_model(spec, what=f"--{name}")
        except ModelSourceError as e:
            raise RelayError(str(e)) from None
    return sources


def _out_dir(cfg: RelayConfig, bench) -> Path:
    """``--out``, or results/analysis/<final run>/relay/<tag>/; RelayError when it is a file."""
    early, final = cfg.early, cfg.final
    tag = (f"{bench.name}-{io.run_name(early)}_{Path(early).name}-to-{io.run_name(final)}_{Path(final).name}"
           f"-cut{cfg.cut:g}")
    out_dir = Path(cfg.out) if cfg.out is not None else io.default_out(io.run_name(final), "relay") / tag
    if out_dir.exists() and not out_dir.is_dir():
        raise RelayError(f"{'--out' if cfg.out is not None else 'the output folder'} {out_dir} is a file, not a "
                         f"folder; choose another --out")
    return out_dir


def _encode_prompts(cfg: RelayConfig, sources: dict, template: str, problems) -> tuple[object, dict[str, list[int]]]:
    """(the final checkpoint's tokenizer, problem id -> prompt token ids); RelayError when the two checkpoints'
    tokenizers differ (token ids are handed from one to the other) or a rendered prompt is empty."""
    from transformers import AutoTokenizer

    try:
        tok_early = AutoTokenizer.from_pretrained(sources["early"].path)
        tok_final = AutoTokenizer.from_pretrained(sources["final"].path)
    except (OSError, ValueError) as e:
        raise RelayError(f"cannot load the tokenizers of --early {cfg.early} and --final {cfg.final}: "
                         f"{' '.join(str(e).split())[:300]}") from None
    check_same_tokenizer(tok_early, tok_final)
    return tok_final, _prompt_ids(tok_final, template, problems)


def _prompt_ids(tok, template: str, problems) -> dict[str, list[int]]:
    """Problem id -> the rendered prompt's token ids; RelayError when a rendered prompt is empty."""
    from scoring.templates import render_prompt

    prompt_ids = {}
    for p in problems:
        ids = tok(render_prompt(template, p.question, tok), add_special_tokens=False)["input_ids"]
        if not ids:
            raise RelayError(f"problem {p.id}: the rendered prompt is empty")
        prompt_ids[str(p.id)] = ids
    return prompt_ids


def _check_contexts(plan: _Plan) -> None:
    """A relay row (prompt + prefix + continuation) and a final-only row both hold at most prompt + max_tokens
    tokens: each checkpoint's context must hold the longest (``inference.hub.check_context``)."""
    from inference.hub import ContextError, check_context, model_context

    for name, spec in (("early", plan.cfg.early), ("final", plan.cfg.final)):
        folder = plan.sources[name].path
        try:
            check_context(f"--{name} {spec}: {plan.bench.name}", plan.prompt_ids, plan.max_tokens,
                          model_context(folder), where=str(Path(folder) / "config.json"))
        except ContextError as e:
            raise RelayError(str(e)) from None


def _benchmark(cfg: RelayConfig):
    """(benchmark, problems, template, max_tokens) of a relay config; a code benchmark's responses run in the
    sandbox, so it is refused (RelayError) where the sandbox is not fully isolated."""
    from scoring.sandbox import SandboxError, check_isolation

    bench, probs = _load_problems(cfg.benchmark, cfg.problems, cfg.limit)
    if bench.kind == "code":
        try:
            check_isolation(allow_unisolated=cfg.allow_unisolated)
        except SandboxError as e:
            raise RelayError(str(e)) from None
    template = cfg.template or bench.default_template
    return bench, probs, template, int(cfg.max_tokens or bench.generation.get("max_tokens", 4096))


def _plan(cfg: RelayConfig) -> _Plan:
    """Everything that can fail cheaply, before a model is loaded and before the output folder is claimed: the
    config, the checkpoints' files, the engine, the problems, the sandbox, the output path, the tokenizers, the
    context."""
    from inference import resolve_engine
    from inference.hub import checkpoint_dtype

    validate_relay(cfg)
    if cfg.matrix is not None:
        raise RelayError("run_relay relays two checkpoints (--early, --final); a --matrix RUN_DIR config goes to "
                         "tsanalysis.relay_matrix.run_relay_matrix")
    sources = _check_models(cfg)
    try:
        engine = resolve_engine(cfg.engine, model_path=sources["final"].path)   # "auto": see inference.engines
    except ValueError as e:
        raise RelayError(str(e)) from None
    # both checkpoints generate in the final one's dtype (its config.json's; float32 when it declares none): one
    # precision for the whole folder, recorded in relay_settings.json (vLLM keeps the engine's dtype when the final
    # weights are pushed into it)
    dtype = checkpoint_dtype(sources["final"].path)
    bench, probs, template, max_tokens = _benchmark(cfg)
    out_dir = _out_dir(cfg, bench)
    tok, prompt_ids = _encode_prompts(cfg, sources, template, probs)
    plan = _Plan(cfg, sources, engine, dtype, resolve_top_k(cfg.top_k), bench, probs, template, max_tokens, out_dir,
                 tok, prompt_ids)
    _check_contexts(plan)
    return plan


def _claim(plan: _Plan) -> bool:
    """Create the folder with relay_settings.json, or check the settings recorded there (RelayError for others);
    whether this call created it."""
    identity = plan.identity()
    try:
        return claim_folder(plan.out_dir, SETTINGS_FILE, identity, owner="tsanalysis relay", keys=IDENTITY_KEYS,
                            defaults={**{k: identity[k] for k in GENERATION_KEYS}, **ADDED_DEFAULTS},
                            fix="use another --out or delete that folder (its samples come from one engine in one "
                                "dtype: to resume it, rerun with its --engine)")
    except SettingsMismatch as e:
        raise RelayError(str(e)) from None


class _Grader:
    """The benchmark's grader through the one batch grader (``scoring.benchmarks.protocol.grade_responses``, the
    one ``eval.run`` and the trainer's validation use): math in one process pool for the whole run (a hard per-item
    limit), code in its worker processes; a grader that fails gives timeout/grader_error, never a wrong answer. The
    pool starts at the first math batch; its workers are daemons, so an error on the way leaves none behind."""

    def __init__(self, bench, tok):
        self.bench, self.tok, self.pool = bench, tok, None

    def __call__(self, problems, responses: list[list[list[int]]]) -> list[tuple[list[bool], list[str]]]:
        """Per problem, (correct, verdict) of each of its responses (token ids)."""
        from scoring.benchmarks.protocol import grade_responses
        from scoring.grading import GRADE_TIMEOUT_S
        from scoring.math import MATH_MEMORY_MB
        from scoring.pool import WorkerPool, apply

        if self.pool is None and self.bench.kind == "math":
            self.pool = WorkerPool(apply, timeout=GRADE_TIMEOUT_S, memory_mb=MATH_MEMORY_MB)
        texts = [[self.tok.decode(ids, skip_special_tokens=True) for ids in rs] for rs in responses]
        verdicts, _, _ = grade_responses(self.bench, problems, texts, pool=self.pool)
        return [([bool(v.correct) for v in vs], [v.verdict for v in vs]) for vs in verdicts]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def _eos_ids(tok, sampler) -> list[int]:
    """The ids that end a response (the tokenizer's EOS and the sampler's stop ids): never part of a prefix."""
    eos_ids = [tok.eos_token_id] if tok.eos_token_id is not None else []
    return sorted(set(eos_ids) | set(getattr(sampler, "eos_token_ids", [])))   # + the generation config's


def _prefix_records(sampler, grade: _Grader, chunk, prompt_ids: dict[str, list[int]], *, n: int, cut: float,
                    max_tokens: int, seed: int, eos_ids: Sequence[int], sampling: dict) -> list[dict]:
    """One chunk's prefixes.jsonl records: the writing checkpoint samples n responses per problem of ``chunk`` from
    the chunk's one seed (``derive_seed(seed, "early", *ids)``), each graded and cut into its prefix (with the
    writer's lengths, finish reasons and verdicts). Shared by the relay's early phase and ``tsanalysis.relay_matrix``,
    so a matrix writer's prefixes are the relay's early prefixes, sample for sample."""
    ids = [str(p.id) for p in chunk]
    comps = sampler.generate([prompt_ids[i] for i in ids for _ in range(n)], max_new_tokens=max_tokens,
                             seed=derive_seed(seed, "early", *ids), **sampling)
    per = [comps[j * n:(j + 1) * n] for j in range(len(chunk))]
    graded = grade(chunk, [[c.token_ids for c in cs] for cs in per])
    return [{"problem_id": pid, "prefix_ids": [cut_prefix(c.token_ids, cut, eos_ids=eos_ids) for c in cs],
             "early_len": [len(c.token_ids) for c in cs], "early_finish": [c.finish_reason for c in cs],
             "early_correct": correct} for pid, cs, (correct, _) in zip(ids, per, graded)]


def _relay_rows(sampler, base: list[list[int]], pre: list[list[int]], *, max_tokens: int, seed: int,
                sampling: dict) -> tuple[list[list[int]], list[str]]:
    """The continuing checkpoint's relay rows: prompt + prefix continued in one call with the longest budget any
    row needs, then each continuation cut to ``max_tokens − |prefix|`` (its finish reason then ``length``).
    ``base``: each row's prompt ids, ``pre``: its prefix ([B*G] each). Returns (relay response token ids = prefix +
    continuation, finish reasons). Shared by ``_continue`` and ``tsanalysis.relay_matrix``."""
    budget = [max_tokens - len(pf) for pf in pre]
    relay = sampler.generate([b + pf for b, pf in zip(base, pre)], max_new_tokens=max(0, max(budget)), seed=seed,
                             **sampling)
    relay_ids, relay_fin = [], []
    for pf, c, b in zip(pre, relay, budget):
        cont = c.token_ids[:max(0, b)]
        relay_ids.append(list(pf) + cont)
        relay_fin.append(c.finish_reason if len(cont) == len(c.token_ids) else "length")
    return relay_ids, relay_fin


def _early_phase(plan: _Plan, todo, grade: _Grader, prefixes: dict, *, claimed: bool, log):
    """Phase A: the early checkpoint writes n responses per problem of ``todo``; their prefixes (with the early
    lengths, finish reasons and verdicts) are appended to prefixes.jsonl one chunk at a time. Returns the sampler,
    or None when it was freed (the HF engine; one vLLM engine is kept for the final weights)."""
    from inference import load_policy, make_sampler

    cfg, n = plan.cfg, plan.cfg.n
    log(f"early phase: {len(todo)} problems × {n} samples from {cfg.early}")
    with _unclaimed_on_error(plan.out_dir, claimed):   # a failed start leaves no folder holding only its settings
        model, _ = load_policy(plan.sources["early"].path, device=plan.device, dtype=plan.dtype)
        sampler = make_sampler(model, plan.tok, engine=plan.engine, **plan.engine_kw)
    eos_ids = _eos_ids(plan.tok, sampler)
    for chunk in _chunks(todo, cfg.batch_problems):
        recs = _prefix_records(sampler, grade, chunk, plan.prompt_ids, n=n, cut=cfg.cut, max_tokens=plan.max_tokens,
                               seed=cfg.seed, eos_ids=eos_ids, sampling=plan.sampling)
        append_jsonl_rows(plan.out_dir / PREFIXES, recs)
        prefixes.update({r["problem_id"]: r for r in recs})
    del model
    if plan.engine != "vllm":   # free the early model before the final one is loaded
        sampler = None
        _free_memory()
    return sampler


def _continue(plan: _Plan, sampler, ids: list[str], pre: list[list[int]]):
    """One chunk's relay rows (``_relay_rows``) and final-only rows, n per problem, from the chunk's one seed (with
    cut 0 the two calls are identical). Returns (relay response token ids, relay finish reasons, final-only
    completions)."""
    n, seed = plan.cfg.n, derive_seed(plan.cfg.seed, "final", *ids)
    base = [plan.prompt_ids[i] for i in ids for _ in range(n)]
    relay_ids, relay_fin = _relay_rows(sampler, base, pre, max_tokens=plan.max_tokens, seed=seed,
                                       sampling=plan.sampling)
    final_only = sampler.generate(base, max_new_tokens=plan.max_tokens, seed=seed, **plan.sampling)
    return relay_ids, relay_fin, final_only


def _final_phase(plan: _Plan, todo, sampler, grade: _Grader, prefixes: dict, results: dict, *, log):
    """Phase B: the final checkpoint continues the prefixes of ``todo`` and samples its final-only responses; both
    sets are graded and each chunk's per-problem records appended to results.jsonl. Returns the sampler."""
    from inference import load_policy, make_sampler

    cfg, n = plan.cfg, plan.cfg.n
    log(f"final phase: {len(todo)} problems × {n} relay + {n} final-only samples from {cfg.final}")
    model, _ = load_policy(plan.sources["final"].path, device=plan.device, dtype=plan.dtype)
    if sampler is not None and plan.engine == "vllm":
        sampler.update_weights(model)   # one vLLM engine: same architecture, new weights
    else:
        sampler = make_sampler(model, plan.tok, engine=plan.engine, **plan.engine_kw)
    for chunk in _chunks(todo, cfg.batch_problems):
        ids = [str(p.id) for p in chunk]
        pre = [pf for i in ids for pf in prefixes[i]["prefix_ids"]]
        relay_ids, relay_fin, final_only = _continue(plan, sampler, ids, pre)
        per = [slice(j * n, (j + 1) * n) for j in range(len(chunk))]
        graded = grade(chunk + chunk, [relay_ids[sl] for sl in per] + [[c.token_ids for c in final_only[sl]]
                                                                        for sl in per])
        recs = []
        for j, (pid, sl) in enumerate(zip(ids, per)):
            (rc, rv), (fc, fv), e = graded[j], graded[len(chunk) + j], prefixes[pid]
            recs.append({
                "problem_id": pid, "n": n, "early_correct": int(sum(e["early_correct"])),
                "relay_correct": int(sum(rc)), "final_correct": int(sum(fc)),
                "relay_correct_list": rc, "final_correct_list": fc, "relay_verdicts": rv, "final_verdicts": fv,
                "prefix_len": [len(x) for x in pre[sl]], "early_len": e["early_len"],
                "relay_len": [len(x) for x in relay_ids[sl]], "final_len": [len(c.token_ids) for c in final_only[sl]],
                "relay_finish": relay_fin[sl], "final_finish": [c.finish_reason for c in final_only[sl]],
            })
        append_jsonl_rows(plan.out_dir / RESULTS, recs)
        results.update({r["problem_id"]: r for r in recs})
    del model
    return sampler


def _tables(plan: _Plan, results: dict) -> tuple[dict[str, pd.DataFrame], Path, dict]:
    """(``relay_problems`` and ``relay_passk`` over the selected problems, the folder, the settings)."""
    rows = []
    for p in plan.problems:
        r = results[str(p.id)]
        rows.append({"problem_id": str(p.id), "n": r["n"], "early_correct": r["early_correct"],
                     "relay_correct": r["relay_correct"], "final_correct": r["final_correct"],
                     **{f"{k}_len_mean": float(np.mean(r[f"{k}_len"])) for k in ("prefix", "early", "relay", "final")}})
    per_problem = pd.DataFrame(rows)
    passk = pass_k_table(per_problem["n"], per_problem["early_correct"], per_problem["relay_correct"],
                         per_problem["final_correct"], seed=plan.cfg.seed)
    settings = {"command": "relay", "args": {**plan.identity(), "limit": plan.cfg.limit, "engine": plan.cfg.engine,
                                             "engine_used": plan.engine}, "problems_evaluated": len(plan.problems),
                "same_model": plan.same_model}
    return {"relay_problems": per_problem, "relay_passk": passk}, plan.out_dir, settings


def run_relay(cfg: RelayConfig, *, log: Callable[[str], None] = print) -> tuple[dict[str, pd.DataFrame], Path, dict]:
    """Run (or resume) relay inference as ``cfg`` says; returns (tables, out_dir, settings). See the module
    docstring. Bad input raises RelayError before any model is loaded and before the folder is claimed (``_plan``:
    ``validate_relay`` first)."""
    plan = _plan(cfg)
    if plan.same_model:   # a null control, not bad input: said before any model loads (module docstring)
        log(f"warning: --early {cfg.early} and --final {cfg.final} are the same model "
            f"({plan.sources['final'].identity}): the relay is that model continuing its own prefixes, so relay and "
            f"final-only sample one distribution and differ by sampling noise only (a null control, not Figure 2); "
            f"for Figure 2 give an earlier checkpoint as --early")
    with _writer(plan.out_dir):
        return _run(plan, log)


@contextmanager
def _writer(out_dir: Path):
    """One relay writes a folder at a time (``contracts.locks``: ``.<folder>.lock`` beside it, so the folder holds
    only results): a second relay on the same folder gets RelayError naming the holder before it reads anything."""
    try:
        lock = hold(lock_file(out_dir), what=f"the relay folder {out_dir}", command="tsanalysis relay",
                    fix="wait for it to finish (or stop it), or give another --out")
        with lock:
            yield
    except LockHeld as e:
        raise RelayError(str(e)) from None


def _run(plan: _Plan, log: Callable[[str], None]) -> tuple[dict[str, pd.DataFrame], Path, dict]:
    """Both phases on the problems not yet in the folder's files, then the tables (``run_relay``, holding the lock)."""
    claimed = _claim(plan)
    prefixes = _read_jsonl(plan.out_dir / PREFIXES, log)
    results = _read_jsonl(plan.out_dir / RESULTS, log)
    grade, sampler = _Grader(plan.bench, plan.tok), None
    todo = [p for p in plan.problems if str(p.id) not in results and str(p.id) not in prefixes]
    if todo:   # -- phase A: the early checkpoint writes responses; their prefixes are kept
        sampler = _early_phase(plan, todo, grade, prefixes, claimed=claimed, log=log)
    todo = [p for p in plan.problems if str(p.id) not in results]
    if todo:   # -- phase B: the final checkpoint continues the prefixes, and samples final-only responses
        sampler = _final_phase(plan, todo, sampler, grade, prefixes, results, log=log)
    if sampler is not None and hasattr(sampler, "close"):
        sampler.close()   # a vLLM engine's memory goes back now, not when the process ends
    sampler = None
    grade.close()
    return _tables(plan, results)
