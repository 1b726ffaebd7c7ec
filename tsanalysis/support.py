"""Support dynamics of checkpoints scored by ``eval.run``: ``support_tables(cfg)``, ``cfg`` a
``tsanalysis.config.SupportConfig``, behind ``tsanalysis support``.

Input: an ``eval.run`` results folder, ``<eval-dir>/<model>/<benchmark>.jsonl`` (one line per problem with its
``responses``, extracted ``answers``, ``verdicts``, ``correct``, ``prompt`` and ``settings``; ``contracts.samples``),
holding two or more models (base / early / final ...), and optionally a relay folder (``tsanalysis relay``'s
``results.jsonl``: its relay samples are one more model, ``relay``). Models are compared in the order given
(``--models base,early,final``): every pair (earlier → later) on the problems both scored. The reverse pair is the
mirror image (its ``gained`` is this one's ``lost``). Samples that could not be graded (``UNGRADED_VERDICTS``) are
left out, as the leaderboard leaves them out; a problem left with none is dropped.

Tables (the estimators and their papers: ``tsanalysis.core.support``):

- ``passk``: per model, k = 1, 2, 4, ... n: mean pass@k with its bootstrap interval;
- ``support``: per pair and k, the expected problems ``gained``, ``lost``, ``kept``, ``neither`` (the unbiased
  per-problem pass@k of each model, draws independent), ``net`` (= gained − lost), ``retention`` and
  ``discovery``, each with a paired bootstrap interval over the shared problems;
- ``crossover``: per pair, the k where the later model's pass@k falls to the earlier one's, with its interval;
- ``problems``: per model and problem, graded samples, correct, distinct answers, distinct correct answers, answer
  entropy (nats), samples without an answer;
- ``diversity``: per model, the means over problems of those with intervals; ``diversity_pairs``: per pair the
  paired difference (later − earlier) of each mean on the shared problems;
- ``likelihood`` (``likelihood=True``): per (samples_of, scored_by), the mean per-token log-prob of samples_of's
  correct responses under scored_by, with the paired difference to samples_of's own log-prob (``vs_self``): does
  the final policy still give the base model's solutions probability, and the reverse (Yue et al. 2025's
  perplexity analysis, arXiv:2504.13837).

What counts as one answer (``answer_labels``):

- math: the extracted final answers, clustered with the grader's equivalence (``scoring.math.math_equal_mv``,
  math-verify, earlier cluster representative first as the gold). A correct answer is equivalent to the gold, so
  distinct *correct* answers of a math problem are almost always 1; distinct answers and the entropy carry the
  signal there;
- countdown: the final expression as a canonical tree (``canonical_solution``: commutative operands sorted);
  addition and other embedded tasks: the extracted answer as written (their canonical form already: an integer);
- code: by normalised program text, an approximation of behaviour: the results lines carry verdicts only, not
  per-test outputs, so programs that behave alike but read differently count twice. The program is
  ``scoring.code.extract_code``'s, normalised by ``ast.dump`` (comments, spacing, line breaks dropped), or by its
  whitespace-collapsed text when it does not parse;
- a relay folder stores no response texts: its rows have pass@k, support and crossover, and no answers.

Likelihood: each model is loaded with ``inference.load_policy`` from ``paths[model]`` or the ``model_path`` its
results record (a local folder, or a hub id already in the cache); a model that cannot be loaded is skipped with a
note (an explicit path that cannot be loaded is bad input). The response is re-tokenised with the scoring model's
tokenizer after the samples_of row's prompt (the sampled token ids are not stored: a decode/encode round trip may
differ slightly), its log-probs are the model's at temperature 1, and the EOS is not scored. At most
``likelihood_samples`` correct responses per problem (the first ones) are scored. Log-probs per token depend on the
tokenizer, so compare scorers that share one.
"""

from __future__ import annotations

