"""The relay matrix (``tsanalysis relay --matrix RUN_DIR``): Figure 2's relay for every ordered pair of a run's
checkpoints.

For checkpoints c_1 < c_2 < … < c_m of one training run (``RUN_DIR/checkpoints/step_N``; ``--checkpoints`` chooses
the steps, default every one; the ``best`` link is no step of its own) and every pair i < j, the EARLIER checkpoint
i writes n responses per problem, each is cut at ``--cut`` (``tsanalysis.relay.cut_prefix``), and the LATER
checkpoint j continues the prefixes (relay i→j); j also samples n responses from the prompt alone. The cell (i, j)
is the pass@k gain of relay i→j over j alone, ``mean_p(pass@k relay − pass@k alone)``, with a paired percentile
bootstrap interval over problems (``contracts.passk.paired_bootstrap``, 2000 resamples, seeded with ``--seed``; the
unbiased estimator, k = 1, 2, 4, …, n). The cell (first, last) is Figure 2 (``tsanalysis relay --early FIRST
--final LAST``): with the same settings it holds the same samples and the same numbers.

Every sampling step is the relay's, from its pieces (``tsanalysis.relay``): the writer's prefixes
(``_prefix_records``: chunks of ``batch_problems`` problems, seed ``derive_seed(seed, "early", *ids)``), the
continuation (``_relay_rows``: the relay row is cut at ``max_tokens − |prefix|``), the continuer's samples alone
(the same chunk's seed ``derive_seed(seed, "final", *ids)`` as its continuations: with ``--cut 0`` a relay row is
the continuer sampling from scratch, so relay and alone are the same samples and every gain is exactly 0), the one
batch grader (``_Grader``), the prompts (``_prompt_ids``). A writer's prefixes and a continuer's samples alone do not
depend on the pair, so each is sampled once: each checkpoint writes its prefixes once (for every later continuer) and
samples alone once; the relay rows are grouped by continuer. The checkpoints are served in step order, each loaded
once: as continuer of every earlier checkpoint's prefixes, then as writer of its own. Every checkpoint generates in
the last one's dtype; all must share one tokenizer. How they are served:

- the HF engine: one checkpoint at a time (a LoRA adapter folder as its merged model, ``inference.hub
  .merged_adapter``, as ``tsanalysis relay`` and ``eval.run`` read it);
- vLLM, full checkpoints: one engine, each checkpoint's weights pushed into it (``update_weights``), as the relay
  does with its final checkpoint;
- vLLM, every checkpoint a LoRA adapter of one base (``trainer.lora``'s checkpoints): one engine over the base
  started with ``lora_rank`` (``enable_lora``), each checkpoint served as its own ``LoRARequest``
  (``VLLMSampler.use_adapter``: the adapter folder as saved, no merge, no weight moves).

Output folder (``--out``, default ``results/analysis/<run>/relay-matrix/<benchmark>-cut<cut>/``):
``matrix_settings.json`` (the settings every phase file belongs to, ``contracts.settings.claim_folder``: a rerun with
other sampling settings, engine or dtype is refused; the set of checkpoints is not among them, so a matrix extended
by more ``--checkpoints`` reuses every finished phase), the resumable phase files, one JSON line per problem each
(``contracts.files.append_jsonl_rows``; read back through ``contracts.samples.repair``: a torn last line is redone):
``prefixes/step_N.jsonl`` (writer N), ``alone/step_N.jsonl`` (continuer N alone), ``relay/step_I-to-step_J.jsonl``;
a checkpoint whose phases are all complete is not loaded again. ``run_relay_matrix(cfg)`` returns the tables
``matrix`` (one row per writer, continuer and k: relay, alone, gain, gain_low, gain_high, p_value, problems; pass@k
as fractions, gain in the same units) and ``matrix_problems`` (per writer, continuer and problem: n, relay_correct,
alone_correct, prefix_len_mean); the command writes them with ``tsanalysis.io.write_results`` (``matrix.csv``,
``settings.json``); ``figures.relay_matrix`` draws the heat map. Bad input (the relay's config checks; a run folder
with fewer than two checkpoints; an unknown step in ``--checkpoints``; the checkpoints' files, tokenizers and
contexts) raises ``RelayError`` before any model loads and before the folder is claimed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from contracts.files import append_jsonl_rows
from contracts.passk import N_BOOT, k_grid, paired_bootstrap, passk_matrix
from contracts.sampling import resolve_top_k
from contracts.settings import SettingsMismatch, claim_folder

from . import io
from .config import RelayConfig, validate_relay
from .errors import RelayError
from .relay import (_benchmark, _chunks, _eos_ids, _free_memory, _Grader, _prefix_records, _prompt_ids,
                    _read_jsonl, _relay_rows, _unclaimed_on_error, _writer, check_same_tokenizer, derive_seed)

__all__ = ["SETTINGS_FILE", "IDENTITY_KEYS", "run_checkpoints", "select_checkpoints", "gain_table", "format_matrix",
           "run_relay_matrix"]

SETTINGS_FILE = "matrix_settings.json"
# the settings every phase file belongs to; the checkpoints are not among them: a phase file is one checkpoint's
# (prefixes, alone) or one pair's (relay), named by its steps, and does not depend on the others
IDENTITY_KEYS = ("run", "benchmark", "problems", "template", "n", "cut", "max_tokens", "temperature", "top_p", "top_k",
                 "seed", "batch_problems", "engine", "dtype", "lora")
PREFIX_DIR, ALONE_DIR, RELAY_DIR = "prefixes", "alone", "relay"
_STEP = re.compile(r"step_(\d+)")


def step_name(step: int) -> str:
    return f"step_{step:06d}"   # trainer.checkpoint.checkpoint_dir's name


# ---- pure pieces -----------------------------------------------------------------------------------------------
def select_checkpoints(available: dict[int, Path], chosen, *, run: str) -> list[int]:
    """The steps to relay, ascending: ``chosen`` (steps as ints or ``step_N`` names; None: every one of
    ``available``). RelayError for a step the run does not have, or fewer than two."""
    have = ", ".join(map(str, available)) or "none"
    if chosen is None:
        steps = sorted(available)
    else:
        steps = sorted(int(str(x).removeprefix("step_")) for x in chosen)
        unknown = [s for s in steps if s not in available]
        if unknown:
            raise RelayError(f"--checkpoints: step {unknown[0]} is not a checkpoint of {run} (its checkpoints: "
                             f"{have}); choose from those")
    if len(steps) < 2:
        what = "--checkpoints names" if chosen is not None else f"{run} has"
        raise RelayError(f"the relay matrix needs at least two checkpoints (a writer and a later continuer); {what} "
                         f"{len(steps)} (checkpoints/step_N holding a model: {have})")
    return steps


def gain_table(problems: pd.DataFrame, *, n_boot: int = N_BOOT, seed: int = 0) -> pd.DataFrame:
    """The matrix: one row per (writer, continuer, k) of the per-problem counts ``problems`` (columns writer,
    continuer, n, relay_correct, alone_correct; one row per problem of each pair, the same problems in the same
    order for every pair). Columns writer, continuer, k, problems, relay, alone (mean unbiased pass@k over
    problems), gain = relay − alone, gain_low, gain_high (paired percentile bootstrap over problems, 95 %, seeded),
    p_value. k = 1, 2, 4, …, n (``k_grid``). Equal to ``tsanalysis.relay.pass_k_table``'s relay, final and diff
    columns for the same counts."""
    rows = []
    for (w, c), d in problems.groupby(["writer", "continuer"], sort=True):
        n = d["n"].to_numpy(np.int64)
        ks = k_grid(int(n.min()))
        relay, alone = passk_matrix(n, d["relay_correct"], ks), passk_matrix(n, d["alone_correct"], ks)   # [P, K]
        for j, k in enumerate(ks):
            pb = paired_bootstrap(relay[:, j], alone[:, j], n_boot=n_boot, seed=seed)
            rows.append({"writer": int(w), "continuer": int(c), "k": k, "problems": int(n.size),
                         "relay": float(relay[:, j].mean()), "alone": float(alone[:, j].mean()),
                         "gain": pb["diff"], "gain_low": pb["low"], "gain_high": pb["high"], "p_value": pb["p_value"]})
    return pd.DataFrame(rows, columns=["writer", "continuer", "k", "problems", "relay", "alone", "gain", "gain_low",
                                       "gain_high", "p_value"])


def format_matrix(matrix: pd.DataFrame, k: int | None = None) -> str:
    """The matrix at ``k`` (default the largest) as printed: rows writer, columns continuer, each cell the gain in
    points with its 95 % interval, ``*`` where the interval excludes 0."""
    k = int(matrix["k"].max()) if k is None else k
    d = matrix[matrix["k"] == k]

    def cell(r) -> str:
        star = "*" if r.gain_low > 0 or r.gain_high < 0 else ""
        return f"{100 * r.gain:+.1f} [{100 * r.gain_low:+.1f}, {100 * r.gain_high:+.1f}]{star}"

    shown = d.assign(cell=[cell(r) for r in d.itertuples()]).pivot(index="writer", columns="continuer",
                                                                    values="cell").fillna("")
    shown.index.name, shown.columns.name = "writer \\ continuer", None
    return (f"relay matrix: pass@{k} of relay (writer's prefix, continuer continues) − the continuer alone, in points "
            f"[95 % paired bootstrap interval]; * the interval excludes 0\n" + shown.to_string())


# ---- the run's checkpoints ---------------------------------------------------------------------------------------
def run_checkpoints(run_dir: str | Path) -> dict[int, Path]:
    """step -> folder of every ``checkpoints/step_N`` of a run that holds a model (``inference.hub.holds_model``: a
    Hugging Face model or a LoRA adapter), ascending; the ``best`` link and other names are not steps."""
    from inference.hub import holds_model

    root = Path(run_dir) / "checkpoints"
    found = [(int(m.group(1)), d) for d in (root.iterdir() if root.is_dir() else ())
             if (m := _STEP.fullmatch(d.name)) and not d.is_symlink() and holds_model(d)]
    return dict(sorted(found))


@dataclass(frozen=True)
class _Checkpoint:
    step: int
    folder: Path      # RUN_DIR/checkpoints/step_N
    path: str         # what the engine loads: the folder, an adapter's merged model, or (lora) the adapter folder
    identity: str

    @property
    def name(self) -> str:
        return step_name(self.step)


@dataclass
class _Plan:
    """What the phases share, resolved and checked before any model loads or the folder is claimed (``_plan``)."""

    cfg: RelayConfig
    run_dir: Path
    ckpts: list[_Checkpoint]      # ascending steps
    lora_base: object | None      # inference.hub.ModelSource of the adapters' base when served as LoRA (vLLM)
    lora_rank: int                # the largest adapter rank (lora)
    engine: str
    dtype: str
    top_k: int
    bench: object
    problems: list
    template: str
    max_tokens: int
    out_dir: Path
    tok: object
    prompt_ids: dict[str, list[int]]

    @property
    def sampling(self) -> dict:
        return {"temperature": self.cfg.temperature, "top_p": self.cfg.top_p, "top_k": self.top_k}

    @property
    def engine_kw(self) -> dict:
        """vLLM: the KV cache holds the longest prompt plus its budget; the engine starts from the first checkpoint
        (full weights: later ones are pushed) or from the adapters' base (lora: one adapter per checkpoint)."""
        if self.engine != "vllm":
            return {}
        kw = {"max_model_len": max(len(x) for x in self.prompt_ids.values()) + self.max_tokens}
        if self.lora_base is None:
            return {**kw, "model_path": self.ckpts[0].path}
        return {**kw, "model_path": self.lora_base.path, "sync_weights": False, "lora_rank": self.lora_rank}

    @property
    def device(self) -> str | None:
        import torch

        return "cuda" if self.engine == "hf" and torch.cuda.is_available() else None

    def identity(self) -> dict:
        c = self.cfg
        return {"run": str(self.run_dir.resolve()), "benchmark": self.bench.name,
                "problems": str(Path(c.problems).resolve()) if c.problems else None, "template": self.template,
                "n": c.n, "cut": c.cut, "max_tokens": self.max_tokens, "temperature": c.temperature, "top_p": c.top_p,
                "top_k": self.top_k, "seed": c.seed, "batch_problems": c.batch_problems, "engine": self.engine,
                "dtype": self.dtype, "lora": self.lora_base is not None}


