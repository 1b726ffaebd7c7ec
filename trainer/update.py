"""The update of one rollout batch: advantages, the micro-batch loop (loss, backward), the optimizer steps.

Every algorithm's per-token loss is one entry of ``trainer.algos.LOSSES`` (hyperparameters from
``trainer.config.loss_kwargs``), reduced by ``reduce_loss`` over the one denominator of the whole mini-batch
(``loss_denominator``: all its micro-batches and ranks), so neither the micro-batch split nor the world size changes
the gradient. This module builds the tensors, looks the loss up and calls it; the optimizer is AdamW with
a warmup and a constant or cosine schedule.

With ``kl_coef > 0`` the loss also holds ``kl_coef`` times the KL penalty to the frozen reference policy
(``trainer.algos.kl_penalty``, reduced over the same tokens and denominator as the policy loss, as verl's
``use_kl_loss`` adds ``kl_loss_coef * agg_loss(kld)``): the reference log-probs are one no-grad forward of the
reference (``score``) per rollout batch, before the first update; ``actor/kl`` is the estimate's token-mean over
the response tokens of the batch. The entropy bonus (``entropy_coef``) is a token mean over the loss tokens with its
own step-wide count, whatever ``loss_agg`` is (LUFFY's, beside its sum / max length), and Prefix-RFT's prefix term
(``seed_prefix_sft_coef``) a token mean over the step's reference-prefix tokens.

``rollout_correction`` (``trainer.algos.rollout_correction``) corrects the sampler-vs-trainer mismatch on the tokens
the engine sampled: ``tis`` multiplies each token's policy loss by min(pi_old / pi_sampler, C); the ``mis_*`` modes
drop tokens or whole responses from the loss mask, and so from the step's token-mean denominator. That mask must be
known before the first backward, so under ``mis_*`` pi_old is the no-grad forward taken before the update (as with
mini-batching). ``rollout_corr/*`` (mean weight, share clipped or masked, k3 KL, log-perplexity ratio) is logged
every step, under ``none`` too.

The 2025 exploration baselines plug in at the same seams: the advantage is ``ADVANTAGES[cfg.advantage]``
(``assign_advantages``; pass@k, verl's grpo_passk, W-REINFORCE); ``clip_cov``/``kl_cov`` are ``LOSSES`` entries whose
token selection (``cov_masks``) and ``token_mask=high_entropy``'s kept tokens (``entropy_keep_masks``) are computed
over the whole mini-batch from one no-grad forward of the current policy at its start (the pi_old forward for the
first mini-batch), before its first backward, so the denominator and every micro-batch see the same masks. They log
``clip_cov/*``, ``kl_cov/*`` and ``entropy_mask/*``.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import torch

from inference.batching import micro_batches
from trainer.algos import (ADVANTAGES, COV_ALGORITHMS, LOSSES, MASKING_CORRECTIONS, MISMATCH_SUMS, TokenBatch,
                           clip_cov_mask, clipped_policy_loss, high_entropy_mask, kl_cov_mask, kl_penalty,
                           loss_denominator, loss_mask, m2po_log_ratio_cap, m2po_mask, reduce_loss, rollout_keep,
                           rollout_mismatch_metrics, rollout_mismatch_sums, rollout_weights, seed_token_mask)
from trainer.config import Config, adv_kwargs, loss_kwargs
from trainer.fsdp import Dist, all_reduce_values, clip_grad_norm, reshard
from trainer.lora import disabled_adapters
from trainer.policy import _DTYPES, response_logprobs, score, use_flat
from trainer.rollout import Rollout, row_key, split_groups


@dataclass
class TokenRecord:
    """One row's per-token values from the update, each a list over its L response tokens: what the rollout records
    store (``contracts.records``) and the step's metrics read."""
    logp_old: list[float]       # log pi_old: the trainer's log-prob before the step's first optimizer update
    entropy: list[float]
    ratio: list[float]          # the loss's ratio (r, or LUFFY's f(pi) on off-policy tokens)
    clipped_low: list[bool]
    clipped_high: list[bool]
    loss_mask: list[bool]       # the tokens the loss counts
    kl: list[float] | None = None   # the KL penalty's per-token estimate (kl_coef > 0), else None