import ast
import json
import os
import threading
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from contracts.passk import bootstrap_ci, k_grid, paired_bootstrap, passk_curve, passk_matrix
from scoring.benchmarks.protocol import graded_row   # the one rule: ungraded samples left out, lists aligned

from .config import RELAY_MODEL, SupportConfig, validate_support
from .core import support as S
from .errors import UsageError

__all__ = ["RELAY_MODEL", "RELAY_RESULTS", "RELAY_SETTINGS", "DIVERSITY_METRICS", "ModelSamples", "read_eval_dir",
           "read_relay", "graded_row", "answer_labels", "program_key", "mean_token_logprobs", "support_tables"]

RELAY_RESULTS = "results.jsonl"           # tsanalysis.relay writes these two
RELAY_SETTINGS = "relay_settings.json"
DIVERSITY_METRICS = ("distinct_correct", "distinct_answers", "answer_entropy")
MATH_TIMEOUT_S = 5                        # math-verify's own limit per equivalence check (main thread only)

Log = Callable[[str], None]


@dataclass
class ModelSamples:
    """One model's graded samples on one benchmark, problems sorted by id."""

    model: str
    benchmark: str
    ids: list[str]
    n: np.ndarray                      # [P] graded samples per problem
    c: np.ndarray                      # [P] correct samples per problem
    rows: list[dict] | None            # graded rows (responses, answers, correct aligned); None: no texts (relay)
    ungraded: int = 0                  # samples left out (grader errors, grader timeouts)
    model_path: str | None = None      # what the results record as the model (eval's settings.model_path)
    source: str = ""                   # the file it was read from
    kind: str | None = None            # math | code | task | None (unknown benchmark)
    meta: dict = field(default_factory=dict)


# ---- reading ---------------------------------------------------------------------------------------------------
def _samples(model: str, benchmark: str, rows: list[dict], source: str, *, texts: bool) -> ModelSamples:
    kept, ungraded = [], 0
    for r in sorted(rows, key=lambda r: str(r["problem_id"])):
        g = graded_row(r)
        ungraded += len(r["correct"]) - (0 if g is None else len(g["correct"]))
        if g is not None:
            kept.append(g)
    ids = [str(r["problem_id"]) for r in kept]
    # keyed by (problem, sample): contracts.samples.read_samples keeps each problem's first row (a duplicate is
    # dropped with a warning naming the file and its lines), so no problem is counted twice here
    assert len(set(ids)) == len(ids), f"{source}: a problem id appears twice after read_samples"
    n = np.array([len(r["correct"]) for r in kept], dtype=np.int64)
    c = np.array([sum(bool(x) for x in r["correct"]) for r in kept], dtype=np.int64)
    path = next((r.get("settings", {}).get("model_path") for r in kept if (r.get("settings") or {}).get("model_path")),
                None)
    return ModelSamples(model, benchmark, ids, n, c, kept if texts else None, ungraded, path, source,
                        kind=_kind(benchmark))


def _kind(benchmark: str) -> str | None:
    from scoring.benchmarks import BENCHMARKS, get_benchmark

    if benchmark not in BENCHMARKS:
        return None
    try:
        return get_benchmark(benchmark).kind
    except ImportError:
        return None


