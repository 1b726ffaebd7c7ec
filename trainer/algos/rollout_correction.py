"""Rollout correction: the sampler-vs-trainer mismatch on the tokens the engine sampled (docs/method.md).

The engine that samples (vLLM, the HF sampler) and the trainer's forward give the same weights slightly different
probabilities (kernels, dtype, batch shapes). Per sampled token the correction reads

    w_t = π_old(o_t|·) / π_sampler(o_t|·) = exp(log π_old − log π_sampler)    (detached; log w clamped to ±20)

with π_old the trainer's log-prob before the step's first update (the three-policy "decoupled" PPO of Hilton et al.
2021, arXiv:2110.00641, as verl's rollout correction frames it: π_sampler → π_old by importance sampling, π_old →
π_θ by the loss's own ratio and clip). Modes (config ``rollout_correction``, cap C = ``rollout_correction_cap``):

    none       metrics only: the per-token loss is unchanged
    tis        truncated IS: ℓ_t ← min(w_t, C) · ℓ_t                      (Yao et al. 2025, "Your Efficient RL
               Framework Secretly Brings You Off-Policy RL Training"; verl ``rollout_is=token``, threshold 2)
    mis_token  masked IS, token level: a token with w_t ∉ [1/C, C] leaves the loss  (verl ``rollout_rs=token``,
               lower bound 1/C by default)
    mis_seq    masked IS, sequence level: a response whose product Π_t w_t ∉ [1/C, C] leaves the loss
               (verl ``rollout_rs=sequence``; TRL's default ``vllm_importance_sampling_mode="sequence_mask"``
               is the same product with an upper bound only; Liu, Li et al. 2025, "When Speed Kills Stability")
    mis_geo    masked IS, sequence level by the geometric mean exp(mean_t log w_t) ∉ [1/C, C] (verl
               ``rollout_rs=geometric``; its C is close to 1, e.g. 1.001: the mean of a long response barely moves)

Which tokens it touches: the *sampled* ones, response tokens with a finite sampler log-prob. Tokens without one get
w = 1 and are never masked: seed tokens of Thinking Seeds (NaN there: under state+action they already train with
r = π_θ / π_b, the cached behavior policy's ratio), stale rows (M2PO) and LUFFY's off-policy traces (no sampler
log-probs at all). A sequence-level mask drops every sampled token of the response (a seeded row keeps its seed).

The denominator rule: masked tokens leave the loss mask (``trainer.algos.loss_mask(..., rollout_keep=)``) and hence
the token-mean denominator Σ m of the step, as verl's rejection sampling removes them from ``response_mask``; with
token-mean the loss is the mean over the kept tokens. (TRL instead multiplies them by 0 and keeps them in the
count.) The seq-mean modes keep counting responses, a fully masked one included; LUFFY's token-sum-norm keeps
N · max_len. The TIS weight multiplies the policy loss only (not the KL penalty or the entropy bonus), as verl's.

Metrics (``rollout_mismatch_sums`` then ``rollout_mismatch_metrics``: additive sums, so ranks and micro-batches
add up before one division), over the sampled tokens:

    rollout_corr/weight_mean    mean w_t (before the cap)
    rollout_corr/clipped_share  share with w_t > C (tis)
    rollout_corr/masked_share   share masked (mis_*)
    rollout_corr/k3_kl          mean of w_t − log w_t − 1: the k3 estimate of KL(π_sampler ‖ π_old) from the
                                sampler's own samples (verl's ``k3_kl``; ≥ 0, 0 iff the two agree)
    rollout_corr/log_ppl_ratio  mean over responses of (mean_t log π_sampler − mean_t log π_old)
                                = log(PPL_trainer / PPL_sampler) (verl's ``log_ppl_diff``; > 0: the trainer is less
                                confident than the sampler)
    rollout_corr/tokens         sampled tokens counted
"""

from __future__ import annotations

import math
import typing
from typing import Literal

import torch
from torch import Tensor

from trainer.algos.losses import MAX_LOG_RATIO

RolloutCorrection = Literal["none", "tis", "mis_token", "mis_seq", "mis_geo"]   # the config's `rollout_correction`
ROLLOUT_CORRECTIONS = typing.get_args(RolloutCorrection)
MASKING_CORRECTIONS = ("mis_token", "mis_seq", "mis_geo")   # the modes that change the loss mask (and denominator)

# the additive sums of `rollout_mismatch_sums`, in the order ranks reduce them
MISMATCH_SUMS = ("tokens", "weight", "k3", "clipped", "masked", "responses", "log_ppl")


def _check(mode: str, cap: float) -> None:
    assert mode in ROLLOUT_CORRECTIONS, f"rollout correction must be one of {ROLLOUT_CORRECTIONS}, got {mode!r}"
    assert mode == "none" or cap > 1.0, f"the rollout correction cap C={cap} must be > 1 ({mode})"


def rollout_log_ratio(
    old_logp: Tensor,  # [N, T] log π_old (trainer, before the update)
    sampler_logp: Tensor,  # [N, T] log π_sampler; NaN where the engine did not sample the token now
    response_mask: Tensor,  # [N, T] bool
) -> tuple[Tensor, Tensor]:  # log_w [N, T] (0 off the sampled tokens), sampled [N, T] bool
    """log w = log π_old − log π_sampler, clamped to ±20 (as verl's safety bound), on the sampled tokens
    (response tokens with a finite sampler log-prob); 0 elsewhere, so w = 1 there. Detached."""
    assert old_logp.shape == sampler_logp.shape == response_mask.shape, (
        f"old_logp {tuple(old_logp.shape)}, sampler_logp {tuple(sampler_logp.shape)} and response_mask "
        f"{tuple(response_mask.shape)} must all be [N, T]")
    sampled = response_mask.bool() & torch.isfinite(sampler_logp)
    diff = (old_logp.detach() - sampler_logp.nan_to_num(0.0)).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.where(sampled, diff, torch.zeros((), dtype=diff.dtype, device=diff.device)), sampled


