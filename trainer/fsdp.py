"""Everything that touches torch.distributed and FSDP2 lives here (and only here).

One process: the model is a plain module and every helper is the identity. ``torchrun --nproc_per_node N``:
``fully_shard`` wraps each decoder layer and the root (bf16 parameters with fp32 reduction on CUDA, fp32 on CPU
with gloo), state dicts are gathered in full for checkpoints and for the rollout engine.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed() -> Dist:
    """Initialise the process group when launched by torchrun; otherwise a single-process Dist."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(minutes=30))
    rank = dist.get_rank() if dist.is_initialized() else 0
    return Dist(rank=rank, world_size=world, local_rank=local, device=device)


def shard_model(model: torch.nn.Module, d: Dist, *, param_dtype: torch.dtype) -> torch.nn.Module:
    """FSDP2: fully_shard every decoder layer, then the root. A no-op on one process."""
    if not d.enabled:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    layers = _decoder_layers(model)
    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    # The loss is already divided by the global token count (all ranks), so gradients must be summed across
    # ranks, not averaged: FSDP's default divide-by-world-size would shrink them by N.
    for module in [*layers, model]:
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PREMUL_SUM)
    return model


def _decoder_layers(model: torch.nn.Module):
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    assert layers is not None, f"cannot find decoder layers on {type(model).__name__} (expected model.model.layers)"
    return list(layers)


def full_model_state_dict(model: torch.nn.Module, d: Dist) -> dict:
    """The full (unsharded) state dict on every rank, on CPU."""
    if not d.enabled:
        return {k: v.detach() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=False))


def load_full_model_state_dict(model: torch.nn.Module, state: dict, d: Dist) -> None:
    if not d.enabled:
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def optimizer_state_dict(model, optimizer, d: Dist) -> dict:
    if not d.enabled:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state_dict(model, optimizer, state: dict, d: Dist) -> None:
    if not d.enabled:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Global gradient norm (DTensor-aware under FSDP2) and in-place clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm


def all_reduce_sum(values: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.enabled:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_gather_objects(obj, d: Dist) -> list:
    if not d.enabled:
        return [obj]
    out = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, d: Dist):
    if not d.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()


def shutdown(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()
