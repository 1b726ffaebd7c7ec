"""Training configuration: one validated dataclass; YAML presets are flat overrides of its fields.

``load_config(path, overrides)`` reads a preset, applies ``key=value`` overrides from the command line, and
validates everything before any model is built: unknown keys, wrong types and impossible batch divisions fail
with a message that names the field and says what to do. The machinery (coercion to the declared types, presets,
overrides, the YAML dump) is ``contracts.config``'s; a choice field is typed once as a ``Literal``, defined where
its concept lives (``trainer.algos`` for the losses, reductions, advantage scales and seed rules,
``inference.engines`` for the engines, ``trainer.tracking`` for the trackers; the trainer's own below), and
validated from that type. ``validate`` holds the cross-field checks.
"""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from contracts.config import ConfigError, build, load, to_dict
from inference.names import EngineName
from inference.names import TINY_SIZES
from contracts.passk import k_grid
from scoring.benchmarks import BENCHMARKS, Benchmark, get_benchmark
from scoring.benchmarks.protocol import generation_settings
from scoring.rewards import CodeReward, RewardFnError, parse_reward_fn
from scoring.tasks import TASKS
from scoring.templates import TEMPLATES
from trainer.algos import (AdvScale, Advantage, Algorithm, KlEstimator, LossAgg, M2poVariant, RolloutCorrection, SeedLoss,
                           SeedRule, SeedSource, SeedTrigger, StaleLoss, TokenMask, CYCLE_SOURCES)
from trainer.mixture import MixtureWeights, read_relay_matrix
from trainer.tracking import TrackerName

__all__ = ["Config", "ConfigError", "load_config", "build_config", "validate", "validate_lora", "validation_on", "uses_traces", "validation_warnings",
           "val_settings", "val_metric_names",
           "loss_kwargs", "adv_kwargs", "to_dict",
           "ALGORITHMS", "LORA_TARGETS", "ADVANTAGE_NAMES", "TOKEN_MASK_NAMES", "SEED_RULE_NAMES", "SEED_LOSSES", "LOSS_AGGS"]

Precision = Literal["float32", "bfloat16"]             # weights and AdamW state (master_dtype)
Dtype = Literal["auto", Precision]                     # compute and export dtypes; auto: bf16 on CUDA, fp32 on CPU
TrainForward = Literal["auto", "flat", "model"]        # the log-prob forward (trainer.policy.use_flat)
LrSchedule = Literal["constant", "cosine"]
Refill = Literal["auto", "fresh", "none"]              # what replaces the groups dynamic sampling drops
Ungraded = Literal["drop_group", "zero"]
BehaviorSource = Literal["trainer", "sampler"]         # where cached behavior log-probs come from
LongTraces = Literal["drop", "truncate"]               # LUFFY traces longer than the response budget
SleepMode = Literal["auto", "on", "off"]               # vLLM sleep mode during updates
ValTemplate = Literal[tuple(TEMPLATES)]               # validation prompts (scoring.templates), as eval.run's template
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")   # Llama-family names

# the choice lists tests and messages name, derived from the types above (never written twice)
ALGORITHMS = typing.get_args(Algorithm)
ADVANTAGE_NAMES = typing.get_args(Advantage)
TOKEN_MASK_NAMES = typing.get_args(TokenMask)
BINARY_ADVANTAGES = ("passk", "w_reinforce")   # defined for rewards in {0, 1} only
SEED_RULE_NAMES = typing.get_args(SeedRule)   # the keys of trainer.algos.SEED_RULES
SEED_LOSSES = typing.get_args(SeedLoss)
LOSS_AGGS = typing.get_args(LossAgg)


