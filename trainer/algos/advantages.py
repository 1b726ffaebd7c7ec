"""Per-response advantages, behind one table (a plain dict): the config's `advantage` names the entry.

    ADVANTAGES[advantage](rewards [N], group_ids [N], **adv_kwargs(cfg)) -> Â [N]

    name         Â_i                                                                     hyperparameters
    grpo         (R_i − mean_g R) / (std_g R + ε)  (GRPO / DAPO, docs/method.md)         scale (adv_scale)
    passk        Pass@k Training's analytical advantage (Chen et al. 2025, arXiv:2508.10751)  k (passk_k)
    grpo_passk   the group's best response gets (R_max − R_2nd) / (std_g R + ε), the rest 0  scale (adv_scale)
                 (verl's `grpo_passk`, which cites Tang et al. 2025, arXiv:2503.19595)
    w_reinforce  +λ for a correct response, −1 for a wrong one, no baseline                 positive_weight (λ)
                 (Zhu et al. 2025, arXiv:2506.01347)

g is the group (prompt) of response i and std the unbiased (N−1) estimator, as in verl's
`compute_grpo_outcome_advantage`. Every token of o_i gets the same Â_i; the caller broadcasts. passk and
w_reinforce are defined for binary rewards R ∈ {0, 1} (the references key on R == 1 / R == 0) and refuse others.
"""

from __future__ import annotations

import math
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
    """Group-normalised advantages (docs/method.md, DAPO): Â_i = (R_i − mean_g R) / (std_g R + eps).

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


def passk_advantages(
    rewards: Tensor,  # [N] float in {0, 1}
    group_ids: Tensor,  # [N] long, any ids
    *,
    k: int,
    eps: float = 1e-6,
) -> Tensor:  # [N] float32
    """Pass@k Training with analytical derivation (Chen et al. 2025, arXiv:2508.10751, §4; the reference is
    RUCAIBox/Passk_Training `code/passk_adv.py:calc_adv`). Per group of N responses with N_neg wrong ones:

        R̄ = 1 − C(N_neg, k) / C(N, k)                  the expected pass@k reward of a random k-subset
        σ = sqrt(R̄ (1 − R̄))
        Â_pos = (1 − R̄) / (σ + ε)
        Â_neg = (1 − R̄ − C(N_neg − 1, k − 1) / C(N − 1, k − 1)) / (σ + ε)

    i.e. Â_i = (E[max R over a random k-subset that holds i] − R̄) / σ. An all-correct or all-wrong group gets 0
    (σ = 0 and the numerators vanish), as does a group with N_neg < k (every k-subset holds a correct response).
    k = 1 is GRPO's advantage with the population std. A group smaller than k is an error. Binomials exact
    (math.comb), statistics in float64.
    """
    _check_binary(rewards, "passk")
    assert k >= 1, f"pass@k needs k >= 1, got {k}"
    inverse, num_groups = _group_index(group_ids)
    r = rewards.detach().to(torch.float64).cpu()
    out = torch.zeros_like(r)
    for g in range(num_groups):
        idx = (inverse.cpu() == g).nonzero().squeeze(1)
        n, n_neg = idx.numel(), int((r[idx] == 0).sum())
        if n < k:
            raise ValueError(f"pass@k advantages need at least k={k} responses per group, got a group of {n}; "
                             f"lower passk_k or raise samples_per_prompt")
        rbar = 1.0 - math.comb(n_neg, k) / math.comb(n, k)
        sigma = math.sqrt(rbar * (1.0 - rbar))
        a_pos = (1.0 - rbar) / (sigma + eps)
        a_neg = (1.0 - rbar - math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1)) / (sigma + eps) if n_neg else 0.0
        out[idx] = torch.where(r[idx] == 1, torch.tensor(a_pos, dtype=torch.float64),
                               torch.tensor(a_neg, dtype=torch.float64))
    return out.to(torch.float32).to(rewards.device)


def max_advantages(
    rewards: Tensor,  # [N] float
    group_ids: Tensor,  # [N] long, any ids
    *,
    scale: str = "std",
    eps: float = 1e-6,
) -> Tensor:  # [N] float32
    """verl's `grpo_passk` (`verl/trainer/ppo/core_algos.py:compute_grpo_passk_outcome_advantage`, after Tang et al.
    2025, arXiv:2503.19595): in each group only the best response gets a non-zero advantage,

        Â_{i*} = (R_max − R_2nd) / (std_g R + ε)   (scale="std", verl's norm_adv_by_std_in_grpo=True; "none": no
                                                    division), every other Â = 0,

    with std the unbiased estimator (torch.std, as verl). Ties at the maximum give R_max − R_2nd = 0, so which of
    them is "best" does not matter. A group of one response is an error (verl's ValueError)."""
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"unknown advantage scale {scale!r}; valid: {', '.join(ADVANTAGE_SCALES)}")
    inverse, num_groups = _group_index(group_ids)
    r = rewards.detach().to(torch.float64).cpu()
    out = torch.zeros_like(r)
    for g in range(num_groups):
        idx = (inverse.cpu() == g).nonzero().squeeze(1)
        if idx.numel() < 2:
            raise ValueError(f"grpo_passk needs at least 2 responses per group, got a group of {idx.numel()}")
        top = torch.topk(r[idx], 2)
        adv = float(top.values[0] - top.values[1])
        if scale == "std":
            adv = adv / (float(r[idx].std()) + eps)
        out[idx[top.indices[0]]] = adv
    return out.to(torch.float32).to(rewards.device)


