"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv:2505.22617, §5): restrain the few tokens whose log-prob and advantage co-vary most, the tokens that
drive the entropy down.

    Cov_t = (Â_t − mean Â) · (log π_θ(o_t) − mean log π_θ)         means over the loss tokens of the batch

    Clip-Cov  of the tokens with ω_low < Cov_t < ω_high whose PPO clip is not active, draw max(⌊r·N⌋, 1) uniformly
              without replacement (N = loss tokens) and set their loss to 0 (no gradient);
              every other token keeps DAPO's clipped loss max(−Â r, −Â clip(r, 1−ε_low, 1+ε_high)).
              r = 2e-4, ω_low = 1, ω_high = 5.
    KL-Cov    the max(⌊k·N⌋, 1) tokens of largest Cov_t get ℓ = −Â r + β |log r|; every other token ℓ = −Â r.
              No ε-clip at all. k = 2e-3, β = 1 (Qwen2.5-7B).

Reference: volcengine/verl `verl/trainer/ppo/core_algos.py:compute_policy_loss_clip_cov` and
`compute_policy_loss_kl_cov` (adapted from PRIME-RL/Entropy-Mechanism-of-RL). The defaults are the paper's 7B recipe
(verl before the recipe moved out, `recipe/entropy/7b_clip_cov.sh`: clip_cov_ratio 0.0002, lb 1, ub 5 with
clip_ratio_low = clip_ratio_high = 1; `7b_kl_cov.sh`: kl_cov_ratio 0.002, ppo_kl_coef 1). verl's generic config
(`verl/trainer/config/actor/actor.yaml`) holds kl_cov_ratio 0.0002 and ppo_kl_coef 0.1 instead (its 32B recipe's
ratio); the functions' own fallbacks are 0.0002 and 1.0.

Where the selection is computed: verl selects inside each micro-batch (its means, its ⌊r·N⌋ and its random draw),
so the split changes which tokens are restrained. Here the selection is a mask over a whole mini-batch (every
micro-batch and rank), from one no-grad forward of the current policy at the mini-batch's start (the trainer's
π_old forward for the first mini-batch, `trainer.update.cov_masks`), drawn from a generator seeded by (seed, step,
mini-batch): the gradient does not depend on the micro-batch size or the world size (docs/method.md, "DAPO, the on-policy base"). Called without a
mask, the losses select over the batch they are given (generator seed 0).

KL-Cov's penalty β|log r| has gradient β·sign(log r)·∇log π_θ, and none at r = 1 (torch's d|x|/dx at 0 is 0): with one
on-policy update per batch (π_old = π_θ.detach()) KL-Cov is the unclipped policy gradient, as in verl; the paper's
recipe takes 8 updates per rollout batch, and the penalty acts from the second on.

The denominator rule: restrained tokens stay in the loss mask and in the token-mean denominator (verl aggregates
with the unchanged response mask): Clip-Cov's are zeros of the loss, KL-Cov's carry the extra penalty.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trainer.algos.losses import broadcast_adv, clipped_policy_loss, log_ratio


def token_covariance(
    logp: Tensor,  # [N, T] log π_θ of the sampled tokens
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T] bool, the tokens the means run over
) -> Tensor:  # [N, T] float64, 0 off the mask
    """Cov_t = (Â_t − mean Â)(log π_t − mean log π), both means token-weighted over `mask` (verl's masked_mean over
    the response mask), detached, in float64."""
    mask = mask.bool()
    assert logp.shape == mask.shape, f"logp {tuple(logp.shape)} vs mask {tuple(mask.shape)}"
    a = broadcast_adv(adv, logp).detach().to(torch.float64)
    lp = logp.detach().to(torch.float64)
    n = mask.sum().clamp(min=1)
    zero = torch.zeros((), dtype=torch.float64, device=lp.device)
    a_mean = torch.where(mask, a, zero).sum() / n
    lp_mean = torch.where(mask, lp, zero).sum() / n
    return torch.where(mask, (a - a_mean) * (lp - lp_mean), zero)


def clip_cov_mask(
    logp: Tensor,  # [N, T]
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T] bool, loss tokens
    *,
    ratio: float = 2e-4,
    lb: float = 1.0,
    ub: float = 5.0,
    clipped: Tensor | None = None,  # [N, T] bool, tokens whose PPO clip is active (never drawn)
    generator: torch.Generator | None = None,
) -> Tensor:  # [N, T] bool: True = the token's loss (and gradient) is set to 0
    """Clip-Cov's draw: among loss tokens with lb < Cov_t < ub (strict, as verl) that are not `clipped`, a uniform
    random subset of min(max(⌊ratio · Σ mask⌋, 1), #candidates) tokens (torch.randperm on `generator`)."""
    assert ratio > 0, f"clip_cov ratio must be > 0, got {ratio}"
    assert lb < ub, f"clip_cov bounds need lb < ub, got lb={lb}, ub={ub}"
    mask = mask.bool()
    cov = token_covariance(logp, adv, mask)
    cand = mask & (cov > lb) & (cov < ub)
    if clipped is not None:
        cand = cand & ~clipped.bool()
    out = torch.zeros_like(mask)
    n_tokens = int(mask.sum())
    if n_tokens == 0:
        return out
    n_draw = max(int(ratio * n_tokens), 1)
    idx = cand.flatten().nonzero().squeeze(1)  # [n] row-major candidate positions
    if idx.numel() == 0:
        return out
    perm = torch.randperm(idx.numel(), generator=generator).to(idx.device)
    out.view(-1)[idx[perm[: min(n_draw, idx.numel())]]] = True
    return out