@dataclass
class Config:
    # --- run -------------------------------------------------------------------------------------------
    run_name: str = "run"                 # folder under output_dir
    output_dir: str = "runs"              # runs/<run_name>/ holds config, metrics, rollouts, checkpoints
    seed: int = 0                         # seeds data order, sampling and truncation
    resume: str = "auto"                  # auto: continue from the latest checkpoint of this run; never; or a checkpoint path
    resume_with_changes: bool = False     # resume even where training settings differ from the run's config.yaml (refused
                                          # otherwise); each launch's config is kept in config_history.jsonl
    threads: int = 0                      # torch threads per rank; 0: OMP_NUM_THREADS when set, else the cores / ranks
    deterministic: bool = False           # torch deterministic algorithms (CPU runs are then bit-reproducible)
    total_steps: int = 100                # optimizer steps (one rollout batch each; several with mini_batches_per_step)
    # --- model -----------------------------------------------------------------------------------------
    model: str = "tiny:2m"                # HF directory or hub id, or tiny:<size> to build a fresh tiny model
    dtype: Dtype = "auto"                 # compute dtype of forward/backward: auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16
    master_dtype: Precision = "float32"   # parameters and AdamW state: float32 (mixed precision: bf16 compute, fp32
                                          # updates) | bfloat16 (pure bf16, needs dtype=bfloat16: at lr 1e-6 most
                                          # weights cannot move, the update is below half a bf16 ulp)
    sft_steps: int = 0                    # tiny:<size> only: supervised warm-up on the task first (cached under output_dir/_sft_cache)
    sft_stop_loss: float = 0.0            # > 0: the warm-up ends once the mean loss of its last 20 steps is at or
                                          # below this (sft_steps is then the most it takes; ignored with sft_steps 0):
                                          # a small model learns these tasks abruptly, and a loss lands it in the
                                          # imperfect middle more reliably than a step count
    gradient_checkpointing: bool = False
    # --- LoRA (trainer/lora.py, docs/lora.md; Hu et al. 2021, arXiv:2106.09685) ----------------------------
    lora_rank: int = 0                    # > 0: train rank-r adapters (PEFT) on lora_targets, the base frozen in the
                                          # compute dtype (no fp32 master, no AdamW state); 0 = full fine-tuning
    lora_alpha: float | None = None       # adapter scale alpha / rank; null or 0 = 2 * lora_rank (scale 2, verl's and
                                          # TRL's examples' choice: the update's size then does not shrink with rank)
    lora_dropout: float = 0.0             # dropout on the adapters' input while training (0: the old, behavior and
                                          # current log-probs of a token stay one function; > 0 makes them noisy)
    lora_targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS))  # module names that get adapters:
                                          # the attention and MLP projections of Llama/Qwen2/Qwen3 and the tiny models
    export_merged: bool = False           # lora_rank > 0: each checkpoint also holds merged/, the base with the adapter
                                          # folded in (a full Hugging Face model: vLLM, eval.run without merging)
    # --- data and reward -------------------------------------------------------------------------------
    task: str = "addition"                # reward: addition | countdown | math | code
    code_reward: CodeReward = "lcb"       # task=code: lcb = LiveCodeBench's harness, 1 when every test passes, else 0
                                          # (the paper presets: binary rewards); klear = KlearReasoner's verifier
                                          # (scoring.klear: +1/-1 per sampled test for coder1 rows, format
                                          # penalties; rewards in [-2, 1]; rows need data_source). docs/graders.md
    allow_unisolated: bool = False        # code tasks and code val_benchmarks: grade even where the sandbox is not
                                          # fully isolated (not root, no unshare: programs then run as this user,
                                          # outside a jail, and can read its files and signal the trainer); false:
                                          # such a machine stops the launch (exit 2) before a model loads
    reward_fn: str = ""                   # your own reward, "module:function" with the graders' signature
                                          # fn(response: str, example: dict) -> bool | scoring.verdict.Verdict (0/1
                                          # accepted; example: the data row, prompt, answer and every other column):
                                          # reward 1.0 when correct, else 0.0. It grades in worker processes like the
                                          # built-in graders: a call that raises is that row's grader_error, one over
                                          # 10 s its timeout (both ungraded: `ungraded`). The module must import from
                                          # the working directory or PYTHONPATH. Empty = the task's grader (`task`
                                          # still picks the embedded data and the template rule)
    train_file: str = ""                  # JSONL or JSON array (or a hub dataset id); empty: generate the embedded task
    train_subset: str = ""                # hub datasets: the configuration name (e.g. "en"); empty = default
    max_train_examples: int = 0           # > 0: a random subset of this many rows (drawn with `seed`), e.g. 4608
    prompt_key: str = "prompt"            # field holding the question (dotted paths reach nested fields; chat lists use the last turn)
    answer_key: str = "answer"            # field holding the gold answer (e.g. reward_model.ground_truth)
    off_policy_key: str = "solution"      # field holding LUFFY's off-policy trace
    template: str = "raw"                 # prompt template (scoring.templates): raw | qwen-math | qwen-boxed | r1 | lcb (code)
    num_train_examples: int = 4000        # embedded tasks: examples generated from `seed`
    task_kwargs: dict = field(default_factory=dict)  # embedded tasks: difficulty, e.g. {min_digits: 2, max_digits: 3}
    max_prompt_tokens: int = 512          # longer prompts are dropped at load time (counted in the log)
    skip_unsupported_code_rows: bool = False  # task=code: leave out (and count) rows whose tests cannot run here
                                          # (pytest files, kodcode, humanevalplus); false: such a row is an error
    # --- rollout ---------------------------------------------------------------------------------------
    engine: EngineName = "hf"             # hf (KV-cache sampler on transformers) | vllm | auto
    prompts_per_step: int = 16            # B: prompts per optimizer step (global, all ranks)
    samples_per_prompt: int = 8           # G: responses per prompt
    max_response_tokens: int = 64         # generation budget per response (seed + continuation)
    temperature: float = 1.0
    top_p: float = 1.0
    ignore_eos: bool = False              # sample every response to max_response_tokens (throughput benchmarks, token accounting)
    rollout_batch_size: int = 256         # rows decoded together (hf; vLLM's max_num_seqs): more = higher tokens/s and
                                          # more KV-cache memory; a seeds refresh writes T batches at once and gains most
    vllm_gpu_memory_utilization: float = 0.4   # GPU: the engine's share of GPU memory (weights + KV cache)
    vllm_max_model_len: int | None = None  # KV-cache length per sequence; null = max_prompt_tokens + max_response_tokens
    vllm_sleep_mode: SleepMode = "auto"   # auto (on with CUDA) | on | off: free the engine's GPU memory during updates
    # --- DAPO ------------------------------------------------------------------------------------------
    clip_low: float = 0.2                 # epsilon_low
    clip_high: float = 0.28               # epsilon_high (clip-higher)
    clip_ratio_c: float = 10.0            # dual clip (verl's clip_ratio_c; 0 = off, else > 1): a negative-advantage
                                          # token's loss is capped at clip_ratio_c * |A|, so its gradient is zero once
                                          # r > clip_ratio_c. 10 = verl's DAPO recipe (recipe/dapo), the base the paper
                                          # describes (verl's generic actor default is 3): on-policy r = 1 never
                                          # reaches it; it bounds the seed tokens' r = pi/pi_behavior, up to T - 1
                                          # steps stale. LUFFY, M2PO and Clip-Cov have none, as their authors' code
    loss_agg: LossAgg = "token-mean"      # token-mean (global token count) | seq-mean-token-mean | seq-mean-token-sum | token-sum-norm (sum / (responses * max_response_tokens))
    adv_scale: AdvScale = "std"           # std: (R - mean)/(std + eps); none: R - mean (advantage=grpo, grpo_passk)
    advantage: Advantage = "grpo"         # trainer.algos.ADVANTAGES[advantage] (trainer/algos/advantages.py,
                                          # docs/recipes.md "Exploration baselines"): grpo (group-normalised, DAPO) |
                                          # passk = Pass@k Training's analytical advantage (Chen et al. 2025,
                                          # arXiv:2508.10751; k = passk_k) | grpo_passk = verl's: the group's best
                                          # response gets (R_max - R_2nd)/(std + eps), the rest 0 | w_reinforce = +lambda
                                          # on correct, -1 on wrong responses, no baseline (Zhu et al. 2025,
                                          # arXiv:2506.01347). passk and w_reinforce need binary rewards
    passk_k: int = 4                      # k of advantage=passk (1 <= k <= samples_per_prompt; k = 1 is GRPO's)
    w_reinforce_lambda: float = 0.1       # lambda of advantage=w_reinforce: the weight of correct responses (paper: 0.1)
    dynamic_sampling: bool = True         # drop groups whose verdicts are all equal and sample more prompts
    ungraded: Ungraded = "drop_group"     # a row the grader could not grade (grader_error/timeout): drop its group | reward 0
    max_sampling_rounds: int = 3          # bound on generation rounds per step; then train on what there is
    # prompts a dynamic-sampling round samples per group still missing, so that one round usually fills the step
    # (trainer/sampling.py, docs/recipes.md "Dynamic sampling refills"): 0 = auto, the fewest prompts that fill it
    # with 90 % probability at the running keep rate (at most 4x; 2.6x at 8 missing and a keep rate of 0.5) | 1 =
    # none (one prompt per missing group: ~log2(B) rounds per step at a 50 % keep rate) | e.g. 3 = verl's DAPO
    # recipe (gen_batch_size = 3 x train_batch_size). Groups past the step's first prompts_per_step informative
    # ones are not trained, and their prompts go back to the data cursor (resampled next step)
    oversample: float = 0.0
    # what replaces the groups dynamic sampling drops (docs/recipes.md "Dynamic sampling refills"):
    # auto = fresh on-policy groups from the data cursor, except M2PO, which is not refilled (its batch stays
    # all-stale, as in M2PO's experiments); fresh = always fresh groups (an M2PO refill gets the current policy as
    # its behavior policy, r = pi/pi_old); none = never refill: train on the groups that kept signal
    refill: Refill = "auto"
    overlong_buffer_tokens: int = 0       # DAPO soft overlong punishment window (0 = off)
    overlong_penalty: float = 1.0         # maximum penalty inside the window
    mini_batches_per_step: int = 1        # optimizer updates per rollout batch (Figure 3b); 1 = paper setting
    micro_batch_size: int = 32            # responses per forward/backward on each rank
    micro_batch_tokens: int = 0           # > 0: also at most this many padded tokens per micro-batch (rows x longest
                                          # prompt + response), like verl's dynamic batch size; 0 = rows only
                                          # (with the flat forward: tokens it computes, each distinct prompt once)
    train_forward: TrainForward = "auto"  # auto: flat where the architecture allows (Llama/Qwen2/Qwen3, unsharded),
                                          # else model; flat: no padding, each prompt once per micro-batch
                                          # (inference/flat.py); model: the model's own forward on padded rows
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple = (0.9, 0.999)
    warmup_steps: int = 0
    lr_schedule: LrSchedule = "constant"
    max_grad_norm: float = 1.0
    entropy_coef: float = 0.0             # entropy bonus: - entropy_coef * the token mean of the entropy over the step's
                                          # loss tokens, whatever loss_agg is (LUFFY: 0.001, a token mean beside its
                                          # sum / max length policy loss, ElliottYan/LUFFY mix_src/mix_actor.py)
    kl_coef: float = 0.0                  # > 0: + kl_coef * KL(pi_theta || pi_ref) in the loss (verl's use_kl_loss /
                                          # kl_loss_coef), pi_ref a frozen copy of the initial policy (built only then:
                                          # compute dtype, sharded as the policy, no optimizer state); logs actor/kl.
                                          # 0 = off, as in DAPO (arXiv:2503.14476)
    kl_estimator: KlEstimator = "low_var_kl"  # per-token estimator (verl's kl_loss_type): k1 = log pi - log pi_ref |
                                          # k2 = (k1)^2 / 2 | k3 = low_var_kl = exp(-k1) + k1 - 1, clamped as verl
    # --- algorithm -------------------------------------------------------------------------------------
    algorithm: Algorithm = "dapo"         # the loss: trainer.algos.LOSSES[algorithm]
    # Thinking Seeds (algorithm=seeds)
    seed_refresh_interval: int = 8        # T: every T steps the current policy writes rollouts for the next T batches
    seed_rule: SeedRule = "ratio"         # where each cached response is cut: seed_ratio or seed_topk
    seed_ratio: float = 0.5               # ratio rule: seed = round(|o| * ratio)
    seed_topk: int = 32                   # entropy rule: cut at one of the k highest-entropy positions
    seed_loss: SeedLoss = "state+action"  # state: seed tokens masked out; state+action: seed tokens use r = pi/pi_behavior
    seed_stale_loss: StaleLoss = "clip"   # clip (paper) | m2po: loss on seed tokens whose behavior policy is stale
    # restart distributions (trainer/algos/restarts.py): what a seed is cut from -- refresh (the cycle checkpoint's
    # responses: Thinking Seeds) | pool (the prompt's past correct responses, PrefixRL-like) | current (this step's
    # own responses, FR3E-like) | external (the example's off_policy_key trace, Prefix-RFT-like; seed_loss=state)
    seed_source: SeedSource = "refresh"
    seed_trigger: SeedTrigger = "always"  # always: every prompt restarts | all_wrong: only prompts whose fresh group is
                                          # all wrong (the fresh group is sampled first; the others train on it)
    seed_adaptive_arms: int = 3           # seed_rule=adaptive: cut ratios i/(n+1), one chosen per row by Thompson
                                          # sampling of the policy's success rate from such a state
    seed_adaptive_discount: float = 0.9   # seed_rule=adaptive: every win/loss count is multiplied by this at each
                                          # restarted step before the step's outcomes are added (discounted Thompson
                                          # sampling: the policy changes under the posterior; 0.9 = an outcome
                                          # weighs half after 6.6 steps); 1 = never forget
    seed_pool_size: int = 4               # seed_source=pool: the newest correct responses kept per prompt
    seed_mixture_size: int = 3            # seed_source=mixture (trainer/mixture.py; docs/method.md "Seeds from a
                                          # mixture of past policies"): K >= 2 snapshots of the refresh policies t,
                                          # t-T, ..., t-(K-1)T; each prompt of batches 2..T takes its G seeds
                                          # (responses and behavior log-probs) from one member drawn by
                                          # seed_mixture_weights, batch 1 from the current policy (it trains
                                          # on-policy). A snapshot is the trainable tensors on CPU in master_dtype:
                                          # the adapter with LoRA (MB), every parameter with full fine-tuning (4
                                          # B/param in fp32: 28 GB per snapshot at 7B, split over the ranks), held in
                                          # host memory and saved in each checkpoint's trainer_state (one process;
                                          # several ranks keep theirs per rank and resume afresh). A launch whose
                                          # snapshots would take over half the machine's memory is refused
    seed_mixture_base: bool = False       # also keep the initial policy (step 0) as a member for good
    seed_mixture_weights: MixtureWeights = "uniform"  # uniform | age (seed_mixture_age_weights) | relay (from
                                          # seed_mixture_matrix: w ~ max(mean gain at the member's lag, 0) + floor)
    seed_mixture_age_weights: list[float] = field(default_factory=list)  # weights=age: one per member by age,
                                          # newest first (K of them; K + 1 with seed_mixture_base, the base's last)
    seed_mixture_matrix: str = ""         # weights=relay: matrix.csv of `tsanalysis relay --matrix` (writer,
                                          # continuer, k, gain, ...; pass@1 gains, lag = continuer - writer)
    seed_mixture_floor: float = 0.01      # weights=relay: added to every member's max(gain, 0), so each stays drawable
    seed_prefix_sft_coef: float = 0.0     # seed_source=external: > 0 adds this times the negative log-likelihood of the
                                          # reference prefix (the seed tokens; token mean over those of the step) to
                                          # the loss: Prefix-RFT's supervised side (arXiv:2507.01679); 0 = the prefix
                                          # is context only (seed_loss=state), the "Prefix-RFT-like" row
    seed_grade_sources: bool = True       # grade each seed's source response whole: the fresh value the seeds/lift_*
                                          # metrics and the records' source_correct compare with (false: one grading
                                          # batch fewer per seeded step; no lift; pool sources are graded regardless)
    # where cached behavior log-probs and entropies come from (seeds refresh, M2PO stale batches):
    # trainer = one no-grad forward of the trained module per cached batch (exact; docs/method.md);
    # sampler = the sampling engine's own log-probs while it decodes (no extra forward; fp-level mismatch); the HF
    # engine gives entropies too, vLLM none (so seed_rule=entropy needs the trainer's forward there)
    behavior_logprobs: BehaviorSource = "trainer"
    record_behavior_logprobs: bool = False  # seeds: the refresh runs that forward only where the loss or the cut
                                          # reads pi_b (seed_loss=state+action, the entropy rule:
                                          # trainer.rollout.behavior_forward_reason); otherwise (seed_loss=state,
                                          # a length cut) the records' logp_behavior are the sampler's. true: run it
                                          # anyway, so they are the trainer's exact pi_b (tsanalysis mismatch);
                                          # nothing trained changes
    # LUFFY (algorithm=luffy)
    luffy_off_policy_per_group: int = 1   # off-policy traces per group (7 + 1 of G = 8)
    luffy_gamma: float = 0.1              # f(pi) = pi / (pi + gamma)
    luffy_long_traces: LongTraces = "drop"  # an off-policy trace longer than max_response_tokens: drop its prompt at
                                          # load time (as LUFFY's data, filtered to fit; counted as
                                          # data/luffy_prompts_dropped) | truncate (cut at the budget, finish=length)
    # M2PO (algorithm=m2po)
    m2po_tau: float = 0.04                # second-moment threshold (also seed_stale_loss=m2po)
    m2po_staleness: int = 4               # train on rollouts written this many steps ago (as many updates at one per
                                          # step; why the presets' 4 and not M2PO's headline 256 updates:
                                          # docs/recipes.md "M2PO's settings")
    m2po_variant: M2poVariant = "paper"   # paper = the final paper's Algorithm 1: drop the largest (log r)^2 trust-region
                                          # tokens until their mean is <= m2po_tau, no clip | released = the authors'
                                          # code (Infini-AI-Lab/M2PO core_algos.py): clip r to [e^-c, e^c], c the
                                          # |log r| cap at which the capped second moment meets m2po_tau (solved over
                                          # the mini-batch; the release solves it per micro-batch); also seed_stale_loss=m2po.
    # Clip-Cov / KL-Cov (algorithm=clip_cov | kl_cov; Cui et al. 2025, arXiv:2505.22617; trainer/algos/cov.py): the
    # tokens of largest Cov = (A - mean A)(log pi - mean log pi) over the mini-batch are restrained; both cost one
    # no-grad forward per mini-batch (the selection must be known before the first backward)
    clip_cov_ratio: float = 0.0002        # Clip-Cov: share r of the loss tokens whose loss is set to 0 (drawn at random
                                          # among those with clip_cov_lb < Cov < clip_cov_ub); verl's clip_cov_ratio
    clip_cov_lb: float = 1.0              # Clip-Cov: omega_low
    clip_cov_ub: float = 5.0              # Clip-Cov: omega_high
    kl_cov_ratio: float = 0.002           # KL-Cov: share k of the loss tokens (largest Cov) that get kl_cov_coef*|log r|
                                          # (the paper's 7B recipe; verl's generic config default is 0.0002)
    kl_cov_coef: float = 1.0              # KL-Cov: beta (verl's ppo_kl_coef: 1 in the paper's recipe, 0.1 in its config)
    # --- token mask ------------------------------------------------------------------------------------
    token_mask: TokenMask = "none"        # none | high_entropy: the policy loss keeps only the high_entropy_ratio
                                          # highest-entropy tokens of each mini-batch (Wang et al. 2025,
                                          # arXiv:2506.01939; trainer/algos/high_entropy.py). Masked tokens leave the
                                          # token-mean denominator; composes with every algorithm; one no-grad forward
                                          # per mini-batch (entropies before the first backward)
    high_entropy_ratio: float = 0.2       # share of the loss tokens kept by token_mask=high_entropy (paper: 0.2)
    # --- rollout correction ----------------------------------------------------------------------------
    rollout_correction: RolloutCorrection = "none"  # the sampler-vs-trainer mismatch w = pi_old / pi_sampler on the
                                          # tokens the engine sampled (trainer/algos/rollout_correction.py,
                                          # docs/recipes.md "Rollout correction"; rollout_corr/* logged always):
                                          # none = metrics only | tis = loss * min(w, C) | mis_token = drop tokens
                                          # with w outside [1/C, C] | mis_seq = drop responses whose product of w is
                                          # outside it | mis_geo = the same by its geometric mean. Dropped tokens
                                          # leave the token-mean denominator; mis_* costs one no-grad forward per
                                          # step (pi_old before the update). Seed tokens, stale and off-policy rows
                                          # have no sampler log-prob: weight 1, never dropped
    rollout_correction_cap: float = 2.0   # C (> 1): 2 for tis, mis_token, mis_seq (verl's default); ~1.001 for mis_geo
    # --- validation (trainer/validate.py; docs/recipes.md "Validation and the best checkpoint") --------------
    # verl's test_freq / val_before_train, TRL's eval_strategy=steps: the policy of a step is scored on benchmarks
    # with the run's own engine and eval.run's graders; a validated step also saves its checkpoint, and
    # checkpoints/best names the one with the highest select_metric (kept through keep_checkpoints)
    val_every: int = 0                    # validate after every N-th step (step s when (s + 1) % N == 0, as save_every
                                          # counts) and after the last; 0 = off
    val_before_train: bool = False        # also score the starting policy before step 0 (metrics.jsonl step -1,
                                          # validation/before/; a baseline, never the best checkpoint)
    val_benchmarks: list[str] = field(default_factory=list)  # scoring.benchmarks names (the paper: aime24, aime25)
    val_n: int | None = None              # samples per problem; null = the benchmark's (math 32: avg@32)
    val_temperature: float | None = None  # null = the benchmark's (math 0.6), as eval.run
    val_top_p: float | None = None        # null = the benchmark's (math 0.95)
    val_top_k: int | None = None          # null = the benchmark's (off); 0 or -1 = off, as eval.run --top-k
    val_max_tokens: int | None = None     # null = the benchmark's (math 4096; prompt + this must fit the engine)
    val_template: ValTemplate | None = None  # null = the benchmark's (math qwen-math), as eval.run
    val_limit: int = 0                    # at most this many problems per benchmark (the first ones); 0 = all
    val_seed: int = 0                     # sample j of a problem draws from seed (val_seed, benchmark, id, j): eval.run's
                                          # default 0, so eval.run of a validated checkpoint reproduces its scores
    select_metric: str = "mean_avg"       # what checkpoints/best maximises, logged as val/select: mean_avg = the mean
                                          # of val/<bench>/avg@<n> over val_benchmarks (the paper: AIME24+AIME25), or
                                          # one metric validation logs, e.g. val/aime24/avg@32 or val/aime24/pass@8
    # --- logging and checkpoints ------------------------------------------------------------------------
    save_every: int = 50                  # checkpoint every N steps (and at the end); 0 = only at the end
    keep_checkpoints: int = 3             # newest checkpoints kept (0 = all), and checkpoints/best besides them (with
                                          # validation): each a Hugging Face model (2 B/param in bf16, 4 in fp32:
                                          # export_dtype)
    keep_resume_states: int = 2           # of those, the newest that keep trainer_state/ for resume (sharded fp32
                                          # weights + AdamW moments, 12 B/param: 91 GB at 7B); older ones stay models
    export_dtype: Dtype = "auto"          # dtype of each checkpoint's Hugging Face export: auto (the compute dtype,
                                          # `dtype`: bf16 on CUDA) | float32 | bfloat16; the fp32 masters that
                                          # resume reads stay in trainer_state/ whatever it is
    log_rollouts: bool = True             # write rollouts/step_N.parquet every step
    tracker: TrackerName = "none"         # metrics also to TensorBoard (make install brings it) or W&B (pip install
                                          # wandb); metrics.jsonl always
    progress: bool = True                 # rank 0: a progress bar when stderr is a terminal, else one line per step
                                          # (step, loss, reward, entropy, kl, groups dropped, s/step: a log file reads)

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name


