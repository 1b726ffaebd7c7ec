"""DAPO clipped policy loss, and the one place that reduces a per-token loss with its denominator.

docs/method.md "DAPO, the on-policy base":

    r_{i,t} = π_θ(o_{i,t}|·) / π_old(o_{i,t}|·)
    ℓ_{i,t} = −min(r Â, clip(r, 1−ε_low, 1+ε_high) Â) = max(−Â r, −Â clip(r, 1−ε_low, 1+ε_high))
    L = Σ_i Σ_t ℓ_{i,t} / Σ_i |o_i|          (token-mean, global token count of the optimizer step)

with clip-higher ε_low = 0.2, ε_high = 0.28 (Yu et al. 2025). The dual clip (Ye et al. 2020, "Mastering Complex
Control in MOBA Games with Deep RL", arXiv:1912.09729; verl's `clip_ratio_c`) caps the loss of a negative-advantage
token at −Â·c, c > 1, as verl's `compute_policy_loss` (verl/trainer/ppo/core_algos.py) applies it:

    ℓ = min(ℓ, −Â·c)   where Â < 0                     (c = 3 in verl's actor config, 10 in its DAPO recipe)

For Â < 0 the clipped loss −Â·max(r, 1−ε_low) grows without bound in r; the dual clip stops it at r = c (gradient
zero beyond), which matters where r is far from 1: Thinking Seeds' seed tokens, whose r = π_θ / π_b is up to T − 1
steps stale.
"""

from __future__ import annotations

import typing
from typing import Literal

import torch
from torch import Tensor

# the reduction modes (the config's `loss_agg` is typed with this; the tuple is derived from it)
LossAgg = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "token-sum-norm"]
AGGREGATE_MODES = typing.get_args(LossAgg)

# exp(±20) is far outside any trust region; clamping the log-ratio keeps padding or a badly stale token from
# overflowing to inf (whose gradient is NaN even when the token is masked out afterwards).
MAX_LOG_RATIO = 20.0


def broadcast_adv(adv: Tensor, like: Tensor) -> Tensor:  # adv [N] or [N, T], like [N, T] -> [N, T]
    """Per-response advantages [N] broadcast to tokens [N, T]; per-token [N, T] passed through."""
    if adv.dim() == 1:
        assert adv.shape[0] == like.shape[0], f"adv [N]={adv.shape[0]} but tokens have N={like.shape[0]}"
        return adv.unsqueeze(-1).expand_as(like)
    assert adv.shape == like.shape, f"adv {tuple(adv.shape)} must be [N] or [N, T]={tuple(like.shape)}"
    return adv


