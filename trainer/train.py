"""GRPO/DAPO training with Thinking Seeds, LUFFY and M2PO: the entry point, read top to bottom.

    python -m trainer.train --config trainer/configs/tiny.yaml [key=value ...] [--dry-run]
    torchrun --nproc_per_node N -m trainer.train --config ... (FSDP2: fully_shard per decoder layer + root)

config -> distributed init -> data -> model -> rollout engine -> loop (sample, reward, advantage, loss, step,
log, checkpoint). Everything is vanilla DAPO (clip-higher, token-mean over the global token count, dynamic
sampling, optional overlong shaping and mini-batching) except these departures, each behind one config field:

* ``algorithm=seeds`` (Thinking Seeds, the paper's method): ``trainer/algos/seeds.py`` plus
  ``RolloutBuilder._refresh/_seeded`` in ``trainer/rollout.py``. Every ``seed_refresh_interval`` (T) steps the
  current policy writes G responses for the prompts of the next T batches (behavior log-probs and entropies from
  one no-grad trainer forward, or from the sampler with ``behavior_logprobs=sampler``); batch s+j (j >= 1) cuts
  each cached response (``seed_rule`` ratio | entropy) and
  the current policy continues. ``seed_loss=state+action``: seed tokens enter the clipped loss with
  r = pi_theta / pi_behavior, continuation tokens with r = pi_theta / pi_old; ``state``: seed tokens are masked.
* ``algorithm=luffy``: groups mix G-1 on-policy samples with 1 off-policy trace (``off_policy_key`` column);
  off-policy tokens use f(pi) = pi/(pi+gamma) (``trainer/algos/luffy.py``), on-policy tokens are unclipped.
* ``algorithm=m2po``: trains on rollouts written ``m2po_staleness`` steps ago, with the second-moment trust-region
  mask and no epsilon-clip (``trainer/algos/m2po.py``); the denominator counts all tokens. Dynamic sampling does not
  refill its stale batch with fresh groups (``refill``, docs/recipes.md); Thinking Seeds' seeded steps refill with
  fresh on-policy prompts unless ``refill=none``.

Every algorithm's per-token loss is one entry of the table ``trainer.algos.LOSSES`` (pure functions,
``trainer/algos/objectives.py``; hyperparameters from ``trainer.config.loss_kwargs``), reduced by
``reduce_loss`` over the one denominator of the optimizer step (``loss_denominator``: token-mean over the global
token count, seq-mean, or LUFFY's sum / max length), the entropy bonus included. This file builds the tensors,
looks the loss up and calls it.

Log-probs come from the padding-free, shared-prompt forward of ``inference/flat.py`` for Llama/Qwen2/Qwen3 models
(``train_forward=auto``; the same function as the model's own forward, which ``train_forward=model`` and
unsupported or sharded models use).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path

import torch

from inference.batching import micro_batches
from inference.hub import ModelSourceError
from trainer import checkpoint as ckpt
from trainer.algos import (LOSSES, TokenBatch, group_advantages, loss_denominator, loss_mask, m2po_mask,
                           reduce_loss)
from trainer.config import Config, ConfigError, dump_config, load_config, loss_kwargs, to_dict, validate
from trainer.data import PromptLoader, load_examples
from trainer.fsdp import (Dist, all_gather_objects, all_gather_objects_patiently, all_reduce_values, barrier,
                          clip_grad_norm, compute_dtype, copy_full_weights, init_distributed, shutdown)
from trainer.policy import _DTYPES, resolve_dtype, response_logprobs, score, use_flat
from trainer.rollout import Rollout, RolloutBuilder, off_policy_ids
from scoring.verdict import UNGRADED_VERDICTS


# ----------------------------------------------------------------------------------------------------------
# the update: advantages, loss, backward
# ----------------------------------------------------------------------------------------------------------
def assign_advantages(rows: list[Rollout], cfg: Config) -> None:
    rewards = torch.tensor([r.reward for r in rows], dtype=torch.float32)
    groups = torch.tensor([r.group for r in rows], dtype=torch.long)
    adv = group_advantages(rewards, groups, scale=cfg.adv_scale)
    for r, a in zip(rows, adv.tolist()):
        r.advantage = a


def split_groups(rows: list[Rollout]) -> list[list[Rollout]]:
    groups: dict[int, list[Rollout]] = {}
    for r in rows:
        groups.setdefault(r.group, []).append(r)
    return list(groups.values())


def row_key(r: Rollout) -> int:
    """The key of a row's per-row records: its ``uid`` (the same on every rank, set by ``collect_step``); rows built
    by hand that never went through it (tests, library callers of ``backward_minibatch``) are keyed by their
    identity, valid within this process only."""
    return r.uid if r.uid >= 0 else id(r)


def _stack(rows: list[Rollout], values: list[list[float]] | None, R: int, fill=math.nan) -> torch.Tensor:
    out = torch.full((len(rows), R), fill, dtype=torch.float32)
    if values is not None:
        for i, v in enumerate(values):
            if v is not None:
                out[i, : len(v)] = torch.as_tensor(v, dtype=torch.float32)
    return out


def token_batch(rows: list[Rollout], logp, old_logp, resp_mask, keep=None) -> TokenBatch:
    """The tensors of a micro-batch's rows that the policy losses read (``trainer.algos.TokenBatch``)."""
    dev, R = logp.device, logp.shape[1]
    return TokenBatch(
        logp=logp, old_logp=old_logp, response_mask=resp_mask,
        adv=torch.tensor([r.advantage for r in rows], dtype=torch.float32, device=dev),
        seed_lens=torch.tensor([r.seed_len for r in rows], dtype=torch.long, device=dev),
        behavior_logp=_stack(rows, [r.behavior_logp for r in rows], R).to(dev),
        off_policy=torch.tensor([r.off_policy for r in rows], dtype=torch.bool, device=dev),
        keep=keep,
    )


