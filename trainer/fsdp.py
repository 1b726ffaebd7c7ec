"""Everything that touches torch.distributed and FSDP2 lives here (and only here).

One process: the model is a plain module and every helper is the identity. ``torchrun --nproc_per_node N``:
``fully_shard`` wraps each decoder layer and the root of a model built on the meta device, each rank reads only its
own shards of the weights (``load_shards``), and full tensors are gathered one at a time for the export and the
rollout engine (``stream_full_state``, ``copy_full_weights``), never as a whole state dict. Precision is the same on both (``shard_model``): parameters and optimizer state in the master dtype
(fp32), forward and backward in the compute dtype (bf16 on CUDA), gradients reduced and accumulated in fp32.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import warnings
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Replicate, Shard

from inference.flat import enable_fsdp
from inference.hub import ModelSourceError


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    # what ``shard_model`` shards over: None = every rank (FSDP on the default 1-D mesh, or nothing on one process);
    # a 2-D ("replicate", "shard") mesh = HSDP (``hsdp_shape``); a mesh of one rank runs FSDP2's path on one GPU
    mesh: DeviceMesh | None = None
    # the group whose collectives wait ``generation_timeout()``, for the wait after a generation (``patient_group``)
    patient: dist.ProcessGroup | None = field(default=None, repr=False, compare=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


# how long a collective of the process group waits for the slowest rank before the job fails; a wait that may take
# longer (a node's rank downloading the model) goes through ``all_gather_objects_patiently``
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)
PATIENT_TIMEOUT = datetime.timedelta(hours=8)


def init_distributed() -> Dist:
    """Initialise the process group when launched by torchrun (collectives time out after ``COLLECTIVE_TIMEOUT``);
    otherwise a single-process Dist. On several nodes (``WORLD_SIZE // LOCAL_WORLD_SIZE > 1``) or with
    ``THINKING_SEEDS_HSDP_REPLICAS`` > 1, ``d.mesh`` is the HSDP mesh of ``hsdp_shape``."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=COLLECTIVE_TIMEOUT)
    rank = dist.get_rank() if dist.is_initialized() else 0
    mesh = None
    if world > 1:
        replicas, shard = hsdp_shape(world, int(os.environ.get("LOCAL_WORLD_SIZE", world)),
                                     os.environ.get(HSDP_REPLICAS_ENV))
        if replicas > 1:   # collective: every rank builds the same mesh (one group per row and per column)
            mesh = init_device_mesh(device.type, (replicas, shard), mesh_dim_names=("replicate", "shard"))
    return Dist(rank=rank, world_size=world, local_rank=local, device=device, mesh=mesh)


# overrides the replica count of ``hsdp_shape``: 1 shards over every rank of every node (more memory per GPU for
# the model, every all-gather across the nodes' link); N > 1 makes N replicas (a test runs 2 ranks of one machine
# as 2 replicas of 1 shard)
HSDP_REPLICAS_ENV = "THINKING_SEEDS_HSDP_REPLICAS"


def hsdp_shape(world_size: int, local_world_size: int, replicas: str | None = None) -> tuple[int, int]:
    """(replicas, shards per replica) of the data-parallel mesh: on several nodes, shard within a node and
    replicate across nodes (HSDP, as torchtitan's ``dp_replicate`` x ``dp_shard``), so FSDP's per-layer
    all-gathers and reduce-scatters stay on the node's NVLink and only one all-reduce of the gradient shards per
    backward crosses the nodes' link; on one node (1, world_size), plain FSDP. ``replicas``: the
    ``THINKING_SEEDS_HSDP_REPLICAS`` override, which must divide the world size. ``ValueError`` (one line, what
    to set) for a world torchrun cannot have made or an override that does not fit."""
    if local_world_size < 1 or world_size % local_world_size:
        raise ValueError(f"WORLD_SIZE={world_size} is not a multiple of LOCAL_WORLD_SIZE={local_world_size}: launch "
                         f"the same --nproc_per_node on every node")
    n = world_size // local_world_size   # nodes
    if replicas not in (None, ""):
        if not replicas.strip().isdigit() or int(replicas) < 1 or world_size % int(replicas):
            raise ValueError(f"{HSDP_REPLICAS_ENV}={replicas} must be a positive divisor of the world size "
                             f"{world_size}: {n} (one replica per node, the default), 1 (shard over all ranks) or "
                             f"unset it")
        n = int(replicas)
    return n, world_size // n


def shard_model(model: torch.nn.Module, d: Dist, *, param_dtype: torch.dtype) -> torch.nn.Module:
    """FSDP2 with mixed precision: ``fully_shard`` every decoder layer, then the root. The module's own parameters
    stay what they are (the master copy: fp32 unless ``master_dtype=bfloat16``) and so does the optimizer state
    built on them; ``param_dtype`` is the compute dtype. This is torchtitan's and verl's FSDP2 recipe
    (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` over fp32 sharded parameters): each unit's
    all-gather casts its shard to bf16, forward and backward run in bf16, and gradients are cast to fp32 before the
    reduce-scatter, so the sharded fp32 gradient and AdamW's step lose nothing to bf16 rounding (at lr 1e-6 a bf16
    weight of magnitude > ~2.6e-4 cannot move: the update is below half an ulp).

    ``d.mesh`` (``init_distributed``): None shards over every rank; a 2-D ("replicate", "shard") mesh is HSDP, each
    parameter ``(Replicate(), Shard(0))``: reduce-scattered within a replica, then all-reduced across replicas.
    A mesh of one rank takes this path on one process too (the device check measures it on one GPU).

    One process: the same arithmetic without the collectives (``cast_for_compute``). A no-op when the parameters
    are already in ``param_dtype``.
    """
    if not d.enabled and d.mesh is None:
        return cast_for_compute(model, param_dtype)
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    layers = _decoder_layers(model)
    for layer in layers:
        fully_shard(layer, mesh=d.mesh, mp_policy=mp)
    fully_shard(model, mesh=d.mesh, mp_policy=mp)
    _COMPUTE_DTYPE[model] = param_dtype
    # The loss is already divided by the global token count (all ranks), so gradients must be summed across
    # ranks, not averaged: FSDP's default divide-by-world-size would shrink them by N. Under HSDP both the
    # reduce-scatter and the all-reduce across replicas sum (factor 1: no pre- or post-division, SUM for both).
    for module in [*layers, model]:
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PREMUL_SUM)
    enable_fsdp(model)   # the padding-free forward through FSDP's hooks (Llama-family architectures)
    return model


