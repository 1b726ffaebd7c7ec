"""A padding-free, shared-prompt forward for training Llama-family models (Llama, Qwen2, Qwen3).

The padded layout (``policy.pack``) runs every row of a micro-batch to the longest prompt plus the longest
response, and runs a group's prompt once per sample. Here the tokens that matter are laid out flat instead:

    [ prompt tokens of each distinct prompt, once ] [ response tokens of each row, without its last token ]

Norms, projections, the MLP and the LM head (nearly all of the arithmetic) run on those N flat tokens only.
Attention gathers them into two small padded batches, one over the distinct prompts (causal) and one over the
responses, whose keys are the row's shared prompt keys followed by its own response keys (causal), and scatters
the result back. A response's last token predicts nothing, so it is never computed; the first response token is
predicted by the prompt's last hidden state, which every row of the group reads from the same place (autograd
sums their gradients there).

It is the same function of the weights as the model's own forward (same modules, same order of operations per
token); tests compare log-probs and gradients with ``policy.pack`` + ``model.forward`` on each architecture.
verl calls the padding half of this "remove padding" and TRL "padding-free"; sharing the prompt among a group's
samples is what makes GRPO-style batches (G samples per prompt) cheaper still.

Prompts are matched by content: rows with the same prompt in one micro-batch share its computation
(``inference.batching.micro_batches`` keeps a prompt's rows together when asked to). The HF sampler prefills with the same
layout (``prefill=True``: every token an input, one next-token logit per row, keys and values handed to its
cache), with a shared prefix (the question) as the "prompt" and the rest of each row (a seed) as its "response".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from inference.layers import SHARDED, DecodeLayer, apply_rotary, fast_path_unsupported_reason, rotate_half_matrix

FSDP_METHOD = "flat_run"     # the root's method that runs a layout (``enable_fsdp``)
LAYER_METHOD = "flat_layer"  # each decoder layer's method


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """None when ``flat_forward`` computes the same function as ``model.forward``, else why not. A model sharded
    by FSDP2 qualifies once ``enable_fsdp`` gave it the methods FSDP's hooks gather the parameters for."""
    reason = fast_path_unsupported_reason(model)
    if reason == SHARDED and getattr(model, FSDP_METHOD, None) is not None:
        reason = None
    if reason is not None:
        return reason
    layers = model.model.layers
    if not all(DecodeLayer.supports(layer) for layer in layers):
        return "a decoder layer is not a standard Llama-family layer"
    if model.training and float(getattr(model.config, "attention_dropout", 0.0) or 0.0) > 0:
        return "attention dropout is on"
    return None


@dataclass
class FlatLayout:
    """Index tensors of one micro-batch (built once, used by every layer) over its ``N`` flat tokens. Padding
    slots of the attention grids point at token 0: masked out as keys, never read back as queries."""

    ids: torch.Tensor          # [N] token ids
    pos: torch.Tensor          # [N] position ids
    n_prompt: int              # flat tokens [0, n_prompt) are prompt tokens
    p_idx: torch.Tensor        # [U, P] flat index of prompt u's token j (0 where j >= len)
    p_out: torch.Tensor        # [n_prompt] position in the U*P grid of each prompt token, in flat order
    r_q: torch.Tensor          # [n, Q] flat index of row i's response input t (0 where t >= len - 1)
    r_k: torch.Tensor          # [n, P + Q] keys: its prompt's tokens, then its own response inputs
    r_mask: torch.Tensor       # [n, 1, Q, P + Q] additive
    r_out: torch.Tensor        # [N - n_prompt] position in the n*Q grid of each response input, in flat order
    logit_src: torch.Tensor    # [M] flat index whose hidden state predicts each response token (M = sum of lengths)
    targets: torch.Tensor      # [M] the response tokens
    out_rows: torch.Tensor     # [M] where each prediction goes in the [n, R] output
    out_cols: torch.Tensor     # [M]
    seq: list[list[int]] | None = None   # prefill: flat indices of each row's whole sequence, in order