def build_config(values: dict, *, source: str = "config") -> Config:
    """A validated Config from a mapping of fields (unknown keys and wrong types are ConfigErrors)."""
    cfg = build(Config, values, source=source, fields_doc="trainer/config.py")
    validate(cfg)
    return cfg


def load_config(path: str | os.PathLike | None, overrides: list[str] | dict = ()) -> Config:
    """A preset file (optional) with ``key=value`` overrides on top, validated."""
    cfg = load(Config, path, overrides, where="trainer/configs/", fields_doc="trainer/config.py")
    validate(cfg)
    return cfg


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def validate(cfg: Config, *, world_size: int = 1) -> None:
    """Every check that can fail before a model is built (the choice fields are checked from their types when the
    config is built; these are the ranges and the checks across fields)."""
    _check(cfg.total_steps >= 1, f"total_steps must be >= 1, got {cfg.total_steps}")
    _check(bool(cfg.run_name) and cfg.run_name not in (".", "..") and not set(cfg.run_name) & {"/", "\\"},
           f"run_name={cfg.run_name!r} must name one folder under output_dir (not empty, '.', '..', no '/' or "
           f"'\\'); give a plain name, and choose the parent folder with output_dir")
    _check(cfg.prompts_per_step >= 1, "prompts_per_step must be >= 1")
    _check(cfg.samples_per_prompt >= 2,
           f"samples_per_prompt must be >= 2 for group advantages, got {cfg.samples_per_prompt}")
    _check(cfg.max_response_tokens >= 1, "max_response_tokens must be >= 1")
    _check(cfg.micro_batch_size >= 1, "micro_batch_size must be >= 1")
    _check(cfg.rollout_batch_size >= 1, f"rollout_batch_size must be >= 1, got {cfg.rollout_batch_size}")
    _check(cfg.micro_batch_tokens >= 0, f"micro_batch_tokens must be >= 0 (0 = no token cap), got {cfg.micro_batch_tokens}")
    _check(cfg.mini_batches_per_step >= 1, "mini_batches_per_step must be >= 1")
    _check(cfg.prompts_per_step % cfg.mini_batches_per_step == 0,
           f"prompts_per_step={cfg.prompts_per_step} is not divisible by mini_batches_per_step="
           f"{cfg.mini_batches_per_step}: each mini-batch must hold whole groups; change one of them")
    _check(cfg.prompts_per_step % world_size == 0,
           f"prompts_per_step={cfg.prompts_per_step} is not divisible by the world size {world_size}: every rank "
           f"samples the same number of prompts; use a multiple of {world_size}")
    _check(cfg.master_dtype != "bfloat16" or cfg.dtype == "bfloat16",
           f"master_dtype=bfloat16 (pure bf16 weights and optimizer state) needs dtype=bfloat16, got "
           f"dtype={cfg.dtype}: set dtype=bfloat16, or keep master_dtype=float32")
    _check(0.0 <= cfg.clip_low <= 1.0 and cfg.clip_high >= 0.0,
           "clip_low must lie in [0, 1] (1: no lower clip) and clip_high >= 0")
    _check(cfg.clip_ratio_c == 0 or cfg.clip_ratio_c > 1.0,
           f"clip_ratio_c (the dual clip) must be 0 (off) or > 1 (verl: 3; its DAPO recipe: 10), got {cfg.clip_ratio_c:g}")
    _check(cfg.temperature >= 0.0 and 0.0 < cfg.top_p <= 1.0, "temperature must be >= 0 and top_p in (0, 1]")
    _check(cfg.max_train_examples >= 0, "max_train_examples must be >= 0 (0 = all rows)")
    _check(cfg.lr >= 0, f"lr must be >= 0, got {cfg.lr:g}")
    _check(cfg.weight_decay >= 0, f"weight_decay must be >= 0, got {cfg.weight_decay:g}")
    _check(len(cfg.betas) == 2 and all(isinstance(b, (int, float)) and 0 <= b < 1 for b in cfg.betas),
           f"betas must be two numbers in [0, 1), got {list(cfg.betas)}")
    _check(cfg.warmup_steps >= 0, f"warmup_steps must be >= 0, got {cfg.warmup_steps}")
    _check(cfg.max_grad_norm > 0, f"max_grad_norm must be > 0, got {cfg.max_grad_norm:g}")
    _check(cfg.entropy_coef >= 0, f"entropy_coef must be >= 0 (a bonus), got {cfg.entropy_coef:g}")
    _check(cfg.kl_coef >= 0, f"kl_coef must be >= 0 (a penalty; 0 = off), got {cfg.kl_coef:g}")
    if cfg.task in TASKS and not cfg.train_file:   # an embedded task's difficulty: make_examples' keywords only
        unknown = sorted(set(cfg.task_kwargs) - set(TASKS[cfg.task].DIFFICULTY))
        _check(not unknown, f"task_kwargs: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not a "
                            f"difficulty of task={cfg.task}; it takes {', '.join(TASKS[cfg.task].DIFFICULTY)}")
    _check(cfg.code_reward == "lcb" or cfg.task == "code",
           f"code_reward={cfg.code_reward} grades task=code rows (KlearReasoner's, with a data_source field), got "
           f"task={cfg.task}; leave code_reward=lcb")
    if cfg.reward_fn:   # its form only: importing the user's module is the launch checks' (trainer.preflight)
        try:
            parse_reward_fn(cfg.reward_fn)
        except RewardFnError as exc:
            raise ConfigError(f"{exc}; leave it empty for the task's own grader") from None
    _check(cfg.save_every >= 0, f"save_every must be >= 0 (0 = only at the end), got {cfg.save_every}")
    _check(cfg.sft_steps >= 0, f"sft_steps must be >= 0 (0 = no supervised warm-up), got {cfg.sft_steps}")
    _check(cfg.threads >= 0, f"threads must be >= 0 (0 = OMP_NUM_THREADS, else the cores), got {cfg.threads}")
    _check(cfg.max_prompt_tokens >= 1, f"max_prompt_tokens must be >= 1, got {cfg.max_prompt_tokens}")
    _check(cfg.num_train_examples >= 1, f"num_train_examples must be >= 1, got {cfg.num_train_examples}")
    _check(cfg.overlong_penalty >= 0, f"overlong_penalty must be >= 0, got {cfg.overlong_penalty:g}")
    _check(0 < cfg.vllm_gpu_memory_utilization <= 1,
           f"vllm_gpu_memory_utilization must lie in (0, 1], got {cfg.vllm_gpu_memory_utilization:g}")
    _check(cfg.max_sampling_rounds >= 1, "max_sampling_rounds must be >= 1")
    _check(cfg.oversample == 0 or cfg.oversample >= 1,
           f"oversample must be 0 (auto: sized from the running keep rate) or >= 1 (prompts sampled per missing "
           f"group; 1 = no oversampling), got {cfg.oversample:g}")
    _check(cfg.keep_checkpoints >= 0, f"keep_checkpoints must be >= 0 (0 = keep all), got {cfg.keep_checkpoints}")
    _check(cfg.keep_resume_states >= 1,
           f"keep_resume_states must be >= 1 (the newest checkpoint is what a resumed run reads), got "
           f"{cfg.keep_resume_states}")
    _check(cfg.overlong_buffer_tokens < cfg.max_response_tokens,
           "overlong_buffer_tokens must be smaller than max_response_tokens")
    _check(not (cfg.behavior_logprobs == "sampler" and cfg.engine != "hf" and cfg.algorithm == "seeds"
                and cfg.seed_rule == "entropy" and cfg.seed_source in CYCLE_SOURCES),
           "seed_rule=entropy needs the behavior policy's entropies, which vLLM does not return: use "
           "behavior_logprobs=trainer (one no-grad forward of the trained module gives them), or engine=hf")
    _check(not (cfg.record_behavior_logprobs and cfg.behavior_logprobs == "sampler"),
           "record_behavior_logprobs=true records the trainer's forward, behavior_logprobs=sampler takes the "
           "sampler's log-probs instead: set behavior_logprobs=trainer, or record_behavior_logprobs=false")
    _check(cfg.vllm_max_model_len is None or cfg.vllm_max_model_len >= cfg.max_prompt_tokens + cfg.max_response_tokens,
           f"vllm_max_model_len={cfg.vllm_max_model_len} cannot hold a prompt of max_prompt_tokens="
           f"{cfg.max_prompt_tokens} plus max_response_tokens={cfg.max_response_tokens}; raise it or leave it null")
    _check(cfg.resume in ("auto", "never") or Path(cfg.resume).exists(),
           f"resume must be auto, never or an existing checkpoint path; '{cfg.resume}' does not exist")
    if cfg.algorithm == "seeds":
        _check(cfg.seed_refresh_interval >= 1, "seed_refresh_interval (T) must be >= 1")
        _check(0.0 <= cfg.seed_ratio <= 1.0, f"seed_ratio must lie in [0, 1], got {cfg.seed_ratio}")
        _check(cfg.seed_topk >= 1, "seed_topk must be >= 1")
        _check(cfg.seed_stale_loss != "m2po" or cfg.m2po_tau > 0, "m2po_tau must be > 0 (seed_stale_loss=m2po)")
        _check(cfg.seed_source != "external" or cfg.seed_loss == "state",
               "seed_source=external cuts seeds from reference traces, which have no behavior log-probs: use "
               "seed_loss=state (the prefix is context, not trained), or algorithm=luffy to train on the traces")
        _check(cfg.seed_adaptive_arms >= 2 or cfg.seed_rule != "adaptive",
               f"seed_adaptive_arms must be >= 2 (seed_rule=adaptive chooses among them), got {cfg.seed_adaptive_arms}")
        _check(cfg.seed_pool_size >= 1, f"seed_pool_size must be >= 1, got {cfg.seed_pool_size}")
        _check(0 < cfg.seed_adaptive_discount <= 1,
               f"seed_adaptive_discount must lie in (0, 1] (1 = never forget), got {cfg.seed_adaptive_discount:g}")
    validate_mixture(cfg)
    _check(cfg.seed_prefix_sft_coef >= 0, f"seed_prefix_sft_coef must be >= 0 (0 = off), got {cfg.seed_prefix_sft_coef:g}")
    _check(cfg.seed_prefix_sft_coef == 0 or (cfg.algorithm == "seeds" and cfg.seed_source == "external"),
           f"seed_prefix_sft_coef={cfg.seed_prefix_sft_coef:g} trains the reference trace's prefix (Prefix-RFT), which only "
           f"algorithm=seeds with seed_source=external cuts (got algorithm={cfg.algorithm}, seed_source={cfg.seed_source}): "
           f"set both, or seed_prefix_sft_coef=0")
    if cfg.algorithm == "luffy":
        _check(1 <= cfg.luffy_off_policy_per_group < cfg.samples_per_prompt,
               f"luffy_off_policy_per_group must be in [1, samples_per_prompt), got {cfg.luffy_off_policy_per_group}")
        _check(cfg.luffy_gamma > 0, "luffy_gamma must be > 0")
    if cfg.algorithm == "m2po":
        _check(cfg.m2po_tau > 0, "m2po_tau must be > 0")
        _check(cfg.m2po_staleness >= 0, "m2po_staleness must be >= 0")
    if cfg.algorithm == "clip_cov":
        _check(0 < cfg.clip_cov_ratio <= 1, f"clip_cov_ratio must lie in (0, 1] (the paper: 0.0002), got "
                                            f"{cfg.clip_cov_ratio:g}")
        _check(cfg.clip_cov_lb < cfg.clip_cov_ub, f"clip_cov_lb={cfg.clip_cov_lb:g} must be below clip_cov_ub="
                                                  f"{cfg.clip_cov_ub:g} (the paper: 1 and 5)")
    if cfg.algorithm == "kl_cov":
        _check(0 < cfg.kl_cov_ratio <= 1,
               f"kl_cov_ratio must lie in (0, 1] (the paper: 0.002), got {cfg.kl_cov_ratio:g}")
        _check(cfg.kl_cov_coef >= 0, f"kl_cov_coef must be >= 0 (the paper: 1), got {cfg.kl_cov_coef:g}")
    if cfg.advantage == "passk":
        _check(1 <= cfg.passk_k <= cfg.samples_per_prompt,
               f"passk_k must lie in [1, samples_per_prompt={cfg.samples_per_prompt}] (a pass@k reward needs k "
               f"responses of the group), got {cfg.passk_k}")
    if cfg.advantage == "w_reinforce":
        _check(cfg.w_reinforce_lambda >= 0, f"w_reinforce_lambda must be >= 0 (the paper: 0.1; 0 = negative samples "
                                            f"only), got {cfg.w_reinforce_lambda:g}")
    if cfg.advantage in BINARY_ADVANTAGES:
        _check(cfg.overlong_buffer_tokens == 0 and cfg.code_reward == "lcb",
               f"advantage={cfg.advantage} is defined for binary rewards in {{0, 1}}, but overlong_buffer_tokens="
               f"{cfg.overlong_buffer_tokens} / code_reward={cfg.code_reward} shape them: set overlong_buffer_tokens=0 "
               f"and code_reward=lcb, or use advantage=grpo")
    _check(cfg.token_mask == "none" or 0 < cfg.high_entropy_ratio <= 1,
           f"high_entropy_ratio must lie in (0, 1] (the share of loss tokens kept; the paper: 0.2), got "
           f"{cfg.high_entropy_ratio:g}")
    _check(cfg.rollout_correction == "none" or cfg.rollout_correction_cap > 1.0,
           f"rollout_correction_cap must be > 1 (tis keeps min(w, C); mis_* keeps 1/C <= w <= C), got "
           f"{cfg.rollout_correction_cap:g} with rollout_correction={cfg.rollout_correction}; 2 is verl's default")
    _check(cfg.sft_steps == 0 or (cfg.model.startswith("tiny:") and not cfg.train_file),
           "sft_steps (supervised warm-up) applies to tiny:<size> models on embedded tasks; set it to 0")
    _check(cfg.sft_stop_loss >= 0, f"sft_stop_loss must be >= 0 (0: no early stop), got {cfg.sft_stop_loss}")
    validate_lora(cfg, world_size=world_size)
    if cfg.model.startswith("tiny:"):
        _check(cfg.model.split(":", 1)[1] in TINY_SIZES,
               f"model '{cfg.model}': tiny sizes are {', '.join('tiny:' + s for s in TINY_SIZES)}")
    validate_validation(cfg)


