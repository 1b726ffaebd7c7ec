"""LUFFY (Yan et al. 2025): mixed on-/off-policy groups with regularized importance sampling (docs/method.md "LUFFY").

    on-policy tokens:   ℓ = −Â·r,   r = π_θ / π_old        (unclipped, as docs/method.md "LUFFY" states)
    off-policy tokens:  ℓ = −Â·f(π_θ),   f(π) = π / (π + γ),  γ = 0.1, behavior probability taken as 1

f(π) = sigmoid(log π − log γ) is evaluated in that form (no division, stable for tiny π); its gradient wrt
log π is γπ/(π + γ)², which keeps low-probability off-policy tokens learning. With one update per batch the
on-policy r ≡ 1, so the (missing) clip would be inactive anyway; for several updates per batch use
`clipped_policy_loss` on the on-policy rows instead. Advantages over the whole mixed group with
`group_advantages(..., scale="none")`; the "sum / max length" denominator is the reduction's (`reduce_loss` with
`loss_denominator(..., mode="token-sum-norm", max_len=T_max)`). The entropy bonus is not divided by it: LUFFY takes
`masked_mean(entropy, response_mask)`, a token mean, beside that sum (ElliottYan/LUFFY
luffy/verl/verl/mix_src/mix_actor.py, `update_policy`), so the trainer reduces it with `mode="token-mean"` over the
step's loss-token count (LUFFY's mean is per micro-batch, then averaged over them: a split-dependent weighting left
out). Divided by responses x max length it would be max_len / (mean length) times weaker: 3-5x at the 7B preset's
3072-token budget with responses of 600-1000 tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trainer.algos.losses import broadcast_adv, log_ratio


def luffy_policy_loss(
    logp: Tensor,  # [N, T] log π_θ (requires grad)
    old_logp: Tensor,  # [N, T] log π_old; not read on off-policy tokens (may hold NaN there)
    adv: Tensor,  # [N] or [N, T]
    off_policy: Tensor,  # [N] or [N, T] bool, True for tokens of external (off-policy) traces
    *,
    gamma: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:  # loss_mat [N, T], stats
    """Per-token LUFFY loss: −Â·r on on-policy tokens, −Â·π/(π+γ) on off-policy tokens.

    stats (detached, [N, T]): ratio (r on on-policy tokens; π = π/1 on off-policy tokens), shaped_ratio
    (r on on-policy tokens; f(π) on off-policy tokens), off_policy (bool), clipped_low / clipped_high
    (all False; present so every `LOSSES` entry has them).
    """
    assert gamma > 0, f"gamma={gamma} must be > 0"
    off = off_policy.bool()
    if off.dim() == 1:
        assert off.shape[0] == logp.shape[0], f"off_policy [N]={off.shape[0]} but logp has N={logp.shape[0]}"
        off = off.unsqueeze(-1).expand_as(logp)
    assert off.shape == logp.shape, f"off_policy {tuple(off.shape)} must be [N] or [N, T]={tuple(logp.shape)}"
    adv = broadcast_adv(adv, logp).to(logp.dtype)

    # off-policy tokens: behavior prob 1 -> denominator log 1 = 0 (also keeps NaN old_logp out of the graph)
    denom = torch.where(off, torch.zeros((), dtype=logp.dtype, device=logp.device), old_logp.to(logp.dtype))
    ratio = torch.exp(log_ratio(logp, denom))  # r on-policy, π off-policy
    shaped = torch.sigmoid(logp - math.log(gamma))  # π/(π+γ)
    value = torch.where(off, shaped, ratio)
    loss = -adv * value
    no_clip = torch.zeros_like(off)
    stats = {
        "ratio": ratio.detach(),
        "shaped_ratio": value.detach(),
        "off_policy": off.clone(),
        "clipped_low": no_clip,
        "clipped_high": no_clip.clone(),
    }
    return loss, stats
