"""Each step's rollout groups: on-policy, Thinking Seeds, LUFFY-mixed or stale (M2PO).

``RolloutBuilder.collect(step)`` returns the step's groups of ``Rollout`` rows, with rewards, before advantages.
Its state (the seed buffer of the current refresh cycle, the stale queue) is part of ``trainer_state/``, so a
run killed in the middle of a cycle resumes with the same seeds.

Thinking Seeds (docs/method.md): at step s with s mod T = 0 the current policy π_b samples G responses for every
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
import typing
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence, TypedDict

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from inference import make_sampler, resolve_engine
from inference.protocol import Completion, Sampler
from scoring.rewards import grade_task_batch, reward_of
from scoring.templates import render_prompt
from scoring.verdict import UNGRADED_VERDICTS
from trainer.algos import SEED_RULES, CachedResponse, Cut, CutBatch, SourceResponse
from trainer.checkpoint import CheckpointError
from trainer.config import Config
from trainer.data import PromptLoader, off_policy_ids
from trainer.fsdp import (Dist, all_gather_objects, all_gather_rows, compute_dtype, copy_full_weights, patient_group,
                          reshard, wait_for_generation)
from trainer.lora import has_adapters, is_adapter_name
from trainer.policy import engine_copy, score
from trainer.mixture import Snapshot, draw_members, load_snapshot, member_weights, read_relay_matrix, take_snapshot
from trainer.restarts import restart_step


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
MIXTURE_PICK = 6                     # seed_source=mixture: which past policy writes each prompt's seeds


def thinking_seeds(cfg) -> bool:
    """The paper's restart distribution: seeds from the refresh cycle, every prompt, a fixed rule (``_refresh`` /
    ``_seeded``); any other ``seed_source`` / ``seed_trigger`` / ``seed_rule`` goes through
    ``trainer.restarts.restart_step``."""
    return (cfg.seed_source in ("refresh", "mixture") and cfg.seed_trigger == "always"
            and cfg.seed_rule in ("ratio", "entropy"))


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
    (tests/trainer/test_collectives.py). Lossless: ids fit int32, and both engines compute log-probs and entropies in
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


class SeedBuffer(TypedDict):
    """The current refresh cycle (checkpointed with the builder): what pi_b wrote at its first step."""

    step: int                            # the refresh step
    batches: list[list[int]]             # the example indices of the cycle's T batches
    cache: list[list[CachedResponse]]    # batch b's responses, prompt-major: prompt k's G at [k * G:(k + 1) * G]
    # seed_source=mixture only: writers[b][k], the step of the policy that wrote prompt k of batch b (its seed_step)
    writers: typing.NotRequired[list[list[int]]]


class Mixture(TypedDict):
    """seed_source=mixture's members (``trainer.mixture``; checkpointed with the builder on one process)."""

    ring: list[Snapshot]                 # the newest seed_mixture_size refresh policies, newest first
    base: Snapshot | None                # the initial policy (seed_mixture_base), else None