def validate_lora(cfg: Config, *, world_size: int = 1) -> None:
    """The LoRA fields' checks, and what LoRA does not run with yet: several ranks (the adapters are not wired into
    the sharded load and FSDP2 units), and vLLM's sleep mode (the engine is sent the base once, then the adapter
    alone: docs/lora.md)."""
    _check(cfg.lora_rank >= 0, f"lora_rank must be >= 0 (0 = full fine-tuning), got {cfg.lora_rank}")
    _check(cfg.lora_alpha is None or cfg.lora_alpha >= 0,
           f"lora_alpha must be > 0, or 0 / null for 2 * lora_rank, got {cfg.lora_alpha}")
    _check(0 <= cfg.lora_dropout < 1, f"lora_dropout must lie in [0, 1), got {cfg.lora_dropout:g}")
    _check(bool(cfg.lora_targets) and all(isinstance(t, str) and t for t in cfg.lora_targets),
           f"lora_targets must name at least one module (e.g. [q_proj, v_proj]), got {cfg.lora_targets}")
    if cfg.lora_rank == 0:
        _check(not cfg.export_merged, "export_merged=true merges a LoRA adapter, but lora_rank=0 trains none: set "
                                      "lora_rank > 0, or export_merged=false (a full run's checkpoints are models)")
        return
    _check(world_size == 1 or cfg.engine == "hf",
           f"lora_rank={cfg.lora_rank} on {world_size} ranks runs with engine=hf for now (the adapter-only sync "
           f"to vLLM is tested on one process), got engine={cfg.engine}: set engine=hf, or launch one rank")
    if cfg.engine != "hf":   # vllm, or auto (vllm where it is installed and a GPU runs): the adapter-only sync
        _check(cfg.lora_rank <= 512, f"lora_rank={cfg.lora_rank} with engine={cfg.engine}: vLLM serves adapters up "
                                     f"to rank 512 (max_lora_rank); use engine=hf, or a smaller lora_rank")
        _check(cfg.vllm_sleep_mode != "on", f"lora_rank={cfg.lora_rank} with vllm_sleep_mode=on: sleep level 2 "
                                            f"discards the base, which the adapter-only syncs do not send again; "
                                            f"use vllm_sleep_mode=auto or off (a LoRA engine does not sleep)")