def _adapter_config(folder: Path, what: str) -> dict:
    from inference.hub import ADAPTER_CONFIG

    try:
        return json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise RelayError(f"{what}: {folder / ADAPTER_CONFIG} is damaged ({type(e).__name__}: {e}); save the adapter "
                         f"again") from None


def _check_adapter_weights(folder: Path, *, what: str) -> None:
    """RelayError unless ``folder`` holds PEFT's adapter weights with a readable safetensors header (a truncated
    copy is found without loading it)."""
    from safetensors import SafetensorError, safe_open

    from inference.vllm_engine import ADAPTER_WEIGHTS

    weights = folder / ADAPTER_WEIGHTS
    try:
        with safe_open(str(weights), framework="pt"):
            pass
    except (SafetensorError, OSError) as e:
        raise RelayError(f"{what}: {weights} cannot be read ({' '.join(str(e).split())}); save or copy the "
                         f"checkpoint again, or leave it out of --checkpoints") from None


def _resolve(cfg: RelayConfig, run: str, folders: dict[int, Path]) -> tuple[list[_Checkpoint], object, int, str]:
    """(the checkpoints, the adapters' base when they are served as LoRA adapters of one vLLM engine, their largest
    rank, the engine). Served as LoRA when the engine is vLLM and every checkpoint is an adapter of one base;
    otherwise each checkpoint is resolved as the relay resolves one (``resolve_checked_model``: an adapter as its
    merged model)."""
    from inference import resolve_engine
    from inference.hub import ModelSourceError, is_adapter_folder, resolve_checked_model

    def checked(spec, what):
        try:
            return resolve_checked_model(spec, what=what)
        except ModelSourceError as e:
            raise RelayError(str(e)) from None

    last = folders[max(folders)]
    configs = {s: _adapter_config(f, f"--matrix {run}: {step_name(s)}") for s, f in folders.items()
               if is_adapter_folder(f)}
    bases = {str(c.get("base_model_name_or_path") or "") for c in configs.values()}
    base = None
    if len(configs) == len(folders) and len(bases) == 1 and "" not in bases:
        base = checked(bases.pop(), f"--matrix {run}: the adapters' base")
    try:   # "auto": see inference.engines (the size is the base's for adapters)
        engine = resolve_engine(cfg.engine, model_path=base.path if base is not None else
                                checked(str(last), f"--matrix {run}: {step_name(max(folders))}").path)
    except ValueError as e:
        raise RelayError(str(e)) from None
    if engine == "vllm" and base is not None:
        ckpts = []
        for s, f in folders.items():
            _check_adapter_weights(f, what=f"--matrix {run}: {step_name(s)}")
            ckpts.append(_Checkpoint(s, f, str(f), str(f.resolve())))
        return ckpts, base, max(int(c.get("r") or 1) for c in configs.values()), engine
    ckpts = []
    for s, f in folders.items():
        src = checked(str(f), f"--matrix {run}: {step_name(s)}")
        ckpts.append(_Checkpoint(s, f, src.path, str(f.resolve())))
    return ckpts, None, 0, engine


