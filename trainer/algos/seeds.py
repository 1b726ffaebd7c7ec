"""Thinking Seeds: truncation rules, cost factor and the two loss variants (docs/method.md "Thinking Seeds").

A cached behavior response õ_i (written by π_b at the start of a refresh cycle of T steps) is cut to a
seed h_i = õ_i[:m_i]; the current policy continues it, o_i = h_i ⊕ y_i. This module decides m_i
(``SEED_RULES[seed_rule](CutBatch.of(sources), **kwargs)``: the length-ratio or entropy rule, or the restart
distributions' adaptive rule) and builds the masks / denominators of paper Eq. 5:

* "state+action": seed tokens (positions t < m_i, 0-based) enter the DAPO loss with r = π_θ / π_b
  (cached behavior log-probs), continuation tokens with r = π_θ / π_old; token-mean over all tokens.
* "state": seed tokens are masked out of the policy loss; token-mean over continuation tokens only.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal, NamedTuple, NotRequired, TypedDict

import numpy as np
import torch
from torch import Tensor

from trainer.algos.restarts import adaptive_ratios, choose_arms

SeedLoss = Literal["state+action", "state"]   # the config's `seed_loss`
SEED_LOSS_VARIANTS = typing.get_args(SeedLoss)
SeedRule = Literal["ratio", "entropy", "adaptive"]   # the config's `seed_rule`: the keys of SEED_RULES


class CachedResponse(TypedDict):
    """A response π_b wrote at a refresh step, kept for the batches of its cycle (the trainer's seed buffer)."""

    response_ids: list[int]
    finish_reason: str   # stop (ends with EOS) | length
    logp: Tensor | None      # [L] log π_b of its tokens (None: nothing reads them and the sampler gave none)
    entropy: Tensor | None   # [L] π_b's entropies (NaN or None where the engine gives none)


class SourceResponse(CachedResponse):
    """A response a seed is cut from: a cached one, a correct one from the pool, this step's own, a reference trace."""

    step: int | None         # the step whose policy wrote it (None: a reference trace)
    correct: bool | None     # the grader's verdict on the whole response (None: not graded, or ungraded)
    graded: NotRequired[bool]   # graded already (its verdict may be None): not graded again


@dataclass(frozen=True)
class CutBatch:
    """What a truncation rule reads of the N responses it cuts, one seed each."""

    lengths: Tensor  # [N] long, |õ_i| (EOS included when present)
    ends_with_eos: Tensor  # [N] bool
    entropies: list[Tensor | None]  # N × [L_i] π_b's entropies (the entropy rule reads them)
    correct: list[bool | None]  # the verdict on each whole response (the adaptive rule reads them)

    @classmethod
    def of(cls, sources: Sequence[SourceResponse]) -> CutBatch:
        return cls(lengths=torch.tensor([len(s["response_ids"]) for s in sources], dtype=torch.long),
                   ends_with_eos=torch.tensor([s["finish_reason"] == "stop" for s in sources], dtype=torch.bool),
                   entropies=[s["entropy"] for s in sources], correct=[s["correct"] for s in sources])


class Cut(NamedTuple):
    """A rule's cut of N responses."""

    seed_lens: list[int]  # m_i, one per response
    arms: list[int] | None = None  # the adaptive rule: each row's arm, whose statistics its outcome updates


# Ratios are turned into fractions with at most this denominator, so 0.3 is exactly 3/10 and
# round-half-up is decided in integer arithmetic (7 · 0.3 + 0.5 = 2.6 and 5 · 0.5 + 0.5 = 3 exactly).
_MAX_RATIO_DENOMINATOR = 1_000_000


def ratio_seed_lengths(
    lengths: Tensor,  # [N] long, response lengths |õ_i| (EOS included when present)
    ratio: float,
    *,
    ends_with_eos: Tensor | None = None,  # [N] bool, default all False
) -> Tensor:  # [N] long, seed lengths m_i
    """Length-ratio rule (docs/method.md): m_i = round(|õ_i| · ratio), rounding half up (⌊L·ratio + ½⌋).

    The seed never contains the response's EOS: when õ_i ends with EOS, m_i ≤ L_i − 1. LUFFY's floor is a
    known deviation we do not copy. The arithmetic is exact: ratio is read as a fraction p/q
    (denominator ≤ 10⁶) and m = ⌊(2·L·p + q) / (2q)⌋.
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"seed ratio must be in [0, 1], got {ratio}")
    assert lengths.dim() == 1, f"lengths must be [N], got shape {tuple(lengths.shape)}"
    lengths = lengths.long()
    assert bool((lengths >= 0).all()), "response lengths must be >= 0"
    frac = Fraction(ratio).limit_denominator(_MAX_RATIO_DENOMINATOR)
    p, q = frac.numerator, frac.denominator
    m = torch.div(2 * lengths * p + q, 2 * q, rounding_mode="floor")
    if ends_with_eos is None:
        ends_with_eos = torch.zeros_like(lengths, dtype=torch.bool)
    assert ends_with_eos.shape == lengths.shape, (
        f"ends_with_eos {tuple(ends_with_eos.shape)} must match lengths {tuple(lengths.shape)}"
    )
    upper = lengths - ends_with_eos.to(device=lengths.device, dtype=torch.long)
    return torch.minimum(m, upper).clamp(min=0)


def entropy_seed_lengths(
    entropies: Sequence[Tensor],  # N tensors [L_i] (EOS position already excluded by the caller)
    *,
    k: int = 32,
    generator: torch.Generator | None = None,
) -> Tensor:  # [N] long, seed lengths m_i (on the device of the first entropy tensor)
    """Entropy rule (docs/method.md): pick uniformly one of the k highest-entropy positions of õ_i; m_i = that position.

    The seed is õ_i[:m_i], so the current policy makes the decision at the high-entropy position itself.
    The caller passes each response's per-token behavior entropies WITHOUT the EOS position (so EOS is never
    a candidate and the seed never contains EOS). Ties in entropy are broken by position (earlier first), so
    the candidate set is deterministic; with fewer than k positions all are candidates; an empty response
    gives 0. The random pick uses `generator` (a CPU torch.Generator; computed on CPU).
    """
    assert k >= 1, f"k={k} must be >= 1"
    n = len(entropies)
    device = entropies[0].device if n else torch.device("cpu")
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=device)
    lens = torch.tensor([e.numel() for e in entropies], dtype=torch.long)
    for i, e in enumerate(entropies):
        assert e.dim() == 1, f"entropies[{i}] must be 1-D, got shape {tuple(e.shape)}"
        assert not bool(torch.isnan(e).any()), f"entropies[{i}] contains NaN"
    width = max(int(lens.max()), 1)
    padded = torch.full((n, width), float("-inf"), dtype=torch.float64)
    for i, e in enumerate(entropies):
        padded[i, : e.numel()] = e.detach().to("cpu", torch.float64)
    # Stable descending sort: equal entropies keep position order, padding (−inf) goes last.
    order = torch.sort(padded, dim=1, descending=True, stable=True).indices  # [N, width]
    n_cand = lens.clamp(max=k)  # [N]
    u = torch.rand(n, dtype=torch.float64, generator=generator)
    pick = torch.minimum((u * n_cand).long(), (n_cand - 1).clamp(min=0))  # uniform in [0, n_cand)
    pos = order.gather(1, pick.unsqueeze(1)).squeeze(1)
    pos = torch.where(lens > 0, pos, torch.zeros_like(pos))
    return pos.to(device)


def top_entropy_positions(
    entropy: Tensor,  # [L] (EOS excluded)
    *,
    k: int = 32,
) -> Tensor:  # [min(k, L)] long, candidate positions, highest entropy first
    """The candidate set of `entropy_seed_lengths` for one response (same tie-break: earlier position first)."""
    assert entropy.dim() == 1, f"entropy must be 1-D, got shape {tuple(entropy.shape)}"
    order = torch.sort(entropy.detach().to(torch.float64), descending=True, stable=True).indices
    return order[: min(k, entropy.numel())]


def ratio_cut(src: CutBatch, *, ratio: float) -> Cut:
    """``seed_rule=ratio``: m_i = round(|õ_i| · ratio), never the EOS (``ratio_seed_lengths``)."""
    return Cut(ratio_seed_lengths(src.lengths, ratio, ends_with_eos=src.ends_with_eos).tolist())


def entropy_cut(src: CutBatch, *, k: int, seed: int) -> Cut:
    """``seed_rule=entropy``: m_i drawn among the k highest-entropy positions of õ_i, its EOS left out
    (``entropy_seed_lengths``); ``seed`` seeds the draw (a CPU torch.Generator)."""
    assert all(e is not None for e in src.entropies), "the entropy rule needs pi_b's entropies of every response"
    ents = [e[: n - int(eos)] for e, n, eos in zip(src.entropies, src.lengths.tolist(), src.ends_with_eos.tolist())]
    return Cut(entropy_seed_lengths(ents, k=k, generator=torch.Generator().manual_seed(seed)).tolist())


def adaptive_cut(src: CutBatch, *, n_arms: int, stats: dict, seed: int) -> Cut:
    """``seed_rule=adaptive`` (a restart distribution, ``trainer.algos.restarts``): one arm (cut ratio
    ``adaptive_ratios(n_arms)``) per response by Thompson sampling of ``stats`` given its verdict, then the ratio
    rule at that arm's ratio; ``seed`` seeds the draw (numpy's Generator). The caller counts each row's outcome
    under its arm (``update_arm_stats``)."""
    ratios = adaptive_ratios(n_arms)
    arms = choose_arms(stats, src.correct, rng=np.random.default_rng(seed))
    lens = [int(ratio_seed_lengths(src.lengths[i:i + 1], ratios[a], ends_with_eos=src.ends_with_eos[i:i + 1]))
            for i, a in enumerate(arms)]
    return Cut(lens, arms)


# where a seed is cut (docs/method.md "Truncation rules"): SEED_RULES[seed_rule](CutBatch.of(sources), **kwargs)
SEED_RULES = {
    "ratio": ratio_cut,
    "entropy": entropy_cut,
    "adaptive": adaptive_cut,
}
assert tuple(SEED_RULES) == typing.get_args(SeedRule), "every seed rule has one SEED_RULES entry"


def token_factor(ratio: float, refresh_interval: int) -> float:
    """Generated-token growth of Thinking Seeds vs on-policy (docs/method.md "Cost"): 1 + (1 − ratio)·(T − 1)/T.

    Batch 1 of each refresh cycle is generated in full by π_b; batches 2..T regenerate (1 − ratio) of a
    response each. 1.4375 (≈1.44×) at ratio 0.5, T = 8.
    """
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"seed ratio must be in [0, 1], got {ratio}")
    if refresh_interval < 1:
        raise ValueError(f"refresh interval T must be >= 1, got {refresh_interval}")
    return 1.0 + (1.0 - ratio) * (refresh_interval - 1) / refresh_interval


def seed_token_mask(
    response_mask: Tensor,  # [N, T] bool
    seed_lens: Tensor,  # [N] long
) -> Tensor:  # [N, T] bool
    """True on seed tokens: response positions t < m_i (the paper's t ≤ |h_i|, 1-based)."""
    assert response_mask.dim() == 2 and seed_lens.shape == response_mask.shape[:1], (
        f"response_mask {tuple(response_mask.shape)} must be [N, T] and seed_lens {tuple(seed_lens.shape)} [N]"
    )
    pos = torch.arange(response_mask.shape[1], device=response_mask.device)
    return response_mask.bool() & (pos.unsqueeze(0) < seed_lens.to(response_mask.device).unsqueeze(1))


def seed_loss_mask(
    response_mask: Tensor,  # [N, T] bool
    seed_lens: Tensor,  # [N] long
    *,
    variant: str,
) -> Tensor:  # [N, T] bool, tokens that enter the policy loss (and its token-mean denominator)
    """Loss mask of paper Eq. 5: all response tokens ("state+action") or continuation tokens only ("state")."""
    if variant not in SEED_LOSS_VARIANTS:
        raise ValueError(f"unknown seed loss variant {variant!r}; valid: {', '.join(SEED_LOSS_VARIANTS)}")
    if variant == "state+action":
        return response_mask.bool().clone()
    return response_mask.bool() & ~seed_token_mask(response_mask, seed_lens)


def seed_old_logp(
    old_logp: Tensor,  # [N, T] log π_old
    behavior_logp: Tensor,  # [N, T] cached log π_b (only seed positions are read; NaN elsewhere is fine)
    seed_lens: Tensor,  # [N] long
) -> Tensor:  # [N, T], the ratio denominators of the state+action variant
    """Denominator of r in the state+action variant, Eq. 5: log π_b on seed tokens t < m_i, log π_old after."""
    assert old_logp.shape == behavior_logp.shape, (
        f"old_logp {tuple(old_logp.shape)} vs behavior_logp {tuple(behavior_logp.shape)}"
    )
    seed = seed_token_mask(torch.ones_like(old_logp, dtype=torch.bool), seed_lens)
    return torch.where(seed, behavior_logp.to(old_logp.dtype), old_logp)
