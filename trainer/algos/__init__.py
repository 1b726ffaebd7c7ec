"""Pure RL math of the trainer: advantages, policy losses, the loss reduction, entropies, seeds, M2PO, LUFFY,
rollout correction, the 2025 exploration baselines (Clip-Cov / KL-Cov, pass@k and W-REINFORCE advantages, the
high-entropy-token mask).

torch/numpy only, hyperparameters as keyword arguments, shapes on signatures (N responses, T tokens,
V vocabulary). Orchestration (FSDP, rollout engines, IO) lives above this package.

The trainer's update is three calls into this package (see `objectives.py` for the table):

    mask = loss_mask(response_mask, seed_lens, seed_loss=...)                 # which tokens count, [N, T]
    D = loss_denominator(mask_of_the_whole_step, mode=..., max_len=...)      # once per optimizer step
    loss_mat, stats = LOSSES[algorithm](TokenBatch(...), **hyperparameters)  # per micro-batch, [N, T]
    loss = reduce_loss(loss_mat, mask, mode=..., denominator=D)
    # entropy_coef > 0: − entropy_coef * reduce_loss(entropy, mask, mode="token-mean", denominator=Σ mask of the step)
    # kl_coef > 0: + kl_coef * reduce_loss(kl_penalty(logp, ref_logp, estimator=...), mask, same mode and D)
    # rollout_correction: loss_mat * rollout_weights(...) (tis); loss_mask(..., rollout_keep=rollout_keep(...)) (mis_*)
    # token_mask=high_entropy: loss_mask(..., entropy_keep=high_entropy_mask(entropy, mask, ratio=...))
    # advantages: ADVANTAGES[advantage](rewards, group_ids, **hyperparameters)                # [N]

The building blocks (`clipped_policy_loss`, `kl_penalty`, `luffy_policy_loss`, `m2po_policy_loss`, `m2po_mask`,
`m2po_log_ratio_cap`, the seed masks) stay importable for analysis and tests.
"""

from trainer.algos.advantages import (
    ADVANTAGE_SCALES,
    ADVANTAGES,
    ZERO_ON_MIXED,
    AdvScale,
    Advantage,
    group_advantages,
    max_advantages,
    passk_advantages,
    w_reinforce_advantages,
    zero_variance_groups,
)
from trainer.algos.cov import clip_cov_mask, clip_cov_policy_loss, kl_cov_mask, kl_cov_policy_loss, token_covariance
from trainer.algos.entropy import logprobs_and_entropy, token_entropy, token_logprobs
from trainer.algos.high_entropy import TOKEN_MASKS, TokenMask, high_entropy_count, high_entropy_mask
from trainer.algos.kl import KL_ESTIMATORS, KlEstimator, kl_penalty
from trainer.algos.losses import (
    AGGREGATE_MODES,
    LossAgg,
    broadcast_adv,
    clipped_policy_loss,
    loss_denominator,
    masked_mean,
    reduce_loss,
)
from trainer.algos.luffy import luffy_policy_loss
from trainer.algos.m2po import M2PO_VARIANTS, M2poVariant, m2po_log_ratio_cap, m2po_mask, m2po_policy_loss
from trainer.algos.objectives import (
    COV_ALGORITHMS,
    LOSSES,
    STALE_LOSSES,
    Algorithm,
    StaleLoss,
    TokenBatch,
    loss_mask,
)
from trainer.algos.rollout_correction import (
    MASKING_CORRECTIONS,
    MISMATCH_SUMS,
    ROLLOUT_CORRECTIONS,
    RolloutCorrection,
    rollout_keep,
    rollout_log_ratio,
    rollout_mismatch_metrics,
    rollout_mismatch_sums,
    rollout_weights,
)
from trainer.algos.restarts import (
    CYCLE_SOURCES,
    SEED_SOURCES,
    SEED_TRIGGERS,
    SeedSource,
    SeedTrigger,
    adaptive_ratios,
    arm_means,
    choose_arms,
    new_arm_stats,
    update_arm_stats,
)
from trainer.algos.seeds import (
    SEED_LOSS_VARIANTS,
    SEED_RULES,
    CachedResponse,
    Cut,
    CutBatch,
    SeedLoss,
    SeedRule,
    SourceResponse,
    adaptive_cut,
    entropy_cut,
    entropy_seed_lengths,
    ratio_cut,
    ratio_seed_lengths,
    seed_loss_mask,
    seed_old_logp,
    seed_token_mask,
    token_factor,
    top_entropy_positions,
)

__all__ = [
    "ADVANTAGES",
    "ADVANTAGE_SCALES",
    "AGGREGATE_MODES",
    "COV_ALGORITHMS",
    "KL_ESTIMATORS",
    "LOSSES",
    "M2PO_VARIANTS",
    "MASKING_CORRECTIONS",
    "MISMATCH_SUMS",
    "ROLLOUT_CORRECTIONS",
    "SEED_LOSS_VARIANTS",
    "SEED_RULES",
    "SEED_SOURCES",
    "SEED_TRIGGERS",
    "CYCLE_SOURCES",
    "STALE_LOSSES",
    "TOKEN_MASKS",
    "ZERO_ON_MIXED",
    "AdvScale",
    "Advantage",
    "Algorithm",
    "CachedResponse",
    "Cut",
    "CutBatch",
    "KlEstimator",
    "LossAgg",
    "M2poVariant",
    "RolloutCorrection",
    "SeedLoss",
    "SeedRule",
    "SeedSource",
    "SourceResponse",
    "SeedTrigger",
    "adaptive_cut",
    "adaptive_ratios",
    "arm_means",
    "choose_arms",
    "new_arm_stats",
    "update_arm_stats",
    "StaleLoss",
    "TokenBatch",
    "TokenMask",
    "broadcast_adv",
    "clip_cov_mask",
    "clip_cov_policy_loss",
    "clipped_policy_loss",
    "entropy_cut",
    "entropy_seed_lengths",
    "group_advantages",
    "high_entropy_count",
    "high_entropy_mask",
    "kl_cov_mask",
    "kl_cov_policy_loss",
    "kl_penalty",
    "logprobs_and_entropy",
    "loss_denominator",
    "loss_mask",
    "luffy_policy_loss",
    "m2po_log_ratio_cap",
    "m2po_mask",
    "m2po_policy_loss",
    "masked_mean",
    "max_advantages",
    "passk_advantages",
    "ratio_cut",
    "ratio_seed_lengths",
    "reduce_loss",
    "rollout_keep",
    "rollout_log_ratio",
    "rollout_mismatch_metrics",
    "rollout_mismatch_sums",
    "rollout_weights",
    "seed_loss_mask",
    "seed_old_logp",
    "seed_token_mask",
    "token_entropy",
    "token_factor",
    "token_covariance",
    "token_logprobs",
    "top_entropy_positions",
    "w_reinforce_advantages",
    "zero_variance_groups",
]
