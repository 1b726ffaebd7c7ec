"""Rollout engines: one interface (`Sampler`) over Hugging Face models and vLLM.

A prompt is a list of token ids; it may already hold a prefix of an earlier response (a Thinking Seeds *seed*,
DESIGN.md §2). `generate` returns one `Completion` per prompt (callers repeat a prompt G times for G samples).
The whole prompt is prefilled in one forward pass (never decoded token by token), so a long seed costs one
prefill, like a prompt.

Engines:

- `HFSampler` drives a `transformers` causal LM with a preallocated KV cache. For Llama-family models (llama,
  qwen2, qwen3 with full attention, sdpa/eager attention) it runs the model's own decoder layers directly with a
  static cache and its own masks, skipping the per-call mask building and cache bookkeeping of `model.forward`;
  other architectures go through `model.forward` with a `DynamicCache`. Both paths drop finished rows from
  the batch as responses end. CPU (tests, demos) and GPU (fallback when vLLM is absent).
- `VLLMSampler` wraps `vllm.LLM` (GPU only, `pip install thinking-seeds[vllm]`).

`make_sampler` picks one; `load_policy` loads a Hugging Face model directory or hub id.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import tempfile
from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

__all__ = ["Completion", "Sampler", "HFSampler", "VLLMSampler", "make_sampler", "load_policy"]


@dataclass
class Completion:
    token_ids: list[int]  # generated ids; ends with an EOS id when finish_reason == "stop", nothing after it
    finish_reason: str  # "stop" (an EOS id was generated) | "length" (max_new_tokens reached)
    # with generate(..., logprobs=True): per generated token, log pi(token) and the entropy (nats) of the
    # distribution it was drawn from, both at the sampling temperature before top-p (what the trainer computes)
    logprobs: list[float] | None = None
    entropies: list[float] | None = None


class Sampler(Protocol):
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],  # one budget for all prompts, or one per prompt
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        logprobs: bool = False,  # also return each token's log-prob and entropy (engines that can)
        prefix_lens: Sequence[int] | None = None,  # leading tokens of each prompt that other rows share (a hint)
    ) -> list[Completion]: ...

    def update_weights(self, model: torch.nn.Module) -> None: ...


# --------------------------------------------------------------------------------------------------------------
# shared helpers


def _eos_list(eos_token_id: int | Sequence[int] | None) -> list[int]:
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, int):
        return [eos_token_id]
    return [int(e) for e in eos_token_id]


def _budgets(prompts: Sequence[Sequence[int]], max_new_tokens: int | Sequence[int]) -> list[int]:
    """Per-prompt generation budgets (a seeded continuation may only fill what its seed left)."""
    if isinstance(max_new_tokens, int):
        return [max_new_tokens] * len(prompts)
    budgets = [int(m) for m in max_new_tokens]
    if len(budgets) != len(prompts):
        raise ValueError(f"max_new_tokens has {len(budgets)} budgets for {len(prompts)} prompts")
    return budgets


def _check_generate_args(prompts: Sequence[Sequence[int]], max_new_tokens, temperature: float, top_p: float):
    if min(_budgets(prompts, max_new_tokens), default=0) < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token (e.g. BOS)")


def sample_next_token(
    logits: torch.Tensor,  # [b, V] float32
    *,
    temperature: float,
    top_p: float,
    generator: torch.Generator,
) -> torch.Tensor:  # [b] int64
    """Draw one token per row. temperature 0 is greedy (argmax). top_p < 1 keeps the smallest set of the most
    probable tokens whose mass reaches top_p (always at least the top token), as transformers' TopPLogitsWarper
    and vLLM do, and renormalises over it."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_p >= 1.0:
        return draw(torch.softmax(logits, dim=-1), generator)
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of the strictly more likely tokens
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    choice = draw(sorted_probs, generator)  # index into the sorted order
    return sorted_idx.gather(1, choice[:, None]).squeeze(1)


def draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One index per row of ``probs`` [b, V] (non-negative, need not sum to 1), with probability proportional to
    its entry: inverse-CDF sampling, one uniform per row against the float64 running sum (float64 so that rare
    tokens keep their probability over large vocabularies). A zero entry is never drawn. On CPU this is ~10x
    faster than ``torch.multinomial``, which draws an exponential variate for every entry."""
    cdf = probs.to(torch.float64).cumsum(dim=-1)
    total = cdf[:, -1:]
    if not bool(((total > 0) & torch.isfinite(total)).all()):   # as torch.multinomial refuses them
        raise ValueError("cannot sample: a row of probabilities is NaN, infinite or all zero (NaN or inf logits "
                         "from the model? check its weights and dtype)")
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=probs.device) * total
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


class _DecodeBook:
    """Decode bookkeeping shared by both HF paths for one chunk of rows: what each row generated, which rows are
    still alive (no EOS yet, budget left), why each stopped, and optionally every sampled token's log-prob and
    entropy. ``rows`` maps the current (shrinking) batch to chunk rows."""

    def __init__(self, b: int, max_new: int, limits: torch.Tensor, eos_ids: list[int], pad_id: int, device,
                 logprobs: bool):
        self.out = torch.full((b, max_new), pad_id, dtype=torch.long, device=device)
        self.n_gen = torch.full((b,), max_new, dtype=torch.long, device=device)
        self.stopped = torch.zeros(b, dtype=torch.bool, device=device)
        self.rows = torch.arange(b, device=device)
        self.alive = torch.ones(b, dtype=torch.bool, device=device)
        self.limits = limits
        self.eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
        self.logp = torch.full((b, max_new), float("nan"), device=device) if logprobs else None
        self.ent = torch.full((b, max_new), float("nan"), device=device) if logprobs else None

    def step(self, t: int, logits: torch.Tensor, temperature: float, top_p: float, gen) -> torch.Tensor:
        """Sample token t of every current row from ``logits`` [b_cur, V] and record it; returns the tokens."""
        rows, alive = self.rows, self.alive
        if self.logp is not None and temperature > 0 and top_p >= 1.0:
            # sample_next_token's own arithmetic (same draws), keeping the probabilities it sampled from
            probs = torch.softmax(logits / temperature, dim=-1)
            tok = draw(probs, gen)
        else:
            tok = sample_next_token(logits, temperature=temperature, top_p=top_p, generator=gen)  # [b_cur]
            probs = torch.softmax(logits / temperature if temperature > 0 else logits, dim=-1) \
                if self.logp is not None else None
        self.out[rows, t] = tok
        if probs is not None:   # log pi(token) and the entropy -sum p log p (entr(0) = 0), at the temperature
            self.logp[rows, t] = probs.gather(1, tok[:, None]).squeeze(1).log()
            self.ent[rows, t] = torch.special.entr(probs).sum(-1)
        hit = alive & torch.isin(tok, self.eos)
        full = alive & ~hit & (self.limits[rows] <= t + 1)  # this row's own budget is spent
        self.n_gen[rows] = torch.where(hit | full, t + 1, self.n_gen[rows])
        self.stopped[rows] |= hit
        self.alive = alive & ~(hit | full)
        return tok

    def any_alive(self) -> bool:
        return bool(self.alive.any())

    def advance(self, t: int, logits: torch.Tensor, temperature: float, top_p: float, gen):
        """``step`` t, then what the decode loop needs: None when decoding is over (last step or no row alive),
        else (the tokens of the rows that go on, the indices of those rows when some were dropped, else None)."""
        tok = self.step(t, logits, temperature, top_p, gen)
        if t == self.out.shape[1] - 1 or not self.any_alive():
            return None
        keep = self.drop_finished()
        return (tok if keep is None else tok[keep]), keep

    def drop_finished(self) -> torch.Tensor | None:
        """Once an eighth of the current batch has finished, the indices of the rows to keep (else None)."""
        b_cur = self.alive.shape[0]
        n_alive = int(self.alive.sum())
        if b_cur - n_alive < max(1, b_cur // 8):
            return None
        keep = self.alive.nonzero().squeeze(1)
        self.rows, self.alive = self.rows[keep], self.alive[keep]
        return keep

    def completions(self) -> list[Completion]:
        out_l, n_l, stop_l = self.out.tolist(), self.n_gen.tolist(), self.stopped.tolist()
        lp = self.logp.tolist() if self.logp is not None else None
        ent = self.ent.tolist() if self.ent is not None else None
        return [Completion(row[:n], "stop" if s else "length",
                           None if lp is None else lp[i][:n], None if ent is None else ent[i][:n])
                for i, (row, n, s) in enumerate(zip(out_l, n_l, stop_l))]


def _make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()  # fresh non-deterministic seed; the global RNG is never touched
    else:
        gen.manual_seed(int(seed))
    return gen


def _kwarg_name(fn, new: str, old: str) -> str:
    """transformers renamed `past_key_values` to `cache` in 5.x (both accepted until 5.40); use what fn names."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return new
    return new if new in params else old


# --------------------------------------------------------------------------------------------------------------
# Hugging Face engine

_FAST_MODEL_TYPES = {"llama", "qwen2", "qwen3"}
_STATIC_ROPE_TYPES = {None, "default", "linear", "llama3", "yarn"}