def read_eval_dir(eval_dir: str | os.PathLike, *, models: Sequence[str] | None = None,
                  benchmarks: Sequence[str] | None = None) -> dict[str, dict[str, ModelSamples]]:
    """{model: {benchmark: ModelSamples}} of an ``eval.run`` results folder, models in the order given (default:
    every model folder, sorted by name). UsageError naming what is missing."""
    from contracts.samples import read_samples

    root = Path(eval_dir)
    if not root.is_dir():
        raise UsageError(f"--eval-dir {eval_dir}: no such folder; give the --out folder of python -m eval.run "
                         f"(it holds <model>/<benchmark>.jsonl)")
    found = sorted(d.name for d in root.iterdir()
                   if d.is_dir() and any(f for f in d.glob("*.jsonl") if not f.name.endswith(".disagreements.jsonl")))
    names = list(models) if models else found
    missing = [m for m in names if m not in found]
    if missing:
        raise UsageError(f"--models: no results for {', '.join(missing)} under {root} (it holds: "
                         f"{', '.join(found) or 'no model folders'})")
    out: dict[str, dict[str, ModelSamples]] = {}
    for m in names:
        out[m] = {}
        for f in sorted((root / m).glob("*.jsonl")):
            if f.name.endswith(".disagreements.jsonl") or (benchmarks and f.stem not in benchmarks):
                continue
            try:
                rows = read_samples(f)
            except (ValueError, OSError) as e:
                raise UsageError(str(e)) from None
            bad = next((r for r in rows if not {"problem_id", "correct"} <= set(r)), None)
            if bad is not None:
                raise UsageError(f"{f}: a line without problem_id or correct; not an eval.run results file")
            if rows:
                out[m][f.stem] = _samples(m, f.stem, rows, str(f), texts=True)
    return out


def read_relay(relay_dir: str | os.PathLike) -> ModelSamples:
    """The relay samples of a ``tsanalysis relay`` folder as a model named ``relay`` (no response texts)."""
    from contracts.samples import read_samples

    root = Path(relay_dir)
    res, sett = root / RELAY_RESULTS, root / RELAY_SETTINGS
    if not res.is_file() or not sett.is_file():
        raise UsageError(f"--relay {relay_dir}: not a relay folder (it needs {RELAY_RESULTS} and {RELAY_SETTINGS}, "
                         f"as tsanalysis relay writes them)")
    settings = json.loads(sett.read_text(encoding="utf-8"))
    bench = settings.get("benchmark")
    if not bench:
        raise UsageError(f"--relay {relay_dir}: {RELAY_SETTINGS} names no benchmark")
    rows = [{"problem_id": r["problem_id"], "correct": list(r["relay_correct_list"]),
             "verdicts": list(r.get("relay_verdicts") or [None] * len(r["relay_correct_list"]))}
            for r in read_samples(res)]
    s = _samples(RELAY_MODEL, bench, rows, str(res), texts=False)
    s.meta = {"early": settings.get("early"), "final": settings.get("final"), "cut": settings.get("cut")}
    return s


# ---- what counts as one answer ---------------------------------------------------------------------------------
def program_key(response: str) -> str | None:
    """A program's identity: its AST dump (comments and layout dropped), else its whitespace-collapsed text."""
    from scoring.code import extract_code

    code = extract_code(response).strip()
    if not code:
        return None
    try:
        return ast.dump(ast.parse(code))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return " ".join(code.split())


@lru_cache(maxsize=200_000)
def _math_equal(rep: str, ans: str) -> bool:
    from scoring.math import math_equal_mv

    main = threading.current_thread() is threading.main_thread()   # math-verify's SIGALRM works there only
    try:
        return bool(math_equal_mv(rep, ans, timeout=MATH_TIMEOUT_S if main else None))
    except Exception:   # an answer math-verify cannot handle is its own answer, not a crash of the analysis
        return False


def answer_labels(samples: ModelSamples, row: dict) -> list[int | None]:
    """Cluster labels of one problem's samples (module docstring: what counts as one answer); None = no answer."""
    responses = row.get("responses") or []
    if samples.benchmark == "countdown":
        return S.cluster_labels([S.canonical_solution(r) for r in responses])
    if samples.kind == "code":
        return S.cluster_labels([program_key(r) for r in responses])
    answers = [a if isinstance(a, str) and a.strip() else None for a in (row.get("answers") or [None] * len(responses))]
    if samples.kind == "math":
        return S.cluster_labels([a.strip() if a else None for a in answers], equivalent=_math_equal)
    return S.cluster_labels([a.strip() if a else None for a in answers])