def rollout_weights(
    old_logp: Tensor,  # [N, T]
    sampler_logp: Tensor,  # [N, T], NaN where not sampled
    response_mask: Tensor,  # [N, T] bool
    *,
    mode: str,
    cap: float,
) -> Tensor:  # [N, T], detached
    """The factor each token's policy loss is multiplied by: min(w_t, C) under "tis", 1 otherwise (and on every
    token without a sampler log-prob)."""
    _check(mode, cap)
    log_w, _ = rollout_log_ratio(old_logp, sampler_logp, response_mask)
    if mode != "tis":
        return torch.ones_like(log_w)
    return torch.exp(log_w).clamp(max=cap)


def _sequence_log_ratio(log_w: Tensor, sampled: Tensor, *, geometric: bool) -> Tensor:  # [N, T] -> [N]
    total = log_w.sum(-1)  # log Π_t w_t over the sampled tokens (log_w is 0 elsewhere)
    if geometric:
        return total / sampled.sum(-1).clamp(min=1)
    return total


def rollout_keep(
    old_logp: Tensor,  # [N, T]
    sampler_logp: Tensor,  # [N, T], NaN where not sampled
    response_mask: Tensor,  # [N, T] bool
    *,
    mode: str,
    cap: float,
) -> Tensor:  # [N, T] bool
    """The tokens masked IS keeps: False on a sampled token whose ratio (token: w_t; mis_seq: Π_t w_t; mis_geo:
    exp(mean_t log w_t), over the response's sampled tokens) lies outside [1/C, C], bounds included (verl's);
    True everywhere else (tokens without a sampler log-prob, every token under "none" and "tis"). The band is
    tested in log space, |log ratio| ≤ log C, so a long product never overflows."""
    _check(mode, cap)
    log_w, sampled = rollout_log_ratio(old_logp, sampler_logp, response_mask)
    if mode not in MASKING_CORRECTIONS:
        return torch.ones_like(sampled)
    log_c = math.log(cap)
    if mode == "mis_token":
        inside = log_w.abs() <= log_c
    else:
        seq = _sequence_log_ratio(log_w, sampled, geometric=mode == "mis_geo")  # [N]
        inside = (seq.abs() <= log_c).unsqueeze(-1).expand_as(sampled)
    return inside | ~sampled


def rollout_mismatch_sums(
    old_logp: Tensor,  # [N, T]
    sampler_logp: Tensor,  # [N, T], NaN where not sampled
    response_mask: Tensor,  # [N, T] bool
    *,
    mode: str,
    cap: float,
) -> dict[str, float]:
    """The additive sums behind the step's ``rollout_corr/*`` metrics (keys ``MISMATCH_SUMS``), over the sampled
    tokens: their count, Σ w, Σ (w − log w − 1), how many have w > C, how many masked IS drops; the responses with
    at least one sampled token and Σ over them of −mean_t log w (= mean log π_sampler − mean log π_old)."""
    _check(mode, cap)
    log_w, sampled = rollout_log_ratio(old_logp, sampler_logp, response_mask)
    keep = rollout_keep(old_logp, sampler_logp, response_mask, mode=mode, cap=cap)
    clipped = sampled & (log_w > math.log(cap)) if mode != "none" else torch.zeros_like(sampled)  # as keep: float32
    # k3 = expm1(x) − x ≈ x²/2 in float64: float32's w − log w − 1 rounds a 1e-8 gap to 0 or below
    log_w = log_w.double()
    w = torch.exp(log_w)
    n_seq = sampled.sum(-1)  # [N]
    has = n_seq > 0
    per_seq = -log_w.sum(-1) / n_seq.clamp(min=1)  # [N]
    f = lambda x: float(x.double().sum())  # noqa: E731
    return {
        "tokens": f(sampled),
        "weight": f(torch.where(sampled, w, 0.0)),
        "k3": f(torch.where(sampled, (torch.expm1(log_w) - log_w).clamp(min=0.0), 0.0)),
        "clipped": f(clipped),
        "masked": f(sampled & ~keep),
        "responses": f(has),
        "log_ppl": f(torch.where(has, per_seq, 0.0)),
    }


def rollout_mismatch_metrics(sums: dict[str, float], *, mode: str) -> dict[str, float]:
    """``rollout_corr/*`` from the sums (of every micro-batch and rank); {} when no token was sampled this step
    (an M2PO batch of stale rows). ``clipped_share`` under "tis", ``masked_share`` under the mis modes."""
    assert set(sums) == set(MISMATCH_SUMS), f"sums must have the keys {MISMATCH_SUMS}, got {sorted(sums)}"
    n = sums["tokens"]
    if n == 0:
        return {}
    out = {
        "rollout_corr/weight_mean": sums["weight"] / n,
        "rollout_corr/k3_kl": sums["k3"] / n,
        "rollout_corr/log_ppl_ratio": sums["log_ppl"] / max(sums["responses"], 1.0),
        "rollout_corr/tokens": int(n),
    }
    if mode == "tis":
        out["rollout_corr/clipped_share"] = sums["clipped"] / n
    if mode in MASKING_CORRECTIONS:
        out["rollout_corr/masked_share"] = sums["masked"] / n
    return out