def _tokenizers(plan_ckpts: list[_Checkpoint], base) -> object:
    """The last checkpoint's tokenizer; RelayError when another checkpoint's differs (token ids are handed over)."""
    from transformers import AutoTokenizer

    from inference.hub import TOKENIZER_FILES

    def tokenizer_dir(c: _Checkpoint) -> str:
        own = any((Path(c.path) / f).is_file() for f in TOKENIZER_FILES)
        return c.path if own or base is None else base.path

    try:
        toks = [AutoTokenizer.from_pretrained(tokenizer_dir(c)) for c in plan_ckpts]
    except (OSError, ValueError) as e:
        raise RelayError(f"cannot load the checkpoints' tokenizers: {' '.join(str(e).split())[:300]}") from None
    for c, t in zip(plan_ckpts[:-1], toks[:-1]):
        check_same_tokenizer(t, toks[-1], names=(c.name, plan_ckpts[-1].name))
    return toks[-1]


def _plan(cfg: RelayConfig) -> _Plan:
    """Everything that can fail cheaply, before a model is loaded and before the output folder is claimed: the
    config, the run's checkpoints and the steps chosen, their files, the engine, the problems, the sandbox, the
    output path, the tokenizers, the contexts."""
    from inference.hub import ContextError, check_context, checkpoint_dtype, model_context

    validate_relay(cfg)
    if cfg.matrix is None:
        raise RelayError("run_relay_matrix needs --matrix RUN_DIR (two checkpoints: tsanalysis.relay.run_relay)")
    run_dir, run = Path(cfg.matrix), cfg.matrix
    if not (run_dir / "checkpoints").is_dir():
        raise RelayError(f"--matrix {run}: no checkpoints/ folder there; give a training run folder (runs/<name>, "
                         f"written by trainer.train)")
    available = run_checkpoints(run_dir)
    steps = select_checkpoints(available, cfg.checkpoints, run=run)
    ckpts, base, rank, engine = _resolve(cfg, run, {s: available[s] for s in steps})
    # every checkpoint generates in the last one's dtype (the relay's: its final checkpoint's), one precision per folder
    dtype = checkpoint_dtype(base.path if base is not None else ckpts[-1].path)
    bench, probs, template, max_tokens = _benchmark(cfg)
    out_dir = (Path(cfg.out) if cfg.out is not None else
               io.default_out(io.run_name(run_dir), "relay-matrix") / f"{bench.name}-cut{cfg.cut:g}")
    if out_dir.exists() and not out_dir.is_dir():
        raise RelayError(f"the output folder {out_dir} is a file, not a folder; choose another --out")
    tok = _tokenizers(ckpts, base)
    prompt_ids = _prompt_ids(tok, template, probs)
    for c in ckpts if base is None else ckpts[-1:]:   # a relay row and an alone row: at most prompt + max_tokens
        folder = c.path if base is None else base.path
        try:
            check_context(f"--matrix {run} {c.name}: {bench.name}", prompt_ids, max_tokens, model_context(folder),
                          where=str(Path(folder) / "config.json"))
        except ContextError as e:
            raise RelayError(str(e)) from None
    return _Plan(cfg, run_dir, ckpts, base, rank, engine, dtype, resolve_top_k(cfg.top_k), bench, probs, template,
                 max_tokens, out_dir, tok, prompt_ids)