@dataclass
class RolloutBuilder:
    cfg: Config
    examples: list[dict]
    prompt_ids: list[list[int]]      # tokenized, templated prompt of each example
    loader: PromptLoader
    sampler: Sampler
    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module           # the trained policy (for the behavior forward)
    d: Dist
    seed_buffer: SeedBuffer | None = None   # the current Thinking Seeds refresh cycle
    # seed_source=pool: prompt id -> its newest correct responses (trainer.restarts)
    seed_pool: dict[str, list[SourceResponse]] = field(default_factory=dict)
    # seed_rule=adaptive: discounted wins / losses per source verdict and arm (trainer.algos.restarts.new_arm_stats)
    arm_stats: dict[str, dict[str, list[float]]] | None = None
    restart_metrics: dict[str, float] = field(default_factory=dict)   # the step's seeds/* counts (trainer.restarts)
    stale_queue: list[list[Rollout]] = field(default_factory=list)   # M2PO: rollout batches waiting to be trained on
    mixture: Mixture | None = None   # seed_source=mixture: the past policies seeds are drawn from
    # gives the rollout engine the module's current weights (``sync_rollout_weights`` over the run's engine); the
    # mixture calls it after swapping a past policy in and after restoring. None: the engine is the module itself
    sync_engine: Callable[[], None] | None = None
    # dynamic sampling's running keep rate (trainer.sampling.update_keep_counts): decayed counts of informative
    # and sampled groups in the rounds it sized; None before its first round (the prior)
    keep_counts: tuple[float, float] | None = None
    generated_tokens: int = 0        # cumulative tokens sampled by the policy (all ranks)
    prefilled_tokens: int = 0        # cumulative context tokens (prompt, and seed) the sampler was given (all ranks)
    behavior_s: float = 0.0          # cumulative seconds in the no-grad behavior forward (logged, not resumed)
    behavior_noted: bool = False     # the first refresh said where pi_b's log-probs come from (``behavior``)
    _next_group: int = 0
    _opens_think: bool | None = None
    _matrix: object = None           # seed_mixture_weights=relay: the relay matrix (a DataFrame), read once

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
            return restart_step(self, step)
        if cfg.algorithm == "seeds":   # Thinking Seeds: a refresh every T steps, the steps between continue its seeds
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

    # --- Thinking Seeds (docs/method.md "The refresh cycle") ----------------------------------------------
    def _refresh(self, step: int) -> list[Rollout]:
        """Step s of a cycle (s mod T = 0): pi_b writes G responses for every prompt of the next T batches, kept with
        their behavior log-probs and entropies; batch s trains on its own as on-policy rows."""
        cfg = self.cfg
        T, B, G = cfg.seed_refresh_interval, cfg.prompts_per_step, cfg.samples_per_prompt
        batches = [self.loader.next(B) for _ in range(T)]
        flat = [ex for batch in batches for ex in batch]
        prompts = [self.prompt_ids[ex] for ex in flat for _ in range(G)]
        seeds = row_seeds(cfg.seed, step, 0, REFRESH, len(flat), G)
        if cfg.seed_source == "mixture":
            comps, logp, ent, writers = self._write_mixture(step, flat, prompts, seeds)
        else:
            comps = self.generate(prompts, [cfg.max_response_tokens] * len(prompts), logprobs=True, seeds=seeds)
            logp, ent = self.behavior(prompts, comps)
        responses = [c.token_ids for c in comps]
        per_batch = B * G
        self.seed_buffer = {
            "step": step,
            "batches": batches,
            "cache": [[{"response_ids": responses[b * per_batch + i], "finish_reason": comps[b * per_batch + i].finish_reason,
                        "logp": logp[b * per_batch + i], "entropy": ent[b * per_batch + i]}
                       for i in range(per_batch)] for b in range(T)],
        }
        if cfg.seed_source == "mixture":
            self.seed_buffer["writers"] = [writers[b * B:(b + 1) * B] for b in range(T)]
        rows = []
        for k, ex in enumerate(batches[0]):
            group = self._new_group()
            for g in range(G):
                c = self.seed_buffer["cache"][0][k * G + g]
                rows.append(self._row(ex, group, g, c["response_ids"], c["finish_reason"],
                                      sampler_logp=comps[k * G + g].logprobs))   # batch 0 leads the refresh
        return self.reward(rows)

    def _write_mixture(self, step: int, flat: list[int], prompts: list[list[int]], seeds: list[int]):
        """seed_source=mixture's refresh writing (``trainer.mixture``): snapshot the current policy into the ring,
        draw one member per prompt of batches 1..T-1 (batch 0 trains on-policy now: the current policy writes it),
        and let each drawn member generate its prompts' G responses and score them (behavior log-probs and
        entropies) with its weights swapped into the module and the engine; then the current weights come back bit
        for bit (copied from their snapshot) and the engine is synced again. Rows keep their seeds (``row_seeds``
        of the whole refresh), so a row's sample depends on its writer, not on the grouping. Returns the
        completions, log-probs and entropies in ``prompts``' order, and each prompt's writer step."""
        cfg, G, B = self.cfg, self.cfg.samples_per_prompt, self.cfg.prompts_per_step
        members = self._mixture_members(step)
        weights = member_weights([step - m["step"] for m in members], base=[m is self.mixture["base"] for m in members],
                                 mode=cfg.seed_mixture_weights, by_age=cfg.seed_mixture_age_weights,
                                 size=cfg.seed_mixture_size, matrix=self._relay_matrix(), floor=cfg.seed_mixture_floor)
        pick = np.zeros(len(flat), dtype=np.int64)
        pick[B:] = draw_members(weights, len(flat) - B, seed=mix_seed(cfg.seed, step, 0, MIXTURE_PICK))
        n = len(prompts)
        comps, logp, ent = [None] * n, [None] * n, [None] * n
        swapped = False
        try:
            for m in sorted(set(pick.tolist())):   # 0, the current policy, first: no swap
                rows = [k * G + g for k in np.flatnonzero(pick == m).tolist() for g in range(G)]
                if m:
                    load_snapshot(self.model, members[m])
                    swapped = True
                    self._sync_engine()
                sub = [prompts[i] for i in rows]
                c = self.generate(sub, [cfg.max_response_tokens] * len(sub), logprobs=True,
                                  seeds=[seeds[i] for i in rows])
                lp, en = self.behavior(sub, c)
                for i, ci, li, ei in zip(rows, c, lp, en):
                    comps[i], logp[i], ent[i] = ci, li, ei
        finally:
            if swapped:
                load_snapshot(self.model, members[0])   # the current weights, exactly
                self._sync_engine()
        self.restart_metrics["seeds/mixture_members"] = float(len(members))
        self.restart_metrics["seeds/mixture_past_share"] = float((pick[B:] > 0).mean()) if len(flat) > B else 0.0
        return comps, logp, ent, [members[m]["step"] for m in pick.tolist()]

    def _mixture_members(self, step: int) -> list[Snapshot]:
        """The current policy's snapshot pushed into the ring (the newest seed_mixture_size kept); the members,
        newest first, and the initial policy last when it is kept and not in the ring already."""
        cfg = self.cfg
        now = take_snapshot(self.model, step)
        if self.mixture is None:   # the run's first refresh: its policy is the initial one
            self.mixture = {"ring": [], "base": now if cfg.seed_mixture_base else None}
        ring = [now] + [s for s in self.mixture["ring"] if s["step"] != step][:cfg.seed_mixture_size - 1]
        self.mixture["ring"] = ring
        base = self.mixture["base"]
        return ring + ([base] if base is not None and all(s["step"] != base["step"] for s in ring) else [])

    def _relay_matrix(self):
        """seed_mixture_weights=relay's matrix (read once), else None."""
        if self.cfg.seed_mixture_weights != "relay":
            return None
        if self._matrix is None:
            self._matrix = read_relay_matrix(self.cfg.seed_mixture_matrix)
        return self._matrix

    def _sync_engine(self) -> None:
        """The engine samples from the module's weights now (``sync_engine``; default: re-point the engine at the
        module, which is all a one-process HF engine needs)."""
        if self.sync_engine is not None:
            self.sync_engine()
        else:
            sync_rollout_weights(self.sampler, self.model, self.model)

    def _seeded(self, step: int, j: int) -> list[Rollout]:
        """Step s + j of the cycle: every cached response of batch j, cut and continued by the current policy."""
        exs = self.seed_buffer["batches"][j]
        rows, _ = self._cut_and_continue(step, exs, [self._cached(j, k) for k in range(len(exs))])
        return rows

    def _cached(self, j: int, k: int) -> list[SourceResponse]:
        """The G responses pi_b wrote for prompt k of batch j, as seed sources (not graded yet)."""
        buf, G = self.seed_buffer, self.cfg.samples_per_prompt
        writer = buf["writers"][j][k] if "writers" in buf else buf["step"]   # mixture: the drawn past policy
        return [{**c, "step": writer, "correct": None} for c in buf["cache"][j][k * G:(k + 1) * G]]

    def _cut_and_continue(self, step: int, exs: list[int], sources: list[list[SourceResponse]], *,
                          min_budget: int = 0) -> tuple[list[Rollout], Cut]:
        """Prompt k's seeded group, row g from source ``sources[k][g]``: the source cut by ``seed_rule``
        (``trainer.algos.SEED_RULES``) and continued by the current policy from prompt + seed, leaving the
        continuation at least ``min_budget`` tokens; rows graded whole, with the sources not graded yet in the same
        batch (``source_correct``, the fresh value of ``contracts.seed_lift``). Returns the rows and the cut."""
        cfg, G = self.cfg, self.cfg.samples_per_prompt
        flat = [s for srcs in sources for s in srcs]
        cut = SEED_RULES[cfg.seed_rule](CutBatch.of(flat), **self._rule_kwargs(step))
        # min_budget=0 leaves the cut as it is: a cached response is never longer than the budget
        seed_lens = [min(m, cfg.max_response_tokens - min_budget) for m in cut.seed_lens]
        questions = [self.prompt_ids[ex] for ex in exs for _ in range(G)]
        comps = self.generate([q + s["response_ids"][:m] for q, s, m in zip(questions, flat, seed_lens)],
                              [cfg.max_response_tokens - m for m in seed_lens], prefix_lens=[len(q) for q in questions],
                              logprobs=True, seeds=row_seeds(cfg.seed, step, 0, SEEDED, len(exs), G))
        rows = []
        for k, ex in enumerate(exs):
            group = self._new_group()
            for g in range(G):
                i = k * G + g
                s, m, cont = flat[i], seed_lens[i], comps[i]
                ids, logp = s["response_ids"], s["logp"]
                # the seed tokens (t < seed_len) are what the loss treats apart (trainer.algos.loss_mask): their
                # pi_b (NaN after; None when the source has none) is state+action's ratio denominator
                rows.append(self._row(
                    ex, group, g, ids[:m] + cont.token_ids, cont.finish_reason, variant="seed", seed_len=m,
                    seed_step=s["step"], trunc_rule=cfg.seed_rule, trunc_token_id=ids[m] if m < len(ids) else None,
                    source_len=len(ids),
                    behavior_logp=None if logp is None else logp[:m].tolist() + [math.nan] * len(cont.token_ids),
                    sampler_logp=None if cont.logprobs is None else [math.nan] * m + list(cont.logprobs)))
        self._grade_sources(exs, sources, rows)
        for r, s in zip(rows, flat):
            r.source_correct = s["correct"]
        return rows, cut

    def _rule_kwargs(self, step: int) -> dict:
        """``SEED_RULES[seed_rule]``'s keyword arguments: its hyperparameters and, for a rule that draws, the draw's
        seed (from the run's seed and the step: every rank draws the same cuts)."""
        cfg = self.cfg
        return {"ratio": {"ratio": cfg.seed_ratio},
                "entropy": {"k": cfg.seed_topk, "seed": mix_seed(cfg.seed, step, 0, ENTROPY_PICK)},
                "adaptive": {"n_arms": cfg.seed_adaptive_arms, "stats": self.arm_stats,
                             "seed": mix_seed(cfg.seed, step, 0, ADAPTIVE_PICK)}}[cfg.seed_rule]

    def _grade_sources(self, exs: list[int], sources: list[list[SourceResponse]],
                       rows: Sequence[Rollout] = ()) -> None:
        """Grade ``rows`` and, in the same batch, the sources of prompts ``exs`` that have no verdict yet (each once;
        none with seed_grade_sources=false): a source's ``correct`` becomes the verdict on it whole (None: ungraded)."""
        todo = list({id(s): (ex, s) for ex, srcs in zip(exs, sources) for s in srcs
                     if self.cfg.seed_grade_sources and s["correct"] is None and "graded" not in s}.values())
        if not rows and not todo:
            return
        graded = self.reward([*rows, *(self._row(ex, -1, 0, s["response_ids"], s["finish_reason"]) for ex, s in todo)])
        for (_, s), r in zip(todo, graded[len(rows):]):
            s["correct"], s["graded"] = (None if r.verdict in UNGRADED_VERDICTS else r.correct), True

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
        # the mixture's snapshots are this rank's shards: rank 0 writes this state, so only a one-process run's
        # are whole (several ranks resume with the mixture afresh, said then)
        return {"seed_buffer": self.seed_buffer, "stale_queue": self.stale_queue,
                "generated_tokens": self.generated_tokens, "prefilled_tokens": self.prefilled_tokens,
                "seed_pool": self.seed_pool, "arm_stats": self.arm_stats, "keep_counts": self.keep_counts,
                "mixture": self.mixture if self.d.world_size == 1 else None}

    def load_state_dict(self, state: dict) -> None:
        self.seed_buffer = state["seed_buffer"]
        self.stale_queue = state["stale_queue"]
        self.generated_tokens = state["generated_tokens"]
        self.prefilled_tokens = state.get("prefilled_tokens", 0)   # states written before it was counted
        self.seed_pool = state.get("seed_pool", {})     # states written before restart distributions have neither
        self.arm_stats = state.get("arm_stats")
        self.keep_counts = state.get("keep_counts")   # states written before oversampling: the prior again
        self.mixture = state.get("mixture")   # states written before seed_source=mixture have none
        if self.cfg.seed_source == "mixture" and self.mixture is None and self.d.is_main:
            print("warning: seed_source=mixture: the checkpoint holds no snapshots of past policies (saved on "
                  f"several ranks, or before the run used the mixture): the mixture starts afresh from this step's "
                  f"policy{', which stands in for the initial one' if self.cfg.seed_mixture_base else ''}",
                  file=sys.stderr)


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
    (``trainer.fsdp.copy_full_weights``: one full tensor in flight, never a state dict; with LoRA the adapter's); vLLM gets the weights
    pushed, also one tensor at a time."""
    if engine_model is not model:   # a LoRA run's base was copied when the engine was made: the adapters alone
        copy_full_weights(engine_model, model, only=is_adapter_name if has_adapters(model) else None)
    sampler.update_weights(engine_model)
    reshard(model)   # vLLM's sync probe runs a no-grad forward of the sharded module: its root unit would stay
                     # gathered through generation (2.2 GB at 7B; docs/gpu_memory.md)
