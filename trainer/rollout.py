"""Each step's rollout groups: on-policy, Thinking Seeds, LUFFY-mixed or stale (M2PO).

``RolloutBuilder.collect(step)`` returns the step's groups of ``Rollout`` rows, with rewards, before advantages.
Its state (the seed buffer of the current refresh cycle, the stale queue) is part of ``trainer_state/``, so a
run killed in the middle of a cycle resumes with the same seeds.

Thinking Seeds (DESIGN §2): at step s with s mod T = 0 the current policy π_b samples G responses for every
prompt of the next T batches; log-probs and entropies of π_b come from the trainer's own no-grad forward where
something reads them (``behavior_forward_reason``), else from the sampler. Batch s
trains on them as on-policy DAPO; batch s+j truncates each cached response independently (ratio or entropy rule)
and the policy of step s+j continues from prompt + seed. Batch s+j also grades its cached responses whole (no
generation): each seeded row carries the verdict of the response its seed was cut from (``source_correct``), the
fresh value its restart value is compared with (``contracts.seed_lift``, the ``seeds/lift_*`` metrics).

Sampling does not depend on the world size: each rank samples a contiguous block of a call's rows (a prompt's G
samples on one rank where the division allows, ``rank_rows``) and every row carries its own seed (``row_seeds``),
which the engine draws that row from alone, so N ranks sample exactly the rows one rank samples.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from inference import make_sampler, resolve_engine
from inference.protocol import Completion
from scoring.rewards import grade_task_batch, reward_of
from scoring.templates import render_prompt
from scoring.verdict import UNGRADED_VERDICTS
from trainer.algos import (CYCLE_SOURCES, adaptive_ratios, arm_means, choose_arms, entropy_seed_lengths,
                           new_arm_stats, ratio_seed_lengths, update_arm_stats)
from trainer.checkpoint import CheckpointError
from trainer.data import off_policy_ids
from trainer.fsdp import (Dist, all_gather_objects, all_gather_rows, compute_dtype, copy_full_weights, patient_group,
                          reshard, wait_for_generation)
from trainer.policy import engine_copy, score


@dataclass
class Rollout:
    example_idx: int
    prompt_id: str
    group: int                       # group index within the step (advantages are computed per group)
    sample_idx: int
    prompt_ids: list[int]
    response_ids: list[int]
    finish_reason: str               # stop | length
    variant: str = "on_policy"       # on_policy | seed | luffy_off | stale
    seed_len: int = 0
    seed_step: int | None = None
    trunc_rule: str | None = None
    trunc_token_id: int | None = None
    source_len: int | None = None    # seeds: length of the cached response the seed was cut from
    source_correct: bool | None = None   # seeds: the grader's verdict on that whole response (None: ungraded)
    behavior_logp: list[float] | None = None   # seeds: cached log π_b on seed tokens (NaN after); stale: all tokens
    # log π_sampler of the tokens the engine sampled for this step's update (NaN on seed tokens); None for rows
    # not sampled now (stale, off-policy): the rollout check compares it with the trainer's log-probs
    sampler_logp: list[float] | None = None
    reward: float = 0.0              # the trained reward: correctness (the grader's verdict) plus overlong shaping
    correct: bool = False            # the grader's verdict, unshaped (dynamic sampling and records read this)
    verdict: str = ""                # what the grader said (scoring.verdict); grader_error/timeout: not graded
    advantage: float = 0.0
    response_text: str = ""
    # the row's index among the step's rows (``trainer.sampling.collect_step``): the same on every rank, so per-row
    # records computed on one rank and gathered stay attached to their row (a memory address would not)
    uid: int = -1

    @property
    def off_policy(self) -> bool:
        return self.variant == "luffy_off"


def split_groups(rows: list[Rollout]) -> list[list[Rollout]]:
    """Rows by group, in the order the groups first appear."""
    groups: dict[int, list[Rollout]] = {}
    for r in rows:
        groups.setdefault(r.group, []).append(r)
    return list(groups.values())


def row_key(r: Rollout) -> int:
    """The key of a row's per-row records: its ``uid`` (the same on every rank, set by ``collect_step``); rows built
    by hand that never went through it (tests, library callers of ``backward_minibatch``) are keyed by their
    identity, valid within this process only."""
    return r.uid if r.uid >= 0 else id(r)


def mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (config seed, step, round, purpose, and a row's prompt position and sample)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


# what a generate call samples, one code each in its rows' seeds (a fresh group and a seeded continuation of the
# same step and round draw independently)
FRESH, REFRESH, SEEDED = 1, 2, 4
ENTROPY_PICK, ADAPTIVE_PICK = 3, 5   # the entropy rule's and the adaptive rule's draws (not sampling calls)


def thinking_seeds(cfg) -> bool:
    """The paper's restart distribution: seeds from the refresh cycle, every prompt, a fixed rule (``_refresh`` /
    ``_seeded``); any other ``seed_source`` / ``seed_trigger`` / ``seed_rule`` goes through ``_restart``."""
    return cfg.seed_source == "refresh" and cfg.seed_trigger == "always" and cfg.seed_rule in ("ratio", "entropy")


def fresh_first_round(cfg) -> bool:
    """Whether a step's first round (``RolloutBuilder.collect``) is fresh groups of prompts from the loader, which
    dynamic sampling may oversample; Thinking Seeds' and the restart distributions' first rounds come from their
    cycle or seeds, M2PO's from its stale queue."""
    return cfg.algorithm not in ("seeds", "m2po")