class MiniBatchResult(NamedTuple):
    loss: float                         # the mini-batch's loss summed over this rank's micro-batches
    records: dict[int, TokenRecord]     # by ``row_key``: this rank's rows


class UpdateResult(NamedTuple):
    metrics: dict                       # ppo/loss (mean over ranks and mini-batches), ppo/grad_norm, ppo/lr
    records: dict[int, TokenRecord]     # by ``row_key``: this rank's rows


def assign_advantages(rows: list[Rollout], cfg: Config) -> None:
    rewards = torch.tensor([r.reward for r in rows], dtype=torch.float32)
    groups = torch.tensor([r.group for r in rows], dtype=torch.long)
    adv = ADVANTAGES[cfg.advantage](rewards, groups, **adv_kwargs(cfg))
    for r, a in zip(rows, adv.tolist()):
        r.advantage = a


def _stack(rows: list[Rollout], values: list[list[float]] | None, R: int, fill=math.nan) -> torch.Tensor:
    out = torch.full((len(rows), R), fill, dtype=torch.float32)  # [n, R]
    if values is not None:
        for i, v in enumerate(values):
            if v is not None:
                out[i, : len(v)] = torch.as_tensor(v, dtype=torch.float32)
    return out


def token_batch(rows: list[Rollout], logp, old_logp, resp_mask, keep=None, cov_selected=None,
                log_ratio_cap: float | None = None) -> TokenBatch:
    """The tensors of a micro-batch's rows that the policy losses read (``trainer.algos.TokenBatch``)."""
    dev, R = logp.device, logp.shape[1]
    return TokenBatch(
        logp=logp, old_logp=old_logp, response_mask=resp_mask,
        adv=torch.tensor([r.advantage for r in rows], dtype=torch.float32, device=dev),
        seed_lens=torch.tensor([r.seed_len for r in rows], dtype=torch.long, device=dev),
        behavior_logp=_stack(rows, [r.behavior_logp for r in rows], R).to(dev),
        off_policy=torch.tensor([r.off_policy for r in rows], dtype=torch.bool, device=dev),
        keep=keep,
        cov_selected=cov_selected,
        log_ratio_cap=None if log_ratio_cap is None else torch.tensor(log_ratio_cap, dtype=torch.float64),
    )


def _seed_lens(rows: list[Rollout]) -> torch.Tensor:  # [n] long
    return torch.tensor([r.seed_len for r in rows], dtype=torch.long)


def _response_mask(rows: list[Rollout]) -> torch.Tensor:  # [n, longest response] bool
    lengths = torch.tensor([len(r.response_ids) for r in rows], dtype=torch.long)
    return torch.arange(max(1, int(lengths.max()))).unsqueeze(0) < lengths.unsqueeze(1)


def _mask_of(rows: list[Rollout], masks: dict | None, R: int, device=None, fill: bool = True) -> torch.Tensor | None:
    """Per-row boolean lists (by ``row_key``) stacked to [n, R] (``fill`` past a row's end), or None."""
    if masks is None:
        return None
    return _stack(rows, [masks[row_key(r)] for r in rows], R, float(fill)).bool().to(device or "cpu")


def rows_loss_mask(cfg: Config, rows: list[Rollout], rollout_kept: dict | None = None,
                   entropy_kept: dict | None = None) -> torch.Tensor:
    """The loss mask [n, longest response] of rows (for the step's denominator): from their lengths, less the tokens
    masked IS drops (``rollout_kept``, by ``row_key``: ``rollout_keep_masks``; None: none dropped) and those outside
    the high-entropy minority (``entropy_kept``: ``entropy_keep_masks``; None: none dropped)."""
    resp = _response_mask(rows)
    R = resp.shape[1]
    return loss_mask(resp, torch.tensor([r.seed_len for r in rows], dtype=torch.long), seed_loss=cfg.seed_loss,
                     rollout_keep=_mask_of(rows, rollout_kept, R), entropy_keep=_mask_of(rows, entropy_kept, R))


