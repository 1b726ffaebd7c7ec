"""Every algorithm's per-token policy loss, behind one table (docs/method.md; a plain dict, no registry).

    loss_mat, stats = LOSSES[algorithm](batch, **hyperparameters)             # loss_mat [N, T]
    loss = reduce_loss(loss_mat, loss_mask(...), mode=..., denominator=...)    # trainer/algos/losses.py

    name    per-token loss ℓ_{i,t}                                       hyperparameters
    dapo    −min(r Â, clip(r, 1−ε_low, 1+ε_high) Â),  r = π_θ / π_old,     clip_low, clip_high, clip_ratio_c
            capped at −Â·c where Â < 0 (the dual clip, c = clip_ratio_c; 0 = off)
    seeds   the same with r = π_θ / π_b on seed tokens t < m_i (Eq. 5);   clip_low, clip_high, clip_ratio_c,
            stale_loss="m2po": M2PO's loss on seed tokens instead            stale_loss, tau, m2po_variant
    luffy   −Â·r on on-policy tokens (no clip), −Â·π/(π+γ) off-policy     gamma
    m2po    r = π_θ / π_behavior, no dual clip; variant="paper": −Â·r·keep, tau, variant
            keep = M2PO's mask (no ε-clip); "released": the clip at
            [e^−c, e^c], c from the second-moment budget (trainer/algos/m2po.py)
    clip_cov  DAPO's loss without the dual clip (verl's clip_cov), 0 on    clip_low, clip_high,
            a random ⌊r·N⌋ of the tokens with ω_low < Cov < ω_high         ratio, lb, ub
            (Cui et al. 2025, arXiv:2505.22617)
    kl_cov  −Â·r, + β|log r| on the ⌊k·N⌋ tokens of largest Cov        ratio, kl_coef
            (no clip; Cov = (Â − mean Â)(log π_θ − mean log π_θ))

Every entry is a pure function of a `TokenBatch` (tensors only) and keyword hyperparameters; every `stats`
holds "ratio", "clipped_low" and "clipped_high" ([N, T], detached).

Which tokens enter the loss is not the loss function's business: `loss_mask` decides it from the rows alone
(response tokens, less the seed tokens under Thinking Seeds' "state" variant), before any forward, because the
denominator of the step (`loss_denominator`) must count them over all micro-batches before the first backward.
The seed-loss variant of paper Eq. 5 is therefore the mask: "state+action" trains seed tokens with
r = π_θ / π_b, "state" masks them out of the loss and of the token-mean denominator. M2PO's dropped tokens are
zeros of its loss, not holes in the mask, so its denominator counts all tokens; so are Clip-Cov's restrained tokens
(KL-Cov's carry a penalty), whose selection (`trainer/algos/cov.py`) the trainer takes over the whole mini-batch
and passes as `TokenBatch.cov_selected`.

The high-entropy mask (``trainer/algos/high_entropy.py``, config ``token_mask=high_entropy``; Wang et al. 2025)
composes with every entry the same way: its dropped tokens leave ``loss_mask`` (``entropy_keep=``) and the
token-mean denominator.

Rollout correction (``trainer/algos/rollout_correction.py``) composes with every entry from outside the table:
truncated IS multiplies ``loss_mat`` by min(π_old/π_sampler, C) on sampled tokens, masked IS removes tokens from
``loss_mask`` (``rollout_keep=``), so they leave the token-mean denominator as the "state" seed tokens do. That
mask reads π_old, so under mis_* the trainer takes its no-grad forward of the batch before the first backward.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from trainer.algos.cov import clip_cov_policy_loss, kl_cov_policy_loss
from trainer.algos.losses import clipped_policy_loss
from trainer.algos.luffy import luffy_policy_loss
from trainer.algos.m2po import m2po_policy_loss
from trainer.algos.seeds import seed_loss_mask, seed_old_logp, seed_token_mask

StaleLoss = Literal["clip", "m2po"]   # the config's `seed_stale_loss`
STALE_LOSSES = typing.get_args(StaleLoss)


@dataclass(frozen=True)
class TokenBatch:
    """The tensors of one micro-batch that a policy loss reads (N responses, T response tokens)."""

    logp: Tensor  # [N, T] log π_θ of the sampled tokens (requires grad)
    old_logp: Tensor  # [N, T] log π_old (no grad)
    adv: Tensor  # [N] advantages Â_i
    response_mask: Tensor  # [N, T] bool, response tokens
    seed_lens: Tensor | None = None  # [N] long, seed lengths m_i (0: no seed); seeds
    behavior_logp: Tensor | None = None  # [N, T] log π_b (seeds: seed tokens) / π_behavior (m2po); NaN where none
    off_policy: Tensor | None = None  # [N] bool, LUFFY's external traces
    keep: Tensor | None = None  # [N, T] bool, M2PO's keep-mask over the whole step (None: over this batch)
    log_ratio_cap: Tensor | None = None  # [] M2PO "released": the clip's |log r| bound over the whole step (None: this batch)
    cov_selected: Tensor | None = None  # [N, T] bool, Clip-Cov's / KL-Cov's tokens of the mini-batch (None: this one)

    def need(self, *names: str, algorithm: str) -> None:
        missing = [n for n in names if getattr(self, n) is None]
        assert not missing, f"the {algorithm} loss needs TokenBatch.{', '.join(missing)}"


def loss_mask(
    response_mask: Tensor,  # [N, T] bool
    seed_lens: Tensor,  # [N] long, 0 on rows without a seed
    *,
    seed_loss: str,
    rollout_keep: Tensor | None = None,  # [N, T] bool, masked IS's kept tokens (`rollout_correction.rollout_keep`)
    entropy_keep: Tensor | None = None,  # [N, T] bool, the high-entropy tokens (`high_entropy.high_entropy_mask`)
) -> Tensor:  # [N, T] bool
    """Tokens that enter the policy loss and its token-mean denominator, for every algorithm: the response
    tokens, less the seed tokens (t < m_i) when seed_loss is "state", less the sampled tokens masked IS drops
    (``rollout_keep``: rollout_correction=mis_*; they leave the denominator too), less the tokens outside the
    high-entropy minority (``entropy_keep``: token_mask=high_entropy, taken among the tokens the first two rules
    keep; they leave the denominator too). Rows without a seed (m_i = 0, every row outside Thinking Seeds) keep all
    their response tokens."""
    mask = seed_loss_mask(response_mask, seed_lens, variant=seed_loss)
    for name, keep in (("rollout_keep", rollout_keep), ("entropy_keep", entropy_keep)):
        if keep is not None:
            assert keep.shape == mask.shape, f"{name} {tuple(keep.shape)} vs {tuple(mask.shape)}"
            mask = mask & keep.bool()
    return mask


def dapo_loss(
    b: TokenBatch, *, clip_low: float, clip_high: float, clip_ratio_c: float = 0.0
) -> tuple[Tensor, dict[str, Tensor]]:  # loss_mat [N, T], stats
    """On-policy DAPO: the clipped loss with r = π_θ / π_old and verl's dual clip (docs/method.md "DAPO, the
    on-policy base")."""
    return clipped_policy_loss(b.logp, b.old_logp, b.adv, clip_low=clip_low, clip_high=clip_high,
                               clip_ratio_c=clip_ratio_c)