def _claim(plan: _Plan) -> bool:
    try:
        return claim_folder(plan.out_dir, SETTINGS_FILE, plan.identity(), owner="tsanalysis relay --matrix",
                            keys=IDENTITY_KEYS, fix="use another --out or delete that folder (its samples come from "
                                                    "one engine in one dtype: to resume it, rerun with its --engine)")
    except SettingsMismatch as e:
        raise RelayError(str(e)) from None


# ---- the phases ------------------------------------------------------------------------------------------------
def _append(path: Path, recs: list[dict]) -> None:
    path.parent.mkdir(exist_ok=True)
    append_jsonl_rows(path, recs)


class _Files:
    """The phase files of the folder (problem id -> record each), read and repaired once at the start."""

    def __init__(self, plan: _Plan, log):
        out, steps = plan.out_dir, [c.step for c in plan.ckpts]
        self.prefix_path = {s: out / PREFIX_DIR / f"{step_name(s)}.jsonl" for s in steps[:-1]}
        self.alone_path = {s: out / ALONE_DIR / f"{step_name(s)}.jsonl" for s in steps[1:]}
        self.relay_path = {(w, c): out / RELAY_DIR / f"{step_name(w)}-to-{step_name(c)}.jsonl"
                           for i, c in enumerate(steps) for w in steps[:i]}
        self.prefixes = {s: _read_jsonl(p, log) for s, p in self.prefix_path.items()}
        self.alone = {s: _read_jsonl(p, log) for s, p in self.alone_path.items()}
        self.relay = {k: _read_jsonl(p, log) for k, p in self.relay_path.items()}


