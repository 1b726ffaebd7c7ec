"""A step's metrics and per-row records: rewards, lengths, clip fractions, entropies, the rollout log-prob check,
the sync check, and the rows of ``rollouts/step_N.parquet`` (``contracts.records``).

Names say what they count: ``ppo/clipfrac_low`` and ``_high`` are fractions of the loss tokens,
``seeds/*_seed`` and ``*_cont`` split them between seed and continuation tokens, ``rollout/logp_diff_*`` compares
the sampler's log-probs with the trainer's; ``rollout_corr/*`` (the rollout correction's weight, clipped or masked
share, k3 KL and log-perplexity ratio) comes with the update's metrics (``trainer.update.rollout_correction_metrics``).
``seeds/lift_*``, ``seeds/value_*``, ``seeds/rescued*``, ``seeds/all_wrong_fresh`` and ``seeds/zero_adv_*`` are a seeded
step's restart values: its continuations against the fresh group of the same prompt (``contracts.seed_lift``).
"""

from __future__ import annotations

import math

import torch

from contracts.seed_lift import step_summary
from scoring.verdict import UNGRADED_VERDICTS
from trainer.config import Config
from trainer.fsdp import Dist, all_reduce_values, gather_objects_to_main
from trainer.rollout import Rollout, row_key, split_groups
from trainer.update import TokenRecord


def rollout_logp_check(rows: list[Rollout], records: dict[int, TokenRecord], d: Dist) -> dict:
    """``rollout/logp_diff_mean`` and ``_max``: |log pi_sampler - log pi_trainer| over the response tokens the engine
    sampled for this step (seed tokens and stale or off-policy rows excluded), the trainer's side being the log-prob
    the update computed before its first step (``logp_old``). A weight-sync bug or an engine that drifts from the
    trainer (dtype, kernels, temperature handling) shows here first, as in verl's rollout check. This rank's rows
    and records (before the cross-rank gather), then summed and maxed over ranks."""
    total, count, worst = 0.0, 0, 0.0
    for r in rows:
        rec = records.get(row_key(r))
        if r.sampler_logp is None or rec is None:
            continue
        for a, b in zip(r.sampler_logp, rec.logp_old):
            if a == a:   # NaN: a seed token, not sampled now
                x = abs(a - b)
                total, count, worst = total + x, count + 1, max(worst, x)
    t = all_reduce_values([total, count], d)
    worst = all_reduce_values([worst], d, op="max")[0]
    if t[1] == 0:
        return {}
    return {"rollout/logp_diff_mean": t[0] / t[1], "rollout/logp_diff_max": worst, "rollout/logp_tokens": int(t[1])}


def sync_check_metrics(sampler) -> dict:
    """The vLLM engine's account of this step's sync (``VLLMSampler.last_update``): the tensors read back and found
    bit-exact, the probe's log-prob gap between engine and trainer (a metric only: bf16 kernels differ), and the
    bytes sent and seconds taken (``sync/bytes``, ``sync/seconds``)."""
    update = getattr(sampler, "last_update", None) or {}
    if "tensors_checked" not in update:   # the HF engine: it samples from the module itself
        return {}
    out = {"rollout/sync_tensors_checked": update["tensors_checked"],
           "rollout/sync_logp_gap_max": update["probe_logp_diff_max"]}
    # what the sync sent (a LoRA engine: the adapter alone, after the first) and how long it took, probe excluded
    out.update({key: update[name] for key, name in (("sync/bytes", "bytes"), ("sync/seconds", "seconds"))
                if name in update})
    return out


def gather_records(records: dict[int, TokenRecord], d: Dist) -> dict[int, TokenRecord]:
    """Every rank's per-row records, merged on rank 0 (each rank trained a shard of the rows); ``{}`` on the other
    ranks: only rank 0 reads them (the step's metrics, the rollout records it writes)."""
    if not d.enabled:
        return records
    merged = {}
    for part in gather_objects_to_main(records, d) or []:
        merged.update(part)
    return merged