def build_layout(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *, device,
                 neg: float, prefill: bool = False) -> FlatLayout:
    """The flat layout of rows ``prompts[i] + responses[i]``; equal prompts are computed once.

    Training (``prefill=False``): a response's last token is no input, and there is one logit per response
    token. Prefill (``prefill=True``, the sampler: ``responses`` are per-row suffixes after a shared prefix):
    every token is an input, there is one logit per row (after its last token), and ``seq`` lists each row's
    tokens for filling a KV cache.
    """
    n = len(prompts)
    keys: dict[tuple, int] = {}
    uniq: list[Sequence[int]] = []
    row_u: list[int] = []
    for p in prompts:
        if len(p) == 0:
            raise ValueError("flat forward: every prompt needs at least one token")
        u = keys.setdefault(tuple(p), len(uniq))
        if u == len(uniq):
            uniq.append(p)
        row_u.append(u)
    p_len = [len(p) for p in uniq]
    p_off = [0]
    for L in p_len:
        p_off.append(p_off[-1] + L)
    n_prompt = p_off[-1]
    inputs = [list(r) for r in responses] if prefill else [list(r[:-1]) for r in responses]
    q_len = [len(r) for r in inputs]                      # response tokens that are inputs
    r_off = [n_prompt]
    for L in q_len:
        r_off.append(r_off[-1] + L)
    P, Q = max(p_len), max(q_len)

    ids = torch.tensor([t for p in uniq for t in p] + [t for r in inputs for t in r], dtype=torch.long)
    pos = torch.cat([torch.arange(L) for L in p_len]
                    + [torch.arange(p_len[u], p_len[u] + q) for u, q in zip(row_u, q_len)])

    ar_p = torch.arange(P)
    p_len_t, p_off_t = torch.tensor(p_len), torch.tensor(p_off[:-1])
    p_valid = ar_p[None, :] < p_len_t[:, None]                                          # [U, P]
    p_idx = torch.where(p_valid, p_off_t[:, None] + ar_p[None, :], 0)
    p_out = p_valid.reshape(-1).nonzero().squeeze(1)

    ar_q = torch.arange(Q)
    q_len_t, r_off_t = torch.tensor(q_len), torch.tensor(r_off[:-1])
    row_u_t = torch.tensor(row_u)
    r_valid = ar_q[None, :] < q_len_t[:, None]                                          # [n, Q]
    r_q = torch.where(r_valid, r_off_t[:, None] + ar_q[None, :], 0)
    r_k = torch.cat([p_idx[row_u_t], r_q], dim=1)                                       # [n, P + Q]
    see_prompt = p_valid[row_u_t][:, None, :].expand(n, Q, P)                           # the whole prompt
    see_resp = (ar_q[None, :, None] >= ar_q[None, None, :]) & r_valid[:, None, :]       # causal over inputs
    r_mask = torch.zeros(n, 1, Q, P + Q).masked_fill_(~torch.cat([see_prompt, see_resp], -1)[:, None], neg)
    r_out = r_valid.reshape(-1).nonzero().squeeze(1)

    src, tgt, rows, cols, seq = [], [], [], [], None
    if prefill:   # the next token of row i is predicted by its last token; seq: prompt tokens, then its own
        seq = [list(range(p_off[u], p_off[u + 1])) + list(range(r_off[i], r_off[i + 1])) for i, u in enumerate(row_u)]
        src = [x[-1] for x in seq]
    else:         # response token t of row i is predicted by: t = 0, its prompt's last token; t > 0, input t - 1
        for i, r in enumerate(responses):
            if not r:
                continue
            src.append(p_off[row_u[i] + 1] - 1)
            src.extend(range(r_off[i], r_off[i] + len(r) - 1))
            tgt.extend(r)
            rows.extend([i] * len(r))
            cols.extend(range(len(r)))

    def t(x, dtype=torch.long):
        return torch.as_tensor(x, dtype=dtype).to(device)

    return FlatLayout(ids=t(ids), pos=t(pos), n_prompt=n_prompt, p_idx=t(p_idx),
                      p_out=t(p_out), r_q=t(r_q), r_k=t(r_k), r_mask=r_mask.to(device), r_out=t(r_out),
                      logit_src=t(src), targets=t(tgt), out_rows=t(rows), out_cols=t(cols), seq=seq)


