"""LoRA adapters on the policy (config ``lora_rank`` > 0; Hu et al. 2021, arXiv:2106.09685), through PEFT.

``add_adapters`` runs ``peft.get_peft_model`` on the Hugging Face model and keeps training that model itself: PEFT
replaces each target ``nn.Linear`` in place by a ``lora.Linear`` (``base_layer`` plus ``lora_A``/``lora_B``), so
the module tree the trainer reads (``model.model.layers``, ``lm_head``, the flat forward, the HF engine) is the
same one, while the ``PeftModel`` wrapper would move it under ``base_model.model``. What a ``PeftModel`` adds is
done here on the injected layers: the reference with adapters off (``disabled_adapters``, as ``disable_adapter``),
the adapter in PEFT's file format (``write_adapter``, what ``PeftModel.save_pretrained`` writes and
``PeftModel.from_pretrained`` reads), the merged weights (``merged_state``, as ``merge_and_unload``).

Precision: the frozen base is cast to the compute dtype (2 B/param in bf16: no fp32 master, no gradient, no AdamW
state), the adapters stay in the master dtype (fp32) and are what the optimizer sees. PEFT's own input cast to
the adapter's dtype is turned off, so the adapters compute in the compute dtype like every other layer (their
fp32 weights cast per call by ``trainer.fsdp.cast_for_compute``, or ``compute_params`` in the HF engine): the
trainer's forward and the engine's then compute the same function, as in a full run.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import math
import os
from pathlib import Path

import torch

from trainer.config import Config, ConfigError
from trainer.fsdp import Dist, local_rows, stream_full_state

__all__ = ["ADAPTER", "ADAPTER_WEIGHTS", "BASE_DIR", "add_adapters", "adapter_names", "adapter_state",
           "adapter_summary", "base_folder", "base_reference", "disabled_adapters", "has_adapters", "init_adapters",
           "is_adapter_name", "lora_alpha", "merged_state", "write_adapter"]

ADAPTER = "default"                            # PEFT's adapter name: the one adapter a run trains
ADAPTER_WEIGHTS = "adapter_model.safetensors"  # PeftModel.save_pretrained's weights (adapter_config.json beside it)
_PEFT_PREFIX = "base_model.model."             # where the model sits inside a PeftModel, in its state dict's keys


def lora_alpha(cfg: Config) -> float:
    """alpha of ``cfg``: ``lora_alpha``, or 2 * rank when it is null or 0 (scale alpha / r = 2)."""
    return float(cfg.lora_alpha or 2 * cfg.lora_rank)


def has_adapters(model: torch.nn.Module) -> bool:
    """Whether ``add_adapters`` gave ``model`` LoRA layers (PEFT leaves ``peft_config`` on the model it injects)."""
    return isinstance(getattr(model, "peft_config", None), dict) and ADAPTER in model.peft_config


def add_adapters(model: torch.nn.Module, cfg: Config, *, compute: torch.dtype, master: torch.dtype,
                 base: str | None) -> torch.nn.Module:
    """``model`` with rank-``lora_rank`` adapters on ``lora_targets`` (in place; the same module is returned):
    every base parameter frozen and cast to ``compute`` (buffers keep their dtype: RoPE's ``inv_freq`` in fp32),
    adapter parameters in ``master`` and trainable. ``base``: what the adapter's ``adapter_config.json`` names as
    its base model (a folder or hub id; None: the first checkpoint writes the base and names it, ``base_folder``).
    A target no module is named is a ConfigError naming the model's linear layers."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    names = [name for name, _ in model.named_modules()]
    missing = [t for t in cfg.lora_targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ConfigError(f"lora_targets: {type(model).__name__} has no module named {', '.join(missing)}; its "
                          f"linear layers are {', '.join(linear)}")
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(compute)
    config = LoraConfig(r=cfg.lora_rank, lora_alpha=lora_alpha(cfg), lora_dropout=cfg.lora_dropout,
                        target_modules=list(cfg.lora_targets), bias="none", task_type="CAUSAL_LM")
    get_peft_model(model, config, autocast_adapter_dtype=False)   # injects into ``model``; the wrapper is dropped
    model.peft_config[ADAPTER].base_model_name_or_path = base
    for name, p in model.named_parameters():
        if p.requires_grad:
            p.data = p.data.to(master)
    for m in model.modules():
        if isinstance(m, LoraLayer):
            m.cast_input_dtype_enabled = False   # compute in the compute dtype, as the base layer (module doc)
    if not any(p.is_meta for p in model.parameters()):   # on meta: after the sharded load (trainer.policy)
        init_adapters(model, cfg.seed)
    if getattr(model, "is_gradient_checkpointing", False):
        model.enable_input_require_grads()   # frozen embeddings: checkpointed layers still need a graph to recompute
    return model


@contextlib.contextmanager
def disabled_adapters(model: torch.nn.Module):
    """While the block runs, ``model`` computes its base alone (``PeftModel.disable_adapter``): the KL penalty's
    reference without a second copy of the model. A no-op for a model without adapters (a separate reference)."""
    if not has_adapters(model):
        yield model
        return
    from peft.tuners.tuners_utils import BaseTunerLayer

    # the flag PEFT's forward reads, set directly: ``enable_adapters(False)`` also turns the adapters'
    # requires_grad off, and an FSDP2 unit whose first forward ran so would take them for frozen for good (its
    # reduce dtype unset: bf16 gradients into fp32 adapters on several ranks)
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for m in layers:
        m._disable_adapters = True
    try:
        yield model
    finally:
        for m in layers:
            m._disable_adapters = False


def is_adapter_name(name: str) -> bool:
    """Whether a parameter name is the adapter's (``...q_proj.lora_A.default.weight``), not the base's."""
    return f".lora_A.{ADAPTER}." in name or f".lora_B.{ADAPTER}." in name


def adapter_names(model: torch.nn.Module) -> list[str]:
    """The names of the adapter parameters (``...q_proj.lora_A.default.weight``), in the model's order."""
    return [n for n, _ in model.named_parameters() if is_adapter_name(n)]


@torch.no_grad()
def init_adapters(model: torch.nn.Module, seed: int) -> None:
    """PEFT's default initialisation (``init_lora_weights=True``: ``lora_A`` Kaiming-uniform with a = sqrt(5),
    that is U(-1/sqrt(fan_in), 1/sqrt(fan_in)); ``lora_B`` zeros, so the adapted model starts as the base), drawn
    per tensor from a generator seeded by ``seed`` and the tensor's name rather than from the global stream. One
    process and N ranks then start from the same adapter: a sharded (FSDP2) parameter gets its own rows of the
    same full draw (``trainer.fsdp.local_rows``)."""
    for name, p in model.named_parameters():
        if not is_adapter_name(name):
            continue
        if f".lora_B.{ADAPTER}." in name:
            full = torch.zeros(p.shape)
        else:
            key = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)
            bound = 1.0 / math.sqrt(p.shape[1])
            full = (torch.rand(p.shape, generator=torch.Generator().manual_seed(key)) * 2 - 1) * bound
        local, (start, stop) = local_rows(p)
        local.copy_(full[start:stop].to(local.dtype))


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors as ``PeftModel.save_pretrained`` keys them (``base_model.model.<module>.lora_A.weight``:
    the wrapper's prefix, no adapter name), on CPU in their own (master) dtype: ``inference.vllm_engine
    .adapter_tensors``, what the engine's adapter sync sends. Collective on a sharded model (each tensor is gathered
    whole): every rank calls it, and every rank gets the tensors."""
    from inference.vllm_engine import adapter_tensors

    return adapter_tensors(model)


def write_adapter(out: Path, model: torch.nn.Module, tokenizer, *, base: str,
                  state: dict[str, torch.Tensor] | None = None) -> None:
    """PEFT's adapter folder in ``out`` (rank 0): ``adapter_config.json`` naming ``base`` as
    ``base_model_name_or_path``, ``adapter_model.safetensors``, and the tokenizer, so that
    ``PeftModel.from_pretrained(<base>, out)`` loads it and ``eval.run --model out`` scores it. ``state``: the
    tensors, gathered by every rank beforehand (``adapter_state`` is collective); default ``adapter_state(model)``,
    one process."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(adapter_state(model) if state is None else state, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config = copy.deepcopy(model.peft_config[ADAPTER])
    config.base_model_name_or_path = base
    config.save_pretrained(str(out))
    tokenizer.save_pretrained(out)


def merged_state(model: torch.nn.Module, d: Dist, *, dtype: torch.dtype | None, merge: bool = True):
    """``trainer.fsdp.stream_full_state`` of the model as a plain Hugging Face model (the names it had before the
    adapters: ``q_proj.weight``, no ``base_layer``, no ``lora_*``), each target weight W + scale * B @ A summed in
    float32 (``merge=False``: W alone, the frozen base), then cast to ``dtype`` (None: its own). Collective; rank 0
    gets the tensors, the others None."""
    deltas = {}
    if merge:   # scale * B @ A from the whole A and B (gathered on every rank: a shard's product is not a shard)
        from peft.tuners.lora import LoraLayer
        full = adapter_state(model)
        if d.is_main:
            deltas = {name: (full[f"{_PEFT_PREFIX}{name}.lora_B.weight"].float()
                             @ full[f"{_PEFT_PREFIX}{name}.lora_A.weight"].float()) * m.scaling[ADAPTER]
                      for name, m in model.named_modules() if isinstance(m, LoraLayer) and ADAPTER in m.lora_A}
        del full
    adapters = set(adapter_names(model))
    for name, tensor in stream_full_state(model, d):
        if name in adapters or tensor is None:
            continue
        owner, leaf = name.rsplit(".base_layer.", 1) if ".base_layer." in name else (None, None)
        if owner is not None:
            if leaf == "weight" and owner in deltas:
                tensor = tensor.float() + deltas[owner]
            name = f"{owner}.{leaf}"
        yield name, (tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor)


def base_reference(cfg: Config, source: str) -> str | None:
    """What an adapter names as its base: the hub id the run was given (not its cache path: a results file and
    another machine read it alike), else the absolute folder the policy was loaded from; None for a ``tiny:`` model
    built in memory (the checkpoint then writes its base into the run folder: ``base_folder``)."""
    from inference.hub import is_hub_id

    if source.startswith("tiny:"):
        return None
    if is_hub_id(cfg.model):   # source is its snapshot in the cache
        return cfg.model
    return str(Path(source).resolve())


BASE_DIR = "lora_base"   # runs/<run>/lora_base: the frozen base of a tiny: run, written once, named by its adapters


def base_folder(run_dir: Path, model: torch.nn.Module, tokenizer, d: Dist, *, dtype: torch.dtype,
                write_export) -> str:
    """The base folder of a run whose base exists only in memory (``tiny:``): ``run_dir/lora_base``, a Hugging Face
    model of the frozen base written the first time (``write_export(out, tensors)``, collective) and atomically
    (a temporary folder renamed). Returns its absolute path."""
    out = Path(run_dir) / BASE_DIR
    if not (out / "config.json").is_file():
        tmp = out.with_name(out.name + ".tmp")
        if d.is_main:
            tmp.mkdir(parents=True, exist_ok=True)
        write_export(tmp, merged_state(model, d, dtype=dtype, merge=False))
        if d.is_main:
            os.replace(tmp, out)
    return str(out.resolve())


def adapter_summary(model: torch.nn.Module) -> str:
    """One line for the launch: trainable (adapter) and total parameters, as PEFT's ``print_trainable_parameters``."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    cfg = model.peft_config[ADAPTER]
    return (f"LoRA: rank {cfg.r}, alpha {cfg.lora_alpha:g} on {', '.join(sorted(cfg.target_modules))}: "
            f"{trainable:,} trainable of {total:,} parameters ({100 * trainable / total:.3f} %)")