class _StaticKV:
    """Preallocated KV cache, [b, n_kv_heads, capacity, head_dim] per layer, duck-typed to what the attention
    modules call (`update`). Prompts sit right-aligned in slots [0, L) (L = longest prompt of the batch), generated
    tokens follow in slot order, so one slot index serves every row and a decode step writes one column."""

    def __init__(self, n_layers: int, b: int, n_kv: int, cap: int, head_dim: int, dtype, device,
                 zero: bool = True):
        # zeros where a prefill leaves the slots left of a short prompt unwritten: garbage (NaN) there would leak
        # through the attention product even with a zero weight. The flat prefill writes every slot below L
        # (finite values, masked) and decoding writes each slot before reading it, so it needs no zeroing
        new = torch.zeros if zero else torch.empty
        self.k = [new(b, n_kv, cap, head_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [new(b, n_kv, cap, head_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        self.length = 0  # filled slots (decode)
        self.prefill_rows: tuple[int, int] | None = None  # rows [r0, r1) being prefilled ...
        self.prefill_start = 0  # ... into slots [prefill_start, L)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def update(self, key, value, layer_idx, *args, **kwargs):  # key/value: [b, n_kv, q, head_dim]
        if self.prefill_rows is not None:
            r0, r1 = self.prefill_rows
            s0 = self.prefill_start
            self.k[layer_idx][r0:r1, :, s0 : s0 + key.shape[2]] = key
            self.v[layer_idx][r0:r1, :, s0 : s0 + key.shape[2]] = value
            return key, value  # a prefill group attends only to its own tokens
        n = self.length
        self.k[layer_idx][:, :, n : n + 1] = key
        self.v[layer_idx][:, :, n : n + 1] = value
        return self.k[layer_idx][:, :, : n + 1], self.v[layer_idx][:, :, : n + 1]

    def select_rows(self, keep: torch.Tensor) -> None:
        self.k = [t.index_select(0, keep) for t in self.k]
        self.v = [t.index_select(0, keep) for t in self.v]

    def grow(self, new_cap: int) -> None:
        def _grow(t):
            out = t.new_zeros(t.shape[0], t.shape[1], new_cap, t.shape[3])
            out[:, :, : self.length] = t[:, :, : self.length]
            return out

        self.k = [_grow(t) for t in self.k]
        self.v = [_grow(t) for t in self.v]


def _rms_norm(norm: torch.nn.Module):
    """The module as fused ``F.rms_norm`` calls when it is the standard Llama/Qwen RMSNorm (normalise in float32,
    cast back, scale by ``weight``: the module's own arithmetic), else the module itself."""
    w, eps = getattr(norm, "weight", None), getattr(norm, "variance_epsilon", None)
    if type(norm).__name__ not in _STANDARD_RMSNORMS or not isinstance(w, torch.Tensor) or eps is None:
        return norm
    shape, F = (w.shape[-1],), torch.nn.functional
    if w.dtype == torch.float32:
        return lambda x: F.rms_norm(x, shape, w, eps) if x.dtype == torch.float32 else norm(x)
    return lambda x: w * F.rms_norm(x.float(), shape, None, eps).to(x.dtype)


_STANDARD_RMSNORMS = {"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}


def rotate_half_matrix(head_dim: int, dtype, device) -> torch.Tensor:
    """[d, d] signed permutation R with x @ R == rotate_half(x) == cat(-x2, x1), exactly (one +-1 per column):
    one GEMM instead of a chunk, a negation and a concatenation."""
    h = head_dim // 2
    rot = torch.zeros(head_dim, head_dim, dtype=dtype, device=device)
    idx = torch.arange(h, device=device)
    rot[idx + h, idx] = -1.0
    rot[idx, idx + h] = 1.0
    return rot


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """The Llama/NeoX rotary embedding x * cos + rotate_half(x) * sin, with rotate_half as ``x @ rot``."""
    return x * cos + (x @ rot) * sin


class _DecodeLayer:
    """One Llama-family decoder layer for a single-token decode step, with the layer's own weights and norms.

    The same arithmetic as the layer's ``forward`` (RMSNorm, q/k/v projections, Qwen3's per-head q/k norms,
    rotary embedding, attention over the cache, o projection, gated MLP), written for one query per row: q, k and
    v come from one GEMM (and gate and up from one) when the model is small enough that the concatenated copies
    are cheap, and attention is two batched matmuls and a softmax, which on CPU beat the fused SDPA kernel at
    one query. Built per ``generate`` call, so it always reads the weights the module holds then."""

    FUSE_MAX_PARAMS = 1 << 28   # above ~268M parameters the GEMMs are big enough; skip the weight copies

    def __init__(self, layer, *, fuse: bool):
        a, m = layer.self_attn, layer.mlp
        self.ln1, self.ln2 = _rms_norm(layer.input_layernorm), _rms_norm(layer.post_attention_layernorm)
        self.q_norm = _rms_norm(a.q_norm) if getattr(a, "q_norm", None) is not None else None
        self.k_norm = _rms_norm(a.k_norm) if getattr(a, "k_norm", None) is not None else None
        self.head_dim, self.scaling, self.layer_idx = a.head_dim, a.scaling, a.layer_idx
        self.nq = a.q_proj.weight.shape[0] // a.head_dim
        self.nkv = a.k_proj.weight.shape[0] // a.head_dim
        self.a, self.m, self.act = a, m, m.act_fn
        self.qkv = self.gate_up = None
        if fuse:
            def cat(mods, attr):
                parts = [getattr(x, attr) for x in mods]
                return None if parts[0] is None else torch.cat(parts, dim=0)
            proj = (a.q_proj, a.k_proj, a.v_proj)
            self.qkv = (cat(proj, "weight"), cat(proj, "bias"))
            self.gate_up = (cat((m.gate_proj, m.up_proj), "weight"), cat((m.gate_proj, m.up_proj), "bias"))

    @staticmethod
    def supports(layer) -> bool:
        a, m = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        need_a = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling", "layer_idx")
        return (a is not None and m is not None and all(hasattr(a, n) for n in need_a)
                and all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))
                and hasattr(layer, "input_layernorm") and hasattr(layer, "post_attention_layernorm"))

    def __call__(self, h, cos, sin, rot, cache: "_StaticKV", mask_kv) -> torch.Tensor:
        # h [b, 1, H]; cos/sin [b, 1, head_dim]; rot: rotate_half_matrix; mask_kv [b * n_kv, 1, S] additive over
        # the S = cache.length + 1 slots, one row per (row, kv head)
        b, d, F = h.shape[0], self.head_dim, torch.nn.functional
        nq, nkv = self.nq, self.nkv
        x = self.ln1(h)
        if self.qkv is not None and self.q_norm is None:   # q|k are adjacent: one rotary for both
            qkv = F.linear(x, *self.qkv).view(b, nq + 2 * nkv, d)
            qk = apply_rotary(qkv[:, : nq + nkv], cos, sin, rot)
            q, k, v = qk[:, :nq], qk[:, nq:], qkv[:, nq + nkv:]
        else:
            if self.qkv is not None:
                q, k, v = F.linear(x, *self.qkv).split([nq * d, nkv * d, nkv * d], dim=-1)
            else:
                q, k, v = self.a.q_proj(x), self.a.k_proj(x), self.a.v_proj(x)
            q, k, v = q.view(b, nq, d), k.view(b, nkv, d), v.view(b, nkv, d)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = apply_rotary(q, cos, sin, rot), apply_rotary(k, cos, sin, rot)   # cos/sin broadcast over heads
        n = cache.length
        kc, vc = cache.k[self.layer_idx], cache.v[self.layer_idx]   # [b, n_kv, cap, d]
        kc[:, :, n] = k
        vc[:, :, n] = v
        g = nq // nkv                              # grouped-query attention: g query heads per kv head
        K = kc[:, :, : n + 1].reshape(b * nkv, n + 1, d)   # views: the slice keeps (row, head) blocks mergeable
        V = vc[:, :, : n + 1].reshape(b * nkv, n + 1, d)
        qg = q.reshape(b * nkv, g, d)
        scores = torch.baddbmm(mask_kv, qg, K.transpose(1, 2), alpha=self.scaling)   # mask + scale * q k^T
        o = torch.bmm(torch.softmax(scores.float(), dim=-1).to(V.dtype), V)           # [b * n_kv, g, d]
        o = o.view(b, nq * d)
        if self.a.o_proj.bias is None:             # residual add inside the GEMM
            h = torch.addmm(h.view(b, -1), o, self.a.o_proj.weight.t()).view(b, 1, -1)
        else:
            h = h + self.a.o_proj(o).view(b, 1, -1)
        x = self.ln2(h)
        if self.gate_up is not None:
            gate, up = F.linear(x, *self.gate_up).chunk(2, dim=-1)
        else:
            gate, up = self.m.gate_proj(x), self.m.up_proj(x)
        a = (self.act(gate) * up).view(b, -1)
        if self.m.down_proj.bias is None:
            return torch.addmm(h.view(b, -1), a, self.m.down_proj.weight.t()).view(b, 1, -1)
        return h + self.m.down_proj(a).view(b, 1, -1)


def fast_path_unsupported_reason(model: torch.nn.Module) -> str | None:
    """None when `HFSampler` can drive the model's decoder layers directly, else why not."""
    config = getattr(model, "config", None)
    if config is None:
        return "model has no config"
    if getattr(config, "model_type", None) not in _FAST_MODEL_TYPES:
        return f"model_type {getattr(config, 'model_type', None)!r} not in {sorted(_FAST_MODEL_TYPES)}"
    inner = getattr(model, "model", None)
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if not hasattr(inner, name):
            return f"model.model has no {name}"
    if not hasattr(model, "lm_head"):
        return "model has no lm_head"
    attn = getattr(config, "_attn_implementation", None)
    if attn not in ("sdpa", "eager"):
        return f"attention implementation {attn!r} (needs sdpa or eager)"
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        return "sliding-window layers"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
    if rope_type not in _STATIC_ROPE_TYPES:
        return f"rope_type {rope_type!r} depends on the sequence length"
    # FSDP2-sharded parameters are gathered by the root module's forward hooks, which the fast path bypasses
    if any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return "parameters are sharded (DTensor)"
    return None


class HFSampler:
    """Batched KV-cache sampler for Hugging Face causal LMs.

    The engine shares the trainer's module: `update_weights(model)` only re-points to it (no copy), so samples
    always come from the weights the module holds at the time of the call. During `generate` the module is put in
    eval mode (no dropout) and its previous mode is restored afterwards.

    Prompts are sorted by length and processed in chunks of `max_batch_size` rows (shorter padding); inside a
    chunk rows of similar length are prefilled together (each group padded only to its own longest prompt) with
    positions counted from each row's first real token, so left padding changes nothing. Finished rows are
    dropped from the batch (cache rows included) once an eighth of it has finished.

    Randomness comes from a local `torch.Generator` seeded by `seed`: the same seed, model and prompt list give the
    same completions. Greedy outputs do not depend on the batch composition (up to float rounding in matmuls).

    Give it an unsharded module. An FSDP-sharded one falls back to `model.forward`, where every forward is a
    collective: ranks would have to run the same number of decode steps, which row dropping does not guarantee.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_token_id: int | Sequence[int],
        pad_token_id: int,
        max_batch_size: int = 256,
        ignore_eos: bool = False,  # sample every row to its budget (benchmarks, exact token accounting)
        fast: bool | None = None,  # None: the direct layer loop when supported; False: always model.forward
        prefill_tokens: int = 2048,  # tokens (rows x padded length) per prefill forward; bounds activation memory
    ):
        eos = _eos_list(eos_token_id)
        if not eos:
            raise ValueError("eos_token_id is required (an int or a list of ints)")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.eos_token_ids = [] if ignore_eos else eos
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = int(max_batch_size)
        self.prefill_tokens = int(prefill_tokens)
        self._fast_request = fast
        self.update_weights(model)

    # -- public API ---------------------------------------------------------------------------------------------

    def update_weights(self, model: torch.nn.Module) -> None:
        """Re-point to `model` (the trainer's own module; nothing is copied)."""
        self.model = model
        reason = fast_path_unsupported_reason(model)
        if self._fast_request and reason is not None:
            raise ValueError(f"HFSampler(fast=True) cannot drive this model directly: {reason}")
        self.fast = reason is None if self._fast_request is None else bool(self._fast_request)
        self._fast_reason = reason
        self._forward_cache_kw = _kwarg_name(model.forward, "cache", "past_key_values")
        try:
            self._has_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            self._has_logits_to_keep = False
        if self.fast:
            self._layer_cache_kw = _kwarg_name(model.model.layers[0].forward, "cache", "past_key_values")

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        logprobs: bool = False,
        prefix_lens: Sequence[int] | None = None,
    ) -> list[Completion]:
        """``prefix_lens[i]``: how many leading tokens of prompt i are a prefix that other prompts share (e.g. the
        question before a Thinking Seeds seed); the prefill computes each distinct prefix once. Default: the whole
        prompt, so only equal prompts share. A hint: the completions are the same whatever it says."""
        _check_generate_args(prompts, max_new_tokens, temperature, top_p)
        if prefix_lens is not None and len(prefix_lens) != len(prompts):
            raise ValueError(f"prefix_lens has {len(prefix_lens)} entries for {len(prompts)} prompts")
        budgets = _budgets(prompts, max_new_tokens)
        empty = [] if logprobs else None
        results: list[Completion | None] = [Completion([], "length", empty, empty) if m == 0 else None
                                            for m in budgets]
        if all(m == 0 for m in budgets):
            return results  # type: ignore[return-value]
        device = next(self.model.parameters()).device
        gen = _make_generator(seed, device)
        # longest first, stable: chunks hold prompts of similar length
        order = sorted((i for i in range(len(prompts)) if budgets[i] > 0), key=lambda i: -len(prompts[i]))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for c0 in range(0, len(order), self.max_batch_size):
                    idx = order[c0 : c0 + self.max_batch_size]
                    chunk = [list(prompts[i]) for i in idx]
                    limits = torch.tensor([budgets[i] for i in idx], device=device)
                    if self.fast:
                        pre = None if prefix_lens is None else [prefix_lens[i] for i in idx]
                        comps = self._generate_fast(chunk, limits, temperature, top_p, gen, device, logprobs, pre)
                    else:
                        comps = self._generate_generic(chunk, limits, temperature, top_p, gen, device, logprobs)
                    for i, comp in zip(idx, comps):
                        results[i] = comp
        finally:
            self.model.train(was_training)
        return results  # type: ignore[return-value]

    # -- internals ----------------------------------------------------------------------------------------------

    def _generate_fast(self, chunk, limits, temperature, top_p, gen, device, logprobs,
                       prefix_lens=None) -> list[Completion]:
        max_new = int(limits.max())
        model = self.model
        inner = model.model
        cfg = model.config
        b = len(chunk)
        lens = [len(p) for p in chunk]  # sorted, longest first
        L = lens[0]
        dtype = inner.embed_tokens.weight.dtype
        neg = torch.finfo(dtype).min
        n_layers = len(inner.layers)
        n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        total = L + max_new
        cap = L + min(max_new, 512)  # grown geometrically if responses run long
        decode_layers = None
        if all(_DecodeLayer.supports(layer) for layer in inner.layers):
            fuse = sum(p.numel() for p in model.parameters()) <= _DecodeLayer.FUSE_MAX_PARAMS
            decode_layers = [_DecodeLayer(layer, fuse=fuse) for layer in inner.layers]
        cache = _StaticKV(n_layers, b, n_kv, cap, head_dim, dtype, device, zero=decode_layers is None)
        ckw = {self._layer_cache_kw: cache}

        # rotary tables for every position this chunk can reach (static rope types only, see fast path check)
        cos_t, sin_t = inner.rotary_emb(
            torch.zeros(1, 1, cfg.hidden_size, dtype=dtype, device=device),
            torch.arange(total, device=device)[None],
        )
        cos_t, sin_t = cos_t[0], sin_t[0]  # [total, head_dim]

        lens_t = torch.tensor(lens, device=device)
        # additive decode mask over cache slots: a row sees its own prompt slots [L - len, L) and all generated ones
        slot = torch.arange(cap, device=device)
        mask_add = torch.zeros(b, 1, 1, cap, dtype=dtype, device=device)
        mask_add.masked_fill_((slot[None, :] < (L - lens_t)[:, None])[:, None, None, :], neg)

        # ---- prefill
        if decode_layers is not None:   # flat: no padding, each shared prefix once (trainer.flat)
            logits = self._prefill_flat(chunk, prefix_lens, cache, L, device)
        else:
            logits = self._prefill_padded(chunk, lens, cache, ckw, cos_t, sin_t, L, neg, device)
        cache.length = L

        # ---- decode
        final_norm = _rms_norm(inner.norm) if decode_layers is not None else inner.norm
        book = _DecodeBook(b, max_new, limits, self.eos_token_ids, self.pad_token_id, device, logprobs)
        next_pos = lens_t.clone()  # position id of the next token per buffer row
        rot = rotate_half_matrix(head_dim, dtype, device)

        def per_kv_head(m):  # [b, 1, 1, cap] -> [b * n_kv, 1, cap], the decode layers' layout
            return m.expand(m.shape[0], n_kv, 1, m.shape[-1]).reshape(-1, 1, m.shape[-1])

        mask_kv = per_kv_head(mask_add)
        for t in range(max_new):
            nxt = book.advance(t, logits, temperature, top_p, gen)
            if nxt is None:
                break
            tok, keep = nxt
            if keep is not None:
                cache.select_rows(keep)
                mask_add = mask_add.index_select(0, keep)
                mask_kv = per_kv_head(mask_add)
                next_pos = next_pos[keep]
            if cache.length + 1 > cache.capacity:
                new_cap = min(total, 2 * cache.capacity)
                cache.grow(new_cap)
                mask_add = torch.cat(
                    [mask_add, mask_add.new_zeros(mask_add.shape[0], 1, 1, new_cap - mask_add.shape[-1])], dim=-1
                )
                mask_kv = per_kv_head(mask_add)
            h = inner.embed_tokens(tok[:, None])
            cos, sin = cos_t[next_pos][:, None], sin_t[next_pos][:, None]   # [b, 1, head_dim]
            if decode_layers is not None:
                m = mask_kv[..., : cache.length + 1]
                for dl in decode_layers:
                    h = dl(h, cos, sin, rot, cache, m)
            else:
                m = mask_add[..., : cache.length + 1]
                for layer in inner.layers:
                    h = layer(h, attention_mask=m, position_embeddings=(cos, sin), **ckw)
                    if isinstance(h, tuple):
                        h = h[0]
            cache.length += 1
            next_pos = next_pos + 1
            logits = model.lm_head(final_norm(h[:, -1])).float()
        return book.completions()

    def _prefill_flat(self, chunk, prefix_lens, cache: "_StaticKV", L: int, device) -> torch.Tensor:
        """Next-token logits [b, V] of every row, its keys and values written right-aligned into cache slots
        [0, L). Rows are split as shared prefix + own suffix (``prefix_lens``; default the whole prompt, so equal
        prompts are computed once) and run flat (``trainer.flat``) in pieces of at most ``prefill_tokens``."""
        from trainer.flat import build_layout, run_layout
        from trainer.policy import micro_batches

        model = self.model
        if prefix_lens is None:
            cut = [len(p) for p in chunk]
        else:   # at least one prefix token (the flat layout's prompt part is never empty)
            cut = [max(1, min(int(k), len(p))) for p, k in zip(chunk, prefix_lens)]
        pre, suf = [p[:k] for p, k in zip(chunk, cut)], [p[k:] for p, k in zip(chunk, cut)]
        pieces, _ = micro_batches([(len(a), len(x)) for a, x in zip(pre, suf)], rows=len(chunk),
                                  tokens=self.prefill_tokens, prompt_keys=[tuple(a) for a in pre])
        neg = torch.finfo(model.model.embed_tokens.weight.dtype).min
        logits = torch.empty(len(chunk), model.config.vocab_size, dtype=torch.float32, device=device)
        for idx in pieces:
            lay = build_layout([pre[i] for i in idx], [suf[i] for i in idx], device=device, neg=neg, prefill=True)
            # cache slot j of row i holds its token j - (L - len_i); slots before a row's first token read flat
            # token 0 and stay masked (``mask_add``)
            src = torch.tensor([[0] * (L - len(x)) + x for x in lay.seq], dtype=torch.long, device=device)
            rows = torch.tensor(idx, dtype=torch.long, device=device)

            def sink(layer_idx, k, v, src=src, rows=rows):   # k, v [N, n_kv, d]
                for store, x in ((cache.k, k), (cache.v, v)):
                    part = x.index_select(0, src.view(-1)).view(*src.shape, *x.shape[1:]).transpose(1, 2)
                    store[layer_idx][rows, :, :L] = part

            logits[rows] = run_layout(model, lay, kv_sink=sink).float()
        return logits

    def _prefill_padded(self, chunk, lens, cache: "_StaticKV", ckw, cos_t, sin_t, L, neg, device) -> torch.Tensor:
        """The model's own decoder layers over left-padded groups of rows of similar length (layers the flat
        path cannot drive): next-token logits [b, V], keys and values written into the cache."""
        model, inner = self.model, self.model.model
        b, dtype = len(chunk), inner.embed_tokens.weight.dtype
        lens_t = torch.tensor(lens, device=device)
        logits = torch.empty(b, model.config.vocab_size, dtype=torch.float32, device=device)
        r0 = 0
        while r0 < b:
            Lg = lens[r0]
            rows = max(1, min(b - r0, self.prefill_tokens // Lg))
            r1 = r0 + rows
            ids = torch.tensor(
                [[self.pad_token_id] * (Lg - len(p)) + p for p in chunk[r0:r1]], dtype=torch.long, device=device
            )
            pad = (Lg - lens_t[r0:r1])[:, None]  # [rows, 1]
            ar = torch.arange(Lg, device=device)
            pos = (ar[None, :] - pad).clamp(min=0)  # [rows, Lg]
            key_ok = ar[None, :] >= pad  # [rows, Lg]
            allowed = (ar[None, :, None] >= ar[None, None, :]) & key_ok[:, None, :]  # causal & not padding
            allowed |= torch.eye(Lg, dtype=torch.bool, device=device)[None]  # pad queries see themselves: no NaN
            m = torch.zeros(rows, 1, Lg, Lg, dtype=dtype, device=device).masked_fill_(~allowed[:, None], neg)
            cache.prefill_rows, cache.prefill_start = (r0, r1), L - Lg
            h = inner.embed_tokens(ids)
            pe = (cos_t[pos], sin_t[pos])
            for layer in inner.layers:
                h = layer(h, attention_mask=m, position_embeddings=pe, **ckw)
                if isinstance(h, tuple):  # older transformers return (hidden, ...)
                    h = h[0]
            logits[r0:r1] = model.lm_head(inner.norm(h[:, -1])).float()
            r0 = r1
        cache.prefill_rows = None
        return logits

    def _generate_generic(self, chunk, limits, temperature, top_p, gen, device, logprobs) -> list[Completion]:
        """Any causal LM: model.forward with a DynamicCache, left padding and explicit position ids."""
        max_new = int(limits.max())
        from transformers import DynamicCache

        model = self.model
        b = len(chunk)
        lens = [len(p) for p in chunk]
        L = max(lens)
        ids = torch.full((b, L), self.pad_token_id, dtype=torch.long)
        am = torch.zeros(b, L + max_new, dtype=torch.long)
        for j, p in enumerate(chunk):
            ids[j, L - len(p) :] = torch.tensor(p, dtype=torch.long)
            am[j, L - len(p) :] = 1  # generated slots count as attended from the start
        ids, am = ids.to(device), am.to(device)
        pos = (am[:, :L].cumsum(1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        extra = {"logits_to_keep": 1} if self._has_logits_to_keep else {}
        ckw = {self._forward_cache_kw: cache}
        o = model(input_ids=ids, attention_mask=am[:, :L], position_ids=pos, use_cache=True, **ckw, **extra)
        logits = o.logits[:, -1].float()

        book = _DecodeBook(b, max_new, limits, self.eos_token_ids, self.pad_token_id, device, logprobs)
        next_pos = pos[:, -1] + 1
        for t in range(max_new):
            nxt = book.advance(t, logits, temperature, top_p, gen)
            if nxt is None:
                break
            tok, keep = nxt
            if keep is not None:
                cache.batch_select_indices(keep)
                am = am.index_select(0, keep)
                next_pos = next_pos[keep]
            o = model(
                input_ids=tok[:, None],
                attention_mask=am[:, : L + t + 1],
                position_ids=next_pos[:, None],
                use_cache=True,
                **ckw,
                **extra,
            )
            next_pos = next_pos + 1
            logits = o.logits[:, -1].float()
        return book.completions()


# --------------------------------------------------------------------------------------------------------------
# vLLM engine


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
        eos = _eos_list(eos_token_id)
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
        _check_generate_args(prompts, max_new_tokens, temperature, top_p)
        budgets = _budgets(prompts, max_new_tokens)
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


# --------------------------------------------------------------------------------------------------------------
# factories


def _model_eos_ids(model, tokenizer) -> list[int]:
    """EOS ids from the tokenizer and the model's generation config (chat models often list several)."""
    ids: list[int] = []
    gc = getattr(model, "generation_config", None)
    for src in (getattr(tokenizer, "eos_token_id", None), getattr(gc, "eos_token_id", None)):
        for e in _eos_list(src):
            if e not in ids:
                ids.append(e)
    return ids


def make_sampler(model, tokenizer, *, engine: str = "hf", **kw) -> Sampler:
    """Build a sampler for `model`. engine: "hf" | "vllm" | "auto" (vLLM when CUDA and vllm are available).

    EOS ids default to the union of the tokenizer's and the generation config's; the pad id to the tokenizer's
    (else the first EOS id). Other keywords go to the engine (`max_batch_size` for HF, which vLLM receives as
    `max_num_seqs`; `gpu_memory_utilization` and vllm.LLM arguments for vLLM)."""
    engines = ("hf", "vllm", "auto")
    if engine not in engines:
        raise ValueError(f"engine must be one of {engines}, got {engine!r}")
    if engine == "auto":
        engine = "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None else "hf"
    eos = kw.pop("eos_token_id", None) or _model_eos_ids(model, tokenizer)
    if not eos:
        raise ValueError("no EOS id: the tokenizer and generation config define none; pass eos_token_id=")
    pad = kw.pop("pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = _eos_list(eos)[0]
    if engine == "hf":
        return HFSampler(model, eos_token_id=eos, pad_token_id=pad, **kw)
    if "max_batch_size" in kw:   # the same knob in vLLM's words: sequences scheduled together
        kw["max_num_seqs"] = kw.pop("max_batch_size")
    return VLLMSampler(model, eos_token_id=eos, pad_token_id=pad, tokenizer=tokenizer, **kw)


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