def _gather(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:   # x [N, heads, d], idx [B, S] -> [B, heads, S, d]
    # index_select, not x[idx]: its backward is one index_add, advanced indexing's is a much slower index_put
    return x.index_select(0, idx.reshape(-1)).view(*idx.shape, *x.shape[1:]).transpose(1, 2)


# The SDPA backend each part of the flat attention got, the first time it ran on each device type (``sdpa_backend``):
# {"cuda/prompts": "flash", "cuda/responses": "efficient", ...}. The trainer prints it once.
BACKENDS: dict[str, str] = {}


def sdpa_backend(q, k, v, mask, is_causal: bool, gqa: bool) -> str:
    """The kernel ``F.scaled_dot_product_attention`` picks for these arguments (``torch._fused_sdp_choice``: the
    dispatcher's own choice, on CPU and CUDA alike): ``flash``, ``efficient``, ``cudnn``, ``math``..."""
    try:
        from torch.nn.attention import SDPBackend
        choice = torch._fused_sdp_choice(q, k, v, mask, 0.0, is_causal, enable_gqa=gqa)
        return SDPBackend(choice).name.lower().replace("_attention", "")
    except Exception as e:   # an older torch without enable_gqa in the choice, or a backend it cannot name
        return f"unknown ({type(e).__name__})"


def cuda_fused_kernels(head_dim: int, dtype: torch.dtype, *, mask: bool, is_causal: bool, gqa: bool) -> list[str]:
    """The CUDA fused kernels whose documented constraints a call meets (torch 2.5-2.13): FlashAttention takes no
    explicit mask (``is_causal`` is its mask), fp16/bf16, head_dim <= 256 and a multiple of 8, and grouped keys
    (``enable_gqa``); the memory-efficient kernel takes an additive mask and fp32/fp16/bf16, but not
    ``enable_gqa``. A call that meets neither runs the math kernel, which materializes [B, heads, Q, S] fp32
    scores (about 11 GB per layer at the device check's size)."""
    out = []
    if not mask and dtype in (torch.float16, torch.bfloat16) and head_dim <= 256 and head_dim % 8 == 0:
        out.append("flash")
    if not gqa and dtype in (torch.float32, torch.float16, torch.bfloat16):
        out.append("efficient")
    return out


def _attend(q, k, v, idx_q, idx_k, mask, scaling, gqa, part: str) -> torch.Tensor:
    """SDPA over gathered rows: q/k/v [N, heads, d]; idx_q [B, Q], idx_k [B, S] (padding slots point at token 0:
    the mask gives them zero weight as keys, and padding queries are never read back).

    Two calls a fused kernel accepts (``cuda_fused_kernels``): ``mask=None`` is causal attention over a square,
    right-padded grid (the prompts: a real query only reaches real keys at or before it), which FlashAttention
    takes with grouped keys as they are; with a mask (the responses: the shared prompt's keys, then their own,
    causally), grouped keys are expanded to the query heads, since the memory-efficient kernel takes a mask but not
    ``enable_gqa``."""
    qb, kb, vb = _gather(q, idx_q), _gather(k, idx_k), _gather(v, idx_k)
    if mask is not None:
        mask = mask.to(qb.dtype)
        if gqa:
            rep = qb.shape[1] // kb.shape[1]
            kb, vb = kb.repeat_interleave(rep, dim=1), vb.repeat_interleave(rep, dim=1)
            gqa = False
    key = f"{qb.device.type}/{part}"
    if key not in BACKENDS:
        BACKENDS[key] = sdpa_backend(qb, kb, vb, mask, mask is None, gqa)
    o = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, is_causal=mask is None, scale=scaling,
                                       enable_gqa=gqa)
    return o.transpose(1, 2).reshape(-1, o.shape[1] * o.shape[3])   # [B * Q, nq * d]


def _layer(layer, h, cos, sin, rot, lay: FlatLayout, kv_sink=None):
    # the modules themselves (adapters such as LoRA keep working); fusing q|k|v or gate|up into one GEMM was
    # measured slower here in training (the weight copies and the split gradients cost more than they save)
    a, m = layer.self_attn, layer.mlp
    d, n = a.head_dim, h.shape[0]
    x = layer.input_layernorm(h)
    q, k, v = a.q_proj(x).view(n, -1, d), a.k_proj(x).view(n, -1, d), a.v_proj(x).view(n, -1, d)
    if getattr(a, "q_norm", None) is not None:   # Qwen3: per-head norms before the rotary embedding
        q, k = a.q_norm(q), a.k_norm(k)
    q, k = apply_rotary(q, cos, sin, rot), apply_rotary(k, cos, sin, rot)   # cos/sin [N, 1, d]
    if kv_sink is not None:
        kv_sink(a.layer_idx, k, v)
    gqa = q.shape[1] != k.shape[1]
    parts = [_attend(q, k, v, lay.p_idx, lay.p_idx, None, a.scaling, gqa, "prompts").index_select(0, lay.p_out)]
    if lay.r_q.shape[1] > 0:
        parts.append(_attend(q, k, v, lay.r_q, lay.r_k, lay.r_mask, a.scaling, gqa, "responses")
                     .index_select(0, lay.r_out))
    h = h + a.o_proj(torch.cat(parts) if len(parts) > 1 else parts[0])
    x = layer.post_attention_layernorm(h)
    return h + m.down_proj(m.act_fn(m.gate_proj(x)) * m.up_proj(x))