def behavior_forward_reason(cfg) -> str | None:
    """Why a refresh needs the behavior policy's log-probs or entropies of its cached responses (the trainer's
    no-grad forward over all T·B·G rows, ``RolloutBuilder.behavior``), or None when nothing reads them. The readers:
    the seed tokens' ratio pi_theta / pi_b (``seed_loss=state+action``, and ``seed_stale_loss=m2po``'s mask within
    it), the entropy rule's cut, and the records' ``logp_behavior`` when asked for (``record_behavior_logprobs``,
    for ``tsanalysis mismatch``). ``seed_loss=state`` masks the seed tokens out of the loss and its denominator, so
    neither their ratio nor a stale-loss option reaches the gradient; the ratio and adaptive rules cut by length."""
    if cfg.seed_loss == "state+action":
        return "seed_loss=state+action: the seed tokens' ratio is pi_theta / pi_b"
    if cfg.seed_rule == "entropy":
        return "seed_rule=entropy: the cut reads pi_b's entropies"
    if cfg.record_behavior_logprobs:
        return "record_behavior_logprobs=true: the records' logp_behavior"
    return None


def _all_wrong(group: list[Rollout]) -> bool:
    """The group was graded (at least one verdict) and none of its graded rows is correct."""
    graded = [r for r in group if r.verdict not in UNGRADED_VERDICTS]
    return bool(graded) and not any(r.correct for r in graded)


def row_seeds(seed: int, step: int, round_: int, purpose: int, n_prompts: int, per_prompt: int) -> list[int]:
    """One sampling seed per row of a call whose prompts each repeat ``per_prompt`` times (row k * per_prompt + g
    is sample g of prompt k): a function of the run's seed, the step, the sampling round, what is sampled, the
    prompt's position in the step's list and the sample index, so the same on every rank whoever samples the row."""
    return [mix_seed(seed, step, round_, purpose, k, g) for k in range(n_prompts) for g in range(per_prompt)]