def reshard(model: torch.nn.Module) -> None:
    """Free the unsharded parameters FSDP2 keeps after a forward: the root unit (embeddings, head) stays gathered
    until backward, which a module that only runs no-grad forwards (the KL penalty's reference) never reaches, so
    it would hold them for the rest of the step. A no-op on one process."""
    if isinstance(model, FSDPModule):
        model.reshard()


# model -> the dtype its forward computes in, for modules whose parameters hold another (the master) dtype
_COMPUTE_DTYPE: "weakref.WeakKeyDictionary[torch.nn.Module, torch.dtype]" = weakref.WeakKeyDictionary()


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype ``model``'s forward computes in: the one ``shard_model`` set, else its parameters' own."""
    if model in _COMPUTE_DTYPE:
        return _COMPUTE_DTYPE[model]
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


def cast_for_compute(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """One-process mixed precision with FSDP2's semantics: every module that owns floating parameters computes
    with them cast to ``dtype``, while the parameters themselves (what the optimizer, checkpoints and state dicts
    see) keep their own dtype.

    A forward pre-hook on each such module swaps its parameters for differentiable casts (``p.to(dtype)``) for the
    length of the call and a forward hook puts them back, as FSDP2 registers its unsharded bf16 parameters for a
    unit's forward. So the whole forward runs in ``dtype`` (embeddings, norms, residual stream, attention, head),
    exactly what ``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=dtype)`` computes and what a bf16 rollout
    engine computes; backward produces ``dtype`` gradients that the cast's backward turns into float32 ones,
    accumulated into the float32 ``.grad`` (FSDP2: cast to ``reduce_dtype``, reduce-scattered, accumulated).
    Autocast was the alternative and is not used: it keeps norms, embeddings and the residual stream in float32
    and casts per op, a different function from the multi-GPU one and from the engine's. Because the swap is per
    module call, activation checkpointing's recomputation (which calls the modules again during backward) gets
    the casts too, as FSDP2 all-gathers again before recomputing.

    Code that reads weights directly instead of calling the modules (the HF engine's decode layers) runs inside
    ``compute_params(model, dtype)``. A no-op when every parameter is already ``dtype``.
    """
    owners = [m for m in model.modules() if any(p is not None and p.is_floating_point() and p.dtype != dtype
                                                for p in m._parameters.values())]
    if not owners:
        return model

    masters: dict[int, list] = {}   # id(module) -> its (name, master) pairs swapped out during the call

    def pre(module, args):
        swapped = []
        for name, p in module._parameters.items():
            # only masters are swapped: inside ``compute_params`` the entries are casts already
            if isinstance(p, torch.nn.Parameter) and p.is_floating_point() and p.dtype != dtype:
                swapped.append((name, p))
                module._parameters[name] = p.to(dtype)
        masters[id(module)] = swapped

    def post(module, args, output):
        for name, p in masters.pop(id(module), ()):
            module._parameters[name] = p

    for m in owners:
        m.register_forward_pre_hook(pre)
        m.register_forward_hook(post, always_call=True)   # also when the forward raises: masters come back
    _COMPUTE_DTYPE[model] = dtype
    return model


@contextlib.contextmanager
def compute_params(model: torch.nn.Module, dtype: torch.dtype):
    """Inside the block every floating parameter of ``model`` reads as its cast to ``dtype`` (one cast per
    parameter, tied weights cast once), also for code that reads ``module.weight`` without calling the module;
    the parameters come back on exit. For sampling from master weights (no autograd needed; call it under
    ``torch.no_grad()``)."""
    casts: dict[int, torch.Tensor] = {}
    swapped = []
    try:
        for m in model.modules():
            for name, p in list(m._parameters.items()):
                if p is None or not p.is_floating_point() or p.dtype == dtype:
                    continue
                if id(p) not in casts:
                    casts[id(p)] = p.detach().to(dtype)
                swapped.append((m, name, p))
                m._parameters[name] = casts[id(p)]
        yield model
    finally:
        for m, name, p in swapped:
            m._parameters[name] = p


def _decoder_layers(model: torch.nn.Module):
    inner = getattr(model, "model", model)
    layers = getattr(inner, "layers", None)
    assert layers is not None, f"cannot find decoder layers on {type(model).__name__} (expected model.model.layers)"
    return list(layers)


# ----------------------------------------------------------------------------------------------------------
# building on the meta device, loading each rank's shard, streaming full tensors
# ----------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def params_on_meta():
    """While the block runs, every parameter a module registers is moved to the ``meta`` device (no memory), while
    buffers are built for real. A model built so costs nothing until ``materialize``; its non-persistent buffers
    (RoPE's ``inv_freq``), which are computed at construction and are in no checkpoint, keep their values
    (accelerate's ``init_empty_weights(include_buffers=False)``; torchtitan recomputes them in ``init_weights``
    instead). The constructors' ``torch.empty`` allocations are moved before any page is touched."""
    register = torch.nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def materialize(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """Give a model built under ``params_on_meta`` (sharded or not) real, uninitialised storage on ``device``
    (``to_empty``), keeping the values of the buffers that were real and the weight ties. A sharded (DTensor)
    parameter keeps its identity through ``to_empty`` (FSDP2's documented meta-device recipe); a plain one is
    replaced per module, so ties are restored here."""
    kept = {name: b.detach().clone() for name, b in model.named_buffers() if b.device.type != "meta"}
    owners: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                owners.setdefault(id(p), []).append((module, name))
    model.to_empty(device=device)
    for group in owners.values():
        (first, first_name), rest = group[0], group[1:]
        for module, name in rest:
            if module._parameters[name] is not first._parameters[first_name]:
                module._parameters[name] = first._parameters[first_name]
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name in kept:
                b.copy_(kept[name])
    return model


def safetensors_index(path) -> dict[str, str]:
    """tensor name -> the file holding it, for a Hugging Face directory's ``model.safetensors`` or its sharded
    ``model.safetensors.index.json``; ``inference.hub.ModelSourceError`` (one line) when the directory has neither."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return {k: str(path / f) for k, f in json.loads(index.read_text())["weight_map"].items()}
    single = path / "model.safetensors"
    if not single.is_file():
        raise ModelSourceError(f"{path}: no model.safetensors(.index.json); on several ranks each rank reads its "
                                f"own shard from safetensors files: re-save the model with save_pretrained "
                                f"(safe_serialization=True) or train it on one process")
    with safe_open(str(single), "pt") as f:
        return {k: str(single) for k in f.keys()}


def _dim0_rows(p) -> tuple[int, int]:
    """The rows [start, stop) of a DTensor parameter's global tensor that this rank holds: FSDP2's ``Shard(0)``
    splits dim 0 as ``torch.chunk`` does (chunks of ceil(D / N) rows, the last ones shorter or empty) over the
    mesh's last dimension; under HSDP, ``(Replicate(), Shard(0))``, every replica holds the same rows."""
    *rep, shard = p.placements
    assert shard == Shard(0) and all(x == Replicate() for x in rep), f"expected FSDP2's placements, got {p.placements}"
    dim = p.device_mesh.ndim - 1
    n, r, rows = p.device_mesh.size(dim), p.device_mesh.get_local_rank(dim), p.shape[0]
    chunk = -(-rows // n)
    start, stop = min(rows, r * chunk), min(rows, (r + 1) * chunk)
    local = p.to_local().shape[0]
    assert stop - start == local, f"shard of {tuple(p.shape)}: rows [{start}, {stop}) but {local} held locally"
    return start, stop


def local_rows(p) -> tuple[torch.Tensor, tuple[int, int]]:
    """(the tensor this rank holds, the rows [start, stop) of the full tensor it is): a sharded (DTensor)
    parameter's local shard and ``_dim0_rows``; a plain tensor is all of itself."""
    if hasattr(p, "to_local"):
        return p.to_local(), _dim0_rows(p)
    return p, (0, p.shape[0])


@torch.no_grad()
def load_shards(model: torch.nn.Module, path, d: Dist, *, skip=None) -> torch.nn.Module:
    """Materialise a model that was built under ``params_on_meta`` and sharded (``shard_model``) on ``d.device``,
    and fill it from the safetensors files of ``path``: every rank reads only the rows of its own shards
    (``safe_open(...).get_slice``, one tensor's slice at a time, cast to the parameter's dtype as it is copied in),
    so no rank ever holds the whole model, and nothing is communicated. Buffers saved in the checkpoint are read
    whole; the others keep their constructed values. Names are the model's state-dict names (Llama, Qwen2, Qwen3:
    the checkpoint's), a PEFT-wrapped layer's ``<layer>.base_layer.weight`` read as ``<layer>.weight``; a tensor
    the files lack, or of another shape, is a ``ModelSourceError`` naming it. ``skip(name)``: parameters left
    uninitialised for the caller to fill (a LoRA run's adapters, ``trainer.lora.init_adapters``)."""
    index = safetensors_index(path)
    materialize(model, d.device)
    aliases: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
    targets = [(aliases[id(p)], p, True) for name, p in model.named_parameters() if not (skip and skip(name))]
    persistent = model.state_dict(keep_vars=True)
    targets += [([name], b, False) for name, b in model.named_buffers() if name in persistent and name in index]
    for names, t, is_param in targets:
        names = list(dict.fromkeys(m for n in names for m in (n, n.replace(".base_layer.", "."))))
        key = next((n for n in names if n in index), None)
        if key is None:
            raise ModelSourceError(f"{path}: the checkpoint has no tensor {' / '.join(names)} (saved from another "
                                   f"architecture, or with other tensor names): re-save it with this transformers "
                                   f"version's save_pretrained, or train it on one process")
        sharded = hasattr(t, "to_local")
        local = t.to_local() if sharded else t
        with safe_open(index[key], "pt", device="cpu") as f:   # opened per tensor: its mapped pages go with it
            part = f.get_slice(key)
            shape = tuple(part.get_shape())
            if shape != tuple(t.shape):
                raise ModelSourceError(f"{index[key]}: {key} has shape {shape}, the model expects "
                                       f"{tuple(t.shape)}: config.json and the weights disagree")
            if sharded:
                start, stop = _dim0_rows(t)
                if stop > start:
                    local.copy_(part[start:stop])
            else:
                local.copy_(part[:])
    return model


def stream_full_state(model: torch.nn.Module, d: Dist, *, dtype: torch.dtype | None = None):
    """The full (unsharded) tensors of ``model``'s state dict one at a time, for an export that rank 0 writes:
    yields ``(name, tensor)`` with the tensor on CPU on rank 0 and ``None`` on the other ranks. Every rank must
    iterate to the end (each sharded tensor is one all-gather). Peak memory is one full tensor per GPU and what
    the caller keeps on rank 0's CPU, never the whole model on every GPU. ``dtype``: floating tensors are cast to
    it, on each shard before the gather (half the bytes moved for bf16). A weight tied to another (``lm_head`` to
    the embedding) is yielded once, under its first name, as ``save_pretrained`` writes it."""
    first: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        (tied.add(name) if id(p) in first else first.setdefault(id(p), name))
    for name, value in model.state_dict().items():
        if name in tied:
            continue
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        yield name, (full.detach().to("cpu", copy=True) if d.is_main else None)
        del full, value


@torch.no_grad()
def copy_full_weights(dst: torch.nn.Module, src: torch.nn.Module, *, only=None) -> None:
    """Overwrite the unsharded module ``dst`` with the current weights of ``src`` (sharded or not; the same
    architecture), one tensor at a time: each tensor of ``src``'s state dict is cast to ``dst``'s dtype on its
    shard, all-gathered, copied into ``dst``'s tensor and freed. Beyond the two models the peak is one tensor's
    gather (its cast shard, its full tensor in ``dst``'s dtype and the collective's buffers: 2.5x the largest
    tensor measured on gloo, tests/trainer/test_host_memory.py), never a state dict. Collective (every rank runs the same
    gathers in the same order); a tied weight is copied once."""
    targets = dst.state_dict(keep_vars=True)
    done: set[int] = set()
    for name, value in src.state_dict().items():
        target = targets[name]
        if id(target) in done:
            continue
        done.add(id(target))
        value = value.to(target.dtype)
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        target.detach().copy_(full)
        del full, value


def _model_options(model) -> StateDictOptions:
    """Frozen parameters (a LoRA run's base: ``trainer.lora``) are left out of the resume state, which holds what
    training changes; the base is rebuilt from its source on resume. ``strict=False`` lets the load leave them
    alone: ``dcp.load`` still fails on any trainable tensor the checkpoint lacks."""
    frozen = any(not p.requires_grad for p in model.parameters())
    return StateDictOptions(ignore_frozen_params=frozen, strict=not frozen)


def _model_state(model) -> dict:
    """``get_model_state_dict`` under ``_model_options``, without a frozen weight's tied aliases either (torch drops
    a frozen parameter under its first name only: ``lm_head.weight`` tied to the embedding would stay)."""
    state = get_model_state_dict(model, options=_model_options(model))
    for name, p in model.named_parameters(remove_duplicate=False):
        if not p.requires_grad:
            state.pop(name, None)
    return state


def _dcp_state(model, optimizer) -> dict:
    """This rank's shards of model and optimizer state, keyed by parameter name (torchtitan's recipe: sharded
    ``get_model_state_dict`` and ``get_optimizer_state_dict(flatten_optimizer_state_dict=True)``, so a checkpoint
    written by N ranks loads on M: DCP reshards by name and global offsets). Frozen parameters: ``_model_options``."""
    return {"model": _model_state(model),
            "optimizer": get_optimizer_state_dict(model, optimizer,
                                                  options=StateDictOptions(flatten_optimizer_state_dict=True))}


class ShardedCheckpointError(RuntimeError):
    """DCP failed on some rank while saving or loading (the message names the ranks and what each met)."""


@contextlib.contextmanager
def _quiet_single_process():
    """DCP's calls as the rest of the trainer meets errors: its ``CheckpointException`` is a ``BaseException``
    (an ``except Exception`` never sees it) that wraps what each rank raised, a Ctrl-C included. A Ctrl-C on any
    rank leaves as ``KeyboardInterrupt`` (the command's exit 130), anything else as ``ShardedCheckpointError``."""
    from torch.distributed.checkpoint.api import CheckpointException
    try:
        with warnings.catch_warnings():   # DCP says it saves "in a single process" each time: intended on one process
            warnings.filterwarnings("ignore", message=".*assuming the intent is to .* in a single process.*")
            yield
    except CheckpointException as exc:
        failures = {rank: pair[0] for rank, pair in exc.failures.items()}
        if any(isinstance(e, KeyboardInterrupt) for e in failures.values()):
            raise KeyboardInterrupt from None
        what = "; ".join(f"rank {r}: {type(e).__name__}: {' '.join(str(e).split())[:300]}"
                         for r, e in sorted(failures.items()))
        raise ShardedCheckpointError(f"torch.distributed.checkpoint failed ({what})") from None


def save_sharded(model, optimizer, path, d: Dist) -> None:
    """Write model and optimizer state with torch.distributed.checkpoint: every rank writes its own shards into
    ``path`` (one ``__<rank>_0.distcp`` file each, ``.metadata`` by rank 0); nothing is gathered. Collective. One
    process (no process group) writes the same format."""
    with _quiet_single_process():
        dcp.save(_dcp_state(model, optimizer), checkpoint_id=str(path))


def load_sharded(model, optimizer, path, d: Dist) -> None:
    """Load what ``save_sharded`` wrote, whatever world size wrote it: each rank reads only the slices of its own
    shards. Collective."""
    state = _dcp_state(model, optimizer)
    with _quiet_single_process():
        dcp.load(state, checkpoint_id=str(path))
    set_model_state_dict(model, state["model"], options=_model_options(model))
    set_optimizer_state_dict(model, optimizer, state["optimizer"],
                             options=StateDictOptions(flatten_optimizer_state_dict=True))


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Global gradient norm (DTensor-aware under FSDP2) and in-place clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm


def check_device(t: torch.Tensor, d: Dist, what: str = "a collective") -> None:
    """A tensor handed to a collective must live on the rank's device (NCCL refuses CPU tensors; gloo accepts
    them, so a CPU test alone would never see the bug). Checked on every call, one process included, so a one-GPU
    run fails the same way."""
    if t.device != d.device:
        raise ValueError(f"{what} got a tensor on {t.device}, but this rank's device is {d.device}: create it with "
                         f"device=d.device (or use all_reduce_values)")


def all_reduce_sum(values: torch.Tensor, d: Dist) -> torch.Tensor:
    check_device(values, d, "all_reduce_sum")
    if d.enabled:
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_reduce_values(values, d: Dist, *, op: str = "sum") -> list[float]:
    """Sum (or max) Python numbers over ranks; the tensor is built here, on the rank's device, in float64."""
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=d.device)
    if d.enabled:
        dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}[op])
    return t.tolist()


def gpu_memory_metrics(phase: str, d: Dist, *, free: bool = False, cuda=torch.cuda) -> dict:
    """What this phase of the step asked of the GPU, in GB (10^9 B), for the step's log; {} without CUDA (nothing
    measured: no numbers). ``memory/<phase>_peak_allocated_gb`` and ``_peak_reserved_gb``: the caching allocator's
    peaks since the previous call, which starts them afresh; with ``free``, ``memory/<phase>_free_gb`` instead: what
    an engine waking now can take, the device's free memory (``mem_get_info``: every process and allocator counted,
    a sleeping engine's remains too) plus the blocks torch holds cached and unused (reserved - allocated: vLLM's
    wake returns them to the device first, ``torch.cuda.empty_cache``), then the peaks start afresh. The largest
    peak and the smallest free value over the ranks (the rank nearest OOM), so every rank calls it at the same points
    (a collective). ``cuda``: ``torch.cuda`` (tests pass a fake)."""
    if not cuda.is_available():
        return {}
    values = ([-(cuda.mem_get_info()[0] + cuda.memory_reserved() - cuda.memory_allocated()) / 1e9] if free else
              [cuda.max_memory_allocated() / 1e9, cuda.max_memory_reserved() / 1e9])   # free: negated, max = min
    values = all_reduce_values(values, d, op="max")
    cuda.reset_peak_memory_stats()
    if free:
        return {f"memory/{phase}_free_gb": -values[0]}
    return {f"memory/{phase}_peak_allocated_gb": values[0], f"memory/{phase}_peak_reserved_gb": values[1]}


def all_gather_objects(obj, d: Dist) -> list:
    if not d.enabled:
        return [obj]
    out = [None] * d.world_size
    dist.all_gather_object(out, obj)
    return out


def gather_objects_to_main(obj, d: Dist) -> list | None:
    """Every rank's ``obj`` on rank 0, in rank order; ``None`` on the other ranks, which unpickle nothing: for what
    only rank 0 writes (the step's per-token records)."""
    if not d.enabled:
        return [obj]
    out = [None] * d.world_size if d.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out


def all_gather_rows(rows: dict[int, Sequence], d: Dist, *, dtype: torch.dtype) -> dict[int, torch.Tensor]:
    """Every rank's ``{row index: values}`` (rows of any length; indices unique across ranks) merged on every rank,
    each row a 1-D CPU tensor of ``dtype``. Sent as tensors, not pickled Python lists (``all_gather_objects``): each
    rank's rows are one flat ``dtype`` tensor, padded to the longest rank's total, beside its ``[row, 2]`` table of
    (index, length): 4 bytes a token id or log-prob (int32/float32) instead of 5-9 pickled, and nothing to unpickle.
    ``dtype`` must hold the values exactly (token ids: int32; the engines' log-probs are float32 already)."""
    np_dtype = torch.empty(0, dtype=dtype).numpy().dtype   # a list goes through numpy: 3x faster than torch's own
    local = {i: v.to(dtype).reshape(-1).cpu() if isinstance(v, torch.Tensor) else
             torch.from_numpy(np.asarray(v, dtype=np_dtype).reshape(-1)) for i, v in rows.items()}
    if not d.enabled:
        return local
    table = torch.tensor([[i, len(v)] for i, v in local.items()], dtype=torch.int64).reshape(-1, 2)
    flat = torch.cat(list(local.values())) if local else torch.zeros(0, dtype=dtype)
    sizes = torch.tensor([len(local), len(flat)], dtype=torch.int64, device=d.device)
    all_sizes = [torch.empty_like(sizes) for _ in range(d.world_size)]
    dist.all_gather(all_sizes, sizes)
    max_rows, max_total = (max(int(s[k]) for s in all_sizes) for k in (0, 1))
    tables = [torch.empty(max_rows, 2, dtype=torch.int64, device=d.device) for _ in range(d.world_size)]
    dist.all_gather(tables, torch.cat([table, table.new_full((max_rows - len(table), 2), -1)]).to(d.device))
    flats = [torch.empty(max_total, dtype=dtype, device=d.device) for _ in range(d.world_size)]
    dist.all_gather(flats, torch.cat([flat, flat.new_zeros(max_total - len(flat))]).to(d.device))
    merged = {}
    for s, t, f in zip(all_sizes, tables, flats):
        t, f = t[:int(s[0])].cpu(), f[:int(s[1])].cpu()
        # each row its own storage: a view would drag its rank's whole flat tensor into every pickle or save of it
        merged.update(zip(t[:, 0].tolist(), (v.clone() for v in f.split(t[:, 1].tolist()))))
    return merged


def all_gather_objects_patiently(obj, d: Dist, *, timeout: datetime.timedelta | None = None) -> list:
    """``all_gather_objects`` on a gloo group of its own whose collectives wait ``timeout`` (``PATIENT_TIMEOUT``),
    not the process group's ``COLLECTIVE_TIMEOUT``: for a rank that does long work alone while the others wait (a
    15 GB model download on one rank per node, which calls it when done). The group is built inside the call, so its
    set-up waits under ``timeout`` too."""
    if not d.enabled:
        return [obj]
    group = dist.new_group(backend="gloo", timeout=timeout or PATIENT_TIMEOUT)
    try:
        out = [None] * d.world_size
        dist.all_gather_object(out, obj, group=group)
    finally:
        dist.destroy_process_group(group)
    return out


# how long the ranks wait for each other once a generation is done (``wait_for_generation``): the slowest rank's tail
# of a 16k-token refresh or validation can outlast COLLECTIVE_TIMEOUT, which stays short to catch real hangs
GENERATION_TIMEOUT = datetime.timedelta(hours=2)
GENERATION_TIMEOUT_ENV = "THINKING_SEEDS_GENERATION_TIMEOUT_MIN"


def generation_timeout() -> datetime.timedelta:
    """``GENERATION_TIMEOUT``, or ``THINKING_SEEDS_GENERATION_TIMEOUT_MIN`` minutes where that is set."""
    env = os.environ.get(GENERATION_TIMEOUT_ENV, "").strip()
    if not env:
        return GENERATION_TIMEOUT
    try:
        minutes = float(env)
    except ValueError:
        minutes = float("nan")
    if not minutes > 0:
        raise ValueError(f"{GENERATION_TIMEOUT_ENV}={env!r}: set it to a positive number of minutes, or unset it "
                         f"for {GENERATION_TIMEOUT.total_seconds() / 60:g}")
    return datetime.timedelta(minutes=minutes)


def patient_group(d: Dist) -> dist.ProcessGroup:
    """The gloo group whose collectives wait ``generation_timeout()``, made on first use and kept on ``d``. Making
    it is collective (every rank at the same point: ``trainer.rollout.make_rollout_engine``) and waits under that
    timeout too."""
    if d.patient is None:
        d.patient = dist.new_group(backend="gloo", timeout=generation_timeout())
    return d.patient


def wait_for_generation(d: Dist) -> None:
    """Every rank waits here, on the patient group, until all have finished generating, before the gathers that
    follow on the process group: a rank whose share decoded sooner waits out the slowest one's tail (a 16k-token
    refresh or validation) for up to ``generation_timeout()`` (2 h), not in a collective that fails after
    ``COLLECTIVE_TIMEOUT`` (30 min), which stays short for real hangs."""
    if d.enabled:
        dist.barrier(group=patient_group(d))


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
