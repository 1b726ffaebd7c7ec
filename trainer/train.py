"""GRPO/DAPO training with Thinking Seeds, LUFFY and M2PO: the entry point, read top to bottom.

    python -m trainer.train --config trainer/configs/tiny.yaml [key=value ...] [--dry-run]
    torchrun --nproc_per_node N -m trainer.train --config ... (FSDP2: fully_shard per decoder layer + root)

config -> distributed init -> data -> model -> rollout engine -> loop (sample, reward, advantage, loss, step,
log, checkpoint). Everything is vanilla DAPO (clip-higher, token-mean over the global token count, dynamic
sampling, optional overlong shaping and mini-batching, and verl's dual clip of negative-advantage tokens at
``clip_ratio_c`` = 10, its DAPO recipe's value) except these departures, each behind one config field:

* ``algorithm=seeds`` (Thinking Seeds, the paper's method): ``trainer/algos/seeds.py`` plus
  ``RolloutBuilder._refresh/_seeded/_cut_and_continue`` in ``trainer/rollout.py``. Every
  ``seed_refresh_interval`` (T) steps the current policy writes G responses for the prompts of the next T batches
  (behavior log-probs and entropies from one no-grad trainer forward, or from the sampler with
  ``behavior_logprobs=sampler``); batch s+j (j >= 1) cuts each cached response (``seed_rule`` ratio | entropy) and
  the current policy continues. ``seed_loss=state+action``: seed tokens enter the clipped loss with
  r = pi_theta / pi_behavior, continuation tokens with r = pi_theta / pi_old; ``state``: seed tokens are masked.
  ``seed_source=mixture`` (beyond the paper, its §7; ``trainer/mixture.py``): each prompt's seeds are written by a
  policy drawn from the last ``seed_mixture_size`` refresh checkpoints, swapped in for the writing and restored.
* ``algorithm=luffy``: groups mix G-1 on-policy samples with 1 off-policy trace (``off_policy_key`` column);
  off-policy tokens use f(pi) = pi/(pi+gamma) (``trainer/algos/luffy.py``), on-policy tokens are unclipped.
* ``algorithm=m2po``: trains on rollouts written ``m2po_staleness`` steps ago, with the second-moment trust-region
  mask and no epsilon-clip (``m2po_variant=paper``, the paper's Algorithm 1; ``released``: the authors' code's cap
  on log r and clip at [e^-tau, e^tau], ``trainer/algos/m2po.py``); the denominator counts all tokens. Dynamic sampling does not
  refill its stale batch with fresh groups (``refill``, docs/recipes.md); Thinking Seeds' seeded steps refill with
  fresh on-policy prompts unless ``refill=none``.
* ``algorithm=clip_cov`` / ``kl_cov`` (Cui et al. 2025, arXiv:2505.22617; ``trainer/algos/cov.py``): the tokens of
  largest covariance between log-prob and advantage get no gradient (Clip-Cov) or a |log r| penalty (KL-Cov, no
  clip); the selection spans the mini-batch, from one no-grad forward at its start.
* ``advantage`` (``trainer/algos/advantages.py``): ``grpo`` is DAPO's; ``passk`` (Chen et al. 2025, arXiv:2508.10751),
  ``grpo_passk`` (verl's) and ``w_reinforce`` (Zhu et al. 2025, arXiv:2506.01347) replace the group advantage.
* ``token_mask=high_entropy`` (Wang et al. 2025, arXiv:2506.01939; ``trainer/algos/high_entropy.py``): the policy loss
  keeps the top ``high_entropy_ratio`` highest-entropy tokens of each mini-batch; the others leave the denominator.

Validation is no departure (it does not change what is trained): ``val_every`` > 0 scores the step's policy on
``val_benchmarks`` with the run's engine and eval's graders after its update (``trainer/validate.py``), the step
saves its checkpoint, and ``checkpoints/best`` follows the highest ``select_metric``.

More fields, all off by default (DAPO has none of them): ``kl_coef`` > 0 adds a KL penalty to a frozen copy of the
initial policy (``trainer/algos/kl.py``, ``kl_estimator`` as verl's ``kl_loss_type``; logged as ``actor/kl``);
``reward_fn=module:function`` grades with a user function in place of the task's grader (``scoring/rewards.py``);
``rollout_correction`` (tis | mis_token | mis_seq | mis_geo, cap ``rollout_correction_cap``) corrects the sampler
vs trainer mismatch on sampled tokens (``trainer/algos/rollout_correction.py``; ``rollout_corr/`` metrics are logged
every step, also with ``none``); ``code_reward=klear`` grades code with KlearReasoner's verifier.

Every algorithm's per-token loss is one entry of the table ``trainer.algos.LOSSES`` (pure functions,
``trainer/algos/objectives.py``; hyperparameters from ``trainer.config.loss_kwargs``), reduced by
``reduce_loss`` over the one denominator of the optimizer step (``loss_denominator``: token-mean over the global
token count, seq-mean, or LUFFY's sum / max length), the entropy bonus included. ``trainer/update.py`` builds the
tensors, looks the loss up and calls it; ``trainer/sampling.py`` is dynamic sampling, ``trainer/metrics.py`` the
step's metrics and records, ``trainer/tracking.py`` where they go besides ``metrics.jsonl``,
``trainer/warmup.py`` where the policy starts from, ``trainer/checkpoint.py`` what a step saves and a resumed run
reads back.

Log-probs come from the padding-free, shared-prompt forward of ``inference/flat.py`` for Llama/Qwen2/Qwen3 models
(``train_forward=auto``; the same function as the model's own forward, which ``train_forward=model`` and
unsupported or sharded models use).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
from transformers.utils import logging as hf_logging

from contracts.commands import (EXIT_CODES_HELP, EXIT_FAILURE, EXIT_USAGE, Terminated, debug, failure_line,
                               sigint_arrived, sigterm_raises, stopped_line)
from contracts.config import field_help, to_dict
from contracts.files import append_jsonl
from contracts.locks import LockHeld
from contracts.records import rollout_path, write_rollouts
from inference import make_sampler, resolve_engine
from inference.flat import BACKENDS as FLAT_BACKENDS, unsupported_reason
from inference.hub import ModelSourceError
from scoring.rewards import CODE_TASKS
from scoring.sandbox import check_isolation
from trainer import checkpoint as ckpt
from trainer import history
from trainer.config import (Config, ConfigError, learning_warnings, load_config, validate, validation_on,
                            validation_warnings)
from trainer.data import PromptLoader, load_examples, tokenize_prompts
from trainer.fsdp import Dist, gpu_memory_metrics, init_distributed, shutdown
from trainer.lora import add_adapters, adapter_summary, base_reference
from trainer.metrics import gather_records, record_rows, rollout_logp_check, step_metrics, sync_check_metrics
from trainer.mixture import check_host_memory
from trainer.policy import (compute_dtype_engines, load_for_training, load_reference, resolve_dtype,
                            resolve_master_dtype)
from trainer.preflight import NODE_CHECKS, preflight
from trainer.plan import plan_lines
from trainer.rollout import RolloutBuilder, make_rollout_engine, sync_rollout_weights
from trainer.sampling import collect_step
from trainer.signals import INTERRUPTED_EXIT, PREEMPTED_EXIT, Preempted, Preemption, resume_hint
from trainer.tracking import make_tracker
from trainer.update import assign_advantages, make_optimizer, make_scheduler, skip_update, update
from trainer.validate import BEFORE, ValidationError, Validator, encode, engine_context, is_due, load_plan
from trainer.warmup import WarmupStopped, warm_start


def train(cfg: Config, d: Dist, *, policy_builder=None, sampler_builder=None, on_step=None) -> Path:
    """Run (or resume) the training run ``cfg`` describes; returns its run directory.

    One trainer writes a run folder at a time: rank 0 holds its lock for the whole run (``trainer.checkpoint.
    run_lock``), and a second launch on the same folder is refused on every rank (``contracts.locks.LockHeld``)
    before anything is written. A run already at (or past) ``total_steps`` is said so on stderr in one line
    (``trainer.checkpoint.finished_line``), and nothing is loaded or written.

    Library callers (benchmarks, tests) may pass ``policy_builder`` in place of ``trainer.policy.build_policy``
    (``(model_name, *, dtype, seed) -> (model, tokenizer)``; e.g. a model built from a config), ``sampler_builder``
    in place of ``inference.make_sampler``, and ``on_step(metrics)``, called on rank 0 once a step's metrics are
    written."""
    with ckpt.run_lock(cfg.run_dir, d):   # before anything is written; released when the run ends, however it ends
        return _train(cfg, d, policy_builder=policy_builder, sampler_builder=sampler_builder, on_step=on_step)


def _train(cfg: Config, d: Dist, *, policy_builder, sampler_builder, on_step) -> Path:
    """``train`` under the run folder's lock."""
    hf_logging.disable_progress_bar()  # weight loading/saving bars would drown the training progress bar
    torch.manual_seed(cfg.seed)
    if cfg.deterministic:
        torch.use_deterministic_algorithms(True)
    run_dir = cfg.run_dir
    ckpt.check_shared_run_dir(run_dir, d)   # before any expensive work: all ranks write and resume from it
    # a resume must not rewrite the record: changed training settings are refused (trainer/history.py)
    history.check_resume(run_dir, cfg, resuming=ckpt.find_resume_checkpoint(run_dir, cfg.resume) is not None)
    finished = ckpt.already_trained(run_dir, cfg, d)
    if finished is not None:   # a finished run relaunched: no model is loaded to train no step, nothing recorded
        if d.is_main:
            print(finished, file=sys.stderr)
        return run_dir
    examples = load_examples(cfg)
    # validation's benchmarks (trainer/validate.py): read before the model, so missing data stops the run first
    val_plan = load_plan(cfg) if validation_on(cfg) else []
    if (cfg.task in CODE_TASKS and not cfg.reward_fn) or any(bp.bench.kind == "code" for bp in val_plan):
        check_isolation(allow_unisolated=cfg.allow_unisolated)   # fail closed before the model: SandboxError

    # --- model, data, rollout engine, optimizer ----------------------------------------------------------
    # mixed precision: the model (and so the optimizer state) in master_dtype (fp32), forward/backward in dtype;
    # shard_model installs the casts, the rollout engines sample in dtype (trainer.fsdp.shard_model)
    dtype = resolve_dtype(cfg.dtype, d.device)
    master = resolve_master_dtype(cfg.master_dtype, dtype)
    # on several ranks each rank reads only its own shard of the weights (built on the meta device, then sharded)
    source = warm_start(cfg, d)
    # lora_rank > 0: adapters on the frozen base (trainer/lora.py); only they train and carry AdamW state
    adapt = (lambda m: add_adapters(m, cfg, compute=dtype, master=master, base=base_reference(cfg, source))) \
        if cfg.lora_rank else None
    model, tokenizer = load_for_training(source, d, master=master, compute=dtype, seed=cfg.seed,
                                         builder=policy_builder, gradient_checkpointing=cfg.gradient_checkpointing,
                                         adapt=adapt)
    if cfg.lora_rank and d.is_main:
        print(adapter_summary(model), file=sys.stderr)
    # kl_coef > 0: the KL penalty's frozen reference, the policy the run starts from (none otherwise: no memory);
    # a LoRA run's is the policy itself with its adapters off (trainer.update): the base never moves
    ref_model = None
    if cfg.kl_coef:
        ref_model = model if cfg.lora_rank else load_reference(source, d, compute=dtype, seed=cfg.seed, like=model,
                                                               builder=policy_builder)
    prompts = tokenize_prompts(cfg, examples, tokenizer)
    if val_plan:   # validation's prompts, each checked to fit the engine with its budget, before anything is written
        engine = resolve_engine(cfg.engine, model=model)
        encode(val_plan, tokenizer, context=engine_context(cfg, model, engine))
    if d.is_main and any(prompts.dropped.values()):
        print(f"data: {len(prompts.examples)} of {len(examples)} prompts kept ({prompts.dropped})", file=sys.stderr)
    sampler, engine_model = make_rollout_engine(
        cfg, model, tokenizer, d, sampler_builder=compute_dtype_engines(sampler_builder or make_sampler, dtype))
    optimizer = make_optimizer(model, cfg)
    scheduler = make_scheduler(optimizer, cfg)
    loader = PromptLoader(len(prompts.examples), seed=cfg.seed)
    builder = RolloutBuilder(cfg=cfg, examples=prompts.examples, prompt_ids=prompts.ids, loader=loader,
                             sampler=sampler, tokenizer=tokenizer, model=model, d=d,
                             sync_engine=lambda: sync_rollout_weights(sampler, engine_model, model))
    if cfg.algorithm == "seeds" and cfg.seed_source == "mixture":   # its snapshots' host memory, said or refused
        check_host_memory(model, members=cfg.seed_mixture_size + cfg.seed_mixture_base, main=d.is_main,
                          local_ranks=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), saved=d.world_size == 1)
    start, produced_tokens = ckpt.resume_run(run_dir, cfg, d, model=model, optimizer=optimizer, scheduler=scheduler,
                                             loader=loader, builder=builder)
    if d.is_main:
        history.record_launch(run_dir, cfg, from_step=start)   # config.yaml and the launch's line in the history
        if d.mesh is not None and d.mesh.ndim == 2:   # several nodes (trainer.fsdp.hsdp_shape)
            print(f"sharding: HSDP, {d.mesh.size(0)} replicas x {d.mesh.size(1)} shards", file=sys.stderr)
        if cfg.train_forward == "auto":   # say which forward the log-probs come from, and why not flat
            why = unsupported_reason(model)
            print("training forward: " + ("flat (inference/flat.py)" if why is None else f"model's own ({why})"),
                  file=sys.stderr)
    tracker = make_tracker(cfg.tracker, main=d.is_main, run_dir=run_dir, run_name=cfg.run_name, config=to_dict(cfg),
                           progress=cfg.progress, total_steps=cfg.total_steps, start=start, on_step=on_step)
    validator, best, fresh = None, None, False   # fresh: the engine already holds the current weights
    if val_plan:   # the run's own engine scores the policy, as eval.run would score its checkpoint
        # each validation first gives the engine the current weights (waking a sleeping vLLM engine)
        validator = Validator(cfg, val_plan, sampler=sampler, tokenizer=tokenizer, d=d, run_dir=run_dir,
                              engine=engine, dtype=str(dtype).removeprefix("torch."),
                              sync=lambda: sync_rollout_weights(sampler, engine_model, model))
        if d.is_main:   # a resumed run continues with the best of its earlier steps (checkpoints/best.json)
            best = ckpt.best_so_far(run_dir, validator.selection, before_step=start)
        if cfg.val_before_train and start == 0:   # the starting policy, logged as step -1 (a baseline)
            metrics, fresh = {"step": BEFORE, **validator(BEFORE)}, True
            if d.is_main:
                append_jsonl(run_dir / "metrics.jsonl", metrics)
            tracker.log(metrics, BEFORE)

    # --- the loop: sample, reward, advantage, loss, step, log, checkpoint ----------------------------------
    stopped = None
    with Preemption() as preemption:   # SIGTERM: save a resume point after this step, then stop
        for step in range(start, cfg.total_steps):
            t0 = time.perf_counter()
            # GPU memory (CUDA only; trainer.fsdp.gpu_memory_metrics): free before the engine wakes, then the peaks
            # of generation (the sync, sampling, a refresh's scoring) and of the update, so a first run shows its room
            memory = gpu_memory_metrics("wake", d, free=True) if not fresh else {}
            if not fresh:   # after a validation the engine holds these weights already
                sync_rollout_weights(sampler, engine_model, model)
            fresh = False
            gen_before, behavior_before = builder.generated_tokens, builder.behavior_s
            prefill_before = builder.prefilled_tokens
            rows, kept, metrics = collect_step(builder, cfg, step)   # dynamic sampling (trainer/sampling.py)
            metrics.update(sync_check_metrics(sampler))
            metrics.update(memory, **gpu_memory_metrics("gen", d))
            if hasattr(sampler, "sleep"):
                sampler.sleep()   # vLLM sleep mode: its GPU memory is the trainer's until the next sync wakes it
            t_gen = time.perf_counter() - t0
            records = {}
            if kept:
                assign_advantages(kept, cfg)
                model.train()
                upd = update(model, optimizer, scheduler, cfg, kept, d, pad_id=tokenizer.pad_token_id,
                             ref_model=ref_model)
                records = upd.records
                metrics.update(upd.metrics)
                metrics.update(rollout_logp_check(kept, records, d))
            else:  # the sampling bound was hit with no informative group: no update, logged
                skip_update(scheduler)
                metrics["sampling/skipped_update"] = 1
            metrics.update(gpu_memory_metrics("update", d))
            produced_tokens += sum(len(r.response_ids) for r in rows)
            if d.is_main and step == start and FLAT_BACKENDS:   # the SDPA kernels the flat forward's calls got
                print("flat attention kernels: " + ", ".join(f"{k} {v}" for k, v in sorted(FLAT_BACKENDS.items())),
                      file=sys.stderr)
            records = gather_records(records, d)
            t_step = time.perf_counter() - t0
            validated = validator is not None and is_due(step, val_every=cfg.val_every, total_steps=cfg.total_steps)
            if validated:   # this step's policy, after its update: the weights its checkpoint saves
                metrics.update(validator(step))
                fresh = True
            if d.is_main:
                metrics.update(step_metrics(cfg, rows, kept, records))
                if cfg.algorithm == "luffy":
                    metrics["data/luffy_prompts_dropped"] = prompts.dropped["luffy_trace_too_long"]
                metrics.update({"step": step, "tokens/generated": builder.generated_tokens - gen_before,
                                "tokens/prefilled": builder.prefilled_tokens - prefill_before,
                                "time/step_s": t_step, "time/gen_s": t_gen, "time/train_s": t_step - t_gen,
                                "time/behavior_s": builder.behavior_s - behavior_before})   # inside time/gen_s
                if cfg.algorithm == "seeds":
                    metrics["seeds/token_factor"] = builder.generated_tokens / max(produced_tokens, 1)
                    metrics.update(builder.restart_metrics)   # other restart distributions: what restarted, how deep
                if cfg.log_rollouts:
                    write_rollouts(record_rows(cfg, step, rows, records, tokenizer), rollout_path(run_dir, step))
                append_jsonl(run_dir / "metrics.jsonl", metrics)
            tracker.log(metrics, step)   # rank 0's trackers and on_step; the null tracker elsewhere
            last = step == cfg.total_steps - 1
            stop = not last and preemption.requested(d)   # every rank agrees on the step
            # a validated step saves too, so checkpoints/best always names a real checkpoint
            if last or stop or validated or (cfg.save_every and (step + 1) % cfg.save_every == 0):
                new_best = None
                if validated and d.is_main and ckpt.better(metrics.get("val/select"), best):
                    new_best = ckpt.best_record(step, cfg.select_metric, metrics["val/select"])
                protect = {b["step"] for b in (best, new_best) if b is not None}   # retention keeps the best
                ckpt.save_step(run_dir, step, cfg, d, model=model, tokenizer=tokenizer, optimizer=optimizer,
                               scheduler=scheduler, loader=loader, builder=builder, produced_tokens=produced_tokens,
                               protect=protect)
                if new_best is not None:
                    best = new_best
                    ckpt.keep_best(run_dir, best, cfg)
            if stop:
                stopped = step
                break
    tracker.close()
    if validator is not None:
        validator.close()
    if hasattr(sampler, "close"):
        sampler.close()   # before the process group goes: vLLM tears its own groups down with the engine
    if stopped is not None:
        raise Preempted(stopped)
    return run_dir


