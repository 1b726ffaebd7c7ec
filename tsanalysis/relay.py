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

All three sets (early-only, relay, final-only) are graded with the benchmark's grader through eval's batch grader
(``eval.grading.grade_responses``, the one ``eval.run`` uses: math in a process pool with a hard per-item limit, a
grader that fails is ``timeout``/``grader_error`` and never correct), and pass@k (unbiased
estimator, ``contracts.passk``) is reported for k = 1, 2, 4, …, n with paired bootstrap intervals of the
relay − final-only difference over problems (Figure 2 plots that difference).

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
``run_relay`` returns the tables ``relay_problems`` and ``relay_passk`` with their settings; its callers (the
``tsanalysis relay`` command, the demo) write them with ``tsanalysis.io.write_results`` (Parquet + CSV and
``settings.json``). Bad input raises ``RelayError`` (``tsanalysis.errors``; a ``UsageError``) before any model is
loaded and before the output folder is claimed: sampling values, the checkpoints' files
(``eval.inputs.check_model``: a training run folder is named with its newest checkpoint; missing weights or
tokenizer, a truncated safetensors file), the problems, an output path that is a file. A folder claimed by a run
whose first model then fails to load is removed again when it holds nothing else. This module is a library: the
command line is ``tsanalysis.cli``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from contracts.files import atomic_write_text
from contracts.passk import bootstrap_ci, k_grid, paired_bootstrap, pass_at_k
from contracts.settings import SettingsMismatch, claim_folder

from . import io
from .errors import RelayError

__all__ = ["RelayError", "cut_prefix", "tokenizer_mismatch", "check_same_tokenizer", "derive_seed", "pass_k_table",
           "run_relay"]

SETTINGS_FILE = "relay_settings.json"   # the settings the folder's JSONL files belong to (contracts.settings)
IDENTITY_KEYS = ("early", "final", "benchmark", "problems", "template", "n", "cut", "max_tokens", "temperature",
                 "top_p", "top_k", "seed", "batch_problems", "engine", "dtype")
# how the samples were generated (the resolved engine, hf or vllm, and the dtype): one folder holds one engine's
# samples in one precision, as an eval.run results file does (eval.samples.GENERATION_SETTINGS). A folder written
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
    rows = []
    for k in k_grid(int(n.min())):
        pk = {name: pass_at_k(n, c, k) for name, c in (("early", early), ("relay", relay), ("final", final))}
        row = {"k": k, "problems": int(n.size)}
        for name, v in pk.items():
            est, lo, hi = bootstrap_ci(v, n_boot=n_boot, seed=seed)
            row.update({name: est, f"{name}_low": lo, f"{name}_high": hi})
        pb = paired_bootstrap(pk["relay"], pk["final"], n_boot=n_boot, seed=seed)
        row.update({"diff": pb["diff"], "diff_low": pb["low"], "diff_high": pb["high"], "p_value": pb["p_value"]})
        rows.append(row)
    return pd.DataFrame(rows)


# ---- JSONL helpers ---------------------------------------------------------------------------------------------
def _read_jsonl(path: Path) -> dict[str, dict]:
    """problem_id → record; a torn last line (interrupted write) is ignored, other bad lines are errors."""
    out: dict[str, dict] = {}
    if not path.exists():
        return out
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) and not text.endswith("\n"):
                lines.pop()   # the process died while appending this line: drop it, the problem is redone
                break
            raise RelayError(f"{path}:{i}: malformed JSON line; delete the line or the file to redo it") from None
        out[str(rec["problem_id"])] = rec
    if text and not text.endswith("\n"):   # leave a clean file for the next append
        atomic_write_text(path, "".join(line + "\n" for line in lines))
    return out


def _append_jsonl(path: Path, recs: list[dict]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for r in recs:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())


# ---- orchestration ---------------------------------------------------------------------------------------------
def _load_problems(benchmark: str | None, problems: str | None, limit: int | None):
    from scoring.benchmarks import get_benchmark

    if benchmark is None:
        raise RelayError("relay needs --benchmarks NAME (its problems, grader and template); --problems FILE then "
                         "replaces the benchmark's problems with the file's, read by that benchmark's loader")
    if "," in benchmark:
        raise RelayError(f"--benchmarks {benchmark}: the relay takes one benchmark (a relay folder holds one); run it "
                         f"once per benchmark, each with its own --out")
    try:
        bench = get_benchmark(benchmark)
    except (ValueError, ImportError) as e:
        raise RelayError(str(e)) from None
    name = benchmark
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