# ---- likelihood of one model's correct samples under another ---------------------------------------------------
def mean_token_logprobs(model, tokenizer, prompts: Sequence[str], responses: Sequence[str], *,
                        batch_tokens: int = 4096) -> np.ndarray:
    """Mean per-token log-prob of each response after its prompt under ``model`` (temperature 1), shape [N];
    NaN for an empty response. Sequences are batched by length under ``batch_tokens`` (padded tokens)."""
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    enc = [(tokenizer(p, add_special_tokens=False)["input_ids"], tokenizer(r, add_special_tokens=False)["input_ids"])
           for p, r in zip(prompts, responses)]
    bos = getattr(tokenizer, "bos_token_id", None)
    # an empty prompt: the first response token needs a context, the BOS when there is one
    enc = [((list(p) or ([bos] if bos is not None else [])), list(r)) for p, r in enc]
    out = np.full(len(enc), np.nan)
    order = sorted((i for i, (p, r) in enumerate(enc) if r and p), key=lambda i: len(enc[i][0]) + len(enc[i][1]))
    start = 0
    while start < len(order):
        end = start + 1
        # sorted by length: the batch's padded size is its count times its last (longest) sequence
        while end < len(order) and (end + 1 - start) * sum(map(len, enc[order[end]])) <= batch_tokens:
            end += 1
        batch = order[start:end]
        L = max(len(enc[i][0]) + len(enc[i][1]) for i in batch)
        ids = torch.full((len(batch), L), pad, dtype=torch.long)
        attn = torch.zeros((len(batch), L), dtype=torch.long)
        for b, i in enumerate(batch):
            seq = enc[i][0] + enc[i][1]
            ids[b, :len(seq)] = torch.tensor(seq)
            attn[b, :len(seq)] = 1
        with torch.no_grad():
            logits = model(input_ids=ids.to(device), attention_mask=attn.to(device), use_cache=False).logits
            for b, i in enumerate(batch):   # position t-1 predicts token t: the response's R positions only
                P, R = len(enc[i][0]), len(enc[i][1])
                lp = torch.log_softmax(logits[b, P - 1:P + R - 1].float(), dim=-1)               # [R, V]
                tok = ids[b, P:P + R].to(device)
                out[i] = float(lp.gather(1, tok[:, None])[:, 0].mean())
        start = end
    return out


def _loadable(spec: str) -> str:
    """The local folder of a model argument (a path, a hub id, or eval's ``owner/name@<commit>``), checked; raises
    ``inference.hub.ModelSourceError`` when it cannot be loaded here."""
    from inference.hub import check_model_files, resolve_model

    src = resolve_model(spec if os.path.exists(spec) else spec.split("@")[0], what="model", download=False)
    check_model_files(Path(src.path), what=f"model {spec}")
    return src.path