def rows_loss_mask(cfg: Config, rows: list[Rollout]) -> torch.Tensor:
    """The loss mask [n, longest response] of rows, from their lengths alone (for the step's denominator)."""
    lengths = torch.tensor([len(r.response_ids) for r in rows], dtype=torch.long)
    resp = torch.arange(max(1, int(lengths.max()))).unsqueeze(0) < lengths.unsqueeze(1)
    return loss_mask(resp, torch.tensor([r.seed_len for r in rows], dtype=torch.long), seed_loss=cfg.seed_loss)


def backward_minibatch(model, cfg: Config, rows: list[Rollout], d: Dist, *, pad_id: int,
                       old: dict | None = None, keep: dict | None = None) -> tuple[float, dict]:
    """Accumulate the gradient of one mini-batch (every rank holds all its rows and trains a strided shard).

    The loss is ``LOSSES[cfg.algorithm]`` reduced by ``reduce_loss`` over the denominator of the whole mini-batch
    (all micro-batches and ranks), so neither the micro-batch split nor the world size changes the gradient.
    ``old``/``keep``: per-row old log-probs and M2PO keep masks computed before the first update (keyed by
    ``Rollout.uid``). Returns the summed loss and per-row token records {uid: dict of lists}.
    """
    agg = cfg.loss_agg
    denom = loss_denominator(rows_loss_mask(cfg, rows), mode=agg, max_len=cfg.max_response_tokens)
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
                                                 entropy_grad=bool(cfg.entropy_coef), forward=forward)
        R = logp.shape[1]
        old_logp = logp.detach() if old is None else _stack(mb, [old[row_key(r)] for r in mb], R, 0.0).to(logp.device)
        keep_t = None if keep is None else _stack(mb, [keep[row_key(r)] for r in mb], R, 0.0).to(logp.device).bool()
        batch = token_batch(mb, logp, old_logp, resp_mask, keep_t)
        mask = loss_mask(resp_mask, batch.seed_lens, seed_loss=cfg.seed_loss)
        loss_mat, stats = policy_loss(batch, **hyper)
        loss = reduce_loss(loss_mat, mask, mode=agg, denominator=denom)
        if cfg.entropy_coef:  # the bonus: a token sum over response tokens, over the same denominator
            loss = loss - cfg.entropy_coef * reduce_loss(ent, resp_mask, mode="token-mean", denominator=denom)
        if dummy:
            loss = loss * 0.0
        loss.backward()
        if dummy:
            continue
        total += float(loss.detach())
        for i, r in enumerate(mb):
            L = len(r.response_ids)
            records[row_key(r)] = {
                "logp_old": old_logp[i, :L].tolist(), "entropy": ent[i, :L].detach().tolist(),
                "ratio": stats["ratio"][i, :L].tolist(), "clipped_low": stats["clipped_low"][i, :L].tolist(),
                "clipped_high": stats["clipped_high"][i, :L].tolist(), "loss_mask": mask[i, :L].tolist(),
            }
    return total, records


def uses_m2po_mask(cfg: Config) -> bool:
    """Whether the loss reads M2PO's keep-mask (M2PO, or Thinking Seeds with ``seed_stale_loss=m2po``)."""
    return cfg.algorithm == "m2po" or (cfg.algorithm == "seeds" and cfg.seed_stale_loss == "m2po")