def log_ratio(logp: Tensor, denom_logp: Tensor) -> Tensor:  # [N, T], [N, T] -> [N, T]
    """log r = log π_θ − log π_denominator, clamped to ±MAX_LOG_RATIO so exp() never overflows."""
    assert logp.shape == denom_logp.shape, f"logp {tuple(logp.shape)} vs {tuple(denom_logp.shape)}"
    return (logp - denom_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def clipped_policy_loss(
    logp: Tensor,  # [N, T] log π_θ of the sampled tokens (requires grad)
    old_logp: Tensor,  # [N, T] log π_old (or log π_b on seed tokens), no grad
    adv: Tensor,  # [N] or [N, T]
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_ratio_c: float = 0.0,
) -> tuple[Tensor, dict[str, Tensor]]:  # loss_mat [N, T], stats
    """Per-token DAPO loss ℓ = max(−A·r, −A·clip(r, 1−clip_low, 1+clip_high)), docs/method.md (DAPO).

    With `clip_ratio_c` > 1 the dual clip applies to A < 0: ℓ = min(ℓ, −A·clip_ratio_c) (verl's
    `compute_policy_loss`: `torch.where(advantages < 0, torch.min(-advantages * clip_ratio_c, clip_pg_losses1),
    clip_pg_losses1)`); 0 turns it off.
    Positions outside the response mask are computed like any other; the caller masks them in `reduce_loss`
    (their logp/old_logp must be finite).

    stats (all detached, [N, T]):
      ratio         r = exp(logp − old_logp)
      clipped_low   the low clip is active:  A < 0 and r < 1 − clip_low  (gradient zero)
      clipped_high  the high clip is active: A > 0 and r > 1 + clip_high (gradient zero)
      dual_clipped  the dual clip is active: A < 0 and r > clip_ratio_c (all False with clip_ratio_c = 0)
    Masks are not restricted to the response mask; combine with it before counting.
    """
    assert clip_low >= 0 and clip_high >= 0, f"clip_low={clip_low}, clip_high={clip_high} must be >= 0"
    assert clip_ratio_c == 0 or clip_ratio_c > 1.0, f"dual clip clip_ratio_c={clip_ratio_c} must be 0 (off) or > 1"
    adv = broadcast_adv(adv, logp).to(logp.dtype)
    ratio = torch.exp(log_ratio(logp, old_logp))
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(loss_unclipped, loss_clipped)

    r = ratio.detach()
    dual_clipped = torch.zeros_like(r, dtype=torch.bool)
    if clip_ratio_c:
        dual_clipped = (adv < 0) & (r > clip_ratio_c)
        loss = torch.where(adv < 0, torch.minimum(loss, -adv * clip_ratio_c), loss)
    stats = {
        "ratio": r,
        "clipped_low": (adv < 0) & (r < 1.0 - clip_low),
        "clipped_high": (adv > 0) & (r > 1.0 + clip_high),
        "dual_clipped": dual_clipped,
    }
    return loss, stats


def loss_denominator(
    loss_mask: Tensor,  # [N, T] bool: the loss tokens of EVERY response of the optimizer step
    *,
    mode: str,
    max_len: int | None = None,
) -> float:
    """The denominator of the optimizer step's loss (computed once per step, handed to `reduce_loss`).

    token-mean           Σ m                 tokens that enter the loss (DAPO: the global token count, docs/method.md;
                                             Thinking Seeds "state": continuation tokens; M2PO: all response
                                             tokens, its dropped ones included)
    seq-mean-token-mean  N                   responses (GRPO's 1/G Σ_i; one with no loss token counts too)
    seq-mean-token-sum   N
    token-sum-norm       N · max_len         LUFFY's "sum / max length" (max_len = the response budget)

    `loss_mask` covers all micro-batches and ranks of the step (the trainer holds every row of a mini-batch on
    every rank, so the count is global without a collective). Never below 1, so an empty step gives loss 0.
    """
    _check_mode(mode)
    assert loss_mask.dim() == 2, f"loss_mask must be [N, T], got shape {tuple(loss_mask.shape)}"
    n = loss_mask.shape[0]
    if mode == "token-mean":
        count = int(loss_mask.bool().sum())
    elif mode == "token-sum-norm":
        assert max_len is not None and max_len >= 1, f"token-sum-norm needs max_len >= 1, got {max_len}"
        count = n * max_len
    else:
        count = n
    return float(max(count, 1))


def reduce_loss(
    loss_mat: Tensor,  # [N, T], one micro-batch
    mask: Tensor,  # [N, T] bool (or 0/1), the tokens of loss_mat that count
    *,
    mode: str,
    denominator: float | Tensor,  # `loss_denominator` of the whole optimizer step
) -> Tensor:  # scalar
    """The one reduction of a per-token loss to the scalar that is backpropagated: every loss goes through it, with the step's one denominator.

    token-mean, token-sum-norm   Σ_{i,t} ℓ·m / D                      (DAPO's token-mean when D = Σ m)
    seq-mean-token-mean          Σ_i [Σ_t ℓ·m / Σ_t m] / D            (GRPO's original, D = #responses)
    seq-mean-token-sum           Σ_i [Σ_t ℓ·m] / D

    D is the step's `loss_denominator`, not the micro-batch's own count, so summing `reduce_loss` over the
    micro-batches (and ranks) of a step gives the full-batch value and gradient whatever the split. The entropy
    bonus goes through here too, as a token mean whatever the policy loss's mode (`mode="token-mean"` with
    D = `loss_denominator(mask, mode="token-mean")`, the step's loss-token count: LUFFY's `masked_mean(entropy,
    response_mask)` beside its sum / max length policy loss, ElliottYan/LUFFY luffy/verl/verl/mix_src/mix_actor.py).
    Masked positions contribute exactly 0 (even if they hold NaN). An empty local batch gives 0.
    """
    _check_mode(mode)
    assert loss_mat.shape == mask.shape, f"loss_mat {tuple(loss_mat.shape)} vs mask {tuple(mask.shape)}"
    mask = mask.bool()
    masked = torch.where(mask, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    if mode in ("token-mean", "token-sum-norm"):
        return masked.sum() / denominator
    per_seq = masked.sum(-1)  # [N]
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / denominator


def masked_mean(
    x: Tensor,  # [...]
    mask: Tensor,  # same shape as x
    dim: int | None = None,
) -> Tensor:  # scalar, or x reduced over dim
    """Mean of x over positions where mask is True; 0 where nothing is selected. NaN outside the mask ignored."""
    assert x.shape == mask.shape, f"x {tuple(x.shape)} vs mask {tuple(mask.shape)}"
    mask = mask.bool()
    masked = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    if dim is None:
        return masked.sum() / mask.sum().clamp(min=1)
    return masked.sum(dim) / mask.sum(dim).clamp(min=1)


def _check_mode(mode: str) -> None:
    if mode not in AGGREGATE_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; valid modes: {', '.join(AGGREGATE_MODES)}")
