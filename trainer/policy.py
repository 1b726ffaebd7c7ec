"""The policy model: building it, and the trainer's own forward that yields per-token log-probs and entropies.

Old, behavior and current log-probs all come from ``response_logprobs`` so that they are computed the same way
(one code path, one dtype), in one of two layouts: flat (``trainer/flat.py``: no padding, each distinct prompt
once; Llama/Qwen2/Qwen3) or padded (``pack``: left-padded prompts and right-padded responses, so the response
occupies the same columns in every row and only its R logit columns are computed, ``logits_to_keep``; any
model). Both give the same numbers; ``forward`` / ``train_forward`` chooses.
"""

from __future__ import annotations

from typing import Sequence

import torch

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
        from trainer.tiny import build_model, build_tokenizer
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
    """Whether ``response_logprobs`` takes ``trainer.flat`` for this model: ``auto`` when the architecture allows,
    ``flat`` always (an unsupported model is an error), ``model`` never."""
    if forward == "model":
        return False
    from trainer.flat import unsupported_reason
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
    ``trainer.flat`` (no padding, each distinct prompt once); ``auto`` picks flat where the architecture allows.
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
    from trainer.flat import flat_forward
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


def micro_batches(shapes: Sequence[tuple[int, int]], *, rows: int, tokens: int = 0, rank: int = 0,
                  world_size: int = 1, prompt_keys: Sequence | None = None) -> tuple[list[list[int]], int]:
    """This rank's micro-batches (indices into ``shapes``) and how many forwards every rank must run.

    ``shapes``: (prompt length, response length) per row. Rank r takes rows r, r + W, ...; they are sorted by
    total length (less padding) and cut into runs of at most ``rows`` rows and, when ``tokens`` > 0, at most
    ``tokens`` padded tokens, i.e. rows x (longest prompt + longest response) as ``pack`` lays them out (verl's
    dynamic batch size: long responses get small micro-batches, short ones large). A row longer than the budget
    on its own gets a micro-batch of its own. Every rank computes every rank's split (no communication), so
    ranks with fewer micro-batches can run dummy forwards to stay in step with FSDP's collectives.

    ``prompt_keys`` (one hashable per row, equal for rows of the same prompt) is for the flat forward: rows of a
    prompt stay together, in order of first appearance, and ``tokens`` counts what the flat forward computes,
    each distinct prompt once plus every response token.
    """
    def split(idx) -> list[list[int]]:
        out: list[list[int]] = []
        cur: list[int] = []
        P = R = 0
        for i in sorted(idx, key=lambda i: shapes[i][0] + shapes[i][1]):
            p, r = shapes[i][0], max(1, shapes[i][1])
            if cur and (len(cur) == rows or (tokens and (len(cur) + 1) * (max(P, p) + max(R, r)) > tokens)):
                out.append(cur)
                cur, P, R = [], 0, 0
            cur.append(i)
            P, R = max(P, p), max(R, r)
        return out + [cur] if cur else out

    def split_flat(idx) -> list[list[int]]:
        groups: dict = {}
        for i in idx:
            groups.setdefault(prompt_keys[i], []).append(i)
        out: list[list[int]] = []
        cur: list[int] = []
        cost = 0

        def fits(n_rows, c):
            return len(cur) + n_rows <= rows and (not tokens or cost + c <= tokens)

        for members in groups.values():   # a whole group where it fits (its prompt is computed once) ...
            whole = shapes[members[0]][0] + sum(shapes[i][1] for i in members)
            if cur and not fits(len(members), whole) and len(members) <= rows and (not tokens or whole <= tokens):
                out.append(cur)
                cur, cost = [], 0
            if fits(len(members), whole):
                cur.extend(members)
                cost += whole
                continue
            shared = False                # ... else row by row, the prompt counted once per micro-batch
            for i in members:
                add = shapes[i][1] + (0 if shared else shapes[i][0])
                if cur and not fits(1, add):
                    out.append(cur)
                    cur, cost, shared = [], 0, False
                    add = shapes[i][1] + shapes[i][0]
                cur.append(i)
                cost += add
                shared = True
        return out + [cur] if cur else out

    n = len(shapes)
    cut = split if prompt_keys is None else split_flat
    count = max(len(cut(range(r, n, world_size))) for r in range(world_size))
    return cut(range(rank, n, world_size)), count


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