def m2po_keep_masks(cfg: Config, rows: list[Rollout], old: dict) -> dict | None:
    """M2PO's trust-region mask over the whole mini-batch, from log-probs taken before the update."""
    if not uses_m2po_mask(cfg):
        return None
    R = max(len(r.response_ids) for r in rows)
    logp = _stack(rows, [old[row_key(r)] for r in rows], R, 0.0)
    behavior = _stack(rows, [r.behavior_logp for r in rows], R)
    valid = ~torch.isnan(behavior)
    adv = torch.tensor([r.advantage for r in rows])
    keep = m2po_mask(logp, behavior.nan_to_num(0.0), adv, valid, tau=cfg.m2po_tau)
    return {row_key(r): keep[i, : len(r.response_ids)].float().tolist() for i, r in enumerate(rows)}


def update(model, optimizer, scheduler, cfg: Config, rows: list[Rollout], d: Dist, *, pad_id: int) -> tuple[dict, dict]:
    """One rollout batch: ``mini_batches_per_step`` optimizer updates over whole groups."""
    groups = split_groups(rows)
    per = math.ceil(len(groups) / cfg.mini_batches_per_step)
    minis = [[r for g in groups[i:i + per] for r in g] for i in range(0, len(groups), per)]
    need_old = cfg.mini_batches_per_step > 1 or uses_m2po_mask(cfg)
    old = None
    if need_old:  # pi_old before any update of this step
        logp, _ = score(model, [r.prompt_ids for r in rows], [r.response_ids for r in rows], pad_id=pad_id,
                        micro_batch_size=cfg.micro_batch_size, d=d, temperature=cfg.temperature,
                        micro_batch_tokens=cfg.micro_batch_tokens, forward=cfg.train_forward)
        old = {row_key(r): lp.tolist() for r, lp in zip(rows, logp)}
        if cfg.algorithm == "m2po":
            for r in rows:   # a fresh refill group (refill=fresh): its behavior policy is the current one, r = 1
                if r.behavior_logp is None:
                    r.behavior_logp = old[row_key(r)]
    losses, norms, records = [], [], {}
    for mini in minis:
        optimizer.zero_grad(set_to_none=True)
        keep = m2po_keep_masks(cfg, mini, old) if old is not None else None
        loss, rec = backward_minibatch(model, cfg, mini, d, pad_id=pad_id, old=old, keep=keep)
        norms.append(float(clip_grad_norm(model, cfg.max_grad_norm)))
        optimizer.step()
        losses.append(loss)
        records.update(rec)
    scheduler.step()
    loss = all_reduce_values([sum(losses) / len(losses)], d)[0]
    return {"ppo/loss": loss, "ppo/grad_norm": sum(norms) / len(norms), "ppo/lr": scheduler.get_last_lr()[0]}, records


# ----------------------------------------------------------------------------------------------------------
# dynamic sampling, metrics, records
# ----------------------------------------------------------------------------------------------------------
def rollout_logp_check(rows: list[Rollout], records: dict, d: Dist) -> dict:
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
        for a, b in zip(r.sampler_logp, rec["logp_old"]):
            if a == a:   # NaN: a seed token, not sampled now
                x = abs(a - b)
                total, count, worst = total + x, count + 1, max(worst, x)
    t = all_reduce_values([total, count], d)
    worst = all_reduce_values([worst], d, op="max")[0]
    if t[1] == 0:
        return {}
    return {"rollout/logp_diff_mean": t[0] / t[1], "rollout/logp_diff_max": worst, "rollout/logp_tokens": int(t[1])}


def filter_groups(rows: list[Rollout]) -> tuple[list[Rollout], int]:
    """Keep groups whose grader verdicts are not all equal (DAPO's dynamic sampling on accuracy: an all-wrong
    group of different lengths has no signal even when overlong shaping spreads its rewards); return kept rows
    and the dropped count."""
    kept, dropped = [], 0
    for g in split_groups(rows):
        if len({r.correct for r in g}) > 1:
            kept.extend(g)
        else:
            dropped += 1
    return kept, dropped


def filter_ungraded(cfg: Config, rows: list[Rollout]) -> tuple[list[Rollout], int]:
    """``ungraded=drop_group``: leave out every group with a row the grader could not grade (its reward would be a
    guess); ``zero``: keep them with reward 0. Returns the rows to go on with and the number of groups left out."""
    if cfg.ungraded == "zero":
        return rows, 0
    kept, dropped = [], 0
    for g in split_groups(rows):
        if any(r.verdict in UNGRADED_VERDICTS for r in g):
            dropped += 1
        else:
            kept.extend(g)
    return kept, dropped