def _scorers(data: dict[str, dict[str, ModelSamples]], order: list[str],
             paths: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """({model: local folder} of the models that can score here, notes on the others). An explicit path that
    cannot be loaded is a UsageError; a recorded one that cannot is skipped with a note."""
    notes, folders = [], {}
    for m in order:
        spec = paths.get(m)
        explicit = spec is not None
        if spec is None:
            spec = next((s.model_path for s in data[m].values() if s.model_path), None)
        if spec is None:
            notes.append(f"likelihood: {m} skipped (its results record no model path; give --paths {m}=PATH)")
            continue
        try:
            folders[m] = _loadable(spec)
        except (OSError, ValueError) as e:   # ModelSourceError is an OSError
            if explicit:
                raise UsageError(f"--paths {m}={spec}: {e}") from None
            notes.append(f"likelihood: {m} skipped ({spec} is not a loadable model here: {e})")
    return folders, notes


def _likelihood_table(data: dict[str, dict[str, ModelSamples]], order: list[str], folders: dict[str, str], *,
                      per_problem: int, batch_tokens: int, device, dtype, n_boot: int, seed: int,
                      log: Log) -> pd.DataFrame:
    """Rows (benchmark, samples_of, scored_by, ...) for the scorers in ``folders``: see the module docstring."""
    from inference.loading import load_policy

    if device is None:   # the scorer's forward runs where there is an accelerator
        import torch
        device = "cuda" if torch.cuda.is_available() else None
    # the responses to score: per (benchmark, samples_of), the first correct ones of each problem
    todo: dict[tuple[str, str], tuple[list[str], list[int], list[str], list[str]]] = {}
    for m in order:
        for bench, s in data[m].items():
            if s.rows is None:
                continue
            ids, owner, prompts, texts = [], [], [], []
            for j, r in enumerate(s.rows):
                picked = [t for t, ok in zip(r.get("responses") or [], r["correct"]) if ok][:per_problem]
                for t in picked:
                    ids.append(s.ids[j])
                    owner.append(j)
                    prompts.append(r.get("prompt") or "")
                    texts.append(t)
            if texts:
                todo[(bench, m)] = (ids, owner, prompts, texts)
    scores: dict[tuple[str, str, str], np.ndarray] = {}   # (benchmark, samples_of, scored_by) -> [responses]
    for scorer, folder in folders.items():
        log(f"likelihood: scoring {sum(len(v[3]) for v in todo.values())} correct responses under {scorer} ({folder})")
        model, tok = load_policy(folder, device=device, dtype=dtype)
        for (bench, owner_model), (_, _, prompts, texts) in todo.items():
            scores[(bench, owner_model, scorer)] = mean_token_logprobs(model, tok, prompts, texts,
                                                                       batch_tokens=batch_tokens)
        del model
    rows = []
    for (bench, src), (ids, owner, _, texts) in todo.items():
        own = scores.get((bench, src, src))
        for scorer in folders:
            v = scores.get((bench, src, scorer))
            if v is None:
                continue
            per = _per_problem_mean(owner, v)
            ok = np.isfinite(per)
            row = {"benchmark": bench, "samples_of": src, "scored_by": scorer, "problems": int(ok.sum()),
                   "responses": int(np.isfinite(v).sum())}
            if ok.any():
                est, lo, hi = bootstrap_ci(per[ok], n_boot=n_boot, seed=seed)
                row.update(logp_mean=est, logp_low=lo, logp_high=hi)
            if own is not None and scorer != src:
                own_per = _per_problem_mean(owner, own)
                both = ok & np.isfinite(own_per)
                if both.any():
                    d = paired_bootstrap(per[both], own_per[both], n_boot=n_boot, seed=seed)
                    row.update(vs_self=d["diff"], vs_self_low=d["low"], vs_self_high=d["high"],
                               vs_self_p_value=d["p_value"])
            rows.append(row)
    cols = ["benchmark", "samples_of", "scored_by", "problems", "responses", "logp_mean", "logp_low", "logp_high",
            "vs_self", "vs_self_low", "vs_self_high", "vs_self_p_value"]
    return pd.DataFrame(rows).reindex(columns=cols)


def _per_problem_mean(owner: list[int], values: np.ndarray) -> np.ndarray:
    """Mean of ``values`` per problem index in ``owner`` (problems in first-seen order), NaN-aware."""
    keys = list(dict.fromkeys(owner))
    pos = {k: i for i, k in enumerate(keys)}
    idx = np.array([pos[o] for o in owner])
    fin = np.isfinite(values)
    tot = np.bincount(idx[fin], weights=values[fin], minlength=len(keys))
    cnt = np.bincount(idx[fin], minlength=len(keys))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, tot / np.maximum(cnt, 1), np.nan)


# ---- the tables ------------------------------------------------------------------------------------------------
def _shared(a: ModelSamples, b: ModelSamples) -> tuple[np.ndarray, np.ndarray]:
    ia = {p: i for i, p in enumerate(a.ids)}
    common = [i for i, p in enumerate(b.ids) if p in ia]
    return np.array([ia[b.ids[i]] for i in common], dtype=np.int64), np.array(common, dtype=np.int64)


