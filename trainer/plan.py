"""What a run will cost before it starts: the GPU memory plan by phase, the step-time model, the disk a run fills and
the downloads it needs, as arithmetic from the model's shapes and the config's fields (nothing here is measured).

``python -m trainer.train --config ... --dry-run`` prints ``plan_lines(cfg)``; the pages' tables render the same
functions (``python -m perf.gpu_plan`` for docs/gpu_memory.md, ``python -m perf.step_model`` for
docs/performance.md), so the dry run of a preset and its row on a page can never disagree.

**Memory** (docs/gpu_memory.md): what one GPU holds in a colocated run on one node of ``PLANNED_GPUS`` x 80 GB cards
(one vLLM engine per rank at tensor parallelism 1, FSDP2 over the ranks, ``fully_shard`` per decoder layer and once
for the root), in the update phase (engine asleep) and the generation phase (engine awake). Every term is a function
of the model's shapes and the config's fields; ``terms`` and ``generation_terms`` name where each comes from;
``perf/device_check.py`` measures the update phase's per-layer terms on one GPU.

**LoRA** (``lora_rank`` > 0, docs/lora.md): one process on one GPU (``trainer.config.validate_lora``), so the plan is
for ``LORA_GPUS`` card. The frozen base is held once in the compute dtype (2 B/param: no fp32 master, gradient or
AdamW moments) and only the adapter (``lora_params``: r x (d_in + d_out) per target projection) carries fp32
weights, gradients and two moments; one process computes with the base as it is (``trainer.fsdp.cast_for_compute``),
so no unit is all-gathered; the base's head and embeddings get no gradient. Activations are a full run's. A LoRA
engine does not sleep (vLLM's sleep level 2 would drop the base the adapter-only syncs never resend), so its share
is held in the update phase too, and the derived share leaves ``HEADROOM`` at the larger of the two phases.

**Time** (docs/performance.md, "Step-time model"), on ``PLANNED_GPUS`` x H100 SXM. A term's name matches the metric a
run logs, so the first GPU run reads against it (``time/gen_s``, ``time/train_s``, ``time/behavior_s``):

- **Generation** (``time/gen_s``), one round per step of ``oversample`` x the step's prompts (``AUTO_OVERSAMPLE``
  for the default ``auto``: trainer/sampling.py sizes it from the running keep rate, 2x at ~50 %): each rank's
  engine decodes its share of the rows with continuous batching. Response lengths are assumed uniform on
  [0, max_response_tokens] (so the longest row reaches the budget and the batch thins linearly), prompts at half
  their budget. A decode step of ``b`` live rows at context ``c`` costs the larger of reading the weights once and
  their FLOPs for ``b`` tokens, plus reading ``b`` rows' KV cache: ``max(2P / BW, 2 P b / F) + b c kv / BW``, summed
  over the steps of the longest row; prefill is ``2 P`` FLOPs per prompt token.
- **Update** (``time/train_s``): the flat forward's tokens (each prompt once per group, every response token) at
  ``8 P`` FLOPs each (forward, backward, the checkpointed layers' recompute) plus causal attention, ``8 L^2`` times
  the query width and layers per row, at ``MFU`` of peak.
- **Refresh** (Thinking Seeds, ``algorithm=seeds``): every ``T`` steps the policy writes rollouts for the next ``T``
  batches: a generation of ``T`` times the step's rows, amortized over ``T`` steps. Its scoring forward (``2 P``
  per token) counts only when the config's loss or restart rule reads it (``trainer.rollout.behavior_forward_reason``:
  ``seed_loss=state`` with the ratio rule does not).
- **Validation**: ``val_n`` samples of each validation problem (AIME24 + AIME25: 60) every ``val_every`` steps, at
  ``val_max_tokens``, amortized per step.
- **Weight sync**: an allowance (``SYNC_S``) per step for the all-gather into the engine and its reload.

Only the standard library is imported at module level: ``perf/device_check.py`` imports this module on the
device machine, whose own ``python3`` has torch and transformers but not this project's other dependencies.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

GB = 1e9
# an 80 GB-class card (A100/H100 80 GB) as nvidia-smi reports it: 81,559 MiB; vLLM's gpu_memory_utilization is a
# share of this total, so 0.4 is 34.2 GB, not 32
CARD_BYTES = 81_559 * 2**20
PLANNED_GPUS = 8                # the paper presets are planned for one node of 8 x 80 GB (torchrun --nproc_per_node 8)
RANKS = PLANNED_GPUS
LORA_GPUS = 1                   # lora_rank > 0 runs on one process only (trainer.config.validate_lora): one 80 GB card
LOGIT_CHUNK_MEASURED_GB = 3.9   # perf/bench_logprob_memory.py: 1024 positions x 152,064 logits, fp32, CPU
CUDA_OVERHEAD_GB = 2.0          # CUDA context, NCCL buffers, allocator fragmentation: an allowance, not derived
VLLM_ASLEEP_GB = 1.0            # what a level-2-asleep engine keeps (its context, CUDA-graph pool): an allowance

# the three backbones' published configs (config.json of each hub repository)
SHAPES = {
    "Qwen/Qwen2.5-Math-7B": dict(layers=28, hidden=3584, mlp=18944, heads=28, kv_heads=4, head_dim=128,
                                 vocab=152064, tied=False, qkv_bias=True),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": dict(layers=28, hidden=1536, mlp=8960, heads=12, kv_heads=2,
                                                      head_dim=128, vocab=151936, tied=False, qkv_bias=True),
    "Qwen/Qwen3-4B-Thinking-2507": dict(layers=36, hidden=2560, mlp=9728, heads=32, kv_heads=8, head_dim=128,
                                        vocab=151936, tied=True, qkv_bias=False, qk_norm=True),
}

# ---------------------------------------------------------------------------------------------------- the model
def shapes_from_config(c: dict) -> dict:
    """A shape dict (as ``SHAPES``) from a Hugging Face ``config.json`` of a Llama/Qwen-style decoder."""
    heads = int(c["num_attention_heads"])
    model_type = c.get("model_type", "")
    return dict(layers=int(c["num_hidden_layers"]), hidden=int(c["hidden_size"]), mlp=int(c["intermediate_size"]),
                heads=heads, kv_heads=int(c.get("num_key_value_heads") or heads),
                head_dim=int(c.get("head_dim") or c["hidden_size"] // heads), vocab=int(c["vocab_size"]),
                tied=bool(c.get("tie_word_embeddings", False)),
                qkv_bias=bool(c.get("attention_bias", model_type == "qwen2")), qk_norm=model_type == "qwen3")


def model_shapes(model: str) -> tuple[dict | None, str]:
    """The shapes of ``model`` and where they come from: the published config of a paper backbone, else the
    ``config.json`` of a local folder or of a cached hub snapshot (nothing is downloaded), else (None, why)."""
    if model in SHAPES:
        return SHAPES[model], "its published config.json"
    if model.startswith("tiny:"):
        return None, "a tiny model built locally"
    folder = Path(model)
    if not folder.is_dir():
        from inference.hub import ModelSourceError, is_hub_id, resolve_model
        if not is_hub_id(model):
            return None, f"no config.json found for {model}"
        try:
            folder = Path(resolve_model(model, what="model=", download=False).path)
        except ModelSourceError:
            return None, f"{model} is not in the local cache (its config.json is read once it is)"
    try:
        return shapes_from_config(json.loads((folder / "config.json").read_text())), f"{folder}/config.json"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return None, f"{folder}/config.json has no decoder shape the plan reads ({type(exc).__name__}: {exc})"


def layer_params(s: dict) -> int:
    h, q, kv, m = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["mlp"]
    n = h * q + 2 * h * kv + q * h + 3 * h * m + 2 * h          # q, k, v, o; gate, up, down; two norms
    n += (q + 2 * kv) if s.get("qkv_bias") else 0
    n += 2 * s["head_dim"] if s.get("qk_norm") else 0
    return n


def root_params(s: dict) -> int:
    """The root unit's own parameters (not in a decoder layer): embeddings, LM head unless tied, final norm."""
    return s["vocab"] * s["hidden"] * (1 if s["tied"] else 2) + s["hidden"]


