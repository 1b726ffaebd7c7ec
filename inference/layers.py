"""Llama-family layer math shared by the flat training forward (``inference.flat``) and the HF decoder
(``inference.hf``): fused RMSNorm, rotary embedding as one GEMM, and a single-token decode layer, all with the
model's own weights, plus the check of which models they support."""

from __future__ import annotations

import torch

__all__ = ["SHARDED", "DecodeLayer", "apply_rotary", "fast_path_unsupported_reason", "rms_norm", "rotate_half_matrix"]

_FAST_MODEL_TYPES = {"llama", "qwen2", "qwen3"}
SHARDED = "parameters are sharded (DTensor)"   # the reason a sharded model has no fast path without FSDP's hooks
_STATIC_ROPE_TYPES = {None, "default", "linear", "llama3", "yarn"}


def rms_norm(norm: torch.nn.Module):
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


def _plain(proj: torch.nn.Module) -> bool:
    """Whether ``proj`` is its weight and bias alone (a plain linear layer), so the decode step may read them
    directly; an adapter layer (``base_layer`` plus LoRA's ``lora_A``/``lora_B``) must be called."""
    return not hasattr(proj, "base_layer")


class DecodeLayer:
    """One Llama-family decoder layer for a single-token decode step, with the layer's own weights and norms.

    The same arithmetic as the layer's ``forward`` (RMSNorm, q/k/v projections, Qwen3's per-head q/k norms,
    rotary embedding, attention over the cache, o projection, gated MLP), written for one query per row: q, k and
    v come from one GEMM (and gate and up from one) when the model is small enough that the concatenated copies
    are cheap, and attention is two batched matmuls and a softmax, which on CPU beat the fused SDPA kernel at
    one query. Built per ``generate`` call, so it always reads the weights the module holds then."""

    FUSE_MAX_PARAMS = 1 << 28   # above ~268M parameters the GEMMs are big enough; skip the weight copies

    def __init__(self, layer, *, fuse: bool):
        a, m = layer.self_attn, layer.mlp
        self.ln1, self.ln2 = rms_norm(layer.input_layernorm), rms_norm(layer.post_attention_layernorm)
        self.q_norm = rms_norm(a.q_norm) if getattr(a, "q_norm", None) is not None else None
        self.k_norm = rms_norm(a.k_norm) if getattr(a, "k_norm", None) is not None else None
        self.head_dim, self.scaling, self.layer_idx = a.head_dim, a.scaling, a.layer_idx
        self.nq = a.q_proj.weight.shape[0] // a.head_dim
        self.nkv = a.k_proj.weight.shape[0] // a.head_dim
        self.a, self.m, self.act = a, m, m.act_fn
        self.qkv = self.gate_up = None
        # a projection with adapters (PEFT's LoRA layers keep the weight in ``base_layer``) is called, not read
        self.o_plain, self.down_plain = _plain(a.o_proj), _plain(m.down_proj)
        if fuse and all(map(_plain, (a.q_proj, a.k_proj, a.v_proj, m.gate_proj, m.up_proj))):
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

    def __call__(self, h, cos, sin, rot, cache, mask_kv) -> torch.Tensor:
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
        if self.o_plain and self.a.o_proj.bias is None:   # residual add inside the GEMM
            h = torch.addmm(h.view(b, -1), o, self.a.o_proj.weight.t()).view(b, 1, -1)
        else:
            h = h + self.a.o_proj(o).view(b, 1, -1)
        x = self.ln2(h)
        if self.gate_up is not None:
            gate, up = F.linear(x, *self.gate_up).chunk(2, dim=-1)
        else:
            gate, up = self.m.gate_proj(x), self.m.up_proj(x)
        a = (self.act(gate) * up).view(b, -1)
        if self.down_plain and self.m.down_proj.bias is None:
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
        return SHARDED
    return None
