"""Loading a policy and its tokenizer from a Hugging Face directory or hub id."""

from __future__ import annotations

import os

import torch

__all__ = ["load_policy"]


def _looks_like_hub_id(path: str) -> bool:
    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(path)
    except Exception:
        return False
    return not path.startswith((".", "/", "~")) and path.count("/") <= 1


def load_policy(path: str, *, device=None, dtype=None):
    """Load a causal LM and its tokenizer from a Hugging Face directory or hub id; eval mode.

    dtype: a torch.dtype, its name ("bfloat16") or None (the checkpoint's). A tokenizer without a pad token gets
    its EOS token as pad."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(path)
    if not os.path.exists(path) and not _looks_like_hub_id(path):
        raise FileNotFoundError(
            f"policy {path!r} does not exist locally and is not a valid Hugging Face hub id (owner/name)"
        )
    kwargs = {}
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else dtype
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise OSError(f"could not load policy {path!r}: {e}") from e
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {path!r} has neither a pad nor an EOS token; set one before sampling")
        tokenizer.pad_token = tokenizer.eos_token
    if device is not None:
        model = model.to(device)
    model.eval()
    return model, tokenizer
