"""The vLLM rollout engine (``pip install thinking-seeds[vllm]`` on GPU machines)."""

from __future__ import annotations

import importlib.util
import os
import tempfile
from typing import Sequence

import torch

from inference.protocol import Completion, check_generate_args, prompt_budgets
from inference.stops import eos_list

__all__ = ["VLLMSampler"]


class VLLMSampler:
    """`Sampler` on vLLM (GPU only; `pip install thinking-seeds[vllm]`).

    The engine runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0` is set before vLLM is imported unless the
    caller set it) so `update_weights` can reach the engine's model and call its `load_weights`, as TRL's
    colocate mode does. The engine is built from `model_path`, else the model's `name_or_path` when that is a local
    directory, else a temporary `save_pretrained` copy of the module; then the module's current weights are pushed.

    Each prompt gets its own sampling seed derived from `seed` and its index, so identical prompts (G samples of a
    group) draw different completions and the result does not depend on vLLM's batching.
    """

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
        **llm_kwargs,
    ):
        if importlib.util.find_spec("vllm") is None:
            raise ImportError(
                "VLLMSampler needs vLLM, which is not installed: `pip install thinking-seeds[vllm]` on a machine "
                "with a CUDA GPU, or use engine='hf'"
            )
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process: weights reachable
        import vllm
        if not torch.cuda.is_available():
            raise RuntimeError("VLLMSampler needs a CUDA GPU; use engine='hf' on CPU")
        eos = eos_list(eos_token_id)
        if not eos:
            raise ValueError("eos_token_id is required (an int or a list of ints)")
        self.eos_token_ids = eos
        self.ignore_eos = ignore_eos
        self.pad_token_id = pad_token_id
        self._vllm = vllm
        path = model_path or getattr(model, "name_or_path", None) or ""
        if not os.path.isdir(path):
            # an in-memory module (or a hub id): give vLLM a local directory with the architecture and tokenizer
            path = tempfile.mkdtemp(prefix="ts_vllm_")
            model.save_pretrained(path)
            if tokenizer is not None:
                tokenizer.save_pretrained(path)
        self.model_path = path
        self.llm = vllm.LLM(
            model=path,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            skip_tokenizer_init=tokenizer is None and not _has_tokenizer_files(path),
            **llm_kwargs,
        )
        self.update_weights(model)

    def _engine_model(self):
        """The engine's torch module in this process, across vLLM versions (V0, and V1 run in-process)."""
        engine = getattr(self.llm, "llm_engine", None)
        candidates = (
            lambda: engine.model_executor.driver_worker.worker.model_runner,  # V1 (WorkerWrapperBase.worker)
            lambda: engine.model_executor.driver_worker.model_runner,  # V0, or V1 attribute forwarding
            lambda: engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner,
        )
        for get in candidates:
            try:
                runner = get()
            except AttributeError:
                continue
            # get_model() unwraps CUDA-graph / compile wrappers where the runner has it
            model = runner.get_model() if hasattr(runner, "get_model") else getattr(runner, "model", None)
            if model is not None and hasattr(model, "load_weights"):
                return model
        return None

    def update_weights(self, model: torch.nn.Module) -> None:
        """Push the module's full current state dict into the engine (FSDP2 DTensors are gathered first)."""

        def weights():
            for name, t in model.state_dict().items():
                for prefix in ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module."):
                    name = name.replace(prefix, "")
                if hasattr(t, "full_tensor"):
                    t = t.full_tensor()
                yield name, t.detach().to("cuda")

        target = self._engine_model()
        if target is not None:
            target.load_weights(weights())
        elif hasattr(self.llm, "apply_model"):  # newer vLLM: runs the function next to each worker's model
            state = list(weights())
            self.llm.apply_model(lambda m: m.load_weights(state))
        else:
            raise RuntimeError(
                "cannot reach the vLLM engine's model to update weights; run vLLM in-process "
                "(VLLM_ENABLE_V1_MULTIPROCESSING=0, tensor_parallel_size=1)"
            )
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()  # cached prefixes were computed with the old weights

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        prefix_lens: Sequence[int] | None = None,   # unused: vLLM's prefix caching finds shared prefixes itself
    ) -> list[Completion]:
        check_generate_args(prompts, max_new_tokens, temperature, top_p)
        budgets = prompt_budgets(prompts, max_new_tokens)
        todo = [i for i, m in enumerate(budgets) if m > 0]
        result = [Completion([], "length") for _ in prompts]
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
                detokenize=False,
            )
            for i in todo
        ]
        inputs = [{"prompt_token_ids": list(prompts[i])} for i in todo]
        outs = self.llm.generate(inputs, params, use_tqdm=False)
        for i, o in zip(todo, outs):
            c = o.outputs[0]
            reason = "stop" if c.finish_reason == "stop" else "length"
            result[i] = Completion(list(c.token_ids), reason)
        return result


def _has_tokenizer_files(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