def validate_mixture(cfg: Config) -> None:
    """The seed_mixture_* fields' checks (``seed_source=mixture``, ``trainer.mixture``): the relay matrix is read
    here, so a missing or malformed file stops the launch before a model is built."""
    if cfg.seed_source != "mixture":
        return
    _check(cfg.algorithm == "seeds", f"seed_source=mixture draws Thinking Seeds' seeds from past policies, but "
                                     f"algorithm={cfg.algorithm} has no seeds: set algorithm=seeds, or leave "
                                     f"seed_source at refresh")
    _check(cfg.seed_mixture_size >= 2, f"seed_mixture_size must be >= 2 (the newest policy and at least one older; "
                                       f"1 is seed_source=refresh), got {cfg.seed_mixture_size}")
    n = cfg.seed_mixture_size + cfg.seed_mixture_base
    ws = cfg.seed_mixture_age_weights
    if cfg.seed_mixture_weights == "age":
        _check(len(ws) == n and all(isinstance(w, (int, float)) and w >= 0 for w in ws) and sum(ws) > 0,
               f"seed_mixture_age_weights must be {n} weights >= 0, newest first (seed_mixture_size="
               f"{cfg.seed_mixture_size}" + (" plus the base's, last" if cfg.seed_mixture_base else "")
               + f"), not all 0, e.g. [{', '.join(['1'] * n)}]; got {ws}")
    else:
        _check(not ws, f"seed_mixture_age_weights={ws} is read with seed_mixture_weights=age only, got "
                       f"{cfg.seed_mixture_weights}: set seed_mixture_weights=age, or drop the weights")
    if cfg.seed_mixture_weights == "relay":
        _check(cfg.seed_mixture_floor > 0, f"seed_mixture_floor must be > 0 (every member keeps a chance), got "
                                           f"{cfg.seed_mixture_floor:g}")
        _check(bool(cfg.seed_mixture_matrix), "seed_mixture_weights=relay needs seed_mixture_matrix=<matrix.csv of "
                                              "`tsanalysis relay --matrix`>")
        read_relay_matrix(cfg.seed_mixture_matrix)   # a ConfigError naming the file and what it lacks
    else:
        _check(not cfg.seed_mixture_matrix, f"seed_mixture_matrix is read with seed_mixture_weights=relay only, got "
                                            f"{cfg.seed_mixture_weights}: set seed_mixture_weights=relay, or drop it")


