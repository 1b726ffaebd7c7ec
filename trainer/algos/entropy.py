"""Token log-probabilities and entropies from logits, in row chunks.

    log π(o_t) = z_{o_t} − logsumexp(z)          H_t = −Σ_v π_v log π_v,  log π = z − logsumexp(z)   (nats)

The [N, T, V] logits are flattened to N·T rows and processed `chunk_size` rows at a time, upcast to float32
per chunk (bf16 logsumexp loses ~2 digits), so no second full [N, T, V] tensor is created. Under autograd a
large chunk is recomputed in backward (activation checkpointing) instead of saving its softmax (small chunks,
as with tiny vocabularies, are kept: recomputing them costs more than they weigh), and the chunks come from
one `split` so backward writes the logits gradient once, not once per chunk.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK_SIZE = 1024


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


def _chunk_logp(z: Tensor, ids: Tensor) -> Tensor:  # [C, V], [C] -> [C]
    z = z.to(_compute_dtype(z.dtype))
    return z.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def _chunk_entropy(z: Tensor) -> Tensor:  # [C, V] -> [C]
    z = z.to(_compute_dtype(z.dtype))
    return _entropy_from_log_softmax(z - torch.logsumexp(z, dim=-1, keepdim=True))


def _entropy_from_log_softmax(logq: Tensor) -> Tensor:  # [C, V] -> [C]
    # −Σ q log q on the normalised log-probs (shift-invariant; lse − Σ q·z cancels badly for large logits),
    # with 0·(−inf) := 0 so logits masked to −inf (top-k/top-p filtering) give a finite entropy.
    q = logq.exp()
    return -torch.where(q > 0, q * logq, torch.zeros((), dtype=logq.dtype, device=logq.device)).sum(-1)


def _chunk_both(z: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:  # [C, V], [C] -> [C], [C]
    z = z.to(_compute_dtype(z.dtype))
    logq = z - torch.logsumexp(z, dim=-1, keepdim=True)
    return logq.gather(-1, ids.unsqueeze(-1)).squeeze(-1), _entropy_from_log_softmax(logq)


def _chunk_both_entropy_detached(z: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    z = z.to(_compute_dtype(z.dtype))
    logq = z - torch.logsumexp(z, dim=-1, keepdim=True)
    with torch.no_grad():
        ent = _entropy_from_log_softmax(logq.detach())
    return logq.gather(-1, ids.unsqueeze(-1)).squeeze(-1), ent


# Chunks at least this many logits are recomputed in backward rather than keeping their float32 softmax
# (a 1024-row chunk of a 152k vocabulary is 600 MB); smaller ones are cheaper to keep than to recompute.
CHECKPOINT_MIN_ELEMENTS = 1 << 22


def _row_chunks(logits: Tensor, chunk_size: int) -> tuple[Tensor, ...]:
    """Row chunks of logits.view(-1, V) in row-major order, each chunk made of whole sequences where possible."""
    n, t, v = logits.shape
    if logits.is_contiguous():
        return logits.view(n * t, v).split(chunk_size, dim=0)
    # A strided view (e.g. a slice of a larger model output): reshape groups of whole sequences, so each chunk
    # copies only its own slice, never the whole tensor, and there are about N*T/chunk_size chunks, not N.
    per = max(1, chunk_size // max(t, 1))
    if per == 1:
        return tuple(c for seq in logits.unbind(0) for c in seq.split(chunk_size, dim=0))
    return tuple(logits[i:i + per].reshape(-1, v) for i in range(0, n, per))


def _map_rows(fn, logits: Tensor, token_ids: Tensor | None, chunk_size: int, n_out: int) -> list[Tensor]:
    """Apply fn to row chunks of logits.view(-1, V) (and token_ids.view(-1)); return n_out [N, T] tensors."""
    assert logits.dim() == 3, f"logits must be [N, T, V], got shape {tuple(logits.shape)}"
    assert chunk_size >= 1, f"chunk_size={chunk_size} must be >= 1"
    n, t, v = logits.shape
    row_chunks = _row_chunks(logits, chunk_size)
    if token_ids is not None:
        assert token_ids.shape == (n, t), f"token_ids {tuple(token_ids.shape)} must be [N, T]={(n, t)}"
        flat_ids = token_ids.reshape(n * t).long()
        id_chunks = flat_ids.split([c.shape[0] for c in row_chunks], dim=0)
    grad = torch.is_grad_enabled() and logits.requires_grad
    outs: list[list[Tensor]] = [[] for _ in range(n_out)]
    for i, z in enumerate(row_chunks):
        args = (z,) if token_ids is None else (z, id_chunks[i])
        use_ckpt = grad and z.numel() >= CHECKPOINT_MIN_ELEMENTS
        res = checkpoint(fn, *args, use_reentrant=False) if use_ckpt else fn(*args)
        res = (res,) if n_out == 1 else res
        for k in range(n_out):
            outs[k].append(res[k])
    out_dtype = _compute_dtype(logits.dtype)
    return [
        (o[0] if len(o) == 1 else torch.cat(o)).view(n, t) if o
        else torch.zeros(n, t, dtype=out_dtype, device=logits.device) for o in outs
    ]


def token_entropy(
    logits: Tensor,  # [N, T, V]
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:  # [N, T] nats, float32 (float64 for float64 logits)
    """Entropy H_t = −Σ_v π_v log π_v (nats) of each position's distribution, chunked over N·T rows."""
    return _map_rows(_chunk_entropy, logits, None, chunk_size, 1)[0]


def token_logprobs(
    logits: Tensor,  # [N, T, V]
    token_ids: Tensor,  # [N, T] long
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Tensor:  # [N, T], float32 (float64 for float64 logits)
    """log π(o_t) = z_{o_t} − logsumexp(z): log-softmax gathered at `token_ids`, chunked over N·T rows."""
    return _map_rows(_chunk_logp, logits, token_ids, chunk_size, 1)[0]


def logprobs_and_entropy(
    logits: Tensor,  # [N, T, V]
    token_ids: Tensor,  # [N, T] long
    *,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    entropy_grad: bool = True,
) -> tuple[Tensor, Tensor]:  # logp [N, T], entropy [N, T]
    """`token_logprobs` and `token_entropy` in one pass over the logits (one logsumexp per row).

    Both carry gradients when the logits do; ``entropy_grad=False`` computes the entropy outside autograd
    (it is only logged, e.g. DAPO without an entropy bonus), so backward does not go through it.
    """
    fn = _chunk_both if entropy_grad else _chunk_both_entropy_detached
    logp, ent = _map_rows(fn, logits, token_ids, chunk_size, 2)
    return logp, ent
