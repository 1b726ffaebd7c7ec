"""The high-entropy-token mask (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
Effective Reinforcement Learning for LLM Reasoning", arXiv:2506.01939): the policy gradient flows only through the
"forking" tokens, the top ρ = 20 % highest-entropy tokens of the batch.

    keep_t = [H_t is among the ⌈ρ·N⌉ largest entropies of the N loss tokens]     (at least 1 when N > 0)

Reference: Shenzhi-Wang/Beyond-the-80-20-Rule-RLVR, `verl/trainer/ppo/core_algos.py:get_global_entropy_top_mask`
(top_k = max(1, int(N·ρ + 0.9999)), torch.topk over the flattened response tokens; `entropy_top_ratio=0.2` in
`recipe/rlvr_with_high_entropy_tokens_only/run_only_top20_high_entropy_tokens_dapo_qwen3_14b.sh`), applied in
`compute_policy_loss_vanilla` as `agg_loss(loss_mask=response_mask * entropy_top_mask)`.

The denominator rule: masked tokens leave the loss mask (`trainer.algos.loss_mask(..., entropy_keep=)`) and hence the
token-mean denominator Σ m, as the reference's agg_loss divides by the masked count: with token-mean the loss is the
mean over the kept 20 %. The seq-mean modes keep counting responses; token-sum-norm keeps N · max_len. The mask
applies to the policy loss; the entropy bonus keeps the response tokens and the KL penalty the policy loss's mask.

Composition: the mask is taken among the tokens that already enter the loss (Thinking Seeds' "state" drops seed
tokens first, masked IS its dropped tokens), so it works with every `LOSSES` entry. The reference computes it per
micro-batch from the current forward's entropies; here it covers a whole mini-batch (every micro-batch and rank),
from the no-grad forward of the current policy at the mini-batch's start (`trainer.update.entropy_keep_masks`), so
the split does not change the gradient.
"""

from __future__ import annotations

import typing
from typing import Literal

import torch
from torch import Tensor

TokenMask = Literal["none", "high_entropy"]   # the config's `token_mask`
TOKEN_MASKS = typing.get_args(TokenMask)


def high_entropy_count(n_tokens: int, ratio: float) -> int:
    """How many of n loss tokens the mask keeps: max(1, int(n·ρ + 0.9999)) (the reference's ceiling), 0 for none."""
    assert 0 < ratio <= 1, f"high-entropy ratio must lie in (0, 1], got {ratio}"
    return 0 if n_tokens == 0 else min(n_tokens, max(1, int(n_tokens * ratio + 0.9999)))


def high_entropy_mask(
    entropy: Tensor,  # [N, T] per-token entropy H_t of the policy
    mask: Tensor,  # [N, T] bool, the tokens that enter the loss
    *,
    ratio: float = 0.2,
) -> Tensor:  # [N, T] bool: True = the token stays in the loss
    """The ⌈ratio · Σ mask⌉ (`high_entropy_count`) tokens of `mask` with the largest entropy; False elsewhere (padding
    included). Ties are broken by position, earlier first (a stable sort), so the mask is deterministic."""
    mask = mask.bool()
    assert entropy.shape == mask.shape, f"entropy {tuple(entropy.shape)} vs mask {tuple(mask.shape)}"
    out = torch.zeros_like(mask)
    idx = mask.flatten().nonzero().squeeze(1)
    k = high_entropy_count(idx.numel(), ratio)
    if k == 0:
        return out
    h = entropy.detach().flatten()[idx].to(torch.float64)
    order = torch.sort(h, descending=True, stable=True).indices[:k]
    out.view(-1)[idx[order]] = True
    return out