def kl_cov_mask(
    logp: Tensor,  # [N, T]
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T] bool, loss tokens
    *,
    ratio: float = 2e-3,
) -> Tensor:  # [N, T] bool: True = the token carries the |log r| penalty
    """KL-Cov's top-k: the max(⌊ratio · Σ mask⌋, 1) loss tokens of largest Cov_t (whatever its sign, as verl's
    torch.topk over all loss tokens); ties broken by position, earlier first. Nothing when the mask is empty."""
    assert ratio > 0, f"kl_cov ratio must be > 0, got {ratio}"
    mask = mask.bool()
    out = torch.zeros_like(mask)
    idx = mask.flatten().nonzero().squeeze(1)
    if idx.numel() == 0:
        return out
    cov = token_covariance(logp, adv, mask).flatten()[idx]
    k = max(int(idx.numel() * ratio), 1)
    order = torch.sort(cov, descending=True, stable=True).indices[:k]
    out.view(-1)[idx[order]] = True
    return out


def clip_cov_policy_loss(
    logp: Tensor,  # [N, T] log π_θ (requires grad)
    old_logp: Tensor,  # [N, T] log π_old
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T] bool, loss tokens (for the fallback selection)
    *,
    clip_low: float,
    clip_high: float,
    ratio: float = 2e-4,
    lb: float = 1.0,
    ub: float = 5.0,
    selected: Tensor | None = None,  # [N, T] bool, `clip_cov_mask` over the mini-batch; None: over this batch
) -> tuple[Tensor, dict[str, Tensor]]:  # loss_mat [N, T], stats
    """Clip-Cov per-token loss: the clipped DAPO loss without the dual clip (verl's `compute_policy_loss_clip_cov`
    takes max(pg_losses1, pg_losses2) only), times 0 on the selected tokens (verl's `corr`).

    stats: the clipped loss's (ratio, clipped_low, clipped_high, dual_clipped) and "cov_selected" [N, T] (the
    tokens set to 0). Reduce with the loss mask: the selected tokens stay in the denominator."""
    loss, stats = clipped_policy_loss(logp, old_logp, adv, clip_low=clip_low, clip_high=clip_high)
    if selected is None:
        selected = clip_cov_mask(logp, adv, mask, ratio=ratio, lb=lb, ub=ub,
                                 clipped=stats["clipped_low"] | stats["clipped_high"],
                                 generator=torch.Generator().manual_seed(0))
    assert selected.shape == loss.shape, f"selected {tuple(selected.shape)} vs {tuple(loss.shape)}"
    selected = selected.bool()
    loss = torch.where(selected, torch.zeros((), dtype=loss.dtype, device=loss.device), loss)
    return loss, {**stats, "cov_selected": selected}


def kl_cov_policy_loss(
    logp: Tensor,  # [N, T] log π_θ (requires grad)
    old_logp: Tensor,  # [N, T] log π_old
    adv: Tensor,  # [N] or [N, T]
    mask: Tensor,  # [N, T] bool, loss tokens (for the fallback selection)
    *,
    ratio: float = 2e-3,
    kl_coef: float = 1.0,
    selected: Tensor | None = None,  # [N, T] bool, `kl_cov_mask` over the mini-batch; None: over this batch
) -> tuple[Tensor, dict[str, Tensor]]:  # loss_mat [N, T], stats
    """KL-Cov per-token loss: −Â r everywhere (no ε-clip), plus kl_coef · |log r| on the selected tokens
    (log r = log π_θ − log π_old, clamped to ±20 as every ratio here).

    stats: ratio; clipped_low / clipped_high / dual_clipped all False (no clip); "cov_selected" (penalised)."""
    assert kl_coef >= 0, f"kl_cov coefficient must be >= 0, got {kl_coef}"
    if selected is None:
        selected = kl_cov_mask(logp, adv, mask, ratio=ratio)
    assert selected.shape == logp.shape, f"selected {tuple(selected.shape)} vs {tuple(logp.shape)}"
    selected = selected.bool()
    a = broadcast_adv(adv, logp).to(logp.dtype)
    lr = log_ratio(logp, old_logp)
    ratio_t = torch.exp(lr)
    loss = -a * ratio_t + torch.where(selected, kl_coef * lr.abs(), torch.zeros((), dtype=lr.dtype, device=lr.device))
    no_clip = torch.zeros_like(selected)
    stats = {"ratio": ratio_t.detach(), "clipped_low": no_clip, "clipped_high": no_clip.clone(),
             "dual_clipped": no_clip.clone(), "cov_selected": selected}
    return loss, stats