def _todo(problems, done: dict | None) -> list:
    return [] if done is None else [p for p in problems if str(p.id) not in done]


def _serve(plan: _Plan, ck: _Checkpoint, sampler, log):
    """A sampler generating with checkpoint ``ck`` (see the module doc): the HF engine loads it alone (the previous
    one freed first); one vLLM engine gets its weights pushed, or (lora) serves its adapter folder."""
    from inference import load_policy, load_skeleton, make_sampler

    log(f"{ck.name}: loading {ck.path}")
    if plan.lora_base is not None:
        if sampler is None:
            model = load_skeleton(plan.lora_base.path, dtype=plan.dtype)
            sampler = make_sampler(model, plan.tok, engine="vllm", **plan.engine_kw)
        sampler.use_adapter(ck.name, ck.folder.resolve())   # the saved folder itself: no merge, no weight moves
        return sampler
    if plan.engine != "vllm":
        sampler = None
        _free_memory()   # the previous checkpoint goes before the next loads
    model, _ = load_policy(ck.path, device=plan.device, dtype=plan.dtype)
    if sampler is not None:
        sampler.update_weights(model)   # one vLLM engine: same architecture, new weights
    else:
        sampler = make_sampler(model, plan.tok, engine=plan.engine, **plan.engine_kw)
    return sampler