def params(s: dict) -> int:
    return s["layers"] * layer_params(s) + root_params(s)


def lora_dims(s: dict) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of each projection a LoRA target may name in a decoder layer (trainer.config.LORA_TARGETS)."""
    h, q, kv, m = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["mlp"]
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, m), "up_proj": (h, m), "down_proj": (m, h)}


def lora_layer_params(s: dict, rank: int, targets) -> int:
    """One decoder layer's adapter parameters: A (r x d_in) and B (d_out x r) per target projection; a target the
    plan has no shape for (``lora_unplanned``) is not counted."""
    dims = lora_dims(s)
    return sum(rank * sum(dims[t]) for t in targets if t in dims)


def lora_params(s: dict, rank: int, targets) -> int:
    """The adapter's trainable parameters (PEFT's count for the seven projections of a Llama/Qwen decoder)."""
    return s["layers"] * lora_layer_params(s, rank, targets)


def lora_unplanned(s: dict, targets) -> list[str]:
    """The targets ``lora_params`` does not count (not a decoder layer's projection: e.g. lm_head)."""
    return [t for t in targets if t not in lora_dims(s)]


def kv_bytes_per_token(s: dict) -> int:
    return 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2          # K and V of every layer, bf16


# ------------------------------------------------------------------------------------------------------- memory
def recompute_bytes_per_token(s: dict) -> int:
    """One decoder layer's saved tensors while checkpointing recomputes it for backward, bytes per token: each
    RMSNorm saves its input in fp32 (transformers casts to fp32) and its bf16 output (h x (4 + 2) twice), the
    residual stream (h x 2) and the o-projection's output (h x 2); q, its rotated copy, the attention output and
    the o-projection's input (q x 2 x 4); k, v and rotated k (kv x 2 x 3); gate, up, silu(gate) and their product
    (m x 2 x 4)."""
    h, q, kv, m = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["mlp"]
    return h * 16 + q * 8 + kv * 6 + m * 8


def terms(s: dict, *, tokens: int, ranks: int = RANKS, lora: int = 0) -> dict[str, float]:
    """The update phase's terms in GB (module doc); ``tokens`` is ``micro_batch_tokens``. ``lora``: the adapter's
    parameter count (``lora_params``; 0 = full fine-tuning): the LoRA terms (module doc) on one process."""
    P, Pl, Pr = params(s), layer_params(s), root_params(s)
    h, V = s["hidden"], s["vocab"]
    acts = {"boundaries": s["layers"] * tokens * h * 2 / GB, "final_norm": tokens * h * (4 + 2) / GB,
            "layer_recompute": tokens * recompute_bytes_per_token(s) / GB}
    if lora:
        return {
            "state": (2 * P + 16 * lora) / GB,              # the frozen base in bf16; the adapter's fp32 + grad + 2 moments
            "base": 2 * P / GB,
            "adapter_state": 16 * lora / GB,
            "root_unsharded": 0.0,                           # one process: the base computes as it is, no all-gather
            "layers_in_flight": 0.0,
            **acts,                                          # the activations are a full run's
            "layer_grads": 2 * lora / s["layers"] / GB,      # a layer's adapter gradients in bf16 (fp32: in state)
            "head_grad": 0.0,                                # the head is frozen: no weight gradient
            "head_grad_fp32": 0.0,
            "logit_chunk": LOGIT_CHUNK_MEASURED_GB * V / 152064,
        }
    return {
        "state": 16 * P / ranks / GB,                        # fp32 weights, fp32 gradients, AdamW's two moments
        "root_unsharded": 2 * Pr / GB,                       # the root unit's bf16 all-gather, kept through backward
        "layers_in_flight": 2 * 2 * Pl / GB,                 # one layer's bf16 all-gather + the prefetched next one
        "boundaries": s["layers"] * tokens * h * 2 / GB,     # checkpointed hidden state per layer, bf16
        "final_norm": tokens * h * (4 + 2) / GB,             # the final RMSNorm outside checkpointing
        "layer_recompute": tokens * recompute_bytes_per_token(s) / GB,
        "layer_grads": Pl * (2 + 4) / GB,                    # a unit's bf16 gradients and their fp32 reduce copy
        "head_grad": 2 * V * h / GB,                         # the root's bf16 head/embedding gradient, reduced last
        # the chunked head's float32 weight-gradient sum (trainer.policy._ChunkedHeadFp32Grad), alive while the
        # head's backward runs, before it is rounded into head_grad
        "head_grad_fp32": 4 * V * h / GB,
        "logit_chunk": LOGIT_CHUNK_MEASURED_GB * V / 152064,
    }


def scoring_bytes_per_token(s: dict) -> int:
    """One decoder layer's working set in a no-grad forward, bytes per token: nothing is saved for backward, so only
    the block running holds memory beside the residual stream and the block's normed input (h x 2 x 2): the MLP's
    silu(gate), up and their product (m x 2 x 3), or the attention block's q, k, v with the rotated q and k and the
    attention output (q x 2 x 3 + kv x 2 x 3), whichever is larger (the MLP at every preset)."""
    h, q, kv, m = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["mlp"]
    return 4 * h + max(6 * m, 6 * q + 6 * kv)


def generation_terms(s: dict, *, tokens: int, ranks: int = RANKS, lora: int = 0) -> dict:
    """What the trainer holds beside its state while the engine is awake, in GB: the two terms of a no-grad forward
    of the policy (the sync's probe of vLLM; the refresh's scoring of its cached responses, ``micro_batch_tokens``
    at a time, ``trainer.rollout.RolloutBuilder._score``; M2PO's stale batch and a restart's sources likewise).

    ``root_gathered``: FSDP2 all-gathers the root unit (embeddings, head, final norm) for the forward and, the root
    not resharding after forward, keeps it for a backward that never comes; ``trainer.fsdp.reshard`` after each such
    forward (``_score``, ``sync_rollout_weights``) frees it, so it is held during the forward only (before that, it
    stayed gathered through the whole generation: +2.2 GB at 7B). ``scoring``: the forward's transient, the larger
    of its two moments: a decoder layer (its working set, ``scoring_bytes_per_token``, beside the layer gathered and
    the one prefetched) and the LM head (the final norm's fp32 and bf16 output, one log-prob chunk: the chunk's
    forward + backward measurement, an upper bound of its forward). The probe's forward is one short sequence: the
    same root term, a negligible transient; every preset of a backbone is planned with the scoring term, so they get
    one engine share (the KV cache, i.e. decoding throughput, is then the same in a seeds vs on-policy comparison).
    ``lora``: as ``terms`` (one process: nothing gathered, the layer's working set alone)."""
    t = terms(s, tokens=tokens, ranks=ranks, lora=lora)
    at_layer = t["layers_in_flight"] + tokens * scoring_bytes_per_token(s) / GB
    at_head = t["final_norm"] + t["logit_chunk"]
    return {"root_gathered": t["root_unsharded"], "scoring": max(at_layer, at_head),
            "scoring_at": "a decoder layer" if at_layer > at_head else "the LM head"}


# the engine share is what the generation phase leaves of the card less this headroom (vLLM's profiling run,
# fragmentation beyond the allowance, a longer refill batch: what the plan does not model), rounded down to a
# multiple of UTIL_STEP; the memory/* metrics of a first run (trainer.fsdp.gpu_memory_metrics) say how much is real
HEADROOM = 0.10
UTIL_STEP = 0.05


def derived_util(state_gb: float, gen: dict, *, awake_update: float | None = None) -> float:
    """The ``vllm_gpu_memory_utilization`` the plan derives: the largest multiple of ``UTIL_STEP`` whose share
    leaves ``HEADROOM`` of the card free at the generation phase's peak (state + allowance + the no-grad forward's
    root and transient + the share). ``awake_update``: the update phase's peak less the share when the engine stays
    awake through it (LoRA), which must leave the headroom too."""
    card = CARD_BYTES / GB
    fixed = state_gb + CUDA_OVERHEAD_GB + gen["root_gathered"] + gen["scoring"]
    if awake_update is not None:
        fixed = max(fixed, awake_update)
    steps = int((card * (1 - HEADROOM) - fixed) / card / UTIL_STEP + 1e-9)
    return round(steps * UTIL_STEP, 2)


def update_peak(t: dict) -> tuple[float, str]:
    """The larger of the two moments of backward: at the LM head (its chunk's logits alive, the last layer
    prefetched, the head's float32 gradient sum) and at the last decoder layer (recomputed, its gradients being
    reduced, the head gradient held)."""
    base = t["state"] + t["root_unsharded"] + t["boundaries"] + CUDA_OVERHEAD_GB + VLLM_ASLEEP_GB
    at_head = (base + t["layers_in_flight"] / 2 + t["final_norm"] + t["logit_chunk"] + t["head_grad"]
               + t.get("head_grad_fp32", 0.0))
    at_layer = base + t["layers_in_flight"] + t["layer_recompute"] + t["layer_grads"] + t["head_grad"]
    return (at_head, "LM head") if at_head > at_layer else (at_layer, "last layer")


def planned_gpus(cfg) -> int:
    """The GPUs the preset ``cfg`` is planned for: ``LORA_GPUS`` with ``lora_rank`` > 0, else ``PLANNED_GPUS``."""
    return LORA_GPUS if cfg.lora_rank else PLANNED_GPUS


def memory_plan(cfg, s: dict) -> dict:
    """The per-GPU memory plan of the run ``cfg`` (a ``trainer.config.Config``) on ``planned_gpus(cfg)`` x 80 GB.
    With ``lora_rank`` > 0 the LoRA terms (module doc), and ``update_peak`` holds the awake engine's share."""
    A = lora_params(s, cfg.lora_rank, cfg.lora_targets) if cfg.lora_rank else 0
    ranks = planned_gpus(cfg)
    t = terms(s, tokens=cfg.micro_batch_tokens, ranks=ranks, lora=A)
    peak, where = update_peak(t)
    share = cfg.vllm_gpu_memory_utilization * CARD_BYTES / GB
    awake = bool(A)   # a LoRA engine does not sleep: its share is held through the update
    asleep_peak = peak
    if awake:
        peak = peak - VLLM_ASLEEP_GB + share
    weights = 2 * params(s) / GB
    kv_token = kv_bytes_per_token(s)
    max_len = cfg.vllm_max_model_len or cfg.max_prompt_tokens + cfg.max_response_tokens
    kv_gb = share - weights - 1.0   # vLLM's own activations and CUDA graphs: about 1 GB at these batch sizes
    g = generation_terms(s, tokens=cfg.micro_batch_tokens, ranks=ranks, lora=A)
    gen = t["state"] + share + CUDA_OVERHEAD_GB + g["root_gathered"] + g["scoring"]
    util = derived_util(t["state"], g, awake_update=asleep_peak - VLLM_ASLEEP_GB if awake else None)
    return {"model": cfg.model, "params": params(s), "tokens": cfg.micro_batch_tokens, "gpus": ranks,
            "lora_params": A, "engine_awake_in_update": awake,
            "terms": t, "gen_terms": g, "derived_util": util,
            "update_peak": peak, "update_peak_at": where, "util": cfg.vllm_gpu_memory_utilization,
            "share": share, "vllm_weights": weights, "kv_bytes_per_token": kv_token, "kv_gb": kv_gb,
            "kv_tokens": kv_gb * GB / kv_token, "max_model_len": max_len,
            "kv_sequences": kv_gb * GB / kv_token / max_len, "generation": gen,
            "sleep_off": asleep_peak - VLLM_ASLEEP_GB + share, "card": CARD_BYTES / GB}


# --------------------------------------------------------------------------------------------------------- time
PEAK_FLOPS = 989e12        # H100 SXM dense bf16
HBM_BYTES_S = 3.35e12      # H100 SXM HBM3
MFU = 0.40                 # training matmul efficiency assumed for the update (verl/torchtitan report 35-50 %)
DECODE_FLOPS_EFF = 0.50    # share of peak a decode step's GEMMs reach at large batch
DECODE_BW_EFF = 0.70       # share of HBM bandwidth a decode step's weight and KV reads reach
SYNC_S = 3.0               # weight sync allowance per step (all-gather + the engine's reload)
AUTO_OVERSAMPLE = 2.0      # oversample=auto (0, the default) sizes a round by the running keep rate: 2x at ~50 %
VAL_PROBLEMS = 60          # AIME24 + AIME25
STEP_TOKENS = 64           # the decode sum's stride (tokens per term)


@dataclass(frozen=True)
class StepTime:
    generation_s: float
    update_s: float
    refresh_s: float       # amortized per step
    validation_s: float    # amortized per step
    sync_s: float

    @property
    def total_s(self) -> float:
        return self.generation_s + self.update_s + self.refresh_s + self.validation_s + self.sync_s


def decode_seconds(s: dict, rows_per_gpu: float, prompt: float, max_new: int) -> float:
    """One engine's continuous-batching decode of ``rows_per_gpu`` rows whose lengths are uniform on
    [0, max_new]: at step t, ``rows * (1 - t / max_new)`` rows are live at context ``prompt + t``."""
    P = params(s)
    kv = kv_bytes_per_token(s)
    bw, fl = HBM_BYTES_S * DECODE_BW_EFF, PEAK_FLOPS * DECODE_FLOPS_EFF
    total, t = 0.0, 0
    while t < max_new:
        b = rows_per_gpu * (1 - t / max_new)
        step = max(2 * P / bw, 2 * P * b / fl) + b * (prompt + t) * kv / bw
        total += step * min(STEP_TOKENS, max_new - t)
        t += STEP_TOKENS
    prefill = 2 * P * rows_per_gpu * prompt / fl
    return total + prefill


def update_seconds(s: dict, prompts: int, G: int, prompt: float, max_resp: int, *, gpus: int = PLANNED_GPUS,
                   share_prompt: bool = True, frozen_base: bool = False) -> float:
    """The flat forward's update of ``prompts`` groups of ``G`` rows over the GPUs (module doc); ``share_prompt``
    False: each row's prompt computed again (verl's remove-padding layout); ``frozen_base`` (LoRA): the base's
    weight gradients are not computed, 6 P FLOPs per token instead of 8 P (the adapter's own are negligible)."""
    P = params(s)
    mean_r = max_resp / 2
    tokens = prompts * ((prompt if share_prompt else G * prompt) + G * mean_r)
    mean_l2 = prompt ** 2 + prompt * max_resp + max_resp ** 2 / 3    # E[(p + U(0, R))^2]
    attn = 8 * mean_l2 * s["heads"] * s["head_dim"] * s["layers"] * prompts * G / 2   # causal: half the square
    return ((6 if frozen_base else 8) * P * tokens + attn) / (gpus * PEAK_FLOPS * MFU)


def _validation(cfg) -> tuple[int, int]:
    """(samples per problem, max tokens) of validation: the ``val_*`` fields, else the math benchmarks' defaults."""
    return int(cfg.val_n or 32), int(cfg.val_max_tokens or 4096)


def step_time(cfg, s: dict, *, gpus: int = PLANNED_GPUS, oversample: float | None = None) -> StepTime:
    """The step-time model (module doc) of the run ``cfg`` on ``gpus`` H100s."""
    from trainer.rollout import behavior_forward_reason
    prompts, G = cfg.prompts_per_step, cfg.samples_per_prompt
    prompt, R = cfg.max_prompt_tokens / 2, cfg.max_response_tokens
    k = float(oversample if oversample is not None else cfg.oversample or AUTO_OVERSAMPLE)
    gen = decode_seconds(s, k * prompts * G / gpus, prompt, R)
    upd = update_seconds(s, prompts, G, prompt, R, gpus=gpus, frozen_base=bool(cfg.lora_rank))
    refresh = 0.0
    if cfg.algorithm == "seeds":
        T = cfg.seed_refresh_interval
        refresh = decode_seconds(s, T * prompts * G / gpus, prompt, R) / T
        if behavior_forward_reason(cfg) is not None:
            tokens = prompts * G * (prompt + R / 2)
            refresh += 2 * params(s) * tokens / (gpus * PEAK_FLOPS * MFU)
    val = 0.0
    if cfg.val_every:
        n, max_tokens = _validation(cfg)
        val = decode_seconds(s, VAL_PROBLEMS * n / gpus, prompt, max_tokens) / cfg.val_every
    return StepTime(gen, upd, refresh, val, SYNC_S)


def verl_step_time(cfg, s: dict, *, gpus: int = PLANNED_GPUS) -> StepTime:
    """The same step as verl's DAPO recipe runs it, under the same assumptions: one generation round of 3x the
    train batch (``gen_batch_size``), the old log-probs' no-grad forward every step (``compute_log_prob``), the
    update on remove-padding rows (each row's prompt computed again), the same validation and sync; a Thinking
    Seeds refresh has no verl counterpart and is left out."""
    prompts, G = cfg.prompts_per_step, cfg.samples_per_prompt
    prompt, R = cfg.max_prompt_tokens / 2, cfg.max_response_tokens
    gen = decode_seconds(s, 3 * prompts * G / gpus, prompt, R)
    old = 2 * params(s) * prompts * G * (prompt + R / 2) / (gpus * PEAK_FLOPS * MFU)
    upd = update_seconds(s, prompts, G, prompt, R, gpus=gpus, share_prompt=False,
                         frozen_base=bool(cfg.lora_rank)) + old
    ours = step_time(cfg, s, gpus=gpus)
    return StepTime(gen, upd, 0.0, ours.validation_s, SYNC_S)


# --------------------------------------------------------------------------------------------------------- disk
def dtype_bytes(name: str) -> int:
    return 4 if name == "float32" else 2


def disk_plan(cfg, P: int, *, gpu: bool = True, lora: int = 0) -> dict:
    """Bytes a run writes (``trainer.checkpoint``): each checkpoint's Hugging Face export (``export_dtype``; auto is
    the compute dtype, bf16 on a GPU) and its ``trainer_state/`` (weights and AdamW's two moments in ``master_dtype``,
    sharded by DCP); ``keep_checkpoints`` exports stay (0 = every save) plus ``checkpoints/best``, and the newest
    ``keep_resume_states`` keep their state; one more state exists while the next checkpoint is written.
    ``lora`` (the adapter's parameter count, ``lora_rank`` > 0): the export is the adapter in ``master_dtype``
    (``adapter_model.safetensors``), plus ``merged/`` (P in ``export_dtype``) with ``export_merged``; the state is
    the adapter and its two moments."""
    compute = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if gpu else "float32")
    full = P * dtype_bytes(cfg.export_dtype if cfg.export_dtype != "auto" else compute)
    if lora:
        export = lora * dtype_bytes(cfg.master_dtype) + (full if cfg.export_merged else 0)
        state = 3 * lora * dtype_bytes(cfg.master_dtype)
    else:
        export, state = full, 3 * P * dtype_bytes(cfg.master_dtype)
    saves = math.ceil(cfg.total_steps / cfg.save_every) if cfg.save_every else 1
    kept = min(saves, cfg.keep_checkpoints + 1 if cfg.keep_checkpoints else saves)   # + checkpoints/best
    states = min(saves, cfg.keep_resume_states + 1)
    return {"export": export, "state": state, "saves": saves, "kept": kept,
            "checkpoint": export + state, "run": kept * export + states * state}


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def hub_size(repo_id: str, *, kind: str = "model") -> int | None:
    """The bytes of ``repo_id``'s files on the hub (``huggingface_hub``'s file metadata), or None offline, when the
    hub does not answer within a few seconds, or when the repository is not there."""
    from inference.hub import hub_reachable, offline
    if offline() or not hub_reachable():
        return None
    try:
        from huggingface_hub import HfApi
        api = HfApi()
        info = (api.model_info if kind == "model" else api.dataset_info)(repo_id, files_metadata=True, timeout=10)
        return sum(f.size or 0 for f in info.siblings or [])
    except Exception:   # any hub error: the size is then unknown, which the line says; the dry run goes on
        return None