def uses_traces(cfg: Config) -> bool:
    """The run reads each example's reference trace (``off_policy_key``): LUFFY trains on it, seeds cut from it."""
    return cfg.algorithm == "luffy" or (cfg.algorithm == "seeds" and cfg.seed_source == "external")


def validation_on(cfg: Config) -> bool:
    """Whether the run validates at all (during training, before it, or both)."""
    return cfg.val_every > 0 or cfg.val_before_train


def validate_validation(cfg: Config) -> None:
    """The validation fields' checks: ranges, benchmark names (the registry's list in the message), the select
    metric among those validation logs (``val_metric_names``), and no ignore_eos."""
    _check(cfg.val_every >= 0, f"val_every must be >= 0 (0 = off), got {cfg.val_every}")
    _check(cfg.val_n is None or cfg.val_n >= 1, f"val_n must be >= 1 (samples per problem) or null, got {cfg.val_n}")
    _check(cfg.val_max_tokens is None or cfg.val_max_tokens >= 1,
           f"val_max_tokens must be >= 1 or null (the benchmark's), got {cfg.val_max_tokens}")
    _check(cfg.val_temperature is None or cfg.val_temperature >= 0,
           f"val_temperature must be >= 0 (0 = greedy) or null, got {cfg.val_temperature}")
    _check(cfg.val_top_p is None or 0 < cfg.val_top_p <= 1, f"val_top_p must lie in (0, 1] or null, got {cfg.val_top_p}")
    _check(cfg.val_top_k is None or cfg.val_top_k >= -1, f"val_top_k must be >= 1, 0 or -1 (off), or null, got {cfg.val_top_k}")
    _check(cfg.val_limit >= 0, f"val_limit must be >= 0 (0 = every problem), got {cfg.val_limit}")
    _check(cfg.val_seed >= 0, f"val_seed must be >= 0, got {cfg.val_seed}")
    unknown = [b for b in cfg.val_benchmarks if b not in BENCHMARKS]
    _check(not unknown, f"val_benchmarks: unknown benchmark {', '.join(map(repr, unknown))}; choose from: "
                        f"{', '.join(BENCHMARKS)}")
    _check(len(set(cfg.val_benchmarks)) == len(cfg.val_benchmarks),
           f"val_benchmarks names a benchmark twice: {cfg.val_benchmarks}")
    if not validation_on(cfg):
        return
    _check(bool(cfg.val_benchmarks), f"val_every={cfg.val_every}, val_before_train={cfg.val_before_train} but "
                                     f"val_benchmarks is empty: name the benchmarks to validate on (the paper: "
                                     f"val_benchmarks=[aime24,aime25]) or set val_every=0 and val_before_train=false")
    _check(not cfg.ignore_eos, "ignore_eos=true samples every validation response past its answer to val_max_tokens: "
                               "validation would grade text the model never meant to write; turn validation off "
                               "(val_every=0, val_before_train=false) or ignore_eos off")
    names = val_metric_names(cfg)
    _check(cfg.select_metric == "mean_avg" or cfg.select_metric in names,
           f"select_metric={cfg.select_metric!r} is not a metric validation logs; choose mean_avg (the mean avg@n "
           f"over val_benchmarks) or one of: {', '.join(names)}")