def _alone_records(plan: _Plan, sampler, grade: _Grader, chunk) -> list[dict]:
    """One chunk of the continuer's samples from the prompt alone: the relay's final-only call, same seed."""
    n, ids = plan.cfg.n, [str(p.id) for p in chunk]
    base = [plan.prompt_ids[i] for i in ids for _ in range(n)]
    comps = sampler.generate(base, max_new_tokens=plan.max_tokens, seed=derive_seed(plan.cfg.seed, "final", *ids),
                             **plan.sampling)
    per = [comps[j * n:(j + 1) * n] for j in range(len(chunk))]
    graded = grade(chunk, [[c.token_ids for c in cs] for cs in per])
    return [{"problem_id": pid, "n": n, "correct": int(sum(ok)), "correct_list": ok, "verdicts": v,
             "len": [len(c.token_ids) for c in cs], "finish": [c.finish_reason for c in cs]}
            for pid, cs, (ok, v) in zip(ids, per, graded)]


def _relay_records(plan: _Plan, sampler, grade: _Grader, chunk, prefixes: dict) -> list[dict]:
    """One chunk of relay rows: the continuer continues the writer's prefixes (``_relay_rows``, the relay's seed)."""
    n, ids = plan.cfg.n, [str(p.id) for p in chunk]
    assert all(i in prefixes for i in ids), "a writer's prefixes are written before any later checkpoint continues"
    base = [plan.prompt_ids[i] for i in ids for _ in range(n)]
    pre = [pf for i in ids for pf in prefixes[i]["prefix_ids"]]
    relay_ids, fin = _relay_rows(sampler, base, pre, max_tokens=plan.max_tokens,
                                 seed=derive_seed(plan.cfg.seed, "final", *ids), sampling=plan.sampling)
    sl = [slice(j * n, (j + 1) * n) for j in range(len(chunk))]
    graded = grade(chunk, [relay_ids[s] for s in sl])
    return [{"problem_id": pid, "n": n, "correct": int(sum(ok)), "correct_list": ok, "verdicts": v,
             "prefix_len": [len(x) for x in pre[s]], "len": [len(x) for x in relay_ids[s]], "finish": fin[s]}
            for pid, s, (ok, v) in zip(ids, sl, graded)]