def download_lines(cfg, P: int | None) -> list[str]:
    """What the run reads from the hub before its first step, and how much of it is here already (nothing is
    downloaded; offline the sizes not already here are estimates or unknown)."""
    from inference.hub import ModelSourceError, is_hub_id, resolve_model
    out = []
    if cfg.model.startswith("tiny:"):
        out.append(f"model: {cfg.model} is built locally (nothing to download)")
    elif Path(cfg.model).is_dir():
        out.append(f"model: local folder, {_folder_bytes(Path(cfg.model)) / GB:.2f} GB")
    elif is_hub_id(cfg.model):
        try:
            src = resolve_model(cfg.model, what="model=", download=False)
            out.append(f"model: {cfg.model} is cached ({_folder_bytes(Path(src.path).resolve()) / GB:.2f} GB of "
                       f"snapshot {src.revision}); nothing to download")
        except ModelSourceError:
            exact = hub_size(cfg.model)
            size = (f"{exact / GB:.1f} GB (the hub's file sizes)" if exact else
                    f"about {2 * P / GB:.1f} GB (bf16 safetensors of {P / 1e9:.2f} B parameters)" if P else
                    "a size unknown offline")
            out.append(f"model: {cfg.model} is not cached: local rank 0 of each node downloads {size} at start-up")
    data = Path(cfg.train_file) if cfg.train_file else None
    if data is not None and data.exists():
        out.append(f"train data: local, {_folder_bytes(data) / 1e6 if data.is_dir() else data.stat().st_size / 1e6:.1f} MB")
    elif cfg.train_file:
        exact = hub_size(cfg.train_file, kind="dataset") if is_hub_id(cfg.train_file) else None
        out.append(f"train data: hub dataset {cfg.train_file}, read through datasets' cache at start-up ("
                   + (f"{exact / 1e6:.1f} MB on the hub)" if exact else "its size is unknown offline)"))
    if cfg.val_benchmarks:
        from scoring.benchmarks import DATA_ENV
        where = os.environ.get(DATA_ENV)
        out.append(f"validation data: {', '.join(cfg.val_benchmarks)} from "
                   + (f"{DATA_ENV}={where} (local)" if where else "the hub at run time (set "
                      f"{DATA_ENV} to read them from a folder: docs/data.md)"))
    return out