def support_tables(cfg: SupportConfig, *, log: Log = print) -> dict[str, pd.DataFrame]:
    """The support tables of the models under ``cfg.eval_dir`` (module docstring), ``{name: DataFrame}``.

    ``cfg.models``: names and order (earlier → later); default every model folder by name, and ``relay`` last when
    a relay folder is given (name ``relay`` in ``models`` to place it). Bad input raises UsageError before anything
    is computed: the config (``tsanalysis.config.validate_support``: a model named twice, ``relay`` without its
    folder), a missing folder or model, fewer than two models, no benchmark that two of them share, ``paths`` for a
    model that is not compared or that cannot be loaded.
    """
    validate_support(cfg)
    eval_dir, models, benchmarks, relay = cfg.eval_dir, cfg.models, cfg.benchmarks, cfg.relay
    n_boot, seed = cfg.n_boot, cfg.seed
    order = list(models) if models else None
    plain = [m for m in order if m != RELAY_MODEL] if order else None
    data = read_eval_dir(eval_dir, models=plain, benchmarks=benchmarks)
    order = order or list(data)
    if relay is not None:
        r = read_relay(relay)
        if benchmarks and r.benchmark not in benchmarks:
            raise UsageError(f"--relay {relay} holds {r.benchmark}, which --benchmarks leaves out")
        data[RELAY_MODEL] = {r.benchmark: r}
        if RELAY_MODEL not in order:
            order.append(RELAY_MODEL)
    if len(order) < 2:
        raise UsageError(f"support compares two or more models; {eval_dir} gives {len(order)} "
                         f"({', '.join(order) or 'none'}): name them with --models A,B or add a --relay folder")
    paths = dict(cfg.paths or {})
    extra = [m for m in paths if m not in order]
    if extra:
        raise UsageError(f"--paths names {', '.join(extra)}, not among the models compared ({', '.join(order)})")
    benches = sorted({b for m in order for b in data[m]})
    shared = [b for b in benches if sum(b in data[m] for m in order) >= 2]
    if not shared:
        raise UsageError(f"no benchmark is scored by two of {', '.join(order)} under {eval_dir}"
                         + (f" (benchmarks: {', '.join(benches)})" if benches else ""))
    if cfg.likelihood:   # which checkpoints can score: decided before anything is computed
        folders, notes = _scorers(data, order, paths)
        for note in notes:
            log(note)
    for m in order:
        for b, s in data[m].items():
            if s.ungraded:
                log(f"note: {m}/{b}: {s.ungraded} ungraded samples left out (grader errors or timeouts)")

    passk_rows, support_rows, cross_rows, prob_rows = [], [], [], []
    for b in shared:
        for m in order:
            s = data[m].get(b)
            if s is None or not s.ids:
                continue
            ks = k_grid(int(s.n.min()))
            for k, (est, lo, hi) in passk_curve(passk_matrix(s.n, s.c, ks), ks, n_boot=n_boot, seed=seed).items():
                passk_rows.append({"benchmark": b, "model": m, "k": int(k), "problems": len(s.ids), "pass": est,
                                   "low": lo, "high": hi})
            if s.rows is not None:
                for pid, r in zip(s.ids, s.rows):
                    labels = answer_labels(s, r)
                    prob_rows.append({"benchmark": b, "model": m, "problem_id": pid, "n": len(r["correct"]),
                                      "correct": int(sum(bool(x) for x in r["correct"])),
                                      "no_answer": sum(x is None for x in labels),
                                      "distinct_answers": S.distinct(labels),
                                      "distinct_correct": S.distinct(labels, [bool(x) for x in r["correct"]]),
                                      "answer_entropy": S.answer_entropy(labels)})
        for i, ma in enumerate(order):
            for mb in order[i + 1:]:
                sa, sb = data[ma].get(b), data[mb].get(b)
                if sa is None or sb is None:
                    continue
                ia, ib = _shared(sa, sb)
                if ia.size == 0:
                    log(f"note: {b}: {ma} and {mb} share no problems; pair skipped")
                    continue
                na, ca, nb, cb = sa.n[ia], sa.c[ia], sb.n[ib], sb.c[ib]
                ks = k_grid(int(min(na.min(), nb.min())))
                pa, pb = passk_matrix(na, ca, ks), passk_matrix(nb, cb, ks)
                for row in S.support_rows(pa, pb, ks, n_boot=n_boot, seed=seed):
                    support_rows.append({"benchmark": b, "from": ma, "to": mb, **row})
                ct = S.crossover_table(pa, pb, ks, seed=seed, n_boot=n_boot)
                cross_rows.append({"benchmark": b, "from": ma, "to": mb, "problems": int(ia.size), "k_max": ks[-1],
                                   "crossover_k": ct["crossover_k"], "low": ct["low"], "high": ct["high"],
                                   "frac_within_grid": ct["frac_within_grid"],
                                   "frac_to_never_leads": ct["frac_final_never_leads"]})
    if not support_rows:
        raise UsageError(f"no two of {', '.join(order)} share a scored problem on {', '.join(shared)}: nothing to "
                         f"compare (were they evaluated on the same problems?)")
    problems = pd.DataFrame(prob_rows, columns=["benchmark", "model", "problem_id", "n", "correct", "no_answer",
                                                "distinct_answers", "distinct_correct", "answer_entropy"])
    tables = {"passk": pd.DataFrame(passk_rows), "support": pd.DataFrame(support_rows),
              "crossover": pd.DataFrame(cross_rows), "problems": problems,
              **_diversity_tables(problems, order, n_boot=n_boot, seed=seed)}
    if cfg.likelihood:
        tables["likelihood"] = _likelihood_table(
            {m: {b: s for b, s in data[m].items() if b in shared} for m in order}, order, folders,
            per_problem=cfg.likelihood_samples, batch_tokens=cfg.batch_tokens, device=cfg.device, dtype=cfg.dtype,
            n_boot=n_boot, seed=seed, log=log)
    return tables