def rollout_keep_masks(cfg: Config, rows: list[Rollout], old: dict | None) -> dict | None:
    """Masked IS's kept tokens of every row of the mini-batch (``rollout_correction=mis_*``; None otherwise), from
    pi_old before the update (``old``) and the sampler's log-probs: computed once, so the denominator and every
    micro-batch's mask are the same tensor's."""
    if cfg.rollout_correction not in MASKING_CORRECTIONS:
        return None
    assert old is not None, f"rollout_correction={cfg.rollout_correction} needs old= (pi_old before the update)"
    resp = _response_mask(rows)
    R = resp.shape[1]
    keep = rollout_keep(_stack(rows, [old[row_key(r)] for r in rows], R, 0.0),
                        _stack(rows, [r.sampler_logp for r in rows], R), resp,
                        mode=cfg.rollout_correction, cap=cfg.rollout_correction_cap)
    return {row_key(r): keep[i, : len(r.response_ids)].tolist() for i, r in enumerate(rows)}


def needs_scores(cfg: Config) -> bool:
    """Whether each mini-batch needs the current policy's log-probs and entropies before its first backward: the
    token selections of Clip-Cov / KL-Cov and of the high-entropy mask span the whole mini-batch."""
    return cfg.algorithm in COV_ALGORITHMS or cfg.token_mask != "none"


def entropy_keep_masks(cfg: Config, rows: list[Rollout], ent: dict | None, old: dict | None) -> dict | None:
    """``token_mask=high_entropy``: the ``high_entropy_ratio`` highest-entropy tokens among the mini-batch's loss tokens
    (after the seed and masked-IS rules), from the entropies ``ent`` (by ``row_key``) of the current policy at the
    mini-batch's start; None under ``token_mask=none``."""
    if cfg.token_mask == "none":
        return None
    assert ent is not None, "token_mask=high_entropy needs the entropies before the update (ent=)"
    base = rows_loss_mask(cfg, rows, rollout_keep_masks(cfg, rows, old))
    H = _stack(rows, [ent[row_key(r)] for r in rows], base.shape[1], 0.0)
    keep = high_entropy_mask(H, base, ratio=cfg.high_entropy_ratio)
    return {row_key(r): keep[i, : len(r.response_ids)].tolist() for i, r in enumerate(rows)}


def cov_masks(cfg: Config, rows: list[Rollout], cur: dict | None, old: dict | None, entropy_kept: dict | None, *,
              draw: int = 0) -> dict | None:
    """Clip-Cov's / KL-Cov's selected tokens of the mini-batch (``trainer.algos.clip_cov_mask`` / ``kl_cov_mask``) over
    its loss tokens, from the current policy's log-probs ``cur`` at the mini-batch's start and the advantages; None
    for the other algorithms. Clip-Cov never draws a token whose PPO clip is active against ``old`` (the loss's
    pi_old; None: the current policy, r = 1) and draws on a generator seeded with ``draw``, the same on every rank."""
    if cfg.algorithm not in COV_ALGORITHMS:
        return None
    assert cur is not None, f"algorithm={cfg.algorithm} needs the log-probs before the update (cur=)"
    mask = rows_loss_mask(cfg, rows, rollout_keep_masks(cfg, rows, old), entropy_kept)
    R = mask.shape[1]
    logp = _stack(rows, [cur[row_key(r)] for r in rows], R, 0.0)
    adv = torch.tensor([r.advantage for r in rows], dtype=torch.float32)
    if cfg.algorithm == "kl_cov":
        sel = kl_cov_mask(logp, adv, mask, ratio=cfg.kl_cov_ratio)
    else:
        old_t = logp if old is None else _stack(rows, [old[row_key(r)] for r in rows], R, 0.0)
        _, st = clipped_policy_loss(logp, old_t, adv, clip_low=cfg.clip_low, clip_high=cfg.clip_high)
        sel = clip_cov_mask(logp, adv, mask, ratio=cfg.clip_cov_ratio, lb=cfg.clip_cov_lb, ub=cfg.clip_cov_ub,
                            clipped=st["clipped_low"] | st["clipped_high"],
                            generator=torch.Generator().manual_seed(draw))
    return {row_key(r): sel[i, : len(r.response_ids)].tolist() for i, r in enumerate(rows)}


