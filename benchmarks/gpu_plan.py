"""The GPU memory plan of the paper presets (docs/gpu_memory.md), as arithmetic the page prints and a test checks.

    python -m benchmarks.gpu_plan              # print the tables
    python -m benchmarks.gpu_plan --write      # rewrite the generated part of docs/gpu_memory.md

What one GPU holds in a colocated run on one node of 8 x 80 GB cards (one vLLM engine per rank at tensor
parallelism 1, FSDP2 over the 8 ranks, ``fully_shard`` per decoder layer and once for the root). Every term is a
function of the model's shapes and the preset's fields; ``terms`` names where each comes from. Nothing here is
measured: ``benchmarks/device_check.py`` measures the update phase's per-layer terms on one GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

GB = 1e9
# an 80 GB-class card (A100/H100 80 GB) as nvidia-smi reports it: 81,559 MiB; vLLM's gpu_memory_utilization is a
# share of this total, so 0.4 is 34.2 GB, not 32
CARD_BYTES = 81_559 * 2**20
RANKS = 8
LOGIT_CHUNK_MEASURED_GB = 3.9   # benchmarks/bench_logprob_memory.py: 1024 positions x 152,064 logits, fp32, CPU
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
PRESETS = {"7B": "qwen25math7b_onpolicy", "1.5B": "r1distill15b_onpolicy", "4B": "qwen3_4b_code_onpolicy"}


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


def recompute_bytes_per_token(s: dict) -> int:
    """One decoder layer's saved tensors while checkpointing recomputes it for backward, bytes per token: each
    RMSNorm saves its input in fp32 (transformers casts to fp32) and its bf16 output (h x (4 + 2) twice), the
    residual stream (h x 2) and the o-projection's output (h x 2); q, its rotated copy, the attention output and
    the o-projection's input (q x 2 x 4); k, v and rotated k (kv x 2 x 3); gate, up, silu(gate) and their product
    (m x 2 x 4)."""
    h, q, kv, m = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["mlp"]
    return h * 16 + q * 8 + kv * 6 + m * 8


def terms(s: dict, *, tokens: int, ranks: int = RANKS) -> dict[str, float]:
    """The update phase's terms in GB (module doc); ``tokens`` is ``micro_batch_tokens``."""
    P, Pl, Pr = params(s), layer_params(s), root_params(s)
    h, V = s["hidden"], s["vocab"]
    return {
        "state": 16 * P / ranks / GB,                        # fp32 weights, fp32 gradients, AdamW's two moments
        "root_unsharded": 2 * Pr / GB,                       # the root unit's bf16 all-gather, kept through backward
        "layers_in_flight": 2 * 2 * Pl / GB,                 # one layer's bf16 all-gather + the prefetched next one
        "boundaries": s["layers"] * tokens * h * 2 / GB,     # checkpointed hidden state per layer, bf16
        "final_norm": tokens * h * (4 + 2) / GB,             # the final RMSNorm outside checkpointing
        "layer_recompute": tokens * recompute_bytes_per_token(s) / GB,
        "layer_grads": Pl * (2 + 4) / GB,                    # a unit's bf16 gradients and their fp32 reduce copy
        "head_grad": 2 * V * h / GB,                         # the root's bf16 head/embedding gradient, reduced last
        "logit_chunk": LOGIT_CHUNK_MEASURED_GB * V / 152064,
    }