def w_reinforce_advantages(
    rewards: Tensor,  # [N] float in {0, 1}
    group_ids: Tensor,  # [N] long (unused: no baseline; the table's shared signature)
    *,
    positive_weight: float = 0.1,
) -> Tensor:  # [N] float32
    """Weighted REINFORCE (Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
    Reasoning", arXiv:2506.01347): L = λ·L_PSR + L_NSR, i.e. Â_i = λ on a correct response (R = 1) and −1 on a wrong
    one (R = 0), no group baseline and no std; λ = 0.1 in the paper (reference: TianHongZXY/RLVR-Decomposed
    `verl/trainer/ppo/core_algos.py:compute_psr_nsr_outcome_advantage`, advantage="weighted",
    positive_advantage_weight=0.1 in its run scripts). λ = 0 is NSR alone, λ = 1 REINFORCE with ±1 rewards. An
    all-correct or all-wrong group keeps its signal (no baseline), so dynamic sampling would drop usable groups."""
    _check_binary(rewards, "w_reinforce")
    assert positive_weight >= 0, f"positive_weight (lambda) must be >= 0, got {positive_weight}"
    assert rewards.shape == group_ids.shape, f"rewards {tuple(rewards.shape)} vs group_ids {tuple(group_ids.shape)}"
    r = rewards.detach().to(torch.float32)
    return torch.where(r == 1, torch.full_like(r, positive_weight), torch.full_like(r, -1.0))


def _check_binary(rewards: Tensor, name: str) -> None:
    assert rewards.dim() == 1, f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}"
    bad = rewards[(rewards != 0) & (rewards != 1)]
    if bad.numel():
        raise ValueError(f"the {name} advantage is defined for binary rewards in {{0, 1}}, got {float(bad[0]):g}; use "
                         f"advantage=grpo with shaped or graded rewards (overlong_buffer_tokens, code_reward=klear)")


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


Advantage = Literal["grpo", "passk", "grpo_passk", "w_reinforce"]   # the config's `advantage`: the keys of ADVANTAGES
# the entries that can give EVERY response of a verdict-mixed group Â = 0, so dynamic sampling reads their advantages
# (trainer/sampling.py): passk when N_neg < k (every k-subset holds a correct response), grpo_passk when two responses
# tie at the best reward. grpo gives a mixed group non-zero advantages, w_reinforce every group
ZERO_ON_MIXED = ("passk", "grpo_passk")
ADVANTAGES = {
    "grpo": group_advantages,
    "passk": passk_advantages,
    "grpo_passk": max_advantages,
    "w_reinforce": w_reinforce_advantages,
}
assert tuple(ADVANTAGES) == typing.get_args(Advantage), "every advantage has one ADVANTAGES entry"
