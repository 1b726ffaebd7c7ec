"""The policy model: building it, and the trainer's own forward that yields per-token log-probs and entropies.

Old, behavior and current log-probs all come from ``response_logprobs`` so that they are computed the same way
(one code path, one dtype), in one of two layouts: flat (``inference/flat.py``: no padding, each distinct prompt
once; Llama/Qwen2/Qwen3) or padded (``pack``: left-padded prompts and right-padded responses, so the response
occupies the same columns in every row and only its R logit columns are computed, ``logits_to_keep``; any
model). Both give the same numbers; ``forward`` / ``train_forward`` chooses.

Neither layout materialises the logits of a whole micro-batch: the LM head runs on ``LOGIT_CHUNK_TOKENS``
positions at a time, and each chunk's logits are divided by the temperature and reduced to (log-prob of the
target, entropy) in float32 before the next chunk starts; under autograd each chunk is recomputed in backward
(``torch.utils.checkpoint``), so no chunk's logits outlive it. At 8k response tokens and a 152k vocabulary the
float32 logits alone would be 5 GB per row; a chunk of 1024 is 0.6 GB.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from inference.batching import micro_batches
from inference.flat import build_layout, run_layout, unsupported_reason
from inference.tiny import build_model, build_tokenizer
from trainer.algos import logprobs_and_entropy
from trainer.algos.entropy import (CHECKPOINT_MIN_ELEMENTS, DEFAULT_CHUNK_SIZE, _chunk_both,
                                   _chunk_both_entropy_detached)
from trainer.fsdp import (Dist, all_gather_rows, compute_dtype, compute_params, load_shards, materialize,
                          params_on_meta, shard_model)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype (config ``dtype``): ``auto`` is bf16 on CUDA, fp32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def resolve_master_dtype(name: str, compute: torch.dtype) -> torch.dtype:
    """The dtype of the parameters and the optimizer state (config ``master_dtype``); the model is built in it and
    ``trainer.fsdp.shard_model`` casts to ``compute`` for forward and backward."""
    master = _DTYPES[name]
    assert master == torch.float32 or compute == master, f"master_dtype={name} with compute dtype {compute}"
    return master


class ComputeDtypeSampler:
    """A rollout engine over a module whose parameters are in the master dtype: ``generate`` runs with them cast
    to the compute dtype (``trainer.fsdp.compute_params``), so the HF engine samples in bf16 as the trainer's
    forward computes, from the fp32 weights it trains. Everything else is the wrapped engine's."""

    def __init__(self, sampler, model: torch.nn.Module, dtype: torch.dtype):
        self.sampler, self.model, self.dtype = sampler, model, dtype

    def generate(self, prompts, **kw):
        with torch.no_grad(), compute_params(self.model, self.dtype):
            return self.sampler.generate(prompts, **kw)

    def update_weights(self, model: torch.nn.Module) -> None:
        self.model = model
        self.sampler.update_weights(model)

    def __getattr__(self, name):
        return getattr(self.sampler, name)


def compute_dtype_engines(make_sampler, dtype: torch.dtype):
    """``make_sampler`` (``inference.make_sampler``'s signature) for a model whose parameters may hold another
    dtype than the compute dtype: vLLM is built in ``dtype`` (its weight loader casts what ``update_weights``
    streams), the HF engine samples through ``ComputeDtypeSampler``. Where the parameters already are ``dtype``
    the engines are built as they are."""
    def build(model, tokenizer, *, engine, **kw):
        if all(p.dtype == dtype for p in model.parameters() if p.is_floating_point()):
            return make_sampler(model, tokenizer, engine=engine, **kw)
        if engine == "vllm":
            return make_sampler(model, tokenizer, engine=engine, dtype=str(dtype).removeprefix("torch."), **kw)
        return ComputeDtypeSampler(make_sampler(model, tokenizer, engine=engine, **kw), model, dtype)
    return build