def selection_counts(cfg: Config, rows: list[Rollout], old: dict | None, entropy_kept: dict | None,
                     cov: dict | None, ent: dict | None) -> dict[str, float]:
    """The additive counts behind ``entropy_mask/*``, ``clip_cov/*`` and ``kl_cov/*`` for one mini-batch (every rank
    holds the same masks, so no collective): loss tokens before and after the high-entropy mask, the smallest kept
    entropy, and the tokens Clip-Cov / KL-Cov restrain among the loss tokens."""
    out: dict[str, float] = {}
    if entropy_kept is not None:
        base = rows_loss_mask(cfg, rows, rollout_keep_masks(cfg, rows, old))
        kept = rows_loss_mask(cfg, rows, rollout_keep_masks(cfg, rows, old), entropy_kept)
        H = _stack(rows, [ent[row_key(r)] for r in rows], base.shape[1], 0.0)
        out.update({"entropy_base": float(base.sum()), "entropy_kept": float(kept.sum()),
                    "entropy_threshold": float(H[kept].min()) if kept.any() else math.nan})
    if cov is not None:
        mask = rows_loss_mask(cfg, rows, rollout_keep_masks(cfg, rows, old), entropy_kept)
        sel = _mask_of(rows, cov, mask.shape[1], fill=False) & mask
        out.update({"cov_tokens": float(mask.sum()), "cov_selected": float(sel.sum())})
    return out


def selection_metrics(cfg: Config, counts: list[dict[str, float]]) -> dict:
    """The step's ``entropy_mask/kept_share`` and ``/threshold`` (mean over mini-batches of the smallest kept entropy),
    ``clip_cov/selected_share`` (tokens whose loss Clip-Cov sets to 0) or ``kl_cov/selected_share`` (tokens KL-Cov
    penalises), each a share of the loss tokens, with the token counts."""
    out = {}
    if cfg.token_mask != "none" and counts:
        base = sum(c["entropy_base"] for c in counts)
        thr = [c["entropy_threshold"] for c in counts if not math.isnan(c["entropy_threshold"])]
        out["entropy_mask/kept_share"] = sum(c["entropy_kept"] for c in counts) / max(base, 1.0)
        out["entropy_mask/kept_tokens"] = int(sum(c["entropy_kept"] for c in counts))
        if thr:
            out["entropy_mask/threshold"] = sum(thr) / len(thr)
    if cfg.algorithm in COV_ALGORITHMS and counts:
        n = sum(c["cov_tokens"] for c in counts)
        sel = sum(c["cov_selected"] for c in counts)
        out[f"{cfg.algorithm}/selected_share"] = sel / max(n, 1.0)
        out[f"{cfg.algorithm}/selected_tokens"] = int(sel)
    return out


