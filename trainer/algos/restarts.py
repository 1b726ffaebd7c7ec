"""Restart distributions: where seeds come from, when a prompt is restarted, and how deep (the adaptive rule).

Thinking Seeds restarts every prompt of batches 2..T of a refresh cycle from the cycle checkpoint's own responses
(``seed_source=refresh``, ``seed_trigger=always``, a fixed ``seed_rule``). The paper names the choice of seed
distribution as its open question (§7: "adaptive selection of seed sources or truncation points, for example
using the current policy's success rate from a state, remains future work"); the neighbouring methods are other
points of the same design space, so they are configuration of the one machinery (``trainer.restarts``, which cuts
and continues on Thinking Seeds' own path, ``trainer.rollout.RolloutBuilder._cut_and_continue``):

* ``seed_source`` -- what a seed is cut from:
  ``refresh``  the responses the policy wrote at the start of the refresh cycle (Thinking Seeds);
  ``pool``     the prompt's pool of the policy's past *correct* responses, filled from the graded refresh caches
               (a prompt with an empty pool gets a fresh group). PrefixRL-like: prefixes of successful traces as
               restarts (arXiv 2601.18795), drawn from the policy's own past instead of a separate sampler;
  ``current``  this step's own fresh responses, cut and continued by the same policy: FR3E-like ("first return,
               then explore" from high-entropy positions, arXiv 2507.07017; with ``seed_rule=entropy``);
  ``external`` the example's reference trace (``off_policy_key``, LUFFY's data) as a prefix: Prefix-RFT-like
               (arXiv 2507.01679), hint scaffolding (arXiv 2509.06923). Such a trace has no behavior log-prob,
               so only ``seed_loss=state`` (the prefix is context, never trained) is defined;
  ``mixture``  as ``refresh``, each prompt's responses written by a policy drawn from the last K refresh
               checkpoints (``trainer.mixture``).
* ``seed_trigger`` -- which prompts are restarted: ``always`` every prompt (with a source); ``all_wrong`` only
  those whose fresh group of G was graded all wrong (the others train on their fresh group). The fresh group is
  then sampled first, so a triggered prompt costs a fresh group plus its continuations.
* ``seed_rule=adaptive`` -- the cut is chosen per row among ``seed_adaptive_arms`` ratios (1/(n+1) .. n/(n+1)) by
  the current policy's estimated success rate from such a state: a Beta(1 + wins, 1 + losses) posterior per
  (arm, whether the source response was correct), updated from every graded continuation, and Thompson sampling
  of the arm whose sampled success p maximises p (1 - p), the variance of a continuation's 0/1 reward and so the
  expected size of its group-normalised advantage (the "sweet spot" of arXiv 2509.06923). Shallow cuts of wrong
  responses and deep cuts of right ones, if that is where the continuations' outcomes are uncertain. The policy
  changes while the counts accumulate, so each update first multiplies every count by a discount γ
  (``seed_adaptive_discount``, 0.9 per restarted step: an outcome weighs half after 6.6 steps), discounted Thompson
  sampling for non-stationary bandits (Raj & Kalyani 2017, arXiv:1707.09727); γ = 1 never forgets.
"""

from __future__ import annotations

import typing
from typing import Literal

import numpy as np

SeedSource = Literal["refresh", "pool", "current", "external", "mixture"]   # the config's `seed_source`
SEED_SOURCES = typing.get_args(SeedSource)
SeedTrigger = Literal["always", "all_wrong"]   # the config's `seed_trigger`
SEED_TRIGGERS = typing.get_args(SeedTrigger)
CYCLE_SOURCES = ("refresh", "pool", "mixture")   # the sources written at refresh steps (seed_refresh_interval applies)

# the key of a source response's verdict in the adaptive statistics (None: ungraded)
_VERDICT = {True: "correct", False: "wrong", None: "ungraded"}


def adaptive_ratios(n_arms: int) -> list[float]:
    """The cut ratios the adaptive rule chooses among: i / (n + 1) for i = 1..n (3 arms: 0.25, 0.5, 0.75)."""
    if n_arms < 1:
        raise ValueError(f"the adaptive rule needs at least one arm, got {n_arms}")
    return [i / (n_arms + 1) for i in range(1, n_arms + 1)]


def new_arm_stats(n_arms: int) -> dict:
    """Wins and losses per source verdict and arm, all zero (the posterior is then Beta(1, 1): uniform)."""
    return {v: {"wins": [0] * n_arms, "losses": [0] * n_arms} for v in _VERDICT.values()}


def choose_arms(stats: dict, source_correct: list[bool | None], *, rng: np.random.Generator) -> list[int]:
    """One arm per row: Thompson sampling of p ~ Beta(1 + wins, 1 + losses) for every arm of the row's source
    verdict, then the arm whose sampled p has the largest p (1 - p) (ties: the lower arm). Deterministic given
    ``rng`` (numpy's Generator, seeded by the caller from the run's seed and the step)."""
    out = []
    for verdict in source_correct:
        s = stats[_VERDICT[verdict]]
        p = rng.beta(np.asarray(s["wins"], dtype=np.float64) + 1, np.asarray(s["losses"], dtype=np.float64) + 1)
        out.append(int(np.argmax(p * (1 - p))))
    return out


def update_arm_stats(stats: dict, arms: list[int], source_correct: list[bool | None],
                     correct: list[bool | None], *, discount: float = 1.0) -> None:
    """One step's update: every count (all verdicts and arms) times ``discount`` (γ in (0, 1]; 1 = never forget),
    then each graded continuation (``correct`` None: ungraded, left out) counted under its arm and source verdict:

        wins ← γ·wins + #correct,   losses ← γ·losses + #wrong       (the Beta(1 + wins, 1 + losses) prior stays)"""
    assert 0 < discount <= 1, f"discount={discount} must lie in (0, 1]"
    if discount < 1:
        for s in stats.values():
            for key in ("wins", "losses"):
                s[key] = [discount * x for x in s[key]]
    for arm, verdict, ok in zip(arms, source_correct, correct):
        if ok is not None:
            stats[_VERDICT[verdict]]["wins" if ok else "losses"][arm] += 1


def arm_means(stats: dict) -> dict[str, list[float]]:
    """The posterior mean success (1 + wins) / (2 + wins + losses) per source verdict and arm."""
    return {v: [(1 + w) / (2 + w + lo) for w, lo in zip(s["wins"], s["losses"])] for v, s in stats.items()}
