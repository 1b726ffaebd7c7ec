"""Loading a policy and its tokenizer from a Hugging Face directory or hub id."""

from __future__ import annotations

import os

import torch

__all__ = ["load_policy", "load_skeleton", "load_tokenizer"]


def _looks_like_hub_id(path: str) -> bool:
    try:
        from huggingface_hub.utils import validate_repo_id

        validate_repo_id(path)
    except Exception:
        return False
    return not path.startswith((".", "/", "~")) and path.count("/") <= 1


def _check_path(path: str) -> None:
    if not os.path.exists(path) and not _looks_like_hub_id(path):
        raise FileNotFoundError(
            f"policy {path!r} does not exist locally and is not a valid Hugging Face hub id (owner/name)"
        )


def load_tokenizer(path: str):
    """The tokenizer of a Hugging Face directory or hub id; without a pad token, its EOS token is the pad."""
    from transformers import AutoTokenizer

    path = str(path)
    _check_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except OSError as e:
        raise OSError(f"could not load the tokenizer of {path!r}: {e}") from e
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {path!r} has neither a pad nor an EOS token; set one before sampling")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_skeleton(path: str, *, dtype=None):
    """The model of ``path`` without its weights (parameters on the ``meta`` device: no memory) and its
    generation config: what an engine that loads the weights itself (vLLM, ``sync_weights=False``) needs to know
    about the model — its config, its dtype, its stop ids — without a host copy of a 7B model per process."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    path = str(path)
    _check_path(path)
    config = AutoConfig.from_pretrained(path)
    if dtype is None or dtype == "auto":
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.name_or_path = path
    try:
        model.generation_config = GenerationConfig.from_pretrained(path)
    except OSError:   # no generation_config.json: the config's own defaults
        pass
    return model.eval()


def load_policy(path: str, *, device=None, dtype=None):
    """Load a causal LM and its tokenizer (``load_tokenizer``) from a Hugging Face directory or hub id; eval mode.

    dtype: a torch.dtype, its name ("bfloat16") or None (the checkpoint's)."""
    from transformers import AutoModelForCausalLM

    path = str(path)
    _check_path(path)
    kwargs = {}
    if dtype is not None:
        kwargs["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else dtype
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as e:
        raise OSError(f"could not load policy {path!r}: {e}") from e
    tokenizer = load_tokenizer(path)
    if device is not None:
        model = model.to(device)
    model.eval()
    return model, tokenizer