def _run(plan: _Plan, log) -> tuple[dict[str, pd.DataFrame], Path, dict]:
    claimed = _claim(plan)
    files = _Files(plan, log)
    grade, sampler, bp, loaded = _Grader(plan.bench, plan.tok), None, plan.cfg.batch_problems, []
    try:
        with _unclaimed_on_error(plan.out_dir, claimed):   # a failed start leaves no folder holding only settings
            for i, ck in enumerate(plan.ckpts):
                alone = _todo(plan.problems, files.alone.get(ck.step))
                relays = {w.step: _todo(plan.problems, files.relay[(w.step, ck.step)]) for w in plan.ckpts[:i]}
                write = _todo(plan.problems, files.prefixes.get(ck.step))
                if not (alone or write or any(relays.values())):
                    continue   # every phase of this checkpoint is finished: not loaded
                sampler = _serve(plan, ck, sampler, log)
                loaded.append(ck.step)
                if alone:
                    log(f"{ck.name} alone: {len(alone)} problems × {plan.cfg.n} samples")
                for chunk in _chunks(alone, bp):
                    recs = _alone_records(plan, sampler, grade, chunk)
                    _append(files.alone_path[ck.step], recs)
                    files.alone[ck.step].update({r["problem_id"]: r for r in recs})
                for w, todo in relays.items():
                    if todo:
                        log(f"relay {step_name(w)} → {ck.name}: {len(todo)} problems × {plan.cfg.n} continuations")
                    for chunk in _chunks(todo, bp):
                        recs = _relay_records(plan, sampler, grade, chunk, files.prefixes[w])
                        _append(files.relay_path[(w, ck.step)], recs)
                        files.relay[(w, ck.step)].update({r["problem_id"]: r for r in recs})
                if write:
                    log(f"{ck.name} writes: {len(write)} problems × {plan.cfg.n} prefixes")
                    eos_ids = _eos_ids(plan.tok, sampler)
                for chunk in _chunks(write, bp):
                    recs = _prefix_records(sampler, grade, chunk, plan.prompt_ids, n=plan.cfg.n, cut=plan.cfg.cut,
                                           max_tokens=plan.max_tokens, seed=plan.cfg.seed, eos_ids=eos_ids,
                                           sampling=plan.sampling)
                    _append(files.prefix_path[ck.step], recs)
                    files.prefixes[ck.step].update({r["problem_id"]: r for r in recs})
    finally:
        if sampler is not None and hasattr(sampler, "close"):
            sampler.close()   # a vLLM engine's memory goes back now, not when the process ends
        sampler = None
        grade.close()
    return _tables(plan, files, loaded)


def _tables(plan: _Plan, files: _Files, loaded: list[int]) -> tuple[dict[str, pd.DataFrame], Path, dict]:
    rows = []
    for (w, c), recs in files.relay.items():
        for p in plan.problems:
            r, a = recs[str(p.id)], files.alone[c][str(p.id)]
            rows.append({"writer": w, "continuer": c, "problem_id": str(p.id), "n": r["n"],
                         "relay_correct": r["correct"], "alone_correct": a["correct"],
                         "prefix_len_mean": float(np.mean(r["prefix_len"]))})
    per_problem = pd.DataFrame(rows)
    matrix = gain_table(per_problem, seed=plan.cfg.seed)
    settings = {"command": "relay", "args": {**plan.identity(), "matrix": str(plan.run_dir.resolve()),
                                             "checkpoints": [c.step for c in plan.ckpts], "limit": plan.cfg.limit,
                                             "engine": plan.cfg.engine, "engine_used": plan.engine},
                "run_dir": str(plan.run_dir.resolve()),   # figures.load: the run the tables come from
                "checkpoints": {c.name: c.identity for c in plan.ckpts}, "problems_evaluated": len(plan.problems),
                "loaded": [step_name(s) for s in loaded]}
    return {"matrix": matrix, "matrix_problems": per_problem}, plan.out_dir, settings


def run_relay_matrix(cfg: RelayConfig, *, log: Callable[[str], None] = print
                     ) -> tuple[dict[str, pd.DataFrame], Path, dict]:
    """Run (or resume) the relay matrix of ``cfg.matrix`` (see the module docstring); returns (tables, out_dir,
    settings). Bad input raises RelayError before any model is loaded and before the folder is claimed."""
    plan = _plan(cfg)
    with _writer(plan.out_dir):
        return _run(plan, log)
