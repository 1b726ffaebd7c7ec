"""The policy model: building it, and the trainer's own forward that yields per-token log-probs and entropies.

Old, behavior and current log-probs all come from ``response_logprobs`` so that they are computed the same way
(one code path, one dtype), in one of two layouts: flat (``inference/flat.py``: no padding, each distinct prompt
once; Llama/Qwen2/Qwen3) or padded (``pack``: left-padded prompts and right-padded responses, so the response
occupies the same columns in every row and only its R logit columns are computed, ``logits_to_keep``; any
model). Both give the same numbers; ``forward`` / ``train_forward`` chooses.
"""

from __future__ import annotations

from typing import Sequence

import torch

from inference.batching import micro_batches
from trainer.algos import logprobs_and_entropy
from trainer.fsdp import Dist, all_gather_objects


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def build_policy(model_name: str, *, dtype: torch.dtype, seed: int):
    """(model, tokenizer) from an HF directory / hub id, or a fresh tiny model for ``tiny:<size>``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    if model_name.startswith("tiny:"):
        from inference.tiny import build_model, build_tokenizer
        tokenizer = build_tokenizer()
        model = build_model(model_name.split(":", 1)[1], tokenizer, seed=seed).to(dtype)
    else:
        tokenizer = AutoTokenizer.from_pretrained(model_name)
        model = AutoModelForCausalLM.from_pretrained(model_name, dtype=dtype)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


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
    from inference.flat import unsupported_reason
    reason = unsupported_reason(model)
    if forward == "flat" and reason is not None:
        raise ValueError(f"train_forward=flat cannot run this model: {reason}; use train_forward=auto or model")
    return reason is None


def response_logprobs(model, prompts, responses, *, pad_id: int, device, temperature: float = 1.0,
                      entropy_grad: bool = True, forward: str = "model"):
    """Per-token log-probs and entropies of ``responses`` given ``prompts``: ([n, R], [n, R], mask [n, R]).

    Logits are divided by the sampling temperature, so the ratio compares the distributions that sampled.
    ``entropy_grad=False`` returns the entropy without a graph (it is only logged): backward skips it.
    ``forward``: ``model`` runs the model's own forward on the padded batch (``pack``); ``flat`` runs
    ``inference.flat`` (no padding, each distinct prompt once); ``auto`` picks flat where the architecture allows.
    Padding positions of the outputs hold 0 (flat) or the pad token's numbers (model); read them through the mask.
    """
    if use_flat(model, forward):
        return _flat_logprobs(model, prompts, responses, device=device, temperature=temperature,
                              entropy_grad=entropy_grad)
    ids, attn, pos, resp_ids, resp_mask = pack(prompts, responses, pad_id=pad_id, device=device)
    R = resp_ids.shape[1]
    P = ids.shape[1] - R
    # position P-1+t predicts response token t: only those R hidden states go through the LM head, so the
    # logits come out contiguous [n, R, V] (no slice of a larger tensor, no copy before the chunked log-softmax)
    keep = torch.arange(P - 1, P + R - 1, device=ids.device)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=keep, use_cache=False)
    logits = out.logits.float()  # [n, R, V]
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp, ent = logprobs_and_entropy(logits, resp_ids, entropy_grad=entropy_grad)
    return logp, ent, resp_mask


def _flat_logprobs(model, prompts, responses, *, device, temperature: float, entropy_grad: bool):
    from inference.flat import flat_forward
    n, R = len(prompts), max(1, max(len(r) for r in responses))
    logp = torch.zeros(n, R, device=device)
    ent = torch.zeros(n, R, device=device)
    mask = torch.zeros(n, R, dtype=torch.bool, device=device)
    if sum(len(r) for r in responses) == 0:
        return logp.requires_grad_(torch.is_grad_enabled()), ent, mask
    logits, lay = flat_forward(model, prompts, responses, device=device)
    logits = logits.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    lp, en = logprobs_and_entropy(logits[None], lay.targets[None], entropy_grad=entropy_grad)
    logp = logp.index_put((lay.out_rows, lay.out_cols), lp[0])
    ent = ent.index_put((lay.out_rows, lay.out_cols), en[0])
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
    results: dict[int, tuple[list[float], list[float]]] = {}
    for b in range(n_batches):
        idx = batches[b] if b < len(batches) else [mine[0] if mine else 0]  # dummy forward keeps ranks in step
        logp, ent, mask = response_logprobs(model, [prompts[i] for i in idx], [responses[i] for i in idx],
                                            pad_id=pad_id, device=d.device, temperature=temperature,
                                            forward="flat" if flat else "model")
        if b >= len(batches):
            continue
        for row, i in enumerate(idx):
            L = len(responses[i])
            results[i] = (logp[row, :L].cpu(), ent[row, :L].cpu())
    gathered = all_gather_objects(results, d)
    merged = {}
    for part in gathered:
        merged.update(part)
    return [merged[i][0] for i in range(n)], [merged[i][1] for i in range(n)]