def learning_warnings(cfg: Config) -> list[str]:
    """Settings that are valid but leave the run nothing to learn from (said once at launch, not refused: a user
    may run them on purpose, e.g. to measure throughput)."""
    out = []
    if cfg.temperature == 0:
        out.append("temperature=0 samples greedily: every response of a group is the same, so every advantage is 0 "
                   "and no step updates the policy (the presets sample at temperature 1.0)")
    if cfg.lr == 0:
        out.append("lr=0 never changes the policy: every step samples and grades the same model")
    if cfg.ignore_eos:
        out.append("ignore_eos=true samples every response to max_response_tokens past its answer (a throughput "
                   "setting): rewards grade text the model never meant to write")
    if cfg.advantage == "w_reinforce" and cfg.dynamic_sampling:
        out.append("advantage=w_reinforce has no baseline, so all-correct and all-wrong groups carry signal, but "
                   "dynamic_sampling=true drops them (the W-REINFORCE runs sample without it: dynamic_sampling=false)")
    return out


def val_settings(cfg: Config, bench: Benchmark) -> dict:
    """The validation settings of ``bench`` (n, temperature, top_p, top_k, max_tokens, template): each ``val_*`` field
    that is set, the benchmark's default for each that is not, resolved as ``eval.run`` resolves its flags
    (``scoring.benchmarks.protocol.generation_settings``)."""
    return generation_settings(bench, n=cfg.val_n, temperature=cfg.val_temperature, top_p=cfg.val_top_p,
                               top_k=cfg.val_top_k, max_tokens=cfg.val_max_tokens, template=cfg.val_template)


