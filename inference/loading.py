"""Loading a policy and its tokenizer from a Hugging Face directory or hub id.

Every loader first turns its argument into a local directory (``inference.hub.local_model_dir``: a hub id becomes
its snapshot in the Hugging Face cache, downloaded where that is allowed), so the model's ``name_or_path`` is always
a folder an engine can load from (vLLM reads the same files, nothing is re-saved)."""

from __future__ import annotations

import torch

from inference.hub import local_model_dir

__all__ = ["load_policy", "load_skeleton", "load_tokenizer"]


def load_tokenizer(path: str):
    """The tokenizer of a Hugging Face directory or hub id; without a pad token, its EOS token is the pad."""
    from transformers import AutoTokenizer

    path = local_model_dir(path)
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

    path = local_model_dir(path)
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

    path = local_model_dir(path)
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
