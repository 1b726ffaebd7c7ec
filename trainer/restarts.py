"""The restart distributions' steps (docs/method.md "Restart distributions"): which prompts of a step restart, from
which sources, and the adaptive rule's statistics. Their pure pieces are ``trainer/algos/restarts.py``.

A restart is Thinking Seeds' cut-and-continue (``RolloutBuilder._cut_and_continue``) with other sources: this
module only chooses the prompts and gathers, grades and scores their sources. ``RolloutBuilder.collect`` calls
``restart_step`` for every ``seed_source`` / ``seed_trigger`` / ``seed_rule`` other than the paper's
(``trainer.rollout.thinking_seeds``) with itself as ``builder``: ``trainer.rollout`` imports this module, so this
one imports nothing of it (tests/test_layering.py) and takes a call's groups by position (the builder returns
prompt k's G rows as rows[k * G:(k + 1) * G]).
"""

from __future__ import annotations

import math

import torch

from scoring.verdict import UNGRADED_VERDICTS
from trainer.algos import (CYCLE_SOURCES, SourceResponse, adaptive_ratios, arm_means, new_arm_stats,
                           update_arm_stats)
from trainer.data import off_policy_ids


def restart_step(builder, step: int) -> list:
    """A step's rows (``trainer.rollout.Rollout``) under a restart distribution. Cycle sources (refresh, pool) keep
    the refresh cycle: its first batch trains on the cycle's responses as on-policy rows (pool: every cached response
    is graded then and the correct ones join their prompt's pool), batches 2..T restart. Other sources take the
    step's prompts from the loader. With ``seed_trigger=all_wrong`` (and always with ``current``, whose sources are
    that group) every prompt first gets a fresh group; a prompt restarts when it has a source and (``always``) or its
    fresh group is all wrong (``all_wrong``); its group is then G continuations, row g from its source g (cycled when
    a prompt has fewer than G)."""
    b, cfg, G = builder, builder.cfg, builder.cfg.samples_per_prompt
    if cfg.seed_source in CYCLE_SOURCES:
        j = step % cfg.seed_refresh_interval
        if j == 0 or b.seed_buffer is None:
            rows = b._refresh(step)
            if cfg.seed_source == "pool":
                _fill_pool(b, rows)
            return rows
        exs = list(b.seed_buffer["batches"][j])
    else:
        j, exs = None, b.loader.next(cfg.prompts_per_step)
    fresh = None
    if cfg.seed_trigger == "all_wrong" or cfg.seed_source == "current":
        fresh = _by_prompt(b.fresh(exs, step, round_=0), G)
    sources = [_sources_of(b, step, k, ex, j, fresh) for k, ex in enumerate(exs)]
    chosen = [k for k in range(len(exs)) if sources[k]
              and (cfg.seed_trigger == "always" or _all_wrong(fresh[k]))]
    groups: dict[int, list] = {k: fresh[k] for k in range(len(exs))} if fresh else {}
    if fresh is None:   # `always` without fresh groups: the prompts with no source still need one
        rest = [k for k in range(len(exs)) if k not in set(chosen)]
        if rest:
            groups.update(zip(rest, _by_prompt(b.fresh([exs[k] for k in rest], step, round_=0), G)))
    if chosen:
        seeded = _continue(b, step, [exs[k] for k in chosen], [sources[k] for k in chosen])
        groups.update(zip(chosen, _by_prompt(seeded, G)))
    rows = []
    for k in range(len(exs)):
        for r in groups[k]:
            r.group = k
            rows.append(r)
    b._next_group = len(exs)
    b.restart_metrics["seeds/restarted_share"] = len(chosen) / max(len(exs), 1)
    if chosen:   # what the restarted groups scored: all-wrong prompts (trigger all_wrong) solved from a seed
        graded = [r for k in chosen for r in groups[k] if r.verdict not in UNGRADED_VERDICTS]
        b.restart_metrics["seeds/restart_value"] = sum(r.correct for r in graded) / max(len(graded), 1)
        if cfg.seed_trigger == "all_wrong":
            b.restart_metrics["seeds/restart_solved_share"] = \
                sum(any(r.correct for r in groups[k]) for k in chosen) / len(chosen)
    if fresh is not None:
        b.restart_metrics["seeds/fresh_all_wrong_share"] = sum(map(_all_wrong, fresh)) / max(len(fresh), 1)
    if cfg.seed_source == "pool":
        b.restart_metrics["seeds/pool_prompts"] = sum(1 for v in b.seed_pool.values() if v)
    return rows


def _by_prompt(rows: list, G: int) -> list[list]:
    """A call's rows in its prompts' groups of G (the order the builder returns them in)."""
    return [rows[i:i + G] for i in range(0, len(rows), G)]


def _all_wrong(group: list) -> bool:
    """The group was graded (at least one verdict) and none of its graded rows is correct."""
    graded = [r for r in group if r.verdict not in UNGRADED_VERDICTS]
    return bool(graded) and not any(r.correct for r in graded)


