"""Engine choice: ``make_sampler`` builds the HF or the vLLM engine for a model, with the one stop rule."""

from __future__ import annotations

import importlib.util

import torch

from inference.protocol import Sampler
from inference.stops import eos_list, stop_ids

__all__ = ["ENGINES", "make_sampler", "resolve_engine"]

ENGINES = ("hf", "vllm", "auto")


def resolve_engine(engine: str) -> str:
    """"hf" or "vllm" for ``engine`` ("auto": vLLM when CUDA and vllm are available)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if engine == "auto":
        return "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None else "hf"
    return engine


def make_sampler(model, tokenizer, *, engine: str = "hf", **kw) -> Sampler:
    """Build a sampler for `model`. engine: "hf" | "vllm" | "auto" (vLLM when CUDA and vllm are available).

    Stop ids default to ``inference.stops.stop_ids`` (the tokenizer's and generation config's EOS ids and the
    chat end-of-turn tokens the vocabulary has); the pad id to the tokenizer's (else the first stop id). Other keywords go to the engine (`max_batch_size` for HF, which vLLM receives as
    `max_num_seqs`; `gpu_memory_utilization` and vllm.LLM arguments for vLLM)."""
    engine = resolve_engine(engine)
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
