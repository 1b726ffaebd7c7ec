"""Pure RL math of the trainer: advantages, policy losses, aggregation, entropies, seeds, M2PO, LUFFY.

torch/numpy only, hyperparameters as keyword arguments, shapes on signatures (N responses, T tokens,
V vocabulary). Orchestration (FSDP, rollout engines, IO) lives above this package.

POLICY_LOSSES maps a loss name to its per-token loss. All entries share one calling convention:

    loss_mat, stats = fn(logp, denom_logp, adv, *extra, **hyperparameters)    # loss_mat [N, T]

    name    denom_logp [N, T]                    extra                         hyperparameters
    dapo    log π_old (log π_b on seed tokens)   — (none)                      clip_low, clip_high, clip_c
    m2po    log π_behavior                       mask [N, T] response tokens   tau, keep
    luffy   log π_old                            off_policy [N] or [N, T]      gamma

and every `stats` holds "ratio", "clipped_low" and "clipped_high" ([N, T], detached). Reduce loss_mat with
`aggregate(loss_mat, response_or_seed_mask, normalizer=...)` (for M2PO the response mask: its denominator
counts dropped tokens too).
"""

from trainer.algos.advantages import ADVANTAGE_SCALES, group_advantages, zero_variance_groups
from trainer.algos.entropy import logprobs_and_entropy, token_entropy, token_logprobs
from trainer.algos.losses import (
    AGGREGATE_MODES,
    aggregate,
    aggregate_normalizer,
    broadcast_adv,
    clipped_policy_loss,
    masked_mean,
)
from trainer.algos.luffy import luffy_policy_loss
from trainer.algos.m2po import m2po_mask, m2po_policy_loss
from trainer.algos.seeds import (
    SEED_LOSS_VARIANTS,
    entropy_seed_lengths,
    ratio_seed_lengths,
    seed_loss_mask,
    seed_old_logp,
    seed_token_mask,
    token_factor,
    top_entropy_positions,
)

POLICY_LOSSES = {
    "dapo": clipped_policy_loss,
    "m2po": m2po_policy_loss,
    "luffy": luffy_policy_loss,
}

__all__ = [
    "ADVANTAGE_SCALES",
    "AGGREGATE_MODES",
    "POLICY_LOSSES",
    "SEED_LOSS_VARIANTS",
    "aggregate",
    "aggregate_normalizer",
    "broadcast_adv",
    "clipped_policy_loss",
    "entropy_seed_lengths",
    "group_advantages",
    "logprobs_and_entropy",
    "luffy_policy_loss",
    "m2po_mask",
    "m2po_policy_loss",
    "masked_mean",
    "ratio_seed_lengths",
    "seed_loss_mask",
    "seed_old_logp",
    "seed_token_mask",
    "token_entropy",
    "token_factor",
    "token_logprobs",
    "top_entropy_positions",
    "zero_variance_groups",
]
