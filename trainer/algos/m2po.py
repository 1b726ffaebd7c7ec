"""M2PO (Zheng et al. 2025): second-moment trust region for stale data (docs/method.md "M2PO").

    r = π_θ / π_behavior,   M2 = (log r)²
    trust-region tokens: {Â > 0, r > 1} ∪ {Â < 0, r < 1}  (the tokens whose ratio the update pushes further)
    drop the trust-region tokens with the largest M2 until the mean M2 of the rest is ≤ τ (τ = 0.04)
    ℓ = −Â·r on kept tokens (no ε-clip), 0 on dropped ones; the denominator counts ALL response tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.algos.losses import broadcast_adv, log_ratio


def m2po_mask(
    logp: Tensor,  # [N, T]
    behavior_logp: Tensor,  # [N, T]
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T] bool, response tokens
    *,
    tau: float = 0.04,
) -> Tensor:  # [N, T] bool: True = the token STAYS in the loss
    """Keep-mask of M2PO. Polarity: True means "kept"; False marks dropped trust-region tokens and padding.

    Global over everything passed in (the paper applies it over the batch): the trust-region M2 values are
    sorted once and the smallest number of largest-M2 tokens is dropped such that the mean M2 of the kept
    trust-region tokens is ≤ tau (mean of none = 0). Ties in M2 are dropped in flattened (row-major) order,
    earlier token first. Tokens with mask True outside the trust region are always kept; mask False → False.
    With one update per batch the current logp equals π_old's, so the caller may compute this once per
    optimizer step from old and behavior log-probs over the whole batch and pass it as `keep`.
    """
    assert tau >= 0, f"tau={tau} must be >= 0"
    mask = mask.bool()
    assert logp.shape == mask.shape, f"logp {tuple(logp.shape)} vs mask {tuple(mask.shape)}"
    adv = broadcast_adv(adv, logp)
    # log r in float64 where it is read (padding may hold NaN behavior log-probs)
    diff = logp.detach().to(torch.float64) - behavior_logp.detach().to(torch.float64)
    lr = torch.where(mask, diff, torch.zeros((), dtype=torch.float64, device=diff.device))
    trust = mask & (((adv > 0) & (lr > 0)) | ((adv < 0) & (lr < 0)))

    flat_idx = trust.flatten().nonzero().squeeze(1)  # [n] row-major positions of trust-region tokens
    m2 = (lr * lr).flatten()[flat_idx]  # [n]
    n = m2.numel()
    keep = mask.flatten().clone()  # row-major, contiguous
    if n == 0:
        return keep.view(mask.shape)
    desc = torch.sort(m2, descending=True, stable=True)  # drop order: largest M2 first, ties earlier first
    asc_cumsum = desc.values.flip(0).cumsum(0)  # [n]: sum of the j smallest, j = 1..n
    counts = torch.arange(1, n + 1, dtype=torch.float64, device=m2.device)
    fits = (asc_cumsum <= tau * counts).long()
    n_keep = int(fits.cumprod(0).sum())  # the mean of the j smallest is non-decreasing in j
    dropped = flat_idx[desc.indices[: n - n_keep]]
    keep[dropped] = False
    return keep.view(mask.shape)


def m2po_policy_loss(
    logp: Tensor,  # [N, T] log π_θ (requires grad)
    behavior_logp: Tensor,  # [N, T] log π_behavior (no grad)
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T] bool, response tokens
    *,
    tau: float = 0.04,
    keep: Tensor | None = None,  # [N, T] bool, a precomputed m2po_mask (e.g. over the whole step)
) -> tuple[Tensor, dict[str, Tensor]]:  # loss_mat [N, T], stats
    """M2PO per-token loss: −Â·r on tokens kept by `m2po_mask`, 0 on dropped tokens and padding; no ε-clip.

    Reduce with the RESPONSE mask (`reduce_loss(loss_mat, mask, ...)`), not `keep`: the M2PO denominator
    counts all tokens, dropped ones included.

    stats (detached): ratio [N, T]; m2po_kept [N, T]; m2po_dropped [N, T] (masked by M2PO);
    m2po_masked (count of dropped tokens) and m2po_masked_frac (of response tokens);
    clipped_low / clipped_high all False (no ε-clip; present so every `LOSSES` entry has them).
    """
    mask = mask.bool()
    if keep is None:
        keep = m2po_mask(logp, behavior_logp, adv, mask, tau=tau)
    assert keep.shape == mask.shape, f"keep {tuple(keep.shape)} vs mask {tuple(mask.shape)}"
    keep = keep.bool() & mask
    adv = broadcast_adv(adv, logp).to(logp.dtype)
    # padding may hold NaN behavior log-probs: read log r only where it is used
    safe_behavior = torch.where(mask, behavior_logp.to(logp.dtype), logp.detach())
    ratio = torch.exp(log_ratio(logp, safe_behavior))
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    loss = torch.where(keep, -adv * ratio, zero)
    dropped = mask & ~keep
    n_dropped = dropped.sum()
    no_clip = torch.zeros_like(mask)
    stats = {
        "ratio": ratio.detach(),
        "m2po_kept": keep,
        "m2po_dropped": dropped,
        "m2po_masked": n_dropped,
        "m2po_masked_frac": n_dropped.to(torch.float32) / mask.sum().clamp(min=1),
        "clipped_low": no_clip,
        "clipped_high": no_clip.clone(),
    }
    return loss, stats
