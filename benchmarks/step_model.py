"""A step-time model of the paper presets on one node of 8 x H100 80 GB: what a step should cost before a GPU run
says what it does cost (docs/performance.md, "Step-time model"; ``python -m trainer.train --dry-run`` prints it).

    python -m benchmarks.step_model            # the table for every paper preset

Every term is arithmetic from the model's shapes (``benchmarks.gpu_plan.SHAPES``), the preset's fields and the
assumptions below, each stated; nothing here is measured. A term's name matches the metric a run logs, so the first
GPU run reads against it (``time/gen_s``, ``time/train_s``, ``time/behavior_s``).

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
  per token) counts only when the preset's loss or restart rule reads it (``trainer.rollout.behavior_forward_reason``:
  ``seed_loss=state`` with the ratio rule does not).
- **Validation**: ``val_n`` samples of each validation problem (AIME24 + AIME25: 60) every ``val_every`` steps, at
  ``val_max_tokens``, amortized per step.
- **Weight sync**: an allowance (``SYNC_S``) per step for the all-gather into the engine and its reload.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu_plan import SHAPES, layer_params, params

REPO = Path(__file__).resolve().parents[1]
GPUS = 8
PEAK_FLOPS = 989e12        # H100 SXM dense bf16
HBM_BYTES_S = 3.35e12      # H100 SXM HBM3
MFU = 0.40                 # training matmul efficiency assumed for the update (verl/torchtitan report 35-50 %)
DECODE_FLOPS_EFF = 0.50    # share of peak a decode step's GEMMs reach at large batch
DECODE_BW_EFF = 0.70       # share of HBM bandwidth a decode step's weight and KV reads reach
SYNC_S = 3.0               # weight sync allowance per step (all-gather + the engine's reload)
AUTO_OVERSAMPLE = 2.0      # oversample=auto (0, the default) sizes a round by the running keep rate: 2x at ~50 %
VAL_PROBLEMS = 60          # AIME24 + AIME25
STEP_TOKENS = 64           # the decode sum's stride (tokens per term)

PAPER_PRESETS = ["qwen25math7b_onpolicy", "qwen25math7b_seeds_entropy", "qwen25math7b_seeds_ratio",
                 "r1distill15b_onpolicy", "r1distill15b_seeds_entropy", "qwen3_4b_code_onpolicy",
                 "qwen3_4b_code_seeds_state"]


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
    kv = 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2          # bytes of K and V per token, bf16
    bw, fl = HBM_BYTES_S * DECODE_BW_EFF, PEAK_FLOPS * DECODE_FLOPS_EFF
    total, t = 0.0, 0
    while t < max_new:
        b = rows_per_gpu * (1 - t / max_new)
        step = max(2 * P / bw, 2 * P * b / fl) + b * (prompt + t) * kv / bw
        total += step * min(STEP_TOKENS, max_new - t)
        t += STEP_TOKENS
    prefill = 2 * P * rows_per_gpu * prompt / fl
    return total + prefill


def update_seconds(s: dict, prompts: int, G: int, prompt: float, max_resp: int, *, share_prompt: bool = True) -> float:
    """The flat forward's update of ``prompts`` groups of ``G`` rows over the GPUs (module doc); ``share_prompt``
    False: each row's prompt computed again (verl's remove-padding layout)."""
    P = params(s)
    mean_r = max_resp / 2
    tokens = prompts * ((prompt if share_prompt else G * prompt) + G * mean_r)
    mean_l2 = prompt ** 2 + prompt * max_resp + max_resp ** 2 / 3    # E[(p + U(0, R))^2]
    attn = 8 * mean_l2 * s["heads"] * s["head_dim"] * s["layers"] * prompts * G / 2   # causal: half the square
    return (8 * P * tokens + attn) / (GPUS * PEAK_FLOPS * MFU)


def load_preset(name: str) -> dict:
    import yaml
    return yaml.safe_load((REPO / "trainer" / "configs" / f"{name}.yaml").read_text())


def needs_scoring_forward(cfg: dict) -> bool:
    """Whether a seeds refresh runs the no-grad scoring forward (the trainer's own rule when it has one)."""
    from trainer.config import load_config
    from trainer.rollout import behavior_forward_reason
    keys = ("algorithm", "seed_loss", "seed_rule", "seed_stale_loss", "record_behavior_logprobs", "behavior_logprobs")
    return behavior_forward_reason(load_config(None, [f"{k}={cfg[k]}" for k in keys if k in cfg])) is not None


def step_time(cfg: dict, *, oversample: float | None = None) -> StepTime:
    s = SHAPES[cfg["model"]]
    prompts, G = int(cfg["prompts_per_step"]), int(cfg["samples_per_prompt"])
    prompt, R = cfg["max_prompt_tokens"] / 2, int(cfg["max_response_tokens"])
    k = float(oversample if oversample is not None else cfg.get("oversample", 0.0) or AUTO_OVERSAMPLE)
    gen = decode_seconds(s, k * prompts * G / GPUS, prompt, R)
    upd = update_seconds(s, prompts, G, prompt, R)
    refresh = 0.0
    if cfg.get("algorithm") == "seeds":
        T = int(cfg.get("seed_refresh_interval", 8))
        refresh = decode_seconds(s, T * prompts * G / GPUS, prompt, R) / T
        if needs_scoring_forward(cfg):
            tokens = prompts * G * (prompt + R / 2)
            refresh += 2 * params(s) * tokens / (GPUS * PEAK_FLOPS * MFU)
    val = 0.0
    if cfg.get("val_every"):
        val = decode_seconds(s, VAL_PROBLEMS * int(cfg.get("val_n", 32)) / GPUS, prompt,
                             int(cfg.get("val_max_tokens", R))) / int(cfg["val_every"])
    return StepTime(gen, upd, refresh, val, SYNC_S)


def verl_step_time(cfg: dict) -> StepTime:
    """The same step as verl's DAPO recipe runs it, under the same assumptions: one generation round of 3x the
    train batch (``gen_batch_size``), the old log-probs' no-grad forward every step (``compute_log_prob``), the
    update on remove-padding rows (each row's prompt computed again), the same validation and sync; a Thinking
    Seeds refresh has no verl counterpart and is left out."""
    s = SHAPES[cfg["model"]]
    prompts, G = int(cfg["prompts_per_step"]), int(cfg["samples_per_prompt"])
    prompt, R = cfg["max_prompt_tokens"] / 2, int(cfg["max_response_tokens"])
    gen = decode_seconds(s, 3 * prompts * G / GPUS, prompt, R)
    old = 2 * params(s) * prompts * G * (prompt + R / 2) / (GPUS * PEAK_FLOPS * MFU)
    upd = update_seconds(s, prompts, G, prompt, R, share_prompt=False) + old
    ours = step_time(cfg)
    return StepTime(gen, upd, 0.0, ours.validation_s, SYNC_S)


def table(presets=PAPER_PRESETS) -> list[dict]:
    rows = []
    for name in presets:
        cfg = load_preset(name)
        t = step_time(cfg)
        steps = int(cfg.get("total_steps", 500))
        rows.append({"preset": name, "generation s": round(t.generation_s, 1), "update s": round(t.update_s, 1),
                     "refresh s/step": round(t.refresh_s, 1), "validation s/step": round(t.validation_s, 1),
                     "sync s": t.sync_s, "step s": round(t.total_s, 1),
                     "run h": round(t.total_s * steps / 3600, 1), "steps": steps,
                     "verl DAPO step s": round(verl_step_time(cfg).total_s, 1)})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.step_model", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", action="append", default=[], help="a preset name (default: the paper presets)")
    a = p.parse_args(argv)
    rows = table(a.preset or PAPER_PRESETS)
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