def scoring_bytes_per_token(s: dict) -> int:
    """One decoder layer's working set in a no-grad forward, bytes per token: nothing is saved for backward, so only
    the block running holds memory beside the residual stream and the block's normed input (h x 2 x 2): the MLP's
    silu(gate), up and their product (m x 2 x 3), or the attention block's q, k, v with the rotated q and k and the
    attention output (q x 2 x 3 + kv x 2 x 3), whichever is larger (the MLP at every preset)."""
    h, q, kv, m = s["hidden"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"], s["mlp"]
    return 4 * h + max(6 * m, 6 * q + 6 * kv)


def generation_terms(s: dict, *, tokens: int, ranks: int = RANKS) -> dict[str, float]:
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
    one engine share (the KV cache, i.e. decoding throughput, is then the same in a seeds vs on-policy comparison)."""
    t = terms(s, tokens=tokens, ranks=ranks)
    at_layer = t["layers_in_flight"] + tokens * scoring_bytes_per_token(s) / GB
    at_head = t["final_norm"] + t["logit_chunk"]
    return {"root_gathered": t["root_unsharded"], "scoring": max(at_layer, at_head),
            "scoring_at": "a decoder layer" if at_layer > at_head else "the LM head"}


# the engine share is what the generation phase leaves of the card less this headroom (vLLM's profiling run,
# fragmentation beyond the allowance, a longer refill batch: what the plan does not model), rounded down to a
# multiple of UTIL_STEP; the memory/* metrics of a first run (trainer.fsdp.gpu_memory_metrics) say how much is real
HEADROOM = 0.10
UTIL_STEP = 0.05


def derived_util(state_gb: float, gen: dict) -> float:
    """The ``vllm_gpu_memory_utilization`` the plan derives: the largest multiple of ``UTIL_STEP`` whose share
    leaves ``HEADROOM`` of the card free at the generation phase's peak (state + allowance + the no-grad forward's
    root and transient + the share)."""
    card = CARD_BYTES / GB
    fixed = state_gb + CUDA_OVERHEAD_GB + gen["root_gathered"] + gen["scoring"]
    steps = int((card * (1 - HEADROOM) - fixed) / card / UTIL_STEP + 1e-9)
    return round(steps * UTIL_STEP, 2)


def update_peak(t: dict) -> tuple[float, str]:
    """The larger of the two moments of backward: at the LM head (its chunk's logits alive, the last layer
    prefetched) and at the last decoder layer (recomputed, its gradients being reduced, the head gradient held)."""
    base = t["state"] + t["root_unsharded"] + t["boundaries"] + CUDA_OVERHEAD_GB + VLLM_ASLEEP_GB
    at_head = base + t["layers_in_flight"] / 2 + t["final_norm"] + t["logit_chunk"] + t["head_grad"]
    at_layer = base + t["layers_in_flight"] + t["layer_recompute"] + t["layer_grads"] + t["head_grad"]
    return (at_head, "LM head") if at_head > at_layer else (at_layer, "last layer")


def plan(preset: str) -> dict:
    from trainer.config import load_config
    repo = Path(__file__).resolve().parents[1]
    cfg = load_config(str(repo / "trainer" / "configs" / f"{preset}.yaml"), [])
    s = SHAPES[cfg.model]
    t = terms(s, tokens=cfg.micro_batch_tokens)
    peak, where = update_peak(t)
    share = cfg.vllm_gpu_memory_utilization * CARD_BYTES / GB
    weights = 2 * params(s) / GB
    kv_token = 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * 2
    max_len = cfg.vllm_max_model_len or cfg.max_prompt_tokens + cfg.max_response_tokens
    kv_gb = share - weights - 1.0   # vLLM's own activations and CUDA graphs: about 1 GB at these batch sizes
    g = generation_terms(s, tokens=cfg.micro_batch_tokens)
    gen = t["state"] + share + CUDA_OVERHEAD_GB + g["root_gathered"] + g["scoring"]
    return {"preset": preset, "model": cfg.model, "params": params(s), "tokens": cfg.micro_batch_tokens,
            "terms": t, "gen_terms": g, "derived_util": derived_util(t["state"], g),
            "update_peak": peak, "update_peak_at": where, "util": cfg.vllm_gpu_memory_utilization,
            "share": share, "vllm_weights": weights, "kv_bytes_per_token": kv_token, "kv_gb": kv_gb,
            "kv_tokens": kv_gb * GB / kv_token, "max_model_len": max_len,
            "kv_sequences": kv_gb * GB / kv_token / max_len, "generation": gen,
            "sleep_off": peak - VLLM_ASLEEP_GB + share, "card": CARD_BYTES / GB}


BEGIN, END = "<!-- plan: generated by python -m benchmarks.gpu_plan --write -->", "<!-- /plan -->"


def render() -> str:
    plans = {k: plan(v) for k, v in PRESETS.items()}
    cols = list(plans)
    f = lambda x: f"{x:.1f} GB"
    rows = [
        ("parameters P", lambda p: f"{p['params'] / 1e9:.2f} B"),
        ("`micro_batch_tokens` T", lambda p: f"{p['tokens']:,}"),
        ("trainer state: 16 B × P / 8 ranks", lambda p: f(p["terms"]["state"])),
        ("root unit (embeddings, head) unsharded, bf16", lambda p: f(p["terms"]["root_unsharded"])),
        ("decoder units in flight: 2 × bf16 layer", lambda p: f(p["terms"]["layers_in_flight"])),
        ("checkpointed boundaries: layers × T × hidden × 2 B", lambda p: f(p["terms"]["boundaries"])),
        ("one layer recomputed: T × (16 h + 8 q + 6 kv + 8 m) B", lambda p: f(p["terms"]["layer_recompute"])),
        ("its gradients before reduce-scatter: bf16 + fp32 copy", lambda p: f(p["terms"]["layer_grads"])),
        ("head gradient, bf16, held until the root reduces", lambda p: f(p["terms"]["head_grad"])),
        ("final norm saves (fp32 + bf16)", lambda p: f(p["terms"]["final_norm"])),
        ("log-prob chunk, 1024 positions (measured on CPU)", lambda p: f(p["terms"]["logit_chunk"])),
        ("CUDA context, NCCL, fragmentation (allowance) + asleep engine", lambda p: f(CUDA_OVERHEAD_GB + VLLM_ASLEEP_GB)),
        ("**update phase peak** (engine asleep)", lambda p: f"**{p['update_peak']:.1f} GB** (at the {p['update_peak_at']})"),
        ("root unit gathered by a no-grad forward (probe, scoring), resharded after it",
         lambda p: f(p["gen_terms"]["root_gathered"])),
        ("no-grad scoring transient, T tokens, engine awake: layer T × (4 h + 6 m) B + 2 layers, or head",
         lambda p: f"{p['gen_terms']['scoring']:.1f} GB (at {p['gen_terms']['scoring_at']})"),
        (f"engine share derived: leaves {HEADROOM:.0%} of the card, in steps of {UTIL_STEP:g}",
         lambda p: f"{p['derived_util']:g}"),
        ("`vllm_gpu_memory_utilization` × 85.5 GB", lambda p: f"{p['util']:g} → {p['share']:.1f} GB"),
        ("vLLM weights (bf16)", lambda p: f(p["vllm_weights"])),
        ("vLLM KV cache: bytes per token", lambda p: f"{p['kv_bytes_per_token'] // 1024} KiB"),
        ("KV cache left (share − weights − 1 GB)", lambda p: f"{p['kv_gb']:.1f} GB ≈ {p['kv_tokens'] / 1e3:.0f} k tokens ≈ "
                                                          f"{p['kv_sequences']:.0f} × {p['max_model_len']:,}"),
        ("**generation phase peak** (state + share + allowance + root + scoring)",
         lambda p: f"**{p['generation']:.1f} GB** ({p['card'] - p['generation']:.1f} GB free)"),
        ("sleep mode off: update peak + the share", lambda p: f"{p['sleep_off']:.1f} GB"),
    ]
    out = [BEGIN, "", "| per GPU | " + " | ".join(f"{c} (`{PRESETS[c]}`)" for c in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for name, fn in rows:
        out.append(f"| {name} | " + " | ".join(fn(plans[c]) for c in cols) + " |")
    out += ["", END]
    return "\n".join(out)


def write(page: Path) -> None:
    text = page.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{page}: no generated section ({BEGIN} ... {END}) to replace")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    tmp = page.with_suffix(".md.tmp")
    tmp.write_text(head + render() + tail)
    tmp.replace(page)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help="rewrite the generated table of docs/gpu_memory.md")
    a = p.parse_args(argv)
    if a.write:
        write(Path(__file__).resolve().parents[1] / "docs" / "gpu_memory.md")
    print(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