def dry_run(cfg: Config, *, world_size: int = 1) -> int:
    """Validate the config and everything it names that can be checked offline, without building a model
    (``trainer.preflight``: reward, template, data columns and rows, rendered prompt, model, output folder,
    packages), then print what the run will cost (``trainer.plan``: GPUs, memory by phase, time per step, disk,
    downloads); 2 when a check fails, else 0."""
    print(json.dumps(to_dict(cfg), indent=1))
    checks = preflight(cfg, world_size=world_size)
    for c in checks:
        print(c.line(), file=sys.stderr)
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        print(f"config NOT OK: {len(failed)} check(s) failed ({', '.join(c.name for c in failed)})", file=sys.stderr)
        return 2
    print("plan (trainer/plan.py: arithmetic, not measurements):", file=sys.stderr)
    for line in plan_lines(cfg, world_size=world_size):
        print(f"  {line}", file=sys.stderr)
    skipped = [c.name for c in checks if c.status == "skip"]
    print("config OK" + (f" (not checkable offline: {', '.join(skipped)})" if skipped else ""), file=sys.stderr)
    return 0


def torch_threads(cfg: Config, world_size: int) -> int:
    """The torch thread count of each rank: ``threads``, else OMP_NUM_THREADS where it is set (the variable every
    launcher and scheduler sets), else the cores shared among the ranks."""
    if cfg.threads:
        return cfg.threads
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 1) // world_size)


