"""Engine choice: ``make_sampler`` builds the HF or the vLLM engine for a model, with the one stop rule."""

from __future__ import annotations

import importlib.util

import torch

from inference.names import ENGINES, EngineName
from inference.protocol import Sampler
from inference.stops import eos_list, stop_ids

__all__ = ["ENGINES", "EngineName", "make_sampler", "resolve_engine"]



# On a CPU, vLLM's CPU build pays a fixed cost per scheduling step that dominates for tiny models (1M parameters:
# the HF engine ~90x faster) and wins from a few hundred million parameters (0.5B, 2 cores, 32 prompts x 64 new
# tokens: vLLM 142 / 79 tokens/s in bf16 / fp32 against the HF engine's 109 / 49). docs/performance.md.
CPU_VLLM_MIN_PARAMS = 200_000_000


def _num_params(model=None, model_path: str | None = None) -> int | None:
    if model is not None:
        return sum(p.numel() for p in model.parameters())
    if model_path is not None:
        import json
        from pathlib import Path
        cfg = Path(model_path) / "config.json"
        if cfg.exists():
            c = json.loads(cfg.read_text())
            h, L, V = c.get("hidden_size"), c.get("num_hidden_layers"), c.get("vocab_size")
            inter = c.get("intermediate_size") or (4 * h if h else None)
            if h and L and V and inter:
                heads = c.get("num_attention_heads") or 1
                kv = (c.get("num_key_value_heads") or heads) * (c.get("head_dim") or h // heads)
                attention = 2 * h * h + 2 * h * kv                 # q, o and the (grouped) k, v projections
                embeddings = V * h * (1 if c.get("tie_word_embeddings") else 2)
                return int(L * (attention + 3 * h * inter) + embeddings)   # + gated MLP
    return None


def resolve_engine(engine: str, *, model=None, model_path: str | None = None, num_params: int | None = None,
                   cuda: bool | None = None) -> str:
    """"hf" or "vllm" for ``engine``. "auto": vLLM on a CUDA machine that has it; on a CPU, vLLM's CPU build for
    models of at least ``CPU_VLLM_MIN_PARAMS`` parameters (size from ``model`` or ``model_path``'s config) and the
    HF engine below, where vLLM's per-step overhead dominates. ``num_params`` and ``cuda`` override what is read
    from the model and the machine."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine != "auto":
        return engine
    if importlib.util.find_spec("vllm") is None:
        return "hf"
    if torch.cuda.is_available() if cuda is None else cuda:
        return "vllm"
    size = num_params if num_params is not None else _num_params(model, model_path)
    return "vllm" if size is not None and size >= CPU_VLLM_MIN_PARAMS else "hf"


def make_sampler(model, tokenizer, *, engine: str = "hf", **kw) -> Sampler:
    """Build a sampler for `model`. engine: "hf" | "vllm" | "auto" (vLLM when CUDA and vllm are available).

    Stop ids default to ``inference.stops.stop_ids`` (the tokenizer's and generation config's EOS ids and the
    chat end-of-turn tokens the vocabulary has); the pad id to the tokenizer's (else the first stop id). Other keywords go to the engine (`max_batch_size` for HF, which vLLM receives as
    `max_num_seqs`; `gpu_memory_utilization` and vllm.LLM arguments for vLLM)."""
    engine = resolve_engine(engine, model=model)
    eos = kw.pop("eos_token_id", None) or stop_ids(model, tokenizer)
    if not eos:
        raise ValueError("no EOS id: the tokenizer and generation config define none; pass eos_token_id=")
    pad = kw.pop("pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = eos_list(eos)[0]
    if engine == "hf":
        from inference.hf import HFSampler
        return HFSampler(model, eos_token_id=eos, pad_token_id=pad, **kw)
    if "max_batch_size" in kw:   # the same knob in vLLM's words: sequences scheduled together
        kw["max_num_seqs"] = kw.pop("max_batch_size")
    from inference.vllm_engine import VLLMSampler
    return VLLMSampler(model, eos_token_id=eos, pad_token_id=pad, tokenizer=tokenizer, **kw)