def refills(cfg: Config) -> bool:
    """Whether dynamic sampling replaces dropped groups with fresh on-policy ones (config ``refill``): by default
    yes, except for M2PO, whose batch stays all-stale as in M2PO's experiments (a fresh group there would need
    the current policy as its behavior policy, which ``refill=fresh`` gives it)."""
    return cfg.refill == "fresh" or (cfg.refill == "auto" and cfg.algorithm != "m2po")


def collect_step(builder: RolloutBuilder, cfg: Config, step: int) -> tuple[list[Rollout], list[Rollout], dict]:
    """The step's rows (all of them, for records and zero-advantage statistics) and the rows to train on. Every
    row gets its ``uid``, its index among the step's rows: the same on every rank (all ranks hold all rows)."""
    all_rows, kept, metrics = _collect_step(builder, cfg, step)
    for i, r in enumerate(all_rows):
        r.uid = i
    return all_rows, kept, metrics


def _collect_step(builder: RolloutBuilder, cfg: Config, step: int) -> tuple[list[Rollout], list[Rollout], dict]:
    rows = builder.collect(step)
    all_rows = list(rows)
    rows, ungraded = filter_ungraded(cfg, rows)
    if not cfg.dynamic_sampling:
        return all_rows, rows, {"sampling/groups_kept": len(split_groups(rows)), "sampling/groups_dropped": 0,
                                "sampling/groups_ungraded": ungraded, "sampling/extra_rounds": 0}
    kept, dropped = filter_groups(rows)
    rounds = 1
    while refills(cfg) and len(split_groups(kept)) < cfg.prompts_per_step and rounds < cfg.max_sampling_rounds:
        need = cfg.prompts_per_step - len(split_groups(kept))
        more = builder.fresh(builder.loader.next(need), step, round_=rounds)
        all_rows.extend(more)
        more, ug = filter_ungraded(cfg, more)
        k, dr = filter_groups(more)
        kept.extend(k)
        dropped, ungraded = dropped + dr, ungraded + ug
        rounds += 1
    return all_rows, kept, {"sampling/groups_kept": len(split_groups(kept)), "sampling/groups_dropped": dropped,
                            "sampling/groups_ungraded": ungraded, "sampling/extra_rounds": rounds - 1}


def step_metrics(cfg: Config, all_rows: list[Rollout], kept: list[Rollout], records: dict) -> dict:
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
        for t, (lm, lo, hi, e) in enumerate(zip(rec["loss_mask"], rec["clipped_low"], rec["clipped_high"], rec["entropy"])):
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
        for k in ("seed", "cont"):
            c, lo, hi, e = tok[k]
            m.update({f"seeds/{k}_tokens": c, f"seeds/clipfrac_low_{k}": lo / max(c, 1),
                      f"seeds/clipfrac_high_{k}": hi / max(c, 1), f"seeds/entropy_{k}": e / max(c, 1)})
    return m


def record_rows(cfg: Config, step: int, all_rows: list[Rollout], records: dict, tokenizer) -> list[dict]:
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
            "logp_old": rec["logp_old"] if rec else nan, "logp_behavior": r.behavior_logp,
            "entropy": rec["entropy"] if rec else nan, "ratio": rec["ratio"] if rec else nan,
            "clipped_low": rec["clipped_low"] if rec else false, "clipped_high": rec["clipped_high"] if rec else false,
            "loss_mask": rec["loss_mask"] if rec else false, "finish_reason": r.finish_reason,
        })
    return out


# ----------------------------------------------------------------------------------------------------------
# set-up, resume, loop
# ----------------------------------------------------------------------------------------------------------
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
    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "cosine":
            progress = (step - cfg.warmup_steps) / max(1, cfg.total_steps - cfg.warmup_steps)
            return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        return 1.0
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_rollout_engine(cfg: Config, model, tokenizer, d: Dist, *, sampler_builder=None):
    """The sampler over the trained model (already sharded and loaded). One process: the HF engine shares the
    trained module. Several ranks: the HF engine samples from an unsharded copy in the compute dtype
    (``trainer.policy.engine_copy``: built on the meta device, no fp32 copy) that ``sync_rollout_weights`` fills,
    here and every step; vLLM loads the checkpoint directory itself and is pushed the sharded model's weights.
    ``sampler_builder``: replaces ``inference.make_sampler`` (same signature). Collective on several ranks."""
    from inference import make_sampler, resolve_engine
    from trainer.policy import engine_copy
    make_sampler = sampler_builder or make_sampler
    engine = resolve_engine(cfg.engine, model=model)
    engine_model = model
    if d.enabled and engine == "hf":
        engine_model = engine_copy(model, compute_dtype(model), d.device)
        copy_full_weights(engine_model, model)
    kw = {"ignore_eos": True} if cfg.ignore_eos else {}
    kw["max_batch_size"] = cfg.rollout_batch_size
    if engine == "vllm":
        if d.enabled and not os.path.isdir(str(getattr(model, "name_or_path", "") or "")):
            # each rank's engine loads a model folder and is then pushed the shards; a sharded module cannot be
            # saved as one (a fresh tiny: model without sft_steps has no folder)
            raise ckpt.CheckpointError(f"model={cfg.model}: engine=vllm on {d.world_size} ranks needs a model "
                                       f"folder or hub id for the engines to load (or tiny: with sft_steps > 0)")
        kw["gpu_memory_utilization"] = cfg.vllm_gpu_memory_utilization
        kw["max_model_len"] = cfg.vllm_max_model_len or cfg.max_prompt_tokens + cfg.max_response_tokens
        kw["enable_sleep_mode"] = {"auto": None, "on": True, "off": False}[cfg.vllm_sleep_mode]
        kw["seed"] = cfg.seed
    return make_sampler(engine_model, tokenizer, engine=engine, **kw), engine_model