def _interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt is among the causes of ``exc``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _warmup_stopped(exc: WarmupStopped, run_dir: Path) -> str:
    """The line of a Ctrl-C or SIGTERM during the supervised warm-up (``trainer.warmup``): where it stopped, that
    nothing of it is kept (a warm-up is saved only once it finishes; sft has no part-way state to resume), and what
    the same command does: the warm-up again from step 0, then the run from its newest checkpoint or step 0."""
    done = [(step, path) for step, path in ckpt.list_checkpoints(run_dir) if ckpt.damaged(path) is None]
    then = (f"then resumes the run from {done[-1][1]} (step {done[-1][0] + 1})" if done
            else "then trains the run from step 0")
    return stopped_line(isinstance(exc, KeyboardInterrupt),
                        f"{exc.where()}; a warm-up is saved only once it finishes, so the same command builds it "
                        f"again from step 0, {then}")


def main(argv: list[str] | None = None) -> int:
    try:
        return launch(argv)
    except KeyboardInterrupt:   # before the run started (its own Ctrl-C is handled in launch)
        print("\ninterrupted (Ctrl-C) before the run started: nothing was trained", file=sys.stderr)
        return INTERRUPTED_EXIT


def launch(argv: list[str] | None = None) -> int:
    """Parse, validate and check, then train; every failure a caller can fix is one line and exit 2."""
    p = argparse.ArgumentParser(
        prog="python -m trainer.train", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config fields (set in the YAML preset or as key=value; defaults shown):\n\n" + field_help(Config)
               + "\n\n" + EXIT_CODES_HELP + "\n(bad input here: config, data, model, output folder, a changed "
                 "resume; SIGTERM saves a resume point first)")
    p.add_argument("--config", help="YAML preset (trainer/configs/*.yaml)")
    p.add_argument("--dry-run", action="store_true", help="validate config and data, build nothing")
    p.add_argument("overrides", nargs="*", help="key=value overrides of config fields")
    args = p.parse_args(argv)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        cfg = load_config(args.config, args.overrides)
        validate(cfg, world_size=world_size)
    except ConfigError as exc:
        print(f"error: config: {exc}", file=sys.stderr)
        return EXIT_USAGE
    main_rank = os.environ.get("RANK", "0") == "0"
    if main_rank:
        for warning in learning_warnings(cfg) + validation_warnings(cfg):   # valid, but likely not meant: said once
            print(f"warning: {warning}", file=sys.stderr)
    if args.dry_run:
        return dry_run(cfg, world_size=world_size)
    # a launch makes the dry run's checks first: bad input is a line naming the field or file, exit 2, nothing written
    checks = preflight(cfg, world_size=world_size)
    failed = [c for c in checks if c.status == "fail"]
    node_main = os.environ.get("LOCAL_RANK", "0") == "0"   # a node's own checks are said by its first rank
    for c in checks:
        if c.status in ("fail", "warn") and (main_rank or (node_main and c.name in NODE_CHECKS)):
            print(f"{'error' if c.status == 'fail' else 'warning'}: {c.name}: {c.detail}", file=sys.stderr)
    if failed:
        return 2
    d = init_distributed()
    threads_before = torch.get_num_threads()   # given back on return: main() may run inside a caller's process
    torch.set_num_threads(torch_threads(cfg, d.world_size))
    where = f" (rank {d.rank})" if d.enabled else ""
    try:
        with sigterm_raises():   # SIGTERM outside the loop (the warm-up, loading): one line, exit 143 (the loop saves)
            run_dir = train(cfg, d)
    except LockHeld as exc:   # another process writes this run folder: bad input, said once (rank 0 names it)
        if d.is_main:
            print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ckpt.CheckpointError, ConfigError, ModelSourceError, history.ResumeChanged, ValidationError) as exc:
        # bad input (checkpoint, run directory, model, lora_targets, a changed resume, validation data): a message,
        # no traceback
        print(f"error{where}: {exc}", file=sys.stderr)
        return 2
    except WarmupStopped as exc:   # Ctrl-C or SIGTERM during the warm-up: said with its step
        if d.is_main:
            print(_warmup_stopped(exc, cfg.run_dir), file=sys.stderr)
        return INTERRUPTED_EXIT if isinstance(exc, KeyboardInterrupt) else PREEMPTED_EXIT
    except KeyboardInterrupt:
        if d.is_main:
            print(stopped_line(True, resume_hint(cfg.run_dir)), file=sys.stderr)
        return INTERRUPTED_EXIT
    except Terminated:   # SIGTERM outside the steps' loop (loading, the engine): its last checkpoint resumes it
        if d.is_main:
            print(stopped_line(False, resume_hint(cfg.run_dir)), file=sys.stderr)
        return PREEMPTED_EXIT
    except Preempted as exc:
        if d.is_main:
            print(f"{exc}, resume point saved: {resume_hint(cfg.run_dir)}", file=sys.stderr)
        return PREEMPTED_EXIT
    except Exception as exc:   # a failure inside the run: one line per rank (the traceback on request)
        if _interrupted(exc) or sigint_arrived():   # a Ctrl-C that a library turned into its own error on the way out
            if d.is_main:
                print(stopped_line(True, resume_hint(cfg.run_dir)), file=sys.stderr)
            return INTERRUPTED_EXIT
        if debug():
            traceback.print_exc()
        kept = f"checkpoints so far kept; {resume_hint(cfg.run_dir)}"
        print(failure_line(exc, kept=kept, writing=str(cfg.run_dir)).replace("error:", f"error{where}:", 1),
              file=sys.stderr)
        return EXIT_FAILURE
    finally:
        shutdown(d)
        torch.set_num_threads(threads_before)
    if d.is_main:
        print(f"run folder: {run_dir}")   # also after a finished run's relaunch, which wrote nothing there
    return 0


if __name__ == "__main__":
    sys.exit(main())