def seeds_loss(
    b: TokenBatch,
    *,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float = 0.0,
    stale_loss: str = "clip",
    tau: float = 0.04,
    m2po_variant: str = "paper",
) -> tuple[Tensor, dict[str, Tensor]]:  # loss_mat [N, T], stats
    """Thinking Seeds, paper Eq. 5: the DAPO clipped loss (with the dual clip `clip_ratio_c`) with r = π_θ / π_b
    on seed tokens (cached behavior log-probs) and r = π_θ / π_old on continuation tokens.

    stale_loss="m2po": seed tokens take M2PO's loss of `m2po_variant` instead (`m2po_policy_loss` over the seed
    tokens: "paper" −Â·π_θ/π_b on the tokens its keep-mask `b.keep` keeps and 0 on dropped ones; "released" its
    clip at `b.log_ratio_cap`; both over the whole step, None: over this batch's seed tokens with `tau`); "clip" is
    the paper's setting. stats are the clipped loss's (ratio = π_θ / π_b on seed tokens).
    """
    assert stale_loss in STALE_LOSSES, f"stale_loss must be one of {STALE_LOSSES}, got {stale_loss!r}"
    b.need("seed_lens", "behavior_logp", algorithm="seeds")
    behavior = b.behavior_logp.nan_to_num(0.0)  # only seed positions are read
    denom = seed_old_logp(b.old_logp, behavior, b.seed_lens)
    loss, stats = clipped_policy_loss(b.logp, denom, b.adv, clip_low=clip_low, clip_high=clip_high,
                                      clip_ratio_c=clip_ratio_c)
    if stale_loss == "m2po":
        seed = seed_token_mask(b.response_mask, b.seed_lens)
        stale, _ = m2po_policy_loss(b.logp, behavior, b.adv, seed, tau=tau, variant=m2po_variant, keep=b.keep,
                                    log_ratio_cap=b.log_ratio_cap)
        loss = torch.where(seed, stale, loss)
    return loss, stats