def rank_rows(n_rows: int, rank: int, world_size: int) -> range:
    """The rows of a call's list that ``rank`` samples: a contiguous block, [rank * n // W, (rank + 1) * n // W).
    Rows come in groups of one prompt's samples, so when the number of groups divides by the world size (the
    first round of every step: the config requires prompts_per_step % W == 0) each block is whole groups and a
    prompt's samples share one engine, whose prefix cache then holds the prompt once. Otherwise (a dynamic
    sampling refill of any size) the blocks stay as even as rows allow and a group cut at a block boundary is
    sampled on two (or, with fewer rows than ranks per group, more) ranks."""
    return range(rank * n_rows // world_size, (rank + 1) * n_rows // world_size)


def gather_completions(comps: dict[int, Completion], d: Dist) -> dict[int, Completion]:
    """Every rank's ``{row: Completion}`` merged on every rank (all of them train on all rows). Token ids and
    log-probs / entropies go as int32 / float32 tensors (``all_gather_rows``), not as pickled Python lists: 512
    rows of 4k tokens with log-probs are 16.8 MB so, 27.6 MB pickled, which every rank received and unpickled
    (tests/test_collectives.py). Lossless: ids fit int32, and both engines compute log-probs and entropies in
    float32."""
    if not d.enabled:
        return comps
    reasons = {}
    for part in all_gather_objects({i: c.finish_reason for i, c in comps.items()}, d):
        reasons.update(part)
    ids = all_gather_rows({i: c.token_ids for i, c in comps.items()}, d, dtype=torch.int32)
    lps = all_gather_rows({i: c.logprobs for i, c in comps.items() if c.logprobs is not None}, d,
                          dtype=torch.float32)
    ents = all_gather_rows({i: c.entropies for i, c in comps.items() if c.entropies is not None}, d,
                           dtype=torch.float32)
    return {i: Completion(ids[i].tolist(), reason, lps[i].tolist() if i in lps else None,
                          ents[i].tolist() if i in ents else None) for i, reason in reasons.items()}


@dataclass
class RolloutBuilder:
    cfg: object
    examples: list[dict]
    prompt_ids: list[list[int]]      # tokenized, templated prompt of each example
    loader: object                   # trainer.data.PromptLoader
    sampler: object                  # inference.Sampler
    tokenizer: object
    model: torch.nn.Module           # the trained policy (for the behavior forward)
    d: Dist
    seed_buffer: dict | None = None  # the current Thinking Seeds refresh cycle
    seed_pool: dict = field(default_factory=dict)   # seed_source=pool: prompt id -> its newest correct responses
    arm_stats: dict | None = None    # seed_rule=adaptive: wins / losses per source verdict and arm
    restart_metrics: dict = field(default_factory=dict)   # the step's seeds/* restart counts (``_restart``)
    stale_queue: list = field(default_factory=list)   # M2PO: rollout batches waiting to be trained on
    # dynamic sampling's running keep rate (trainer.sampling.update_keep_counts): decayed counts of informative
    # and sampled groups in the rounds it sized; None before its first round (the prior)
    keep_counts: tuple[float, float] | None = None
    generated_tokens: int = 0        # cumulative tokens sampled by the policy (all ranks)
    prefilled_tokens: int = 0        # cumulative context tokens (prompt, and seed) the sampler was given (all ranks)
    behavior_s: float = 0.0          # cumulative seconds in the no-grad behavior forward (logged, not resumed)
    behavior_noted: bool = False     # the first refresh said where pi_b's log-probs come from (``behavior``)
    _next_group: int = 0
    _opens_think: bool | None = None

    @property
    def prompt_opens_think(self) -> bool:
        """The template ends the prompt in ``<think>`` (Qwen3-*-Thinking-2507's chat template): the klear code
        reward then counts the think block as opened (``scoring.klear.klear_format``)."""
        if self._opens_think is None:
            self._opens_think = render_prompt(self.cfg.template, "q", self.tokenizer).rstrip().endswith("<think>")
        return self._opens_think

    # ---------------------------------------------------------------------------------------------------
    def collect(self, step: int, *, fresh_prompts: int | None = None) -> list[Rollout]:
        """The step's first round of groups (dynamic sampling asks ``fresh`` for more). ``fresh_prompts``: how many
        prompts a first round of fresh groups (``fresh_first_round``) draws from the loader, dynamic sampling's
        oversampled count (default ``prompts_per_step``); a seeded, refresh or stale first round has its batch."""
        self._next_group = 0
        self.restart_metrics = {}
        cfg = self.cfg
        if cfg.algorithm == "seeds" and not thinking_seeds(cfg):
            return self._restart(step)
        if cfg.algorithm == "seeds":
            j = step % cfg.seed_refresh_interval
            if j == 0 or self.seed_buffer is None:
                return self._refresh(step)
            return self._seeded(step, j)
        if cfg.algorithm == "m2po":
            return self._stale(step)
        assert fresh_first_round(cfg)
        return self.fresh(self.loader.next(fresh_prompts or cfg.prompts_per_step), step, round_=0)

    def fresh(self, example_idxs: Sequence[int], step: int, round_: int, *, behavior: bool = False) -> list[Rollout]:
        """On-policy groups of G for the given prompts (LUFFY: G - n_off on-policy plus n_off off-policy).
        ``behavior``: keep the sampler's log-probs of each response as its ``behavior_logp``."""
        cfg = self.cfg
        n_off = cfg.luffy_off_policy_per_group if cfg.algorithm == "luffy" else 0
        g_on = cfg.samples_per_prompt - n_off
        prompts = [self.prompt_ids[i] for i in example_idxs for _ in range(g_on)]
        comps = self.generate(prompts, [cfg.max_response_tokens] * len(prompts), logprobs=True,
                              seeds=row_seeds(cfg.seed, step, round_, FRESH, len(example_idxs), g_on))
        rows = []
        for k, ex in enumerate(example_idxs):
            group = self._new_group()
            for g in range(g_on):
                c = comps[k * g_on + g]
                rows.append(self._row(ex, group, g, c.token_ids, c.finish_reason,
                                      behavior_logp=c.logprobs if behavior else None, sampler_logp=c.logprobs))
            for g in range(g_on, cfg.samples_per_prompt):
                ids, finish = self._off_policy_trace(ex)
                rows.append(self._row(ex, group, g, ids, finish, variant="luffy_off"))
        return self.reward(rows)

    # --- Thinking Seeds ------------------------------------------------------------------------------
    def _refresh(self, step: int) -> list[Rollout]:
        cfg = self.cfg
        T, B, G = cfg.seed_refresh_interval, cfg.prompts_per_step, cfg.samples_per_prompt
        batches = [self.loader.next(B) for _ in range(T)]
        flat = [ex for batch in batches for ex in batch]
        prompts = [self.prompt_ids[ex] for ex in flat for _ in range(G)]
        comps = self.generate(prompts, [cfg.max_response_tokens] * len(prompts), logprobs=True,
                              seeds=row_seeds(cfg.seed, step, 0, REFRESH, len(flat), G))
        responses = [c.token_ids for c in comps]
        logp, ent = self.behavior(prompts, comps)
        per_batch = B * G
        self.seed_buffer = {
            "step": step,
            "batches": batches,
            "cache": [[{"response_ids": responses[b * per_batch + i], "finish_reason": comps[b * per_batch + i].finish_reason,
                        "logp": logp[b * per_batch + i], "entropy": ent[b * per_batch + i]}
                       for i in range(per_batch)] for b in range(T)],
        }
        rows = []
        for k, ex in enumerate(batches[0]):
            group = self._new_group()
            for g in range(G):
                c = self.seed_buffer["cache"][0][k * G + g]
                rows.append(self._row(ex, group, g, c["response_ids"], c["finish_reason"],
                                      sampler_logp=comps[k * G + g].logprobs))   # batch 0 leads the refresh
        return self.reward(rows)

    def _seeded(self, step: int, j: int) -> list[Rollout]:
        cfg, buf = self.cfg, self.seed_buffer
        G = cfg.samples_per_prompt
        cache = buf["cache"][j]
        lengths = torch.tensor([len(c["response_ids"]) for c in cache], dtype=torch.long)
        ends_eos = torch.tensor([c["finish_reason"] == "stop" for c in cache], dtype=torch.bool)
        if cfg.seed_rule == "ratio":
            seed_lens = ratio_seed_lengths(lengths, cfg.seed_ratio, ends_with_eos=ends_eos)
        else:
            gen = torch.Generator().manual_seed(mix_seed(cfg.seed, step, 0, 3))
            ents = [c["entropy"][: len(c["response_ids"]) - int(e)] for c, e in zip(cache, ends_eos.tolist())]
            seed_lens = entropy_seed_lengths(ents, k=cfg.seed_topk, generator=gen)
        seed_lens = seed_lens.tolist()
        prompts, budgets, shared = [], [], []
        for k, ex in enumerate(buf["batches"][j]):
            for g in range(G):
                c, m = cache[k * G + g], seed_lens[k * G + g]
                prompts.append(self.prompt_ids[ex] + c["response_ids"][:m])
                budgets.append(cfg.max_response_tokens - m)
                shared.append(len(self.prompt_ids[ex]))
        comps = self.generate(prompts, budgets, prefix_lens=shared, logprobs=True,
                              seeds=row_seeds(cfg.seed, step, 0, SEEDED, len(buf["batches"][j]), G))
        rows = []
        for k, ex in enumerate(buf["batches"][j]):
            group = self._new_group()
            for g in range(G):
                i = k * G + g
                c, m, cont = cache[i], seed_lens[i], comps[i]
                seed = c["response_ids"][:m]
                # None: the refresh kept no log-probs (nothing reads them, and the sampler returned none)
                behavior = None if c["logp"] is None else c["logp"][:m].tolist() + [math.nan] * len(cont.token_ids)
                cut = c["response_ids"][m] if m < len(c["response_ids"]) else None
                rows.append(self._row(ex, group, g, seed + cont.token_ids, cont.finish_reason, variant="seed",
                                      seed_len=m, seed_step=buf["step"], trunc_rule=cfg.seed_rule,
                                      trunc_token_id=cut, behavior_logp=behavior, source_len=len(c["response_ids"]),
                                      sampler_logp=None if cont.logprobs is None else
                                      [math.nan] * m + list(cont.logprobs)))
        if not cfg.seed_grade_sources:
            return self.reward(rows)
        # the fresh value of each prompt (contracts.seed_lift): its G cached responses graded whole, in the same batch
        sources = [self._row(ex, -1, g, cache[k * G + g]["response_ids"], cache[k * G + g]["finish_reason"])
                   for k, ex in enumerate(buf["batches"][j]) for g in range(G)]
        self.reward(rows + sources)
        for r, src in zip(rows, sources):
            r.source_correct = None if src.verdict in UNGRADED_VERDICTS else src.correct
        return rows

    # --- other restart distributions (trainer.algos.restarts) ------------------------------------------
    def _restart(self, step: int) -> list[Rollout]:
        """A step of ``seed_source`` / ``seed_trigger`` / ``seed_rule`` other than the paper's. Cycle sources
        (refresh, pool) keep the refresh cycle: its first batch trains on the cycle's responses as on-policy rows
        (pool: every cached response is graded then and the correct ones join their prompt's pool), batches 2..T
        restart. Other sources take the step's prompts from the loader. With ``seed_trigger=all_wrong`` (and always
        with ``current``, whose sources are that group) every prompt first gets a fresh group; a prompt restarts
        when it has a source and (``always``) or its fresh group is all wrong (``all_wrong``); its group is then G
        continuations, row g from its source g (cycled when a prompt has fewer than G)."""
        cfg = self.cfg
        if cfg.seed_source in CYCLE_SOURCES:
            j = step % cfg.seed_refresh_interval
            if j == 0 or self.seed_buffer is None:
                rows = self._refresh(step)
                if cfg.seed_source == "pool":
                    self._fill_pool(rows)
                return rows
            exs = list(self.seed_buffer["batches"][j])
        else:
            j, exs = None, self.loader.next(cfg.prompts_per_step)
        fresh = None
        if cfg.seed_trigger == "all_wrong" or cfg.seed_source == "current":
            fresh = split_groups(self.fresh(exs, step, round_=0))
        sources = [self._sources_of(k, ex, j, fresh) for k, ex in enumerate(exs)]
        chosen = [k for k in range(len(exs)) if sources[k]
                  and (cfg.seed_trigger == "always" or _all_wrong(fresh[k]))]
        groups: dict[int, list[Rollout]] = {k: fresh[k] for k in range(len(exs))} if fresh else {}
        if fresh is None:   # `always` without fresh groups: the prompts with no source still need one
            rest = [k for k in range(len(exs)) if k not in set(chosen)]
            if rest:
                groups.update(zip(rest, split_groups(self.fresh([exs[k] for k in rest], step, round_=0))))
        if chosen:
            seeded = self._continue(step, [exs[k] for k in chosen], [sources[k] for k in chosen])
            groups.update(zip(chosen, split_groups(seeded)))
        rows = []
        for k in range(len(exs)):
            for r in groups[k]:
                r.group = k
                rows.append(r)
        self._next_group = len(exs)
        self.restart_metrics["seeds/restarted_share"] = len(chosen) / max(len(exs), 1)
        if chosen:   # what the restarted groups scored: all-wrong prompts (trigger all_wrong) solved from a seed
            graded = [r for k in chosen for r in groups[k] if r.verdict not in UNGRADED_VERDICTS]
            self.restart_metrics["seeds/restart_value"] = sum(r.correct for r in graded) / max(len(graded), 1)
            if cfg.seed_trigger == "all_wrong":
                self.restart_metrics["seeds/restart_solved_share"] = \
                    sum(any(r.correct for r in groups[k]) for k in chosen) / len(chosen)
        if fresh is not None:
            self.restart_metrics["seeds/fresh_all_wrong_share"] = sum(map(_all_wrong, fresh)) / max(len(fresh), 1)
        if cfg.seed_source == "pool":
            self.restart_metrics["seeds/pool_prompts"] = sum(1 for v in self.seed_pool.values() if v)
        return rows

    def _sources_of(self, k: int, ex: int, j: int | None, fresh: list[list[Rollout]] | None) -> list[dict]:
        """The G source responses prompt ``k`` (example ``ex``) would restart from (empty: none), each a dict of
        response_ids, finish_reason, logp and entropy (tensors, None when not known yet), step (who wrote it,
        None for a reference trace) and correct (None: not graded yet)."""
        cfg, G = self.cfg, self.cfg.samples_per_prompt
        src = cfg.seed_source
        if src == "refresh":
            buf = self.seed_buffer
            return [{**c, "step": buf["step"], "correct": None} for c in buf["cache"][j][k * G:(k + 1) * G]]
        if src == "pool":
            pool = self.seed_pool.get(self.examples[ex]["id"], [])
            return [pool[g % len(pool)] for g in range(G)] if pool else []
        if src == "current":   # behavior log-probs: the sampler's (behavior_logprobs=sampler) or scored later
            from_sampler = cfg.behavior_logprobs == "sampler"
            return [{"response_ids": r.response_ids, "finish_reason": r.finish_reason,
                     "logp": torch.tensor(r.sampler_logp, dtype=torch.float32) if from_sampler and r.sampler_logp
                     else None, "entropy": None, "step": None, "correct": None if r.verdict in UNGRADED_VERDICTS else r.correct,
                     "sampled_now": True} for r in fresh[k]]
        # external: the whole trace with its EOS (the cut, not the budget, decides how much of it is kept)
        ids = off_policy_ids(self.tokenizer, self.examples[ex], cfg.off_policy_key)
        trace = {"response_ids": ids, "finish_reason": "stop", "logp": None, "entropy": None, "step": None,
                 "correct": None}
        return [trace] * G

    def _continue(self, step: int, exs: list[int], sources: list[list[dict]]) -> list[Rollout]:
        """The seeded groups of prompts ``exs``: each source graded (when not yet), cut by ``seed_rule``, and
        continued by the current policy; rows as ``_seeded``'s (variant seed, source_len, source_correct)."""
        cfg, G = self.cfg, self.cfg.samples_per_prompt
        flat = [s for srcs in sources for s in srcs]
        self._complete(exs, sources)
        ends_eos = torch.tensor([s["finish_reason"] == "stop" for s in flat], dtype=torch.bool)
        lengths = torch.tensor([len(s["response_ids"]) for s in flat], dtype=torch.long)
        arms = None
        if cfg.seed_rule == "ratio":
            seed_lens = ratio_seed_lengths(lengths, cfg.seed_ratio, ends_with_eos=ends_eos).tolist()
        elif cfg.seed_rule == "entropy":
            gen = torch.Generator().manual_seed(mix_seed(cfg.seed, step, 0, ENTROPY_PICK))
            ents = [s["entropy"][: len(s["response_ids"]) - int(e)] for s, e in zip(flat, ends_eos.tolist())]
            seed_lens = entropy_seed_lengths(ents, k=cfg.seed_topk, generator=gen).tolist()
        else:   # adaptive: one arm (cut ratio) per row by Thompson sampling of the success rate
            if self.arm_stats is None:
                self.arm_stats = new_arm_stats(cfg.seed_adaptive_arms)
            ratios = adaptive_ratios(cfg.seed_adaptive_arms)
            arms = choose_arms(self.arm_stats, [s["correct"] for s in flat],
                               rng=np.random.default_rng(mix_seed(cfg.seed, step, 0, ADAPTIVE_PICK)))
            seed_lens = [int(ratio_seed_lengths(lengths[i:i + 1], ratios[a], ends_with_eos=ends_eos[i:i + 1]))
                         for i, a in enumerate(arms)]
        # a seed leaves the continuation at least one token of the budget (a reference trace may be longer)
        seed_lens = [min(m, cfg.max_response_tokens - 1) for m in seed_lens]
        prompts, budgets, shared = [], [], []
        for i, s in enumerate(flat):
            ex = exs[i // G]
            prompts.append(self.prompt_ids[ex] + s["response_ids"][: seed_lens[i]])
            budgets.append(cfg.max_response_tokens - seed_lens[i])
            shared.append(len(self.prompt_ids[ex]))
        comps = self.generate(prompts, budgets, prefix_lens=shared, logprobs=True,
                              seeds=row_seeds(cfg.seed, step, 0, SEEDED, len(exs), G))
        rows = []
        for k, ex in enumerate(exs):
            group = self._new_group()
            for g in range(G):
                i = k * G + g
                s, m, cont = flat[i], seed_lens[i], comps[i]
                logp = s["logp"]
                behavior = (logp[:m].tolist() if logp is not None else [math.nan] * m) + [math.nan] * len(cont.token_ids)
                cut = s["response_ids"][m] if m < len(s["response_ids"]) else None
                rows.append(self._row(ex, group, g, s["response_ids"][:m] + cont.token_ids, cont.finish_reason,
                                      variant="seed", seed_len=m, seed_step=step if s.get("sampled_now") else s["step"],
                                      trunc_rule=cfg.seed_rule, trunc_token_id=cut, behavior_logp=behavior,
                                      source_len=len(s["response_ids"]), source_correct=s["correct"],
                                      sampler_logp=[math.nan] * m + list(cont.logprobs)))
        self.reward(rows)
        if arms is not None:
            update_arm_stats(self.arm_stats, arms, [s["correct"] for s in flat],
                             [None if r.verdict in UNGRADED_VERDICTS else r.correct for r in rows])
            ratios = adaptive_ratios(cfg.seed_adaptive_arms)
            self.restart_metrics["seeds/adaptive_ratio_mean"] = sum(ratios[a] for a in arms) / len(arms)
            for verdict, means in arm_means(self.arm_stats).items():
                if verdict != "ungraded":
                    self.restart_metrics.update({f"seeds/adaptive_p_{verdict}@{r:g}": p for r, p in zip(ratios, means)})
        cuts = [m / n for m, n in zip(seed_lens, lengths.tolist()) if n > 0]
        if cuts:
            self.restart_metrics["seeds/cut_ratio_mean"] = sum(cuts) / len(cuts)
        return rows

    def _complete(self, exs: list[int], sources: list[list[dict]]) -> None:
        """Fill in what the sources lack and the step needs: the verdict (one grading batch, never generation; skipped
        with seed_grade_sources=false), the behavior log-probs (seed_loss=state+action reads them on seed tokens) and
        the entropies (the entropy rule), both from one no-grad forward of the trained module. A source shared by
        several rows is done once."""
        cfg = self.cfg
        uniq: dict[int, tuple[int, dict]] = {}
        for ex, srcs in zip(exs, sources):
            for s in srcs:
                uniq.setdefault(id(s), (ex, s))
        todo = [(ex, s) for ex, s in uniq.values() if s["correct"] is None and "graded" not in s]
        if todo and cfg.seed_grade_sources:
            graded = self.reward([self._row(ex, -1, 0, s["response_ids"], s["finish_reason"]) for ex, s in todo])
            for (_, s), r in zip(todo, graded):
                s["correct"] = None if r.verdict in UNGRADED_VERDICTS else r.correct
                s["graded"] = True
        need_logp = cfg.seed_loss == "state+action" and cfg.seed_source != "external"
        need_ent = cfg.seed_rule == "entropy"
        todo = [(ex, s) for ex, s in uniq.values()
                if (need_logp and s["logp"] is None) or (need_ent and s["entropy"] is None)]
        if todo:
            logp, ent = self._score([self.prompt_ids[ex] for ex, _ in todo], [s["response_ids"] for _, s in todo])
            for (_, s), lp, e in zip(todo, logp, ent):
                s["logp"] = lp if s["logp"] is None else s["logp"]
                s["entropy"] = e

    def _fill_pool(self, batch0: list[Rollout]) -> None:
        """seed_source=pool at a refresh step: grade the cycle's cached responses (batch 0's are the step's rows,
        graded already) and add the correct ones to their prompt's pool, which keeps its newest seed_pool_size."""
        cfg, buf, G = self.cfg, self.seed_buffer, self.cfg.samples_per_prompt
        verdicts = [r.correct if r.verdict not in UNGRADED_VERDICTS else None for r in batch0]
        later = [(ex, c) for b in range(1, len(buf["batches"])) for k, ex in enumerate(buf["batches"][b])
                 for c in buf["cache"][b][k * G:(k + 1) * G]]
        graded = self.reward([self._row(ex, -1, 0, c["response_ids"], c["finish_reason"]) for ex, c in later])
        verdicts += [r.correct if r.verdict not in UNGRADED_VERDICTS else None for r in graded]
        flat = [(ex, c) for k, ex in enumerate(buf["batches"][0]) for c in buf["cache"][0][k * G:(k + 1) * G]] + later
        for (ex, c), ok in zip(flat, verdicts):
            if ok:
                pid = self.examples[ex]["id"]
                entries = self.seed_pool.setdefault(pid, [])
                entries.append({**c, "step": buf["step"], "correct": True})
                del entries[: max(0, len(entries) - cfg.seed_pool_size)]

    # --- M2PO stale batches ----------------------------------------------------------------------------
    def _stale(self, step: int) -> list[Rollout]:
        """Train on the batch written ``m2po_staleness`` steps ago (the first steps fill the queue)."""
        cfg = self.cfg
        n_new = cfg.m2po_staleness + 1 if not self.stale_queue else 1
        for _ in range(n_new):
            from_sampler = cfg.behavior_logprobs == "sampler"
            rows = self.fresh(self.loader.next(cfg.prompts_per_step), step, round_=100 + len(self.stale_queue),
                              behavior=from_sampler)
            if not from_sampler:
                logp, _ = self._score([r.prompt_ids for r in rows], [r.response_ids for r in rows])
                for r, lp in zip(rows, logp):
                    r.behavior_logp = lp.tolist()
            for r in rows:
                r.variant, r.seed_step, r.sampler_logp = "stale", step, None   # trained m2po_staleness steps on
            self.stale_queue.append(rows)
        rows = self.stale_queue.pop(0)
        self._next_group = max(r.group for r in rows) + 1  # dynamic-sampling groups get fresh ids
        return rows

    # --- shared pieces --------------------------------------------------------------------------------
    def behavior(self, prompts, comps) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """Behavior log-probs and entropies of the refresh's completions ``comps``: one no-grad forward of the
        trained module when something reads them (``behavior_forward_reason``) and ``behavior_logprobs=trainer``
        (or the sampler returned none); otherwise the sampler's own, None for a row it returned none for (vLLM: no
        entropies). The 16k code preset (seed_loss=state, ratio rule) so skips ~22 M tokens of forward per refresh,
        run with the engine awake. Says once which it is; ``seeds/behavior_forward`` is 1 on a refresh that ran it."""
        cfg = self.cfg
        why = behavior_forward_reason(cfg)
        sampled = all(c.logprobs is not None for c in comps)
        run = why is not None and (cfg.behavior_logprobs == "trainer" or not sampled)
        self.restart_metrics["seeds/behavior_forward"] = float(run)
        if not self.behavior_noted and self.d.is_main:
            how = (f"the trainer's no-grad forward ({why})" if run else
                   "the sampler (behavior_logprobs=sampler)" if why else
                   "the sampler, no forward: nothing reads them (seed_loss=state, a length cut)")
            print(f"refresh: pi_b's log-probs from {how}", file=sys.stderr)
            self.behavior_noted = True
        if run:
            return self._score(prompts, [c.token_ids for c in comps])
        if cfg.behavior_logprobs == "sampler" and sampled:
            # vLLM returns no entropy: NaN (config refuses the entropy rule there, the only reader of them)
            return ([torch.tensor(c.logprobs, dtype=torch.float32) for c in comps],
                    [torch.tensor(c.entropies if c.entropies is not None else [math.nan] * len(c.logprobs),
                                  dtype=torch.float32) for c in comps])
        as_tensor = lambda v: None if v is None else torch.tensor(v, dtype=torch.float32)  # noqa: E731
        return [as_tensor(c.logprobs) for c in comps], [as_tensor(c.entropies) for c in comps]

    def _score(self, prompts, responses) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """One no-grad forward of the trained module, batched and laid out as the update's forward."""
        cfg, t0 = self.cfg, time.perf_counter()
        out = score(self.model, prompts, responses, pad_id=self.tokenizer.pad_token_id,
                    micro_batch_size=cfg.micro_batch_size, d=self.d, temperature=cfg.temperature,
                    micro_batch_tokens=cfg.micro_batch_tokens, forward=cfg.train_forward)
        self.behavior_s += time.perf_counter() - t0   # score returns CPU tensors: the forward has finished
        reshard(self.model)   # FSDP2 keeps the root unit gathered after a forward with no backward: free it, the
        return out            # engine decodes on (2.2 GB at 7B; docs/gpu_memory.md)

    def generate(self, prompts: list[list[int]], budgets: list[int], *, seeds: list[int], logprobs: bool = False,
                 prefix_lens: list[int] | None = None):
        """Generate on every rank for its block of the rows (``rank_rows``: a prompt's samples together), then
        gather (order preserved). ``seeds``: one per row (``row_seeds``), handed to the engine with the row, so a
        row's sample does not depend on which rank draws it: any world size samples the rows one rank samples.
        ``prefix_lens``: the question's length in each prompt (a seeded row continues question + seed)."""
        d = self.d
        todo = [i for i in rank_rows(len(prompts), d.rank, d.world_size) if budgets[i] > 0]
        out = {}
        if todo:
            kw = {"logprobs": True} if logprobs else {}
            if prefix_lens is not None:
                kw["prefix_lens"] = [prefix_lens[i] for i in todo]
            comps = self.sampler.generate([prompts[i] for i in todo], max_new_tokens=[budgets[i] for i in todo],
                                          temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                          seeds=[seeds[i] for i in todo], **kw)
            out.update(zip(todo, comps))
        wait_for_generation(d)   # the slowest rank's tail, on the patient group: not in the gather's collectives
        merged = gather_completions(out, d)
        empty = [] if logprobs else None
        comps = [merged.get(i) or Completion([], "length", empty, empty) for i in range(len(prompts))]
        self.generated_tokens += sum(len(c.token_ids) for c in comps)
        self.prefilled_tokens += sum(len(p) for p, b in zip(prompts, budgets) if b > 0)
        return comps

    def reward(self, rows: list[Rollout]) -> list[Rollout]:
        """Decode and grade rows (sharded across ranks, then gathered) with the task's grader or ``reward_fn``: the
        verdict, and the reward 1/0 from it plus DAPO's overlong shaping when enabled. An ungraded row (grader_error,
        grader timeout) gets reward 0 here and is the step's to count and leave out
        (``trainer.sampling.filter_ungraded``)."""
        cfg, d = self.cfg, self.d
        for r in rows:
            r.response_text = self.tokenizer.decode(r.response_ids, skip_special_tokens=True)
        mine = list(range(d.rank, len(rows), d.world_size))
        verdicts = grade_task_batch(cfg.task, [rows[i].response_text for i in mine],
                                    [self.examples[rows[i].example_idx] for i in mine], reward_fn=cfg.reward_fn,
                                    code_reward=cfg.code_reward,
                                    prompt_opens_think=cfg.code_reward == "klear" and self.prompt_opens_think)
        merged = {}
        for part in all_gather_objects(dict(zip(mine, verdicts)), d):
            merged.update(part)
        for i, r in enumerate(rows):
            v = merged[i]
            r.correct, r.verdict = bool(v.correct), str(v.verdict)
            r.reward = reward_of(v) + self._overlong_penalty(len(r.response_ids))
        return rows

    def _overlong_penalty(self, length: int) -> float:
        cfg = self.cfg
        if cfg.overlong_buffer_tokens <= 0:
            return 0.0
        start = cfg.max_response_tokens - cfg.overlong_buffer_tokens
        return -cfg.overlong_penalty * min(1.0, max(0, length - start) / cfg.overlong_buffer_tokens)

    def _off_policy_trace(self, ex: int) -> tuple[list[int], str]:
        """LUFFY's trace of example ``ex`` with EOS; longer than the budget only with ``luffy_long_traces=truncate``
        (``drop`` left those prompts out at load time, ``trainer.data.tokenize_prompts``)."""
        ids = off_policy_ids(self.tokenizer, self.examples[ex], self.cfg.off_policy_key)
        if len(ids) > self.cfg.max_response_tokens:
            return ids[: self.cfg.max_response_tokens], "length"
        return ids, "stop"

    def _row(self, ex: int, group: int, sample_idx: int, ids, finish, **kw) -> Rollout:
        return Rollout(example_idx=ex, prompt_id=self.examples[ex]["id"], group=group, sample_idx=sample_idx,
                       prompt_ids=self.prompt_ids[ex], response_ids=list(ids), finish_reason=finish, **kw)

    def _new_group(self) -> int:
        self._next_group += 1
        return self._next_group - 1

    # --- checkpointed state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"seed_buffer": self.seed_buffer, "stale_queue": self.stale_queue,
                "generated_tokens": self.generated_tokens, "prefilled_tokens": self.prefilled_tokens,
                "seed_pool": self.seed_pool, "arm_stats": self.arm_stats, "keep_counts": self.keep_counts}

    def load_state_dict(self, state: dict) -> None:
        self.seed_buffer = state["seed_buffer"]
        self.stale_queue = state["stale_queue"]
        self.generated_tokens = state["generated_tokens"]
        self.prefilled_tokens = state.get("prefilled_tokens", 0)   # states written before it was counted
        self.seed_pool = state.get("seed_pool", {})     # states written before restart distributions have neither
        self.arm_stats = state.get("arm_stats")
        self.keep_counts = state.get("keep_counts")   # states written before oversampling: the prior again


# ----------------------------------------------------------------------------------------------------------
# the rollout engine over the trained model
# ----------------------------------------------------------------------------------------------------------
def make_rollout_engine(cfg, model, tokenizer, d: Dist, *, sampler_builder=None):
    """The sampler over the trained model (already sharded and loaded) and the module it samples from. One
    process: the HF engine shares the trained module. Several ranks: the HF engine samples from an unsharded copy
    in the compute dtype (``trainer.policy.engine_copy``: built on the meta device, no fp32 copy) that
    ``sync_rollout_weights`` fills, here and every step; vLLM loads the checkpoint directory itself and is pushed
    the sharded model's weights. ``sampler_builder``: replaces ``inference.make_sampler`` (same signature).
    Collective on several ranks; the group the ranks wait on after each generation (``trainer.fsdp.patient_group``)
    is made here, before the engine starts."""
    build = sampler_builder or make_sampler
    if d.enabled:
        patient_group(d)
    engine = resolve_engine(cfg.engine, model=model)
    engine_model = model
    if d.enabled and engine == "hf":
        engine_model = engine_copy(model, compute_dtype(model), d.device)
        copy_full_weights(engine_model, model)
    kw = {"ignore_eos": True} if cfg.ignore_eos else {}
    kw["max_batch_size"] = cfg.rollout_batch_size
    if engine == "vllm":
        if d.enabled and not os.path.isdir(str(getattr(model, "name_or_path", "") or "")):
            # each rank's engine loads a model folder and is then pushed the shards; a sharded module cannot be
            # saved as one (a fresh tiny: model without sft_steps has no folder)
            raise CheckpointError(f"model={cfg.model}: engine=vllm on {d.world_size} ranks needs a model "
                                  f"folder or hub id for the engines to load (or tiny: with sft_steps > 0)")
        kw["gpu_memory_utilization"] = cfg.vllm_gpu_memory_utilization
        kw["max_model_len"] = cfg.vllm_max_model_len or cfg.max_prompt_tokens + cfg.max_response_tokens
        kw["enable_sleep_mode"] = {"auto": None, "on": True, "off": False}[cfg.vllm_sleep_mode]
        kw["seed"] = cfg.seed
    return build(engine_model, tokenizer, engine=engine, **kw), engine_model


def sync_rollout_weights(sampler, engine_model, model) -> None:
    """Give the rollout engine the current weights: HF on one process shares the module (nothing to copy);
    HF on several ranks overwrites its compute-dtype copy one gathered tensor at a time
    (``trainer.fsdp.copy_full_weights``: one full tensor in flight, never a state dict); vLLM gets the weights
    pushed, also one tensor at a time."""
    if engine_model is not model:
        copy_full_weights(engine_model, model)
    sampler.update_weights(engine_model)
    reshard(model)   # vLLM's sync probe runs a no-grad forward of the sharded module: its root unit would stay
                     # gathered through generation (2.2 GB at 7B; docs/gpu_memory.md)