def step_metrics(cfg: Config, all_rows: list[Rollout], kept: list[Rollout], records: dict[int, TokenRecord]) -> dict:
    """Rewards and lengths over every row the step sampled; clip fractions, entropy and token counts over the loss
    tokens of the rows trained on (Thinking Seeds: also split into seed and continuation tokens)."""
    groups = split_groups(all_rows)
    rewards = torch.tensor([r.reward for r in all_rows])
    lens = torch.tensor([len(r.response_ids) for r in all_rows], dtype=torch.float32)
    m = {
        "reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()) if len(all_rows) > 1 else 0.0,
        "reward/correct_frac": sum(r.correct for r in all_rows) / len(all_rows),
        "reward/ungraded": sum(r.verdict in UNGRADED_VERDICTS for r in all_rows),
        "adv/zero_group_frac": sum(len({r.reward for r in g}) == 1 for g in groups) / max(len(groups), 1),
        "response/len_mean": float(lens.mean()),
        "response/truncated_frac": sum(r.finish_reason == "length" for r in all_rows) / len(all_rows),
    }
    tok = {"all": [0, 0, 0, 0.0], "seed": [0, 0, 0, 0.0], "cont": [0, 0, 0, 0.0]}  # count, low, high, entropy
    for r in kept:
        rec = records.get(row_key(r))
        if rec is None:
            continue
        for t, (lm, lo, hi, e) in enumerate(zip(rec.loss_mask, rec.clipped_low, rec.clipped_high, rec.entropy)):
            kinds = ["all", "seed" if t < r.seed_len else "cont"] if r.variant == "seed" else ["all"]
            for k in kinds:
                if lm or (k == "seed"):
                    tok[k][0] += 1
                    tok[k][1] += bool(lo) and bool(lm)
                    tok[k][2] += bool(hi) and bool(lm)
                    tok[k][3] += e
    c, lo, hi, e = tok["all"]
    m.update({"ppo/clipfrac_low": lo / max(c, 1), "ppo/clipfrac_high": hi / max(c, 1), "ppo/entropy": e / max(c, 1),
              "tokens/trained": c})
    if cfg.algorithm == "seeds":
        m.update(seed_lift_metrics(all_rows))
        for k in ("seed", "cont"):
            c, lo, hi, e = tok[k]
            m.update({f"seeds/{k}_tokens": c, f"seeds/clipfrac_low_{k}": lo / max(c, 1),
                      f"seeds/clipfrac_high_{k}": hi / max(c, 1), f"seeds/entropy_{k}": e / max(c, 1)})
    return m


def seed_lift_metrics(all_rows: list[Rollout]) -> dict:
    """A seeded step's restart values over its seeded groups (refills and refresh steps hold none: nothing logged),
    ``contracts.seed_lift.step_summary`` as ``seeds/<key>``: lift_mean / lift_std (over prompts) and lift_prompts,
    value_seeded, value_fresh, all_wrong_fresh, rescued, rescued_share (only when a fresh group is all wrong),
    zero_adv_share (seeded groups) and zero_adv_fresh_share (their fresh groups)."""
    seeded = [r for r in all_rows if r.variant == "seed"]
    if not seeded:
        return {}
    correct = [math.nan if r.verdict in UNGRADED_VERDICTS else float(r.correct) for r in seeded]
    source = [math.nan if r.source_correct is None else float(r.source_correct) for r in seeded]
    summary = step_summary([r.group for r in seeded], correct, source)
    return {f"seeds/{k}": v for k, v in summary.items()}


def record_rows(cfg: Config, step: int, all_rows: list[Rollout], records: dict[int, TokenRecord],
                tokenizer) -> list[dict]:
    """The step's rows as ``contracts.records`` rows (a row the update did not train on: NaN and False tokens)."""
    out = []
    for r in all_rows:
        rec = records.get(row_key(r))
        L = len(r.response_ids)
        nan, false = [math.nan] * L, [False] * L
        out.append({
            "run": cfg.run_name, "step": step, "prompt_id": r.prompt_id, "sample_idx": r.sample_idx,
            "variant": r.variant, "seed_step": r.seed_step, "seed_len": r.seed_len, "trunc_rule": r.trunc_rule,
            "trunc_token_id": r.trunc_token_id,
            "trunc_token_text": None if r.trunc_token_id is None else tokenizer.decode([r.trunc_token_id]),
            "prompt_ids": r.prompt_ids, "response_ids": r.response_ids, "response_text": r.response_text,
            "reward": r.reward, "correct": r.correct, "verdict": r.verdict, "advantage": r.advantage,
            "logp_old": rec.logp_old if rec else nan, "logp_behavior": r.behavior_logp,
            "entropy": rec.entropy if rec else nan, "ratio": rec.ratio if rec else nan,
            "clipped_low": rec.clipped_low if rec else false, "clipped_high": rec.clipped_high if rec else false,
            "loss_mask": rec.loss_mask if rec else false, "finish_reason": r.finish_reason,
            "source_len": r.source_len, "source_correct": r.source_correct,
        })
    return out
