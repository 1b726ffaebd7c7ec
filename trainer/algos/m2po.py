"""M2PO (Zheng et al. 2025, arXiv:2510.01161): second-moment trust region for stale data (docs/method.md "M2PO").

Two variants (config `m2po_variant`), the same budget τ (`m2po_tau` = 0.04) on the same tokens:

    r = π_θ / π_behavior,   M2 = (log r)²
    trust-region tokens: {Â > 0, r > 1} ∪ {Â < 0, r < 1}  (the tokens whose ratio the update pushes further)

"paper", the final paper's Algorithm 1 (`m2po_mask`):
    drop the trust-region tokens with the largest M2 until the mean M2 of the rest is ≤ τ
    ℓ = −Â·r on kept tokens (no ε-clip), 0 on dropped ones; the denominator counts ALL response tokens.

"released", the authors' code (Infini-AI-Lab/M2PO, verl/trainer/ppo/core_algos.py: `kpo_clip_harmful_tokens`,
`_solve_tau_from_sorted_delta2`, `compute_m2po_policy_loss`; `m2po_log_ratio_cap`):
    c = the cap on |log r| at which the capped second moment mean_tr min(M2, c²) over the trust-region tokens meets
        the budget τ (the largest breakpoint M2 value below it; no cap when mean_tr M2 ≤ τ already)
    ℓ = max(−Â·r, −Â·clip(r, e^−c, e^c))   (PPO's clip with ε_low = 1 − e^−c, ε_high = e^c − 1; no dual clip)
The clip binds only on trust-region tokens with |log r| ≥ c: their loss is the constant −Â·e^{±c} (gradient 0);
every other token keeps −Â·r. A token exactly at the cap counts as past it (the release lowers c² by 1e-12). The
release solves c per micro-batch (verl's dynamic batch, ≤ 30000 tokens per GPU in its scripts; `miniclip_low/high`,
floors on the ε's, unset there); here c is solved once over the whole mini-batch, as the paper variant's mask, so
the gradient does not depend on the micro-batch split.
"""

from __future__ import annotations

import math
import typing
from typing import Literal

import torch
from torch import Tensor

from trainer.algos.losses import MAX_LOG_RATIO, broadcast_adv, log_ratio

M2poVariant = Literal["paper", "released"]   # the config's `m2po_variant`
M2PO_VARIANTS = typing.get_args(M2poVariant)


def _trust_region_log_ratio(
    logp: Tensor,  # [N, T]
    behavior_logp: Tensor,  # [N, T]
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T] bool
) -> tuple[Tensor, Tensor]:  # log r [N, T] float64 (0 off the mask), trust-region tokens [N, T] bool
    """log r = log π − log π_behavior in float64 (read only on the mask: padding may hold NaN behavior log-probs)
    and the trust-region tokens {Â > 0, log r > 0} ∪ {Â < 0, log r < 0} among the masked ones."""
    adv = broadcast_adv(adv, logp)
    diff = logp.detach().to(torch.float64) - behavior_logp.detach().to(torch.float64)
    lr = torch.where(mask, diff, torch.zeros((), dtype=torch.float64, device=diff.device))
    return lr, mask & (((adv > 0) & (lr > 0)) | ((adv < 0) & (lr < 0)))


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
    lr, trust = _trust_region_log_ratio(logp, behavior_logp, adv, mask)

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


def m2po_log_ratio_cap(
    logp: Tensor,  # [N, T]
    behavior_logp: Tensor,  # [N, T]
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T] bool, response tokens
    *,
    tau: float = 0.04,
) -> float:  # c >= 0, or math.inf (no cap)
    """The released M2PO's bound c on |log r| (`kpo_clip_harmful_tokens` / `_solve_tau_from_sorted_delta2` in
    Infini-AI-Lab/M2PO verl/trainer/ppo/core_algos.py). With v_0 ≤ … ≤ v_{n−1} the M2 = (log r)² of the n
    trust-region tokens:

        mean v ≤ tau                                  → inf (no clip)
        k = the first index with Σ_{i≤k} v_i + v_k·(n − 1 − k) ≥ tau·n   (capping every value at v_k meets the budget)
        c = sqrt(v_{k−1}), or 0 when k = 0             (the largest breakpoint whose capped mean stays below tau)

    The release subtracts 1e-12 in its comparisons (a float-level nudge, left out). Global over everything passed
    in, like `m2po_mask`; with one update per batch the caller computes it once per step from log π_old."""
    assert tau > 0, f"tau={tau} must be > 0"
    mask = mask.bool()
    assert logp.shape == mask.shape, f"logp {tuple(logp.shape)} vs mask {tuple(mask.shape)}"
    lr, trust = _trust_region_log_ratio(logp, behavior_logp, adv, mask)
    v = torch.sort((lr * lr)[trust]).values  # [n] ascending
    n = v.numel()
    if n == 0 or float(v.sum()) <= tau * n:
        return math.inf
    capped = v.cumsum(0) + v * torch.arange(n - 1, -1, -1, dtype=v.dtype, device=v.device)  # Σ min(v_i, v_k)
    k = int((capped >= tau * n).nonzero()[0])
    return 0.0 if k == 0 else math.sqrt(float(v[k - 1]))