def run_relay(*, early: str, final: str, benchmark: str | None = None, problems: str | None = None, n: int = 64,
              cut: float = 0.5, max_tokens: int | None = None, temperature: float = 1.0, top_p: float = 1.0,
              top_k: int = 0, seed: int = 0, limit: int | None = None, engine: str = "auto",
              template: str | None = None, out: str | os.PathLike | None = None, batch_problems: int = 8,
              allow_unisolated: bool = False,
              log: Callable[[str], None] = print) -> tuple[dict[str, pd.DataFrame], Path, dict]:
    """Run (or resume) relay inference; returns (tables, out_dir, settings). See the module docstring.
    ``allow_unisolated``: grade a code benchmark even where the sandbox is not fully isolated (refused otherwise,
    ``scoring.sandbox.check_isolation``)."""
    from transformers import AutoTokenizer

    from inference import load_policy, make_sampler, resolve_engine
    from eval.grading import grade_responses
    from eval.inputs import EvalInputError, check_context, check_model
    from eval.parallel import checkpoint_dtype
    from inference.hub import model_context
    from inference.protocol import resolve_top_k
    from scoring.grading import GRADE_TIMEOUT_S
    from scoring.math import MATH_MEMORY_MB
    from scoring.pool import WorkerPool, apply
    from scoring.sandbox import SandboxError, check_isolation
    from scoring.templates import render_prompt

    # -- everything that can fail cheaply, before a model is loaded and before the output folder is claimed --
    if not 0.0 <= cut <= 1.0:
        raise RelayError(f"--cut must lie in [0, 1], got {cut}")
    if n < 1 or batch_problems < 1:
        raise RelayError("--n and batch_problems must be positive")
    if not temperature >= 0:   # NaN too
        raise RelayError(f"--temperature must be >= 0, got {temperature} (0 is greedy)")
    if not 0 < top_p <= 1:
        raise RelayError(f"--top-p must lie in (0, 1], got {top_p}")
    try:
        top_k = resolve_top_k(top_k)
    except ValueError as e:
        raise RelayError(f"--top-k: {e}") from None
    if max_tokens is not None and max_tokens < 1:
        raise RelayError(f"--max-tokens must be >= 1, got {max_tokens}")
    sources = {}   # a folder, or a hub id's snapshot in the Hugging Face cache (inference.hub), its files checked
    for name, path in (("early", early), ("final", final)):
        try:
            sources[name] = check_model(path, what=f"--{name}")
        except EvalInputError as e:   # a run folder, missing weights or tokenizer, a truncated safetensors file
            raise RelayError(str(e)) from None
    early_dir, final_dir = sources["early"].path, sources["final"].path
    try:
        engine_used = resolve_engine(engine, model_path=final_dir)   # "auto": see inference.engines
    except ValueError as e:
        raise RelayError(str(e)) from None
    # both checkpoints generate in the final one's dtype (its config.json's; float32 when it declares none): one
    # precision for the whole folder, recorded in relay_settings.json (vLLM keeps the engine's dtype when the final
    # weights are pushed into it)
    dtype = checkpoint_dtype(final_dir)
    bench, probs = _load_problems(benchmark, problems, limit)
    if bench.kind == "code":   # its responses run in the sandbox: refused where it is not fully isolated
        try:
            check_isolation(allow_unisolated=allow_unisolated)
        except SandboxError as e:
            raise RelayError(str(e)) from None
    template = template or bench.default_template
    max_tokens = int(max_tokens or bench.generation.get("max_tokens", 4096))
    tag = f"{bench.name}-{io.run_name(early)}_{Path(early).name}-to-{io.run_name(final)}_{Path(final).name}-cut{cut:g}"
    out_dir = Path(out) if out is not None else io.default_out(io.run_name(final), "relay") / tag
    if out_dir.exists() and not out_dir.is_dir():
        raise RelayError(f"{'--out' if out is not None else 'the output folder'} {out_dir} is a file, not a folder; "
                         f"choose another --out")
    try:
        tok_early = AutoTokenizer.from_pretrained(early_dir)
        tok_final = AutoTokenizer.from_pretrained(final_dir)
    except (OSError, ValueError) as e:
        raise RelayError(f"cannot load the tokenizers of --early {early} and --final {final}: "
                         f"{' '.join(str(e).split())[:300]}") from None
    check_same_tokenizer(tok_early, tok_final)
    tok = tok_final
    eos_ids = [tok.eos_token_id] if tok.eos_token_id is not None else []   # + the sampler's (generation config)
    prompt_ids = {}
    for p in probs:
        ids = tok(render_prompt(template, p.question, tok), add_special_tokens=False)["input_ids"]
        if not ids:
            raise RelayError(f"problem {p.id}: the rendered prompt is empty")
        prompt_ids[str(p.id)] = ids
    # a relay row (prompt + prefix + continuation) and a final-only row both hold at most prompt + max_tokens tokens:
    # each checkpoint's context must hold the longest, checked before any model loads
    for name, folder in (("early", early_dir), ("final", final_dir)):
        try:
            check_context(f"--{name} {early if name == 'early' else final}: {bench.name}", prompt_ids, max_tokens,
                          model_context(folder), where=str(Path(folder) / "config.json"))
        except EvalInputError as e:
            raise RelayError(str(e)) from None

    # a folder's absolute path, or owner/name@<commit> for a hub snapshot (the same on every resume from that cache)
    identity = {"early": sources["early"].identity, "final": sources["final"].identity, "benchmark": bench.name,
                "problems": str(Path(problems).resolve()) if problems else None, "template": template, "n": n,
                "cut": cut, "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                "seed": seed,
                "batch_problems": batch_problems, "engine": engine_used, "dtype": dtype}
    try:   # creates out_dir with relay_settings.json, or checks the settings recorded there
        claimed = claim_folder(out_dir, SETTINGS_FILE, identity, owner="tsanalysis relay", keys=IDENTITY_KEYS,
                               defaults={**{k: identity[k] for k in GENERATION_KEYS}, **ADDED_DEFAULTS},
                               fix="use another --out or delete that folder (its samples come from one engine in one "
                                   "dtype: to resume it, rerun with its --engine)")
    except SettingsMismatch as e:
        raise RelayError(str(e)) from None

    pref_path, res_path = out_dir / "prefixes.jsonl", out_dir / "results.jsonl"
    prefixes = _read_jsonl(pref_path)
    results = _read_jsonl(res_path)
    import torch

    device = "cuda" if engine_used == "hf" and torch.cuda.is_available() else None

    # the benchmark's grader through eval's batch grader: math in one process pool for the whole run (a hard
    # per-item limit), code on threads; a grader that fails gives timeout/grader_error, never a wrong answer
    # (started at the first math batch; its workers are daemons, so an error on the way does not leave them behind)
    pool = None

    def grade(problems, responses: list[list[list[int]]]) -> list[tuple[list[bool], list[str]]]:
        nonlocal pool
        if pool is None and bench.kind == "math":
            pool = WorkerPool(apply, timeout=GRADE_TIMEOUT_S, memory_mb=MATH_MEMORY_MB)
        texts = [[tok.decode(ids, skip_special_tokens=True) for ids in rs] for rs in responses]
        verdicts, _, _ = grade_responses(bench, problems, texts, pool=pool)
        return [([bool(v.correct) for v in vs], [v.verdict for v in vs]) for vs in verdicts]

    # vLLM's KV cache holds the longest prompt plus its budget (a relay row is prompt + prefix + continuation)
    engine_kw = ({"max_model_len": max(len(x) for x in prompt_ids.values()) + max_tokens, "model_path": early_dir}
                 if engine_used == "vllm" else {})

    # -- phase A: early checkpoint writes responses; keep the prefixes --
    sampler = None
    todo = [p for p in probs if str(p.id) not in results and str(p.id) not in prefixes]
    if todo:
        log(f"early phase: {len(todo)} problems × {n} samples from {early}")
        with _unclaimed_on_error(out_dir, claimed):   # a failed start leaves no folder holding only its settings
            model, _ = load_policy(early_dir, device=device, dtype=dtype)
            sampler = make_sampler(model, tok, engine=engine_used, **engine_kw)
        eos_ids = sorted(set(eos_ids) | set(getattr(sampler, "eos_token_ids", [])))
        for chunk in _chunks(todo, batch_problems):
            ids = [str(p.id) for p in chunk]
            s = derive_seed(seed, "early", *ids)
            comps = sampler.generate([prompt_ids[i] for i in ids for _ in range(n)], max_new_tokens=max_tokens,
                                     temperature=temperature, top_p=top_p, top_k=top_k, seed=s)
            graded = grade(chunk, [[c.token_ids for c in comps[j * n:(j + 1) * n]] for j in range(len(chunk))])
            recs = []
            for j, p in enumerate(chunk):
                cs = comps[j * n:(j + 1) * n]
                correct = graded[j][0]
                recs.append({"problem_id": str(p.id),
                             "prefix_ids": [cut_prefix(c.token_ids, cut, eos_ids=eos_ids) for c in cs],
                             "early_len": [len(c.token_ids) for c in cs],
                             "early_finish": [c.finish_reason for c in cs], "early_correct": correct})
            _append_jsonl(pref_path, recs)
            prefixes.update({r["problem_id"]: r for r in recs})
        del model
        if engine_used != "vllm":   # free the early model before the final one is loaded
            sampler = None
            _free_memory()

    # -- phase B: final checkpoint continues the prefixes, and samples final-only responses --
    todo = [p for p in probs if str(p.id) not in results]
    if todo:
        log(f"final phase: {len(todo)} problems × {n} relay + {n} final-only samples from {final}")
        model, _ = load_policy(final_dir, device=device, dtype=dtype)
        if sampler is not None and engine_used == "vllm":
            sampler.update_weights(model)   # one vLLM engine: same architecture, new weights
        else:
            sampler = make_sampler(model, tok, engine=engine_used, **engine_kw)
        for chunk in _chunks(todo, batch_problems):
            ids = [str(p.id) for p in chunk]
            s = derive_seed(seed, "final", *ids)
            pre = [pf for i in ids for pf in prefixes[i]["prefix_ids"]]
            base = [prompt_ids[i] for i in ids for _ in range(n)]
            # relay: one call with the longest budget any row needs, then each continuation is cut to its budget
            budget = [max_tokens - len(pf) for pf in pre]
            relay = sampler.generate([b + pf for b, pf in zip(base, pre)], max_new_tokens=max(0, max(budget)),
                                     temperature=temperature, top_p=top_p, top_k=top_k, seed=s)
            final_only = sampler.generate(base, max_new_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                          top_k=top_k, seed=s)
            relay_ids, relay_fin = [], []
            for pf, c, b in zip(pre, relay, budget):
                cont = c.token_ids[:max(0, b)]
                relay_ids.append(list(pf) + cont)
                relay_fin.append(c.finish_reason if len(cont) == len(c.token_ids) else "length")
            per = [slice(j * n, (j + 1) * n) for j in range(len(chunk))]
            graded = grade(chunk + chunk, [relay_ids[sl] for sl in per] + [[c.token_ids for c in final_only[sl]]
                                                                            for sl in per])
            recs = []
            for j, p in enumerate(chunk):
                sl = per[j]
                r_ids, r_fin = relay_ids[sl], relay_fin[sl]
                f_ids = [c.token_ids for c in final_only[sl]]
                (rc, rv), (fc, fv) = graded[j], graded[len(chunk) + j]
                e = prefixes[str(p.id)]
                recs.append({
                    "problem_id": str(p.id), "n": n, "early_correct": int(sum(e["early_correct"])),
                    "relay_correct": int(sum(rc)), "final_correct": int(sum(fc)),
                    "relay_correct_list": rc, "final_correct_list": fc, "relay_verdicts": rv, "final_verdicts": fv,
                    "prefix_len": [len(x) for x in pre[sl]], "early_len": e["early_len"],
                    "relay_len": [len(x) for x in r_ids], "final_len": [len(x) for x in f_ids],
                    "relay_finish": r_fin, "final_finish": [c.finish_reason for c in final_only[sl]],
                })
            _append_jsonl(res_path, recs)
            results.update({r["problem_id"]: r for r in recs})
        del model
    if sampler is not None and hasattr(sampler, "close"):
        sampler.close()   # a vLLM engine's memory goes back now, not when the process ends
    sampler = None
    if pool is not None:
        pool.close()

    # -- tables over the selected problems --
    rows = []
    for p in probs:
        r = results[str(p.id)]
        rows.append({"problem_id": str(p.id), "n": r["n"], "early_correct": r["early_correct"],
                     "relay_correct": r["relay_correct"], "final_correct": r["final_correct"],
                     "prefix_len_mean": float(np.mean(r["prefix_len"])), "early_len_mean": float(np.mean(r["early_len"])),
                     "relay_len_mean": float(np.mean(r["relay_len"])), "final_len_mean": float(np.mean(r["final_len"]))})
    per_problem = pd.DataFrame(rows)
    passk = pass_k_table(per_problem["n"], per_problem["early_correct"], per_problem["relay_correct"],
                         per_problem["final_correct"], seed=seed)
    settings = {"command": "relay", "args": {**identity, "limit": limit, "engine": engine,
                                             "engine_used": engine_used}, "problems_evaluated": len(probs)}
    return {"relay_problems": per_problem, "relay_passk": passk}, out_dir, settings