def backward_minibatch(model, cfg: Config, rows: list[Rollout], d: Dist, *, pad_id: int,
                       old: dict | None = None, keep: dict | None = None, ref: dict | None = None,
                       entropy_kept: dict | None = None, cov: dict | None = None,
                       m2po_cap: float | None = None) -> MiniBatchResult:
    """Accumulate the gradient of one mini-batch (every rank holds all its rows and trains a strided shard).

    The loss is ``LOSSES[cfg.algorithm]`` reduced by ``reduce_loss`` over the denominator of the whole mini-batch
    (all micro-batches and ranks), so neither the micro-batch split nor the world size changes the gradient.
    ``old``/``keep``: per-row old log-probs and M2PO keep masks computed before the first update (keyed by
    ``row_key``); ``m2po_cap``: the released M2PO's |log r| bound over the mini-batch (``m2po_log_ratio_caps``);
    ``ref``: per-row log-probs of the KL penalty's reference policy (needed when ``cfg.kl_coef > 0``);
    ``entropy_kept``: the high-entropy mask's kept tokens (``entropy_keep_masks``; needed under
    ``token_mask=high_entropy``); ``cov``: Clip-Cov's / KL-Cov's selected tokens (``cov_masks``; needed then).
    A rank with fewer micro-batches than the others runs dummy ones (loss times 0) so every rank calls the same
    collectives.
    """
    agg = cfg.loss_agg
    assert not cfg.kl_coef or ref is not None, "kl_coef > 0 needs the reference log-probs (ref=)"
    assert cfg.token_mask == "none" or entropy_kept is not None, \
        "token_mask=high_entropy needs the kept tokens of the mini-batch (entropy_kept=entropy_keep_masks(...))"
    assert cfg.algorithm not in COV_ALGORITHMS or cov is not None, \
        f"algorithm={cfg.algorithm} needs the selected tokens of the mini-batch (cov=cov_masks(...))"
    kept = rollout_keep_masks(cfg, rows, old)   # mis_*: the tokens masked IS keeps, before the first backward
    step_mask = rows_loss_mask(cfg, rows, kept, entropy_kept)
    denom = loss_denominator(step_mask, mode=agg, max_len=cfg.max_response_tokens)
    # the entropy bonus is a token mean over the loss tokens whatever loss_agg is (LUFFY's mix_actor.py:
    # masked_mean(entropy, response_mask) beside a policy loss summed over tokens / max length), so its own
    # denominator: the step's loss-token count (= denom under token-mean)
    ent_denom = loss_denominator(step_mask, mode="token-mean")
    if cfg.seed_prefix_sft_coef:   # Prefix-RFT's supervised term: a token mean over the step's reference-prefix tokens
        prefix_denom = loss_denominator(seed_token_mask(_response_mask(rows), _seed_lens(rows)), mode="token-mean")
    policy_loss, hyper = LOSSES[cfg.algorithm], loss_kwargs(cfg)
    forward = "flat" if use_flat(model, cfg.train_forward) else "model"
    split, n_mbs = micro_batches([(len(r.prompt_ids), len(r.response_ids)) for r in rows], rows=cfg.micro_batch_size,
                                 tokens=cfg.micro_batch_tokens, rank=d.rank, world_size=d.world_size,
                                 prompt_keys=[tuple(r.prompt_ids) for r in rows] if forward == "flat" else None)
    mbs = [[rows[i] for i in mb] for mb in split]
    total, records = 0.0, {}
    for b in range(n_mbs):
        dummy = b >= len(mbs)
        mb = mbs[b] if not dummy else rows[d.rank::d.world_size][:1] or rows[:1]
        logp, ent, resp_mask = response_logprobs(model, [r.prompt_ids for r in mb], [r.response_ids for r in mb],
                                                 pad_id=pad_id, device=d.device, temperature=cfg.temperature,
                                                 entropy_grad=bool(cfg.entropy_coef), forward=forward)  # [n, R] each
        R = logp.shape[1]
        old_logp = logp.detach() if old is None else _stack(mb, [old[row_key(r)] for r in mb], R, 0.0).to(logp.device)
        keep_t = None if keep is None else _stack(mb, [keep[row_key(r)] for r in mb], R, 0.0).to(logp.device).bool()
        batch = token_batch(mb, logp, old_logp, resp_mask, keep_t, _mask_of(mb, cov, R, logp.device, fill=False),
                            m2po_cap)
        mask = loss_mask(resp_mask, batch.seed_lens, seed_loss=cfg.seed_loss,
                         rollout_keep=_mask_of(mb, kept, R, logp.device),
                         entropy_keep=_mask_of(mb, entropy_kept, R, logp.device))
        loss_mat, stats = policy_loss(batch, **hyper)
        # tis: min(pi_old / pi_sampler, C) on the sampled tokens, 1 elsewhere (and under every other mode)
        weight = rollout_weights(old_logp, _stack(mb, [r.sampler_logp for r in mb], R).to(logp.device), resp_mask,
                                 mode=cfg.rollout_correction, cap=cfg.rollout_correction_cap)
        loss = reduce_loss(loss_mat * weight, mask, mode=agg, denominator=denom)
        if cfg.entropy_coef:  # the bonus: a token mean over the step's loss tokens (seeds "state": continuations)
            loss = loss - cfg.entropy_coef * reduce_loss(ent, mask, mode="token-mean", denominator=ent_denom)
        if cfg.seed_prefix_sft_coef:  # + coef * NLL of the reference prefix (seed_source=external: seeds are its cuts)
            prefix = seed_token_mask(resp_mask, batch.seed_lens)
            loss = loss + cfg.seed_prefix_sft_coef * reduce_loss(-logp, prefix, mode="token-mean",
                                                                 denominator=prefix_denom)
        kl = None
        if cfg.kl_coef:  # the penalty: over the policy loss's tokens and denominator (padding: x = 0 there)
            ref_logp = _stack(mb, [ref[row_key(r)] for r in mb], R, 0.0).to(logp.device)
            ref_logp = torch.where(resp_mask, ref_logp, logp.detach())
            kl = kl_penalty(logp, ref_logp, estimator=cfg.kl_estimator)  # [n, R]
            loss = loss + cfg.kl_coef * reduce_loss(kl, mask, mode=agg, denominator=denom)
        if dummy:
            loss = loss * 0.0
        loss.backward()
        if dummy:
            continue
        total += float(loss.detach())
        for i, r in enumerate(mb):
            L = len(r.response_ids)
            records[row_key(r)] = TokenRecord(
                logp_old=old_logp[i, :L].tolist(), entropy=ent[i, :L].detach().tolist(),
                ratio=stats["ratio"][i, :L].tolist(), clipped_low=stats["clipped_low"][i, :L].tolist(),
                clipped_high=stats["clipped_high"][i, :L].tolist(), loss_mask=mask[i, :L].tolist(),
                kl=None if kl is None else kl[i, :L].detach().tolist())
    return MiniBatchResult(total, records)