def train(cfg: Config, d: Dist, *, policy_builder=None, sampler_builder=None, on_step=None) -> Path:
    """Run (or resume) the training run ``cfg`` describes; returns its run directory.

    Library callers (benchmarks, tests) may pass ``policy_builder`` in place of ``trainer.policy.build_policy``
    (``(model_name, *, dtype, seed) -> (model, tokenizer)``; e.g. a model built from a config), ``sampler_builder``
    in place of ``inference.make_sampler``, and ``on_step(metrics)``, called on rank 0 once a step's metrics are
    written."""
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # weight loading/saving bars would drown the training progress bar
    torch.manual_seed(cfg.seed)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    run_dir = cfg.run_dir
    ckpt.check_shared_run_dir(run_dir, d)   # before any expensive work: all ranks write and resume from it
    examples = load_examples(cfg)
    # mixed precision: the model (and so the optimizer state) in master_dtype (fp32), forward/backward in dtype;
    # shard_model installs the casts, the rollout engines sample in dtype (trainer.fsdp.shard_model)
    from inference import make_sampler
    from trainer.policy import compute_dtype_engines, load_for_training, resolve_master_dtype
    dtype = resolve_dtype(cfg.dtype, d.device)
    master = resolve_master_dtype(cfg.master_dtype, dtype)
    # on several ranks each rank reads only its own shard of the weights (built on the meta device, then sharded)
    model, tokenizer = load_for_training(warm_start(cfg, d), d, master=master, compute=dtype, seed=cfg.seed,
                                         builder=policy_builder, gradient_checkpointing=cfg.gradient_checkpointing)
    prompt_ids, kept_examples, data_counts = tokenize_prompts(cfg, examples, tokenizer)
    if d.is_main and any(data_counts.values()):
        print(f"data: {len(kept_examples)} of {len(examples)} prompts kept ({data_counts})", file=sys.stderr)
    sampler, engine_model = make_rollout_engine(cfg, model, tokenizer, d,
                                                sampler_builder=compute_dtype_engines(sampler_builder or make_sampler,
                                                                                      dtype))
    optimizer = make_optimizer(model, cfg)
    scheduler = make_scheduler(optimizer, cfg)
    loader = PromptLoader(len(kept_examples), seed=cfg.seed)
    builder = RolloutBuilder(cfg=cfg, examples=kept_examples, prompt_ids=prompt_ids, loader=loader, sampler=sampler,
                             tokenizer=tokenizer, model=model, d=d)
    start, produced_tokens = 0, 0
    if d.is_main:
        ckpt.remove_partial_saves(run_dir)
    resume_from = ckpt.agree_resume_checkpoint(run_dir, cfg.resume, d)   # rank 0 decides, every rank checks
    if resume_from is not None:
        # each rank reads its own shards of model and optimizer (any world size wrote them), nothing gathered
        state = ckpt.load_checkpoint(resume_from, model=model, optimizer=optimizer, d=d)
        scheduler.load_state_dict(state["scheduler"])
        loader.load_state_dict(state["loader"])
        builder.load_state_dict(state["rollouts"])
        ckpt.set_rng_state(state["rng"], rank=d.rank)
        start, produced_tokens = state["step"] + 1, state["produced_tokens"]
        if d.is_main:
            ckpt.truncate_metrics(run_dir / "metrics.jsonl", state["step"])
            print(f"resumed from {resume_from} at step {start} (saved on {state['world_size']} ranks, resumed on "
                  f"{d.world_size})", file=sys.stderr)
    if d.is_main:
        dump_config(cfg, run_dir / "config.yaml")
        if cfg.train_forward == "auto":   # say which forward the log-probs come from, and why not flat
            from inference.flat import unsupported_reason
            why = unsupported_reason(model)
            print("training forward: " + ("flat (inference/flat.py)" if why is None else f"model's own ({why})"),
                  file=sys.stderr)
    tracker = make_tracker(cfg, run_dir) if d.is_main else None
    bar = None
    if d.is_main and cfg.progress:
        from tqdm import tqdm
        bar = tqdm(total=cfg.total_steps, initial=start, desc=cfg.run_name, dynamic_ncols=True)
    for step in range(start, cfg.total_steps):
        t0 = time.perf_counter()
        sync_rollout_weights(sampler, engine_model, model, d)
        gen_before, behavior_before = builder.generated_tokens, builder.behavior_s
        all_rows, kept, metrics = collect_step(builder, cfg, step)
        metrics.update(sync_check_metrics(sampler))
        if hasattr(sampler, "sleep"):
            sampler.sleep()   # vLLM sleep mode: its GPU memory is the trainer's until the next sync wakes it
        t_gen = time.perf_counter() - t0
        if kept:
            assign_advantages(kept, cfg)
            model.train()
            upd, records = update(model, optimizer, scheduler, cfg, kept, d, pad_id=tokenizer.pad_token_id)
            metrics.update(upd)
            metrics.update(rollout_logp_check(kept, records, d))
        else:  # the sampling bound was hit with no informative group: no update, logged
            records = {}
            with warnings.catch_warnings():   # the schedule follows steps, updated or not: intended, not a bug
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step()`")
                scheduler.step()
            metrics["sampling/skipped_update"] = 1
        produced_tokens += sum(len(r.response_ids) for r in all_rows)
        records = _gather_records(records, d)
        t_step = time.perf_counter() - t0
        if d.is_main:
            metrics.update(step_metrics(cfg, all_rows, kept, records))
            if cfg.algorithm == "luffy":
                metrics["data/luffy_prompts_dropped"] = data_counts["luffy_trace_too_long"]
            metrics.update({"step": step, "tokens/generated": builder.generated_tokens - gen_before,
                            "time/step_s": t_step, "time/gen_s": t_gen, "time/train_s": t_step - t_gen,
                            "time/behavior_s": builder.behavior_s - behavior_before})   # inside time/gen_s
            if cfg.algorithm == "seeds":
                metrics["seeds/token_factor"] = builder.generated_tokens / max(produced_tokens, 1)
            if cfg.log_rollouts:
                from contracts.records import rollout_path, write_rollouts
                write_rollouts(record_rows(cfg, step, all_rows, records, tokenizer), rollout_path(run_dir, step))
            _append_jsonl(run_dir / "metrics.jsonl", metrics)
            if on_step:
                on_step(metrics)
            if tracker:
                tracker(metrics, step)
            if bar:
                bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", step_s=f"{t_step:.2f}")
                bar.update(1)
        last = step == cfg.total_steps - 1
        if last or (cfg.save_every and (step + 1) % cfg.save_every == 0):
            save(run_dir, step, model, tokenizer, optimizer, scheduler, loader, builder, produced_tokens, cfg, d)
    if bar:
        bar.close()
    if hasattr(sampler, "close"):
        sampler.close()   # before the process group goes: vLLM tears its own groups down with the engine
    return run_dir


def tokenize_prompts(cfg: Config, examples: list[dict], tokenizer) -> tuple[list[list[int]], list[dict], dict]:
    """The templated prompt ids of the examples that can be trained: prompts longer than ``max_prompt_tokens`` are
    left out, and for LUFFY with ``luffy_long_traces=drop`` prompts whose off-policy trace (with EOS) exceeds
    ``max_response_tokens``, as LUFFY's own data is filtered to traces that fit (a trace cut at the budget would
    be trained as a response that never ends). Returns ids, the kept examples and the counts left out."""
    prompt_ids, kept = [], []
    counts = {"prompt_too_long": 0, "luffy_trace_too_long": 0}
    drop_traces = cfg.algorithm == "luffy" and cfg.luffy_long_traces == "drop"
    for ex in examples:
        ids = tokenizer(render(cfg.template, ex["prompt"], tokenizer), add_special_tokens=False)["input_ids"]
        if len(ids) > cfg.max_prompt_tokens:
            counts["prompt_too_long"] += 1
        elif drop_traces and len(off_policy_ids(tokenizer, ex, cfg.off_policy_key)) > cfg.max_response_tokens:
            counts["luffy_trace_too_long"] += 1
        else:
            prompt_ids.append(ids)
            kept.append(ex)
    assert kept, (f"no trainable prompt: {counts['prompt_too_long']} are longer than max_prompt_tokens="
                  f"{cfg.max_prompt_tokens}, {counts['luffy_trace_too_long']} have an off-policy trace longer than "
                  f"max_response_tokens={cfg.max_response_tokens} (luffy_long_traces=drop); raise the budgets")
    return prompt_ids, kept, counts


def render(template: str, question: str, tokenizer) -> str:
    if template == "raw":  # embedded tasks: the prompt is the question
        return question
    from scoring.templates import render_prompt
    return render_prompt(template, question, tokenizer)


def sft_cache_dir(cfg: Config) -> Path:
    """Where the supervised warm-up of a ``tiny:<size>`` config is cached: one folder per size, task, task
    arguments, step budget, stop loss and seed."""
    size = cfg.model.split(":", 1)[1]
    kw = "-".join(f"{k}{v}" for k, v in sorted(cfg.task_kwargs.items()))
    stop = f"-stop{cfg.sft_stop_loss:g}" if cfg.sft_stop_loss else ""
    name = f"{size}-{cfg.task}{kw and '-' + kw}-{cfg.sft_steps}steps{stop}-seed{cfg.seed}"
    return Path(cfg.output_dir) / "_sft_cache" / name


def warm_start(cfg: Config, d: Dist) -> str:
    """The directory the policy loads from: a hub id's local snapshot (``hub_snapshot``); for ``tiny:<size>`` with
    ``sft_steps``, the supervised warm-up checkpoint (built once, then cached)."""
    if not (cfg.model.startswith("tiny:") and cfg.sft_steps):
        return hub_snapshot(cfg.model, d)
    size = cfg.model.split(":", 1)[1]
    path = sft_cache_dir(cfg)
    if d.is_main and not path.is_dir():
        from trainer.sft import sft
        from scoring.tasks import get_task
        from inference.tiny import build_model, build_tokenizer, save_pretrained_atomic
        tokenizer = build_tokenizer()
        model = build_model(size, tokenizer, seed=cfg.seed)
        examples = get_task(cfg.task).make_examples(4000, seed=cfg.seed + 7919, **cfg.task_kwargs)
        print(f"supervised warm-up: {cfg.sft_steps} steps" + (f" (stops at mean loss <= {cfg.sft_stop_loss:g})"
              if cfg.sft_stop_loss else "") + f" -> {path}", file=sys.stderr)
        stats = sft(model, tokenizer, examples, steps=cfg.sft_steps, batch_size=64, lr=3e-3, seed=cfg.seed,
                    stop_loss=cfg.sft_stop_loss or None, log=None)
        summary = {k: stats[k] for k in ("steps", "stopped_early", "loss_first", "loss_last", "time_s")}
        print(f"supervised warm-up: {stats['steps']} steps, loss {stats['loss_first']:.3f} -> "
              f"{stats['loss_last']:.3f}", file=sys.stderr)
        save_pretrained_atomic(model, tokenizer, path, extra_files={"warmup_summary.json": summary})
    barrier(d)
    return str(path)


def hub_snapshot(name: str, d: Dist) -> str:
    """A hub id becomes the local directory of its snapshot in the Hugging Face cache (``inference.hub``), fetched
    once per node: local rank 0 downloads what is missing while every other rank waits on a group of its own whose
    timeout is hours (``all_gather_objects_patiently``), never in a collective of the process group (30 minutes: a
    15 GB download on a slow link would end the job). A failure (not cached and no network, an unknown id) is the
    same one-line ``ModelSourceError`` on every rank. Local paths and ``tiny:`` names are returned unchanged."""
    from inference.hub import ModelSourceError, resolve_model
    if name.startswith("tiny:") or os.path.exists(name):
        return name
    error = None
    if d.local_rank == 0:
        try:
            resolve_model(name, what="model=")
        except Exception as exc:   # reported on every rank below, instead of leaving the others waiting
            error = str(exc) if isinstance(exc, ModelSourceError) else f"model={name}: {type(exc).__name__}: {exc}"
    errors = [e for e in all_gather_objects_patiently(error, d) if e]
    if errors:
        raise ModelSourceError(errors[0])
    return resolve_model(name, what="model=", download=False).path


def save(run_dir, step, model, tokenizer, optimizer, scheduler, loader, builder, produced_tokens, cfg, d):
    """The checkpoint of ``step`` (collective): sharded model and optimizer by every rank, the Hugging Face export
    and the rank-independent state by rank 0 (``trainer/checkpoint.py``)."""
    t0 = time.perf_counter()
    state = None
    rng = ckpt.rng_state(d)   # collective: each rank's own CUDA generator
    if d.is_main:
        state = {"step": step, "scheduler": scheduler.state_dict(), "loader": loader.state_dict(),
                 "rollouts": builder.state_dict(), "rng": rng, "produced_tokens": produced_tokens,
                 "world_size": d.world_size, "config": to_dict(cfg)}
    export = resolve_dtype(cfg.dtype if cfg.export_dtype == "auto" else cfg.export_dtype, d.device)   # auto: compute
    path = ckpt.save_checkpoint(run_dir, step, model=model, optimizer=optimizer, tokenizer=tokenizer,
                                trainer_state=state, d=d, keep=cfg.keep_checkpoints, keep_resume=cfg.keep_resume_states,
                                export_dtype=export)
    if d.is_main and not cfg.progress:
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        print(f"checkpoint {path.name}: {size / 1e6:.1f} MB in {time.perf_counter() - t0:.2f} s", file=sys.stderr)


def sync_rollout_weights(sampler, engine_model, model, d: Dist) -> None:
    """Give the rollout engine the current weights: HF on one process shares the module (nothing to copy);
    HF on several ranks overwrites its compute-dtype copy one gathered tensor at a time
    (``trainer.fsdp.copy_full_weights``: one full tensor in flight, never a state dict); vLLM gets the weights
    pushed, also one tensor at a time."""
    if engine_model is not model:
        copy_full_weights(engine_model, model)
    sampler.update_weights(engine_model)


def sync_check_metrics(sampler) -> dict:
    """The vLLM engine's account of this step's sync (``VLLMSampler.last_update``): the tensors read back and found
    bit-exact, and the probe's log-prob gap between engine and trainer (a metric only: bf16 kernels differ)."""
    update = getattr(sampler, "last_update", None) or {}
    if "tensors_checked" not in update:   # the HF engine: it samples from the module itself
        return {}
    return {"rollout/sync_tensors_checked": update["tensors_checked"],
            "rollout/sync_logp_gap_max": update["probe_logp_diff_max"]}


def _gather_records(records: dict, d: Dist) -> dict:
    if not d.enabled:
        return records
    merged = {}
    for part in all_gather_objects(records, d):
        merged.update(part)
    return merged


def _append_jsonl(path: Path, obj: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")
        f.flush()
        os.fsync(f.fileno())


def make_tracker(cfg: Config, run_dir: Path):
    if cfg.tracker == "tensorboard":
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(str(run_dir / "tensorboard"))
        return lambda m, step: [writer.add_scalar(k, v, step) for k, v in m.items() if isinstance(v, (int, float))]
    if cfg.tracker == "wandb":
        import wandb
        wandb.init(project="thinking-seeds", name=cfg.run_name, config=to_dict(cfg), dir=str(run_dir))
        return lambda m, step: wandb.log(m, step=step)
    return None


def dry_run(cfg: Config) -> None:
    """Validate the config and everything it names that can be checked offline, without building a model
    (``trainer.preflight``: reward, template, data columns and rows, rendered prompt, model); exits 2 when a check
    fails."""
    from trainer.preflight import preflight
    print(json.dumps(to_dict(cfg), indent=1))
    checks = preflight(cfg)
    for c in checks:
        print(c.line(), file=sys.stderr)
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        print(f"config NOT OK: {len(failed)} check(s) failed ({', '.join(c.name for c in failed)})", file=sys.stderr)
        raise SystemExit(2)
    skipped = [c.name for c in checks if c.status == "skip"]
    print("config OK" + (f" (not checkable offline: {', '.join(skipped)})" if skipped else ""), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="YAML preset (trainer/configs/*.yaml)")
    p.add_argument("--dry-run", action="store_true", help="validate config and data, build nothing")
    p.add_argument("overrides", nargs="*", help="key=value overrides of config fields")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        validate(cfg, world_size=int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    if not args.dry_run:   # the dry run reports it among its checks
        from trainer.preflight import check_packages
        packages = check_packages(cfg, world_size=int(os.environ.get("WORLD_SIZE", "1")))
        if packages.status == "fail":
            print(f"error: {packages.detail}", file=sys.stderr)
            return 2
    if args.dry_run:
        dry_run(cfg)
        return 0
    d = init_distributed()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // d.world_size))
    try:
        run_dir = train(cfg, d)
    except (ckpt.CheckpointError, ModelSourceError) as exc:   # bad input (checkpoint, run directory, model): a
        print(f"error{f' (rank {d.rank})' if d.enabled else ''}: {exc}", file=sys.stderr)   # message, no traceback
        return 2
    finally:
        shutdown(d)
    if d.is_main:
        print(f"run written to {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