def flat_forward(model, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *, device,
                 prefill: bool = False, kv_sink=None):
    """Logits and the layout that places them. Training: [M, V] for every response token (M = total response
    length, row-major; ``targets``, ``out_rows``, ``out_cols``). ``prefill=True``: [n, V] for the token after
    each row, and ``kv_sink(layer_idx, k, v)`` receives every layer's keys (after the rotary embedding) and
    values over the flat tokens, [N, n_kv, head_dim] each."""
    dtype = model.model.embed_tokens.weight.dtype
    lay = build_layout(prompts, responses, device=device, neg=torch.finfo(dtype).min, prefill=prefill)
    return run_layout(model, lay, kv_sink=kv_sink), lay


def enable_fsdp(model) -> bool:
    """Let the flat forward run on a model sharded by FSDP2 (``fully_shard`` on every decoder layer and the root).

    FSDP2 gathers a unit's parameters in the hooks of its ``forward`` and reshards them after; the flat forward
    calls the layers' submodules itself, which those hooks never see. So each decoder layer gets the flat layer as
    a method and the root the whole layout run, and ``torch.distributed.fsdp.register_fsdp_forward_method``
    gives those methods the same pre- and post-forward hooks (gather, mixed-precision casts, reshard, the
    backward's re-gather) that ``forward`` has. Returns whether it did (False: not an FSDP2 model, or an
    architecture the flat forward does not take)."""
    from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method
    import types
    if not isinstance(model, FSDPModule) or fast_path_unsupported_reason(model) not in (None, SHARDED):
        return False
    layers = model.model.layers
    if not all(isinstance(layer, FSDPModule) and DecodeLayer.supports(layer) for layer in layers):
        return False
    for layer in layers:
        setattr(layer, LAYER_METHOD, types.MethodType(_layer, layer))
        register_fsdp_forward_method(layer, LAYER_METHOD)
    setattr(model, FSDP_METHOD, types.MethodType(_run_layout, model))
    register_fsdp_forward_method(model, FSDP_METHOD)
    return True


def run_layout(model, lay: FlatLayout, *, kv_sink=None) -> torch.Tensor:
    """The model over a built layout: logits at ``lay.logit_src`` (through FSDP's hooks when ``enable_fsdp`` gave
    the model its method)."""
    sharded = getattr(model, FSDP_METHOD, None)
    if sharded is not None:
        return sharded(lay, kv_sink=kv_sink)
    return _run_layout(model, lay, kv_sink=kv_sink)


def _run_layout(model, lay: FlatLayout, *, kv_sink=None) -> torch.Tensor:
    inner = model.model
    h = inner.embed_tokens(lay.ids)                                    # [N, H]
    with torch.no_grad():
        cos_t, sin_t = inner.rotary_emb(h[None, :1], torch.arange(int(lay.pos.max()) + 1, device=h.device)[None])
    cos, sin = cos_t[0][lay.pos][:, None], sin_t[0][lay.pos][:, None]  # [N, 1, d]
    rot = rotate_half_matrix(cos.shape[-1], cos.dtype, cos.device)
    # activation checkpointing as the model's own forward does it: per layer, when enabled and under autograd
    ckpt = torch.is_grad_enabled() and any(getattr(x, "gradient_checkpointing", False) for x in inner.layers)
    for layer in inner.layers:
        fn = getattr(layer, LAYER_METHOD, None) or (lambda *a, layer=layer: _layer(layer, *a))
        if ckpt:
            h = checkpoint(fn, h, cos, sin, rot, lay, kv_sink, use_reentrant=False)
        else:
            h = fn(h, cos, sin, rot, lay, kv_sink)
    hidden = inner.norm(h.index_select(0, lay.logit_src))              # [M, H]
    return model.lm_head(hidden)