def build_policy(model_name: str, *, dtype: torch.dtype, seed: int, meta: bool = False):
    """(model, tokenizer) from an HF directory / hub id, or a fresh tiny model for ``tiny:<size>``.

    ``meta=True`` (a directory): the model's parameters are left on the ``meta`` device, its buffers built
    (``trainer.fsdp.params_on_meta``), and no weight is read: ``trainer.fsdp.load_shards`` fills it once sharded.
    Otherwise the whole model is loaded (``from_pretrained``)."""
    if model_name.startswith("tiny:"):
        assert not meta, "a tiny: model is built, not loaded: there is nothing to read shard by shard"
        tokenizer = build_tokenizer()
        model = build_model(model_name.split(":", 1)[1], tokenizer, seed=seed).to(dtype)
    else:
        tokenizer = AutoTokenizer.from_pretrained(model_name)
        if meta:
            with params_on_meta():
                model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_name), dtype=dtype)
            try:   # what from_pretrained reads beside the weights (stop ids)
                model.generation_config = GenerationConfig.from_pretrained(model_name)
            except OSError:   # no generation_config.json: the config's defaults, as from_pretrained keeps them
                pass
            model.eval()   # as from_pretrained returns it
        else:
            model = AutoModelForCausalLM.from_pretrained(model_name, dtype=dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def load_for_training(model_name: str, d: Dist, *, master: torch.dtype, compute: torch.dtype, seed: int,
                      builder=None, gradient_checkpointing: bool = False, adapt=None):
    """The policy the trainer trains, (model, tokenizer): parameters in ``master`` on ``d.device``, sharded by
    ``trainer.fsdp.shard_model`` (FSDP2 on several ranks, the one-process casts on one) to compute in ``compute``.

    Several ranks and a model directory: every rank builds the model with its parameters on the meta device,
    shards it, and reads only its own rows of each tensor from the safetensors files (``trainer.fsdp.load_shards``),
    so host memory per rank is its shard (at 7B in fp32: 28 GB / N instead of 28 GB on each of the N ranks, plus
    one tensor's slice in flight). One process, a ``tiny:`` model, or a ``builder`` (``build_policy``'s signature,
    for library callers): the model is built whole, moved to the device and sharded, as before.

    ``adapt``: applied to the built model before it is moved and sharded (``trainer.lora.add_adapters``: LoRA
    layers, the base frozen in ``compute``). On several ranks the adapters are injected into the model on the meta
    device, sharded with it (each unit's frozen base and trainable adapters in one FSDP2 group), and after the base
    is read shard by shard they are initialised by ``trainer.lora.init_adapters`` as on one process."""
    meta = d.enabled and builder is None and not model_name.startswith("tiny:")
    if meta:
        model, tokenizer = build_policy(model_name, dtype=master, seed=seed, meta=True)
    else:
        model, tokenizer = (builder or build_policy)(model_name, dtype=master, seed=seed)
    if gradient_checkpointing:
        # transformers 5 renamed it (the old name warns)
        (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    if adapt is not None:
        model = adapt(model)
    if not meta:
        model.to(d.device)
    model = shard_model(model, d, param_dtype=compute)
    if meta:
        from trainer.lora import init_adapters, is_adapter_name
        load_shards(model, model_name, d, skip=is_adapter_name)
        init_adapters(model, seed)   # no-op without adapters
    return model, tokenizer


def load_reference(model_name: str, d: Dist, *, compute: torch.dtype, seed: int, like: torch.nn.Module,
                   builder=None) -> torch.nn.Module:
    """The frozen reference policy of the KL penalty (config ``kl_coef``): the policy the run started from
    (``model_name``: the warm-start source, so a resumed run keeps its step-0 reference, not the checkpoint it
    resumes), loaded as ``load_for_training`` loads the policy, sharded the same way (FSDP2 on several ranks, each
    rank reading its own shard), but in the compute dtype (2 B/param in bf16, no fp32 master), without gradients
    and with no optimizer: it only runs no-grad forwards (``score``).

    Its buffers are the policy's ``like`` (cloned, in their dtype, as ``engine_copy`` takes them): built in bf16 a
    model's RoPE ``inv_freq`` would be rounded to bf16, while the policy (fp32 masters, parameters cast per call)
    keeps it in fp32, and the two would then differ by ~3e-3 in log-prob at step 0 instead of computing the same
    function."""
    ref, _ = load_for_training(model_name, d, master=compute, compute=compute, seed=seed, builder=builder)
    for name, buf in like.named_buffers():
        owner, _, leaf = name.rpartition(".")
        ref.get_submodule(owner)._buffers[leaf] = buf.detach().clone()
    ref.requires_grad_(False)
    return ref.eval()


def engine_copy(model: torch.nn.Module, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """An unsharded module of ``model``'s architecture with its parameters in ``dtype`` (the compute dtype) on
    ``device``, for the HF engine on several ranks: built with its parameters on the meta device and materialised
    there, so it costs 2 bytes per parameter in bf16 and no fp32 copy of the master is ever made (a ``deepcopy``
    of the fp32 model cost 4, 28 GB per GPU at 7B). Buffers are the model's own (cloned, in their dtype); the
    parameters are uninitialised until ``trainer.fsdp.copy_full_weights`` fills them. A model with LoRA adapters
    (``trainer.lora``) gets the same adapters (PEFT's ``inject_adapter_in_model``), so the engine computes base +
    adapter unmerged, as the trained module and the one-process engine do, and a sync need send the adapter only."""
    from trainer.lora import ADAPTER, has_adapters
    with params_on_meta():
        out = AutoModelForCausalLM.from_config(copy.deepcopy(model.config), dtype=dtype)
        if has_adapters(model):
            from peft import inject_adapter_in_model
            from peft.tuners.lora import LoraLayer
            inject_adapter_in_model(copy.deepcopy(model.peft_config[ADAPTER]), out, adapter_name=ADAPTER)
            for m in out.modules():
                if isinstance(m, LoraLayer):
                    m.cast_input_dtype_enabled = False
    materialize(out, device)
    out.to(dtype)   # the adapters were built in the default dtype; the buffers are the model's own just below
    for name, buf in model.named_buffers():
        owner, _, leaf = name.rpartition(".")
        out.get_submodule(owner)._buffers[leaf] = buf.detach().clone()
    if getattr(model, "generation_config", None) is not None:   # the stop ids the engine reads
        out.generation_config = copy.deepcopy(model.generation_config)
    return out.eval()


def pack(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *, pad_id: int, device):
    """Left-pad prompts to P, right-pad responses to R. Returns input_ids [n, P+R], attention_mask,
    position_ids, response ids [n, R] and response mask [n, R]."""
    n = len(prompts)
    P = max(len(p) for p in prompts)
    R = max(1, max(len(r) for r in responses))
    ids = torch.full((n, P + R), pad_id, dtype=torch.long)
    attn = torch.zeros((n, P + R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, P - len(p):P] = torch.tensor(p, dtype=torch.long)
        ids[i, P:P + len(r)] = torch.tensor(r, dtype=torch.long)
        attn[i, P - len(p):P + len(r)] = 1
    pos = (attn.cumsum(1) - 1).clamp(min=0)
    resp_ids = ids[:, P:]
    resp_mask = attn[:, P:].bool()
    return ids.to(device), attn.to(device), pos.to(device), resp_ids.to(device), resp_mask.to(device)


def use_flat(model, forward: str) -> bool:
    """Whether ``response_logprobs`` takes ``inference.flat`` for this model: ``auto`` when the architecture allows,
    ``flat`` always (an unsupported model is an error), ``model`` never."""
    if forward == "model":
        return False
    reason = unsupported_reason(model)
    if forward == "flat" and reason is not None:
        raise ValueError(f"train_forward=flat cannot run this model: {reason}; use train_forward=auto or model")
    return reason is None


LOGIT_CHUNK_TOKENS = DEFAULT_CHUNK_SIZE   # positions per LM-head chunk: [1024, V] float32 logits at a time (V=152k: 0.6 GB)

# architectures whose causal-LM forward ends in ``logits = lm_head(hidden[:, logits_to_keep])`` and returns them
# untouched (no soft-capping or scaling after the head): there the head can hand back log-probs instead of logits
_HEAD_LAST_MODEL_TYPES = {"llama", "qwen2", "qwen3"}


def _chunked_head_reason(model) -> str | None:
    head = getattr(model, "lm_head", None)
    if type(head) is not torch.nn.Linear:
        return "lm_head is not a plain nn.Linear"
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in _HEAD_LAST_MODEL_TYPES:
        return f"model_type {model_type!r} not in {sorted(_HEAD_LAST_MODEL_TYPES)}"
    return None


def _head_chunk(h, w, b, ids, temperature: float, entropy_grad: bool) -> torch.Tensor:
    """One chunk: h [C, H] (compute dtype), w [V, H], ids [C] -> [C, 2] float32 (log-prob of ids, entropy).
    The arithmetic of the full-logits path: logits in the compute dtype, then float32, then / temperature, then
    ``trainer.algos.entropy``'s per-row log-softmax, gather and entropy."""
    return _logits_pair(F.linear(h, w, b), ids, temperature, entropy_grad)


def _logits_pair(z, ids, temperature: float, entropy_grad: bool) -> torch.Tensor:
    """A chunk's logits z [C, V] (compute dtype) -> [C, 2] float32 (log-prob of ids, entropy)."""
    z = z.float()
    if temperature not in (0.0, 1.0):
        z = z / temperature
    lp, en = (_chunk_both if entropy_grad else _chunk_both_entropy_detached)(z, ids)
    return torch.stack([lp, en], dim=-1)


class _ChunkedHeadFp32Grad(torch.autograd.Function):
    """``_head_chunk`` over ``chunk_tokens``-position chunks of h [N, H] whose weight (and bias) gradient is summed
    over the chunks in float32 and rounded to the weight's dtype once at the end, as one GEMM over all N positions
    sums in float32 inside: autograd would add each chunk's bf16 gradient into a bf16 sum, rounding the running sum
    once per chunk (the error grew with the chunk count: ~5x one GEMM's at 64 chunks). Each chunk's own GEMM still
    rounds its [V, H] partial to bf16 once (a float32-output GEMM is not on every backend). Costs a float32 [V, H]
    buffer while the head's backward runs (V x H x 4 B: 2.2 GB at 7B). Forward keeps no chunk's logits; backward
    recomputes each chunk's, as the ``torch.utils.checkpoint`` path does, and takes the two GEMMs of ``F.linear``'s
    backward itself: ``grad_h = dz @ w`` (its chunk's rows), ``grad_w += dz.T @ h`` into the float32 sum."""

    @staticmethod
    def forward(ctx, h, w, b, ids, temperature: float, entropy_grad: bool, chunk_tokens: int):   # -> [N, 2]
        ctx.save_for_backward(h, w, b, ids)
        ctx.args = (temperature, entropy_grad, chunk_tokens)
        return torch.cat([_head_chunk(h_c, w, b, ids_c, temperature, entropy_grad)
                          for h_c, ids_c in zip(h.split(chunk_tokens), ids.split(chunk_tokens))])

    @staticmethod
    def backward(ctx, grad_out):   # [N, 2]
        h, w, b, ids = ctx.saved_tensors
        temperature, entropy_grad, chunk_tokens = ctx.args
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None   # [V, H]
        grad_b = torch.zeros(b.shape, dtype=torch.float32, device=b.device) if need_b else None   # [V]
        start = 0
        for h_c, ids_c, g_c in zip(h.split(chunk_tokens), ids.split(chunk_tokens), grad_out.split(chunk_tokens)):
            z = F.linear(h_c, w, b).detach().requires_grad_()   # [C, V]
            with torch.enable_grad():
                (dz,) = torch.autograd.grad(_logits_pair(z, ids_c, temperature, entropy_grad), z, g_c)
            if need_h:
                grad_h[start:start + len(h_c)] = dz @ w
            if need_w:
                grad_w += dz.t() @ h_c   # one rounding to the compute dtype per chunk, summed in float32
            if need_b:
                grad_b += dz.sum(0, dtype=torch.float32)
            start += len(h_c)
        return (grad_h, None if grad_w is None else grad_w.to(w.dtype),
                None if grad_b is None else grad_b.to(b.dtype), None, None, None, None)


def chunked_head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                          targets: torch.Tensor, *, temperature: float = 1.0, entropy_grad: bool = True,
                          chunk_tokens: int = LOGIT_CHUNK_TOKENS) -> torch.Tensor:
    """(log-prob of ``targets``, entropy) of ``softmax(hidden @ weight.T + bias) / temperature``, [..., 2] float32,
    ``chunk_tokens`` positions at a time. hidden [..., H], targets [...] (same leading shape).

    Under autograd each chunk of at least ``CHECKPOINT_MIN_ELEMENTS`` logits is a ``torch.utils.checkpoint``
    region: forward keeps only its [C, 2] result, and backward recomputes the chunk's logits, takes their gradient
    and frees them before the next chunk, so at no time does more than one such chunk's [C, V] exist (smaller
    chunks, a small vocabulary, keep theirs: cheaper than recomputing, as in ``trainer.algos.entropy``). A bf16 or
    fp16 ``weight`` split into several chunks takes ``_ChunkedHeadFp32Grad`` instead, which recomputes every chunk
    and sums the gradient of ``weight`` over the chunks in float32, as one GEMM over all positions would."""
    assert chunk_tokens >= 1, f"chunk_tokens={chunk_tokens} must be >= 1"
    lead = targets.shape
    assert hidden.shape[:-1] == lead, f"hidden {tuple(hidden.shape)} and targets {tuple(lead)} disagree"
    h = hidden.reshape(-1, hidden.shape[-1])
    ids = targets.reshape(-1).long()
    grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    if grad and weight.dtype in (torch.bfloat16, torch.float16) and h.shape[0] > chunk_tokens:
        out = _ChunkedHeadFp32Grad.apply(h, weight, bias, ids, temperature, entropy_grad, chunk_tokens)   # [N, 2]
        return out if len(lead) == 1 else out.view(*lead, 2).clone()
    outs = []
    for h_c, ids_c in zip(h.split(chunk_tokens), ids.split(chunk_tokens)):
        if grad and h_c.shape[0] * weight.shape[0] >= CHECKPOINT_MIN_ELEMENTS:
            outs.append(checkpoint(_head_chunk, h_c, weight, bias, ids_c, temperature, entropy_grad,
                                   use_reentrant=False, preserve_rng_state=False))   # no randomness inside
        else:
            outs.append(_head_chunk(h_c, weight, bias, ids_c, temperature, entropy_grad))
    out = torch.cat(outs) if outs else h.new_zeros((0, 2), dtype=torch.float32)   # [N, 2]
    # a fresh tensor, not a view: FSDP2 hooks the forward's output for backward, and warns about views
    return out if len(lead) == 1 else out.view(*lead, 2).clone()


@contextlib.contextmanager
def head_returns_logprobs(model, targets: torch.Tensor, *, temperature: float, entropy_grad: bool,
                          chunk_tokens: int = LOGIT_CHUNK_TOKENS):
    """While the block runs, calling ``model.lm_head`` on hidden states [..., H] returns ``chunked_head_logprobs``
    of ``targets`` [...] ([..., 2]) instead of logits [..., V].

    The head is still called by the forward that owns it, so whoever manages its weight sees the call: FSDP2's
    root unit has the weight all-gathered (bf16), the one-process mixed-precision hooks have it cast, and the
    weight read at call time (``lm_head.weight``) is what the chunks use, also when backward recomputes them."""
    head = model.lm_head

    def forward(x):
        return chunked_head_logprobs(x, head.weight, head.bias, targets, temperature=temperature,
                                     entropy_grad=entropy_grad, chunk_tokens=chunk_tokens)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward


def response_logprobs(model, prompts, responses, *, pad_id: int, device, temperature: float = 1.0,
                      entropy_grad: bool = True, forward: str = "model",
                      chunk_tokens: int = LOGIT_CHUNK_TOKENS):
    """Per-token log-probs and entropies of ``responses`` given ``prompts``: ([n, R], [n, R], mask [n, R]).

    Logits are divided by the sampling temperature, so the ratio compares the distributions that sampled.
    ``entropy_grad=False`` returns the entropy without a graph (it is only logged): backward skips it.
    ``forward``: ``model`` runs the model's own forward on the padded batch (``pack``); ``flat`` runs
    ``inference.flat`` (no padding, each distinct prompt once); ``auto`` picks flat where the architecture allows.
    Padding positions of the outputs hold 0 (flat) or the pad token's numbers (model); read them through the mask.
    The LM head runs ``chunk_tokens`` positions at a time (module doc); architectures whose forward does more
    after the head (``_HEAD_LAST_MODEL_TYPES``) take the full logits instead.
    """
    if use_flat(model, forward):
        return _flat_logprobs(model, prompts, responses, device=device, temperature=temperature,
                              entropy_grad=entropy_grad, chunk_tokens=chunk_tokens)
    ids, attn, pos, resp_ids, resp_mask = pack(prompts, responses, pad_id=pad_id, device=device)
    R = resp_ids.shape[1]
    P = ids.shape[1] - R
    # position P-1+t predicts response token t: only those R hidden states go through the LM head
    keep = torch.arange(P - 1, P + R - 1, device=ids.device)
    kw = dict(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=keep, use_cache=False)
    if _chunked_head_reason(model) is None:
        with head_returns_logprobs(model, resp_ids, temperature=temperature, entropy_grad=entropy_grad,
                                   chunk_tokens=chunk_tokens):
            out = model(**kw).logits   # [n, R, 2]
        return out[..., 0], out[..., 1], resp_mask
    logits = model(**kw).logits.float()  # [n, R, V]
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp, ent = logprobs_and_entropy(logits, resp_ids, entropy_grad=entropy_grad)
    return logp, ent, resp_mask


def _flat_logprobs(model, prompts, responses, *, device, temperature: float, entropy_grad: bool,
                   chunk_tokens: int):
    n, R = len(prompts), max(1, max(len(r) for r in responses))
    logp = torch.zeros(n, R, device=device)
    ent = torch.zeros(n, R, device=device)
    mask = torch.zeros(n, R, dtype=torch.bool, device=device)
    if sum(len(r) for r in responses) == 0:
        return logp.requires_grad_(torch.is_grad_enabled()), ent, mask
    assert _chunked_head_reason(model) is None, _chunked_head_reason(model)   # the flat models are Llama-family
    lay = build_layout(prompts, responses, device=device, neg=torch.finfo(compute_dtype(model)).min)
    with head_returns_logprobs(model, lay.targets, temperature=temperature, entropy_grad=entropy_grad,
                               chunk_tokens=chunk_tokens):
        out = run_layout(model, lay)   # [M, 2]
    logp = logp.index_put((lay.out_rows, lay.out_cols), out[:, 0])
    ent = ent.index_put((lay.out_rows, lay.out_cols), out[:, 1])
    mask[lay.out_rows, lay.out_cols] = True
    return logp, ent, mask


@torch.no_grad()
def score(model, prompts, responses, *, pad_id: int, micro_batch_size: int, d: Dist, temperature: float = 1.0,
          micro_batch_tokens: int = 0, forward: str = "model") -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """No-grad log-probs and entropies for every response (all ranks get all of them).

    Each rank scores a strided shard in ``micro_batches``; every rank runs the same number of forwards (FSDP
    needs that), then the results are gathered. ``forward`` as in ``response_logprobs``.
    """
    n = len(prompts)
    mine = list(range(d.rank, n, d.world_size))
    flat = use_flat(model, forward)
    batches, n_batches = micro_batches([(len(p), len(r)) for p, r in zip(prompts, responses)],
                                       rows=micro_batch_size, tokens=micro_batch_tokens, rank=d.rank,
                                       world_size=d.world_size,
                                       prompt_keys=[tuple(p) for p in prompts] if flat else None)
    logps: dict[int, torch.Tensor] = {}   # row -> [L]
    ents: dict[int, torch.Tensor] = {}
    for b in range(n_batches):
        idx = batches[b] if b < len(batches) else [mine[0] if mine else 0]  # dummy forward keeps ranks in step
        logp, ent, mask = response_logprobs(model, [prompts[i] for i in idx], [responses[i] for i in idx],
                                            pad_id=pad_id, device=d.device, temperature=temperature,
                                            forward="flat" if flat else "model")
        if b >= len(batches):
            continue
        for row, i in enumerate(idx):
            L = len(responses[i])
            logps[i], ents[i] = logp[row, :L].float().cpu(), ent[row, :L].float().cpu()
    # as float32 tensors (trainer.fsdp.all_gather_rows), not a pickle of every rank's rows
    logps, ents = (all_gather_rows(x, d, dtype=torch.float32) for x in (logps, ents))
    return [logps[i] for i in range(n)], [ents[i] for i in range(n)]
