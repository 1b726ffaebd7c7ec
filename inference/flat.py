"""A padding-free, shared-prompt forward for training Llama-family models (Llama, Qwen2, Qwen3).

The padded layout (``policy.pack``) runs every row of a micro-batch to the longest prompt plus the longest
response, and runs a group's prompt once per sample. Here the tokens that matter are laid out flat instead:

    [ prompt tokens of each distinct prompt, once ] [ response tokens of each row, without its last token ]

Norms, projections, the MLP and the LM head (nearly all of the arithmetic) run on those N flat tokens only.
Attention gathers each row's sequence (its prompt's flat tokens, then its own response inputs) into blocks of rows
of similar length and runs causal SDPA over them with no mask (padding sits after every real token), grouped keys
as they are: a call FlashAttention takes on CUDA, computing about half of each block's square (the padded forward's
masked call computes the whole square, padding included). A prompt token's output is read from its group's first
row, a response input's from its own; the result is scattered back to the flat order. A response's last token predicts nothing, so it is never computed; the first response token is
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
    """Index tensors of one micro-batch (built once, used by every layer) over its ``N`` flat tokens.

    Attention runs on ``blocks``: each row's whole sequence (its prompt's flat tokens, then its own response inputs)
    laid out as one row of a padded grid, rows of similar length together (``BUCKET_RATIO``), causal with no mask:
    a real query reaches only its own earlier tokens, padding sits after every real token. The output of a prompt
    token is read from its group's first row (every row of the group computes the same one), a response input's from
    its own row."""

    ids: torch.Tensor          # [N] token ids
    pos: torch.Tensor          # [N] position ids
    n_prompt: int              # flat tokens [0, n_prompt) are prompt tokens
    blocks: list[torch.Tensor]  # [B_b, L_b] flat index of each row's j-th token (0 where j >= its length)
    out_idx: torch.Tensor      # [N] position of each flat token's output in the blocks' grids, concatenated
    logit_src: torch.Tensor    # [M] flat index whose hidden state predicts each response token (M = sum of lengths)
    targets: torch.Tensor      # [M] the response tokens
    out_rows: torch.Tensor     # [M] where each prediction goes in the [n, R] output
    out_cols: torch.Tensor     # [M]
    seq: list[list[int]] | None = None   # prefill: flat indices of each row's whole sequence, in order


# A block holds rows down to this fraction of its longest row: padding costs at most 1/BUCKET_RATIO^2 of a block's
# causal attention, for a handful of calls per layer (lengths 100..16k give ~20).
BUCKET_RATIO = 0.8


def build_layout(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *, device,
                 neg: float = 0.0, prefill: bool = False) -> FlatLayout:
    """The flat layout of rows ``prompts[i] + responses[i]``; equal prompts are computed once.

    Training (``prefill=False``): a response's last token is no input, and there is one logit per response
    token. Prefill (``prefill=True``, the sampler: ``responses`` are per-row suffixes after a shared prefix):
    every token is an input, there is one logit per row (after its last token), and ``seq`` lists each row's
    tokens for filling a KV cache. (``neg`` is unused: the attention needs no mask.)
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

    ids = torch.tensor([t for p in uniq for t in p] + [t for r in inputs for t in r], dtype=torch.long)
    pos = torch.cat([torch.arange(L) for L in p_len]
                    + [torch.arange(p_len[u], p_len[u] + q) for u, q in zip(row_u, q_len)])
    seq = [list(range(p_off[u], p_off[u + 1])) + list(range(r_off[i], r_off[i + 1])) for i, u in enumerate(row_u)]

    # blocks: rows by length, longest first; a block takes rows down to BUCKET_RATIO of its first row's length
    order = sorted(range(n), key=lambda i: -len(seq[i]))
    blocks, out_idx, base = [], [0] * len(ids), 0
    first_row = {}
    for i in range(n):
        first_row.setdefault(row_u[i], i)
    k = 0
    while k < n:
        L = len(seq[order[k]])
        members = [order[k]]
        k += 1
        while k < n and len(seq[order[k]]) >= BUCKET_RATIO * L:
            members.append(order[k])
            k += 1
        grid = torch.zeros(len(members), L, dtype=torch.long)
        for b, i in enumerate(members):
            grid[b, :len(seq[i])] = torch.tensor(seq[i], dtype=torch.long)
            u, own = row_u[i], base + b * L
            if first_row[u] == i:                          # its prompt's outputs come from this row
                out_idx[p_off[u]:p_off[u + 1]] = range(own, own + p_len[u])
            out_idx[r_off[i]:r_off[i + 1]] = range(own + p_len[u], own + p_len[u] + q_len[i])
        blocks.append(grid)
        base += len(members) * L

    src, tgt, rows, cols = [], [], [], []
    if prefill:   # the next token of row i is predicted by its last token
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

    return FlatLayout(ids=t(ids), pos=t(pos), n_prompt=n_prompt, blocks=[t(b) for b in blocks],
                      out_idx=t(out_idx), logit_src=t(src), targets=t(tgt), out_rows=t(rows), out_cols=t(cols),
                      seq=seq if prefill else None)


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


def _attend(q, k, v, idx, scaling, gqa) -> torch.Tensor:
    """Causal SDPA over one block of rows: q/k/v [N, heads, d], idx [B, L] (padding slots point at token 0 and sit
    after every real token, so no real query reaches them). No mask and grouped keys as they are: a call
    FlashAttention takes on CUDA (``cuda_fused_kernels``)."""
    qb, kb, vb = _gather(q, idx), _gather(k, idx), _gather(v, idx)
    key = f"{qb.device.type}/blocks"
    if key not in BACKENDS:
        BACKENDS[key] = sdpa_backend(qb, kb, vb, None, True, gqa)
    o = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scaling, enable_gqa=gqa)
    return o.transpose(1, 2).reshape(-1, o.shape[1] * o.shape[3])   # [B * L, nq * d]


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
    outs = [_attend(q, k, v, blk, a.scaling, gqa) for blk in lay.blocks]
    att = (torch.cat(outs) if len(outs) > 1 else outs[0]).index_select(0, lay.out_idx)   # [N, nq * d]
    h = h + a.o_proj(att)
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