def rollout_correction_metrics(cfg: Config, rows: list[Rollout], records: dict[int, TokenRecord], d: Dist) -> dict:
    """``rollout_corr/*`` over the tokens the engine sampled for this step (``trainer.algos.rollout_mismatch_sums``):
    this rank's rows, pi_old as the update used it (``TokenRecord.logp_old``), summed over ranks. {} when nothing was
    sampled now (an all-stale M2PO batch). Every rank calls the one collective."""
    mine = [r for r in rows if row_key(r) in records and r.sampler_logp is not None]
    sums = dict.fromkeys(MISMATCH_SUMS, 0.0)
    if mine:
        resp = _response_mask(mine)
        R = resp.shape[1]
        sums = rollout_mismatch_sums(_stack(mine, [records[row_key(r)].logp_old for r in mine], R, 0.0),
                                     _stack(mine, [r.sampler_logp for r in mine], R), resp,
                                     mode=cfg.rollout_correction, cap=cfg.rollout_correction_cap)
    total = all_reduce_values([sums[k] for k in MISMATCH_SUMS], d)
    return rollout_mismatch_metrics(dict(zip(MISMATCH_SUMS, total)), mode=cfg.rollout_correction)


def uses_m2po_mask(cfg: Config) -> bool:
    """Whether the loss reads M2PO's keep-mask (M2PO, or Thinking Seeds with ``seed_stale_loss=m2po``)."""
    return cfg.algorithm == "m2po" or (cfg.algorithm == "seeds" and cfg.seed_stale_loss == "m2po")