def _sources_of(b, step: int, k: int, ex: int, j: int | None, fresh: list[list] | None) -> list[SourceResponse]:
    """The G source responses prompt ``k`` (example ``ex``) of ``step`` would restart from (empty: none); log-probs
    and entropies None when not known yet, ``correct`` None when not graded yet."""
    cfg, G = b.cfg, b.cfg.samples_per_prompt
    src = cfg.seed_source
    if src in ("refresh", "mixture"):   # mixture: each cached response names its writer
        return b._cached(j, k)
    if src == "pool":
        pool = b.seed_pool.get(b.examples[ex]["id"], [])
        return [pool[g % len(pool)] for g in range(G)] if pool else []
    if src == "current":   # behavior log-probs: the sampler's (behavior_logprobs=sampler) or scored later
        from_sampler = cfg.behavior_logprobs == "sampler"
        return [{"response_ids": r.response_ids, "finish_reason": r.finish_reason,
                 "logp": torch.tensor(r.sampler_logp, dtype=torch.float32) if from_sampler and r.sampler_logp
                 else None, "entropy": None, "step": step,
                 "correct": None if r.verdict in UNGRADED_VERDICTS else r.correct} for r in fresh[k]]
    # external: the whole trace with its EOS (the cut, not the budget, decides how much of it is kept)
    ids = off_policy_ids(b.tokenizer, b.examples[ex], cfg.off_policy_key)
    trace = {"response_ids": ids, "finish_reason": "stop", "logp": None, "entropy": None, "step": None,
             "correct": None}
    return [trace] * G


def _continue(b, step: int, exs: list[int], sources: list[list[SourceResponse]]) -> list:
    """The seeded groups of prompts ``exs``: their sources completed (``_complete``), then cut by ``seed_rule`` and
    continued by the current policy on Thinking Seeds' path, a seed leaving at least one token of the budget (a
    reference trace may be longer than the budget). A row whose source has no behavior log-probs carries NaN on
    every token. The adaptive rule's statistics count each graded continuation under its arm."""
    cfg = b.cfg
    _complete(b, exs, sources)
    if cfg.seed_rule == "adaptive" and b.arm_stats is None:
        b.arm_stats = new_arm_stats(cfg.seed_adaptive_arms)
    rows, cut = b._cut_and_continue(step, exs, sources, min_budget=1)
    for r in rows:
        if r.behavior_logp is None:
            r.behavior_logp = [math.nan] * len(r.response_ids)
    if cut.arms is not None:
        update_arm_stats(b.arm_stats, cut.arms, [s["correct"] for srcs in sources for s in srcs],
                         [None if r.verdict in UNGRADED_VERDICTS else r.correct for r in rows],
                         discount=cfg.seed_adaptive_discount)
        ratios = adaptive_ratios(cfg.seed_adaptive_arms)
        b.restart_metrics["seeds/adaptive_ratio_mean"] = sum(ratios[a] for a in cut.arms) / len(cut.arms)
        for verdict, means in arm_means(b.arm_stats).items():
            if verdict != "ungraded":
                b.restart_metrics.update({f"seeds/adaptive_p_{verdict}@{r:g}": p for r, p in zip(ratios, means)})
    cuts = [r.seed_len / r.source_len for r in rows if r.source_len > 0]
    if cuts:
        b.restart_metrics["seeds/cut_ratio_mean"] = sum(cuts) / len(cuts)
    return rows


def _complete(b, exs: list[int], sources: list[list[SourceResponse]]) -> None:
    """Fill in what the sources lack and the step needs before the cut: the verdict (one grading batch, never
    generation; skipped with seed_grade_sources=false; the adaptive rule reads it), the behavior log-probs
    (seed_loss=state+action reads them on seed tokens) and the entropies (the entropy rule), both from one no-grad
    forward of the trained module. A source shared by several rows is done once."""
    cfg = b.cfg
    b._grade_sources(exs, sources)
    uniq: dict[int, tuple[int, SourceResponse]] = {}
    for ex, srcs in zip(exs, sources):
        for s in srcs:
            uniq.setdefault(id(s), (ex, s))
    need_logp = cfg.seed_loss == "state+action" and cfg.seed_source != "external"
    need_ent = cfg.seed_rule == "entropy"
    todo = [(ex, s) for ex, s in uniq.values()
            if (need_logp and s["logp"] is None) or (need_ent and s["entropy"] is None)]
    if todo:
        logp, ent = b._score([b.prompt_ids[ex] for ex, _ in todo], [s["response_ids"] for _, s in todo])
        for (_, s), lp, e in zip(todo, logp, ent):
            s["logp"] = lp if s["logp"] is None else s["logp"]
            s["entropy"] = e


def _fill_pool(b, batch0: list) -> None:
    """seed_source=pool at a refresh step: grade the cycle's cached responses (batch 0's are the step's rows,
    graded already) and add the correct ones to their prompt's pool, which keeps its newest seed_pool_size."""
    cfg, buf, G = b.cfg, b.seed_buffer, b.cfg.samples_per_prompt
    verdicts = [r.correct if r.verdict not in UNGRADED_VERDICTS else None for r in batch0]
    later = [(ex, c) for i in range(1, len(buf["batches"])) for k, ex in enumerate(buf["batches"][i])
             for c in buf["cache"][i][k * G:(k + 1) * G]]
    graded = b.reward([b._row(ex, -1, 0, c["response_ids"], c["finish_reason"]) for ex, c in later])
    verdicts += [r.correct if r.verdict not in UNGRADED_VERDICTS else None for r in graded]
    flat = [(ex, c) for k, ex in enumerate(buf["batches"][0]) for c in buf["cache"][0][k * G:(k + 1) * G]] + later
    for (ex, c), ok in zip(flat, verdicts):
        if ok:
            pid = b.examples[ex]["id"]
            entries = b.seed_pool.setdefault(pid, [])
            entries.append({**c, "step": buf["step"], "correct": True})
            del entries[: max(0, len(entries) - cfg.seed_pool_size)]
