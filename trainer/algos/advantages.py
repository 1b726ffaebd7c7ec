"""Group-relative advantages (GRPO / DAPO, DESIGN §2 "DAPO objective").

    Â_i = (R_i − mean_g(R)) / (std_g(R) + ε)

where g is the group (prompt) of response i and std is the unbiased (N−1) estimator, as in verl's
`compute_grpo_outcome_advantage`. Every token of o_i gets the same Â_i; the caller broadcasts.
"""

from __future__ import annotations

import typing
from typing import Literal

import torch
from torch import Tensor

AdvScale = Literal["std", "none"]   # the config's `adv_scale` is typed with this
ADVANTAGE_SCALES = typing.get_args(AdvScale)


def _group_index(group_ids: Tensor) -> tuple[Tensor, int]:  # group_ids [N] -> inverse [N], num groups
    """Map arbitrary (unsorted, non-contiguous) group ids to 0..G−1."""
    assert group_ids.dim() == 1, f"group_ids must be 1-D [N], got shape {tuple(group_ids.shape)}"
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    return inverse, uniq.numel()


def group_advantages(
    rewards: Tensor,  # [N] float
    group_ids: Tensor,  # [N] long, any ids
    *,
    scale: str = "std",
    eps: float = 1e-6,
) -> Tensor:  # [N], dtype of rewards (float32 when rewards are not floating)
    """Group-normalised advantages, DESIGN §2: Â_i = (R_i − mean_g R) / (std_g R + eps).

    scale="std" divides by the unbiased group std plus `eps`; scale="none" returns R_i − mean_g R (LUFFY's
    script, Dr. GRPO). A group of a single response gets 0 in both modes (its std is undefined and the
    response carries no relative signal). Vectorised with index_add over the groups; statistics in float64.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; valid: {', '.join(ADVANTAGE_SCALES)}")
    assert rewards.dim() == 1 and rewards.shape == group_ids.shape, (
        f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must both be [N]"
    )
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=out_dtype, device=rewards.device)

    inverse, num_groups = _group_index(group_ids)
    r = rewards.detach().to(torch.float64)
    counts = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(0, inverse, torch.ones_like(r))
    sums = torch.zeros_like(counts).index_add_(0, inverse, r)
    centered = r - (sums / counts)[inverse]
    no_signal = _all_equal(r, inverse, num_groups)[inverse]  # includes singletons
    if scale == "std":
        sq = torch.zeros_like(counts).index_add_(0, inverse, centered * centered)
        std = (sq / (counts - 1).clamp(min=1)).sqrt()
        centered = centered / (std[inverse] + eps)
    centered = torch.where(no_signal, torch.zeros_like(centered), centered)
    return centered.to(out_dtype)


def zero_variance_groups(
    rewards: Tensor,  # [N] float
    group_ids: Tensor,  # [N] long, any ids
) -> Tensor:  # [N] bool
    """True for responses whose group has all-equal rewards (zero advantage for every member).

    This is the event of Lemma 4 (D(p) = p^G + (1−p)^G) and what DAPO's dynamic sampling drops; a singleton
    group counts as zero-variance. The metric `adv/zero_group_frac` is the fraction of groups flagged.
    """
    assert rewards.dim() == 1 and rewards.shape == group_ids.shape, (
        f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must both be [N]"
    )
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=rewards.device)
    inverse, num_groups = _group_index(group_ids)
    return _all_equal(rewards.detach().to(torch.float64), inverse, num_groups)[inverse]


def _all_equal(r: Tensor, inverse: Tensor, num_groups: int) -> Tensor:  # [N], [N], G -> [G] bool
    lo = torch.full((num_groups,), float("inf"), dtype=r.dtype, device=r.device)
    hi = torch.full((num_groups,), float("-inf"), dtype=r.dtype, device=r.device)
    lo = lo.scatter_reduce(0, inverse, r, reduce="amin")
    hi = hi.scatter_reduce(0, inverse, r, reduce="amax")
    return hi == lo