def _diversity_tables(problems: pd.DataFrame, order: list[str], *, n_boot: int, seed: int) -> dict[str, pd.DataFrame]:
    """``diversity`` (per model and metric: mean over problems, interval) and ``diversity_pairs`` (paired
    later − earlier on the shared problems where both values are finite)."""
    rows, pairs = [], []
    for b, g in problems.groupby("benchmark", sort=True):
        by = {m: d.set_index("problem_id") for m, d in g.groupby("model")}
        for m in [m for m in order if m in by]:
            for metric in DIVERSITY_METRICS:
                v = by[m][metric].to_numpy(float)
                v = v[np.isfinite(v)]
                if v.size:
                    est, lo, hi = bootstrap_ci(v, n_boot=n_boot, seed=seed)
                    rows.append({"benchmark": b, "model": m, "metric": metric, "problems": int(v.size), "mean": est,
                                 "low": lo, "high": hi})
        present = [m for m in order if m in by]
        for i, ma in enumerate(present):
            for mb in present[i + 1:]:
                both = by[ma].index.intersection(by[mb].index)
                for metric in DIVERSITY_METRICS:
                    x = by[ma].loc[both, metric].to_numpy(float)
                    y = by[mb].loc[both, metric].to_numpy(float)
                    ok = np.isfinite(x) & np.isfinite(y)
                    if ok.any():
                        d = paired_bootstrap(y[ok], x[ok], n_boot=n_boot, seed=seed)
                        pairs.append({"benchmark": b, "from": ma, "to": mb, "metric": metric, "problems": int(ok.sum()),
                                      "diff": d["diff"], "low": d["low"], "high": d["high"], "p_value": d["p_value"]})
    return {"diversity": pd.DataFrame(rows, columns=["benchmark", "model", "metric", "problems", "mean", "low",
                                                     "high"]),
            "diversity_pairs": pd.DataFrame(pairs, columns=["benchmark", "from", "to", "metric", "problems", "diff",
                                                            "low", "high", "p_value"])}