def _m2po_inputs(rows: list[Rollout], old: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """log pi before the update, log pi_behavior (0 where none), advantages and the tokens that have a behavior
    log-prob, of every row of the mini-batch: what M2PO's step-level mask and cap read."""
    R = max(len(r.response_ids) for r in rows)
    logp = _stack(rows, [old[row_key(r)] for r in rows], R, 0.0)  # [n, R]
    behavior = _stack(rows, [r.behavior_logp for r in rows], R)  # [n, R], NaN where there is no behavior log-prob
    adv = torch.tensor([r.advantage for r in rows])
    return logp, behavior.nan_to_num(0.0), adv, ~torch.isnan(behavior)


def m2po_keep_masks(cfg: Config, rows: list[Rollout], old: dict) -> dict | None:
    """M2PO's trust-region mask over the whole mini-batch, from log-probs taken before the update (variant "paper";
    None otherwise)."""
    if not uses_m2po_mask(cfg) or cfg.m2po_variant != "paper":
        return None
    logp, behavior, adv, valid = _m2po_inputs(rows, old)
    keep = m2po_mask(logp, behavior, adv, valid, tau=cfg.m2po_tau)
    return {row_key(r): keep[i, : len(r.response_ids)].float().tolist() for i, r in enumerate(rows)}


def m2po_log_ratio_caps(cfg: Config, rows: list[Rollout], old: dict) -> float | None:
    """The released M2PO's |log r| bound over the whole mini-batch (``trainer.algos.m2po_log_ratio_cap``), from
    log-probs taken before the update (variant "released"; None otherwise). The authors' code solves it per
    micro-batch; one value per mini-batch keeps the gradient independent of the split."""
    if not uses_m2po_mask(cfg) or cfg.m2po_variant != "released":
        return None
    logp, behavior, adv, valid = _m2po_inputs(rows, old)
    return m2po_log_ratio_cap(logp, behavior, adv, valid, tau=cfg.m2po_tau)


def update(model, optimizer, scheduler, cfg: Config, rows: list[Rollout], d: Dist, *, pad_id: int,
           ref_model=None) -> UpdateResult:
    """One rollout batch: ``mini_batches_per_step`` optimizer updates over whole groups. ``ref_model``: the frozen
    reference policy of the KL penalty (``trainer.policy.load_reference``; needed when ``cfg.kl_coef > 0``), or the
    policy itself in a LoRA run, scored with its adapters off (``trainer.lora.disabled_adapters``)."""
    groups = split_groups(rows)
    per = math.ceil(len(groups) / cfg.mini_batches_per_step)
    minis = [[r for g in groups[i:i + per] for r in g] for i in range(0, len(groups), per)]
    need_old = (cfg.mini_batches_per_step > 1 or uses_m2po_mask(cfg)
                or cfg.rollout_correction in MASKING_CORRECTIONS)   # mis_*: its mask is the denominator's
    old = scores = None
    if need_old or needs_scores(cfg):  # pi_old before any update of this step
        scores = _scores(model, cfg, rows, d, pad_id)
    if need_old:   # the loss's pi_old; without it (one on-policy update) pi_old = pi_theta.detach(), r = 1 exactly
        old = scores[0]
        if cfg.algorithm == "m2po":
            for r in rows:   # a fresh refill group (refill=fresh): its behavior policy is the current one, r = 1
                if r.behavior_logp is None:
                    r.behavior_logp = old[row_key(r)]
    ref = None
    if cfg.kl_coef:  # log pi_ref: one no-grad forward of the frozen reference, laid out as the policy's
        assert ref_model is not None, "kl_coef > 0 needs ref_model (trainer.policy.load_reference)"
        with disabled_adapters(ref_model):
            ref_lp, _ = score(ref_model, [r.prompt_ids for r in rows], [r.response_ids for r in rows], pad_id=pad_id,
                              micro_batch_size=cfg.micro_batch_size, d=d, temperature=cfg.temperature,
                              micro_batch_tokens=cfg.micro_batch_tokens, forward=cfg.train_forward)
        ref = {row_key(r): lp.tolist() for r, lp in zip(rows, ref_lp)}
        reshard(ref_model)   # its gathered root unit is not needed until the next step
    losses, norms, records, counts = [], [], {}, []
    for i, mini in enumerate(minis):
        optimizer.zero_grad(set_to_none=True)
        keep = m2po_keep_masks(cfg, mini, old) if old is not None else None
        cap = m2po_log_ratio_caps(cfg, mini, old) if old is not None else None
        ent_kept = cov = None
        if needs_scores(cfg):   # the current policy at this mini-batch's start: pi_old's forward for the first one
            cur, ent = scores if i == 0 else _scores(model, cfg, mini, d, pad_id)
            ent_kept = entropy_keep_masks(cfg, mini, ent, old)
            cov = cov_masks(cfg, mini, cur, old, ent_kept, draw=cfg.seed * 1_000_003 + scheduler.last_epoch * 1_009 + i)
            counts.append(selection_counts(cfg, mini, old, ent_kept, cov, ent))
        loss, rec = backward_minibatch(model, cfg, mini, d, pad_id=pad_id, old=old, keep=keep, ref=ref,
                                       entropy_kept=ent_kept, cov=cov, m2po_cap=cap)
        norms.append(float(clip_grad_norm(model, cfg.max_grad_norm)))
        optimizer.step()
        losses.append(loss)
        records.update(rec)
    scheduler.step()
    loss = all_reduce_values([sum(losses) / len(losses)], d)[0]
    metrics = {"ppo/loss": loss, "ppo/grad_norm": sum(norms) / len(norms), "ppo/lr": scheduler.get_last_lr()[0]}
    if cfg.kl_coef:  # token-mean over every response token of the batch, all ranks
        total, count = all_reduce_values([sum(sum(r.kl) for r in records.values()),
                                          sum(len(r.kl) for r in records.values())], d)
        metrics["actor/kl"] = total / max(count, 1)
    metrics.update(rollout_correction_metrics(cfg, rows, records, d))
    metrics.update(selection_metrics(cfg, counts))
    return UpdateResult(metrics, records)


def _scores(model, cfg: Config, rows: list[Rollout], d: Dist, pad_id: int) -> tuple[dict, dict]:
    """No-grad log-probs and entropies of the current policy for ``rows`` (every rank gets all), by ``row_key``."""
    logp, ent = score(model, [r.prompt_ids for r in rows], [r.response_ids for r in rows], pad_id=pad_id,
                      micro_batch_size=cfg.micro_batch_size, d=d, temperature=cfg.temperature,
                      micro_batch_tokens=cfg.micro_batch_tokens, forward=cfg.train_forward)
    return ({row_key(r): lp.tolist() for r, lp in zip(rows, logp)},
            {row_key(r): h.tolist() for r, h in zip(rows, ent)})


def make_optimizer(model, cfg: Config) -> torch.optim.Optimizer:
    """AdamW, fused (one kernel over all parameters) on CPU and CUDA: torch's default on CPU is a Python loop of
    ~10 small ops per parameter tensor, 4x slower even at one thread and far slower when threads are contended.
    Its moments take the parameters' dtype: the master dtype (``master_dtype``, fp32 unless pure bf16)."""
    params = [p for p in model.parameters() if p.requires_grad]
    master = _DTYPES[cfg.master_dtype]
    wrong = sorted({str(p.dtype) for p in params if p.is_floating_point() and p.dtype != master})
    assert not wrong, f"parameters in {wrong}, master_dtype={cfg.master_dtype}: build the model in the master dtype"
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, fused=fused)


def make_scheduler(optimizer, cfg: Config):
    """Linear warmup over ``warmup_steps``, then constant or cosine to 0 at ``total_steps`` (``lr_schedule``)."""
    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "cosine":
            progress = (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def skip_update(scheduler) -> None:
    """A step whose sampling bound was hit with no informative group: no optimizer update, but the schedule follows
    steps, updated or not (torch warns about a scheduler step without an optimizer step: intended here)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
        scheduler.step()