def val_eval_command(cfg: Config, checkpoint: str | os.PathLike) -> str:
    """The ``eval.run`` command that scores ``checkpoint`` as validation scores a step: each ``val_*`` field that is
    set as its flag (an unset one is the benchmark's default in both). Said where a launch cannot validate a step
    itself: a finished run relaunched with validation on (``trainer.checkpoint.already_trained``)."""
    flags = {"n": cfg.val_n, "temperature": cfg.val_temperature, "top-p": cfg.val_top_p, "top-k": cfg.val_top_k,
             "max-tokens": cfg.val_max_tokens, "template": cfg.val_template, "limit": cfg.val_limit or None,
             "seed": cfg.val_seed or None}
    return (f"python -m eval.run --model {checkpoint} --benchmarks {','.join(cfg.val_benchmarks)}"
            + "".join(f" --{flag} {value}" for flag, value in flags.items() if value is not None))


def val_metric_names(cfg: Config) -> list[str]:
    """The score metrics validation logs (those ``select_metric`` may name): per benchmark ``val/<bench>/avg@<n>``
    and ``val/<bench>/pass@<k>`` for k in ``contracts.passk.k_grid(n)``."""
    out = []
    for name in cfg.val_benchmarks:
        n = val_settings(cfg, get_benchmark(name))["n"]
        out += [f"val/{name}/avg@{n}"] + [f"val/{name}/pass@{k}" for k in k_grid(n)]
    return out


def validation_warnings(cfg: Config) -> list[str]:
    """Validation settings that are valid but likely not what was meant (said once at launch)."""
    out = []
    if cfg.val_benchmarks and not validation_on(cfg):
        out.append(f"val_benchmarks={cfg.val_benchmarks} but val_every=0 and val_before_train=false: the run never "
                   f"validates (set val_every=N to score every N-th step)")
    if validation_on(cfg) and cfg.val_template is None and cfg.task == "math" and cfg.template != "qwen-math":
        out.append(f"validation prompts with each benchmark's template (qwen-math for math, as eval.run) while training "
                   f"prompts with template={cfg.template}: set val_template={cfg.template} to validate the model as it "
                   f"is trained (and pass the same --template to eval.run)")
    return out


def loss_kwargs(cfg: Config) -> dict:
    """The keyword hyperparameters of ``trainer.algos.LOSSES[cfg.algorithm]``, read from the config in one place."""
    clip = {"clip_low": cfg.clip_low, "clip_high": cfg.clip_high}
    dual = {**clip, "clip_ratio_c": cfg.clip_ratio_c}
    return {
        "dapo": dual,
        "seeds": {**dual, "stale_loss": cfg.seed_stale_loss, "tau": cfg.m2po_tau, "m2po_variant": cfg.m2po_variant},
        "luffy": {"gamma": cfg.luffy_gamma},
        "m2po": {"tau": cfg.m2po_tau, "variant": cfg.m2po_variant},
        "clip_cov": {**clip, "ratio": cfg.clip_cov_ratio, "lb": cfg.clip_cov_lb, "ub": cfg.clip_cov_ub},
        "kl_cov": {"ratio": cfg.kl_cov_ratio, "kl_coef": cfg.kl_cov_coef},
    }[cfg.algorithm]


def adv_kwargs(cfg: Config) -> dict:
    """The keyword hyperparameters of ``trainer.algos.ADVANTAGES[cfg.advantage]``, read from the config in one place."""
    return {
        "grpo": {"scale": cfg.adv_scale},
        "passk": {"k": cfg.passk_k},
        "grpo_passk": {"scale": cfg.adv_scale},
        "w_reinforce": {"positive_weight": cfg.w_reinforce_lambda},
    }[cfg.advantage]