def luffy_loss(b: TokenBatch, *, gamma: float) -> tuple[Tensor, dict[str, Tensor]]:  # loss_mat [N, T], stats
    """LUFFY: −Â·r on on-policy tokens, −Â·π/(π+γ) on off-policy traces (`trainer/algos/luffy.py`)."""
    b.need("off_policy", algorithm="luffy")
    return luffy_policy_loss(b.logp, b.old_logp, b.adv, b.off_policy, gamma=gamma)


def m2po_loss(
    b: TokenBatch, *, tau: float, variant: str = "paper"
) -> tuple[Tensor, dict[str, Tensor]]:  # loss_mat [N, T], stats
    """M2PO on stale rows (`trainer/algos/m2po.py`): variant "paper" −Â·π_θ/π_behavior on kept tokens, 0 on
    dropped ones, no ε-clip (`b.keep`: the mask over the whole step); "released" the ratio clipped to [e^−c, e^c]
    (`b.log_ratio_cap`: c over the whole step). None: computed over this batch."""
    b.need("behavior_logp", algorithm="m2po")
    return m2po_policy_loss(b.logp, b.behavior_logp, b.adv, b.response_mask, tau=tau, variant=variant, keep=b.keep,
                            log_ratio_cap=b.log_ratio_cap)


def clip_cov_loss(
    b: TokenBatch,
    *,
    clip_low: float,
    clip_high: float,
    ratio: float = 2e-4,
    lb: float = 1.0,
    ub: float = 5.0,
) -> tuple[Tensor, dict[str, Tensor]]:  # loss_mat [N, T], stats
    """Clip-Cov (Cui et al. 2025, arXiv:2505.22617; verl's `compute_policy_loss_clip_cov`): DAPO's clipped loss with
    r = π_θ / π_old and no dual clip (verl's has none), set to 0 on the tokens `b.cov_selected` marks (None: drawn
    over this batch's response tokens, `trainer/algos/cov.py`). stats add "cov_selected"."""
    return clip_cov_policy_loss(b.logp, b.old_logp, b.adv, b.response_mask, clip_low=clip_low, clip_high=clip_high,
                                ratio=ratio, lb=lb, ub=ub, selected=b.cov_selected)


def kl_cov_loss(
    b: TokenBatch, *, ratio: float = 2e-3, kl_coef: float = 1.0
) -> tuple[Tensor, dict[str, Tensor]]:  # loss_mat [N, T], stats
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617; verl's `compute_policy_loss_kl_cov`): −Â·r, no clip, plus
    kl_coef·|log r| on the tokens `b.cov_selected` marks (None: the top-k over this batch). stats add
    "cov_selected"."""
    return kl_cov_policy_loss(b.logp, b.old_logp, b.adv, b.response_mask, ratio=ratio, kl_coef=kl_coef,
                              selected=b.cov_selected)


Algorithm = Literal["dapo", "seeds", "luffy", "m2po", "clip_cov", "kl_cov"]   # the config's `algorithm`: LOSSES' keys
COV_ALGORITHMS = ("clip_cov", "kl_cov")   # the entries whose token selection spans the mini-batch (cov_selected)
LOSSES = {
    "dapo": dapo_loss,
    "seeds": seeds_loss,
    "luffy": luffy_loss,
    "m2po": m2po_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
}
assert tuple(LOSSES) == typing.get_args(Algorithm), "every algorithm has one LOSSES entry"