def m2po_policy_loss(
    logp: Tensor,  # [N, T] log π_θ (requires grad)
    behavior_logp: Tensor,  # [N, T] log π_behavior (no grad)
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T] bool, response tokens
    *,
    tau: float = 0.04,
    variant: str = "paper",
    keep: Tensor | None = None,  # [N, T] bool, a precomputed m2po_mask (e.g. over the whole step); variant "paper"
    log_ratio_cap: float | Tensor | None = None,  # a precomputed m2po_log_ratio_cap; variant "released"
) -> tuple[Tensor, dict[str, Tensor]]:  # loss_mat [N, T], stats
    """M2PO per-token loss, 0 on padding.

    variant "paper": −Â·r on tokens kept by `m2po_mask`, 0 on dropped tokens; no ε-clip.
    variant "released": max(−Â·r, −Â·clip(r, e^−c, e^c)) with c = `m2po_log_ratio_cap` (the authors' code): −Â·e^{±c}
    on trust-region tokens with |log r| ≥ c, −Â·r elsewhere.

    Reduce with the RESPONSE mask (`reduce_loss(loss_mat, mask, ...)`), not `keep`: the M2PO denominator
    counts all tokens, dropped ones included.

    stats (detached): ratio [N, T]; m2po_kept [N, T]; m2po_dropped [N, T] (dropped by the mask, or whose
    gradient the released clip zeroes); m2po_masked (their count) and m2po_masked_frac (of response tokens);
    clipped_low / clipped_high (the released clip's; all False under "paper", which has no ε-clip);
    m2po_log_ratio_cap [] (the released c; inf without a cap, NaN under "paper").
    """
    assert variant in M2PO_VARIANTS, f"variant must be one of {M2PO_VARIANTS}, got {variant!r}"
    mask = mask.bool()
    # padding may hold NaN behavior log-probs: read log r only where it is used
    safe_behavior = torch.where(mask, behavior_logp.to(logp.dtype), logp.detach())
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    if variant == "released":
        if log_ratio_cap is None:
            log_ratio_cap = m2po_log_ratio_cap(logp, behavior_logp, adv, mask, tau=tau)
        c = float(log_ratio_cap)
        assert c >= 0, f"log_ratio_cap={c} must be >= 0"
        # PPO's clip at [e^-c, e^c] binds only on trust-region tokens past the cap: there ℓ = −Â·e^{±c}, a constant
        lr, trust = _trust_region_log_ratio(logp, behavior_logp, adv, mask)
        beyond = trust & (lr.abs() >= c)
        adv = broadcast_adv(adv, logp).to(logp.dtype)
        ratio = torch.exp(log_ratio(logp, safe_behavior))
        bound = torch.exp(torch.sign(lr) * min(c, MAX_LOG_RATIO)).to(logp.dtype)
        loss = torch.where(mask, torch.where(beyond, -adv * bound, -adv * ratio), zero)
        ratio = ratio.detach()
        clipped_low, clipped_high = beyond & (adv < 0), beyond & (adv > 0)
        keep = mask & ~beyond
        cap = torch.tensor(c)
    else:
        if keep is None:
            keep = m2po_mask(logp, behavior_logp, adv, mask, tau=tau)
        assert keep.shape == mask.shape, f"keep {tuple(keep.shape)} vs mask {tuple(mask.shape)}"
        keep = keep.bool() & mask
        adv = broadcast_adv(adv, logp).to(logp.dtype)
        ratio = torch.exp(log_ratio(logp, safe_behavior))
        loss = torch.where(keep, -adv * ratio, zero)
        ratio = ratio.detach()
        clipped_low, clipped_high = torch.zeros_like(mask), torch.zeros_like(mask)
        cap = torch.tensor(math.nan)
    dropped = mask & ~keep
    n_dropped = dropped.sum()
    stats = {
        "ratio": ratio,
        "m2po_kept": keep,
        "m2po_dropped": dropped,
        "m2po_masked": n_dropped,
        "m2po_masked_frac": n_dropped.to(torch.float32) / mask.sum().clamp(min=1),
        "m2po_log_ratio_cap": cap,
        "clipped_low": clipped_low,
        "clipped_high": clipped_high,
    }
    return loss, stats