# ------------------------------------------------------------------------------------------------ the dry run
def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def plan_lines(cfg, *, world_size: int = 1) -> list[str]:
    """The plan ``--dry-run`` prints after its checks: GPUs, memory by phase, time, disk, downloads."""
    s, source = model_shapes(cfg.model)
    gpu_run = cfg.engine == "vllm" or s is not None and cfg.model in SHAPES
    lines = []
    if s is None or not gpu_run:
        why = source if s is None else f"engine={cfg.engine}: not a GPU preset"
        lines.append(f"GPUs: not planned ({why}); the GPU plan covers vLLM runs of a model with a known shape")
    else:
        n = planned_gpus(cfg)
        groups = cfg.prompts_per_step / n
        launch = (f"{n} x 80 GB on one node (torchrun --nproc_per_node {n})" if n > 1 else
                  f"1 x 80 GB (one process: lora_rank={cfg.lora_rank} runs on one rank, docs/lora.md)")
        lines.append(f"GPUs: planned for {launch}; prompts_per_step={cfg.prompts_per_step} "
                     + (f"divides {n}: {groups:g} groups per rank" if groups.is_integer() else
                        f"does NOT divide {n}: use a multiple of {n}")
                     + (f"; this launch has {world_size} rank(s)" if world_size not in (1, n) else ""))
        m = memory_plan(cfg, s)
        card = m["card"]
        lines.append(f"memory per GPU (plan, {'docs/lora.md' if m['lora_params'] else 'docs/gpu_memory.md'}; shapes from {source}, {m['params'] / 1e9:.2f} B "
                     f"parameters, micro_batch_tokens={cfg.micro_batch_tokens:,}):")
        if m["lora_params"]:
            unplanned = lora_unplanned(s, cfg.lora_targets)
            lines.append(f"  LoRA rank {cfg.lora_rank} on {', '.join(cfg.lora_targets)}: {m['lora_params']:,} trainable "
                         f"parameters ({m['lora_params'] / m['params']:.2%} of the base); frozen base in bf16 "
                         f"{m['terms']['base']:.1f} GB, adapter fp32 weights + gradients + AdamW moments "
                         f"{m['terms']['adapter_state']:.2f} GB"
                         + (f" (not counted: {', '.join(unplanned)}, no shape in the plan)" if unplanned else ""))
        lines.append(f"  update phase (engine {'awake: a LoRA engine does not sleep' if m['engine_awake_in_update'] else 'asleep'}): "
                     f"{m['update_peak']:.1f} of {card:.1f} GB at the "
                     f"{m['update_peak_at']} (state {m['terms']['state']:.1f}, checkpointed boundaries "
                     f"{m['terms']['boundaries']:.1f}"
                     + (f", engine share {m['share']:.1f}" if m["engine_awake_in_update"] else "") + ")")
        lines.append(f"  generation phase (engine awake): {m['generation']:.1f} of {card:.1f} GB "
                     f"(engine share {m['util']:g} = {m['share']:.1f} GB: KV cache {m['kv_gb']:.1f} GB ~ "
                     f"{m['kv_sequences']:.0f} sequences of {m['max_model_len']:,}; no-grad scoring "
                     f"{m['gen_terms']['scoring']:.1f} GB)")
        if m["util"] != m["derived_util"]:
            lines.append(f"  vllm_gpu_memory_utilization={m['util']:g}, the plan derives {m['derived_util']:g} "
                         f"(leaving {HEADROOM:.0%} of the card free at the "
                         f"{'larger phase' if m['engine_awake_in_update'] else 'generation'} peak)")
        if max(m["update_peak"], m["generation"]) > card:
            lines.append("  WARNING: a phase exceeds the card: lower micro_batch_tokens or the engine share")
        t = step_time(cfg, s, gpus=n)
        verl = verl_step_time(cfg, s, gpus=n)
        lines.append(f"time per step (ESTIMATE from the step-time model on {n} x H100, docs/performance.md; "
                     f"not measured): {t.total_s:.0f} s = generation {t.generation_s:.0f} + update {t.update_s:.0f} "
                     f"+ refresh {t.refresh_s:.0f} + validation {t.validation_s:.0f} + sync {t.sync_s:.0f}; "
                     f"{cfg.total_steps} steps ~ {_hours(t.total_s * cfg.total_steps)} "
                     f"(verl's DAPO recipe at the same settings: {verl.total_s:.0f} s/step)")
    P = params(s) if s is not None else None
    if P is not None:
        A = lora_params(s, cfg.lora_rank, cfg.lora_targets) if cfg.lora_rank else 0
        d = disk_plan(cfg, P, gpu=gpu_run, lora=A)
        kept = ("every export kept (keep_checkpoints=0)" if not cfg.keep_checkpoints else
                f"{d['kept']} exports kept (keep_checkpoints={cfg.keep_checkpoints} and checkpoints/best)")
        what = ("adapter" + (" + merged/" if cfg.export_merged else "")) if A else "export"
        f = ".2f" if A else ".1f"   # an adapter's checkpoint is a fraction of a GB
        lines.append(f"disk: {d['checkpoint'] / GB:{f}} GB per checkpoint ({what} {d['export'] / GB:{f}} + "
                     f"trainer_state {d['state'] / GB:{f}}); {d['saves']} saves, at most {d['run'] / GB:.1f} GB "
                     f"for the run ({kept}; the newest keep_resume_states={cfg.keep_resume_states} states and the "
                     f"one being written)")
    lines += download_lines(cfg, P)
    return lines
