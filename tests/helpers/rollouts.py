"""A fixed batch of rollout rows and the gradient of one mini-batch over it, shared by the update's invariance
tests and the torchrun workers that compare one rank with two."""

import math

import torch

from trainer.config import load_config
from trainer.fsdp import Dist
from trainer.update import backward_minibatch


# ---------------------------------------------------------------------------------------------------------
# gradient invariance: micro-batch size here, world size 1 vs 2 with torchrun (gloo, FSDP2)
# ---------------------------------------------------------------------------------------------------------
def fixed_rollouts(tokenizer, n_groups=3, G=4, seed=0, algorithm="dapo"):
    """A deterministic batch of rows with varied prompt/response lengths and non-trivial advantages; for
    ``seeds``/``luffy``/``m2po`` the same rows also carry seeds (groups 1+), an off-policy trace (the last sample of
    each group) or stale behavior log-probs."""
    from trainer.rollout import Rollout
    g = torch.Generator().manual_seed(seed)
    extra = torch.Generator().manual_seed(seed + 1)   # a second stream: the dapo rows stay as they always were
    rows = []
    for grp in range(n_groups):
        prompt = torch.randint(5, 60, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
        for s in range(G):
            L = int(torch.randint(2, 14, (1,), generator=g))
            resp = torch.randint(5, 60, (L,), generator=g).tolist()
            kw = {}
            if algorithm == "seeds" and grp > 0:
                m = int(torch.randint(1, L, (1,), generator=extra))
                beh = (torch.randn(m, generator=extra) * 0.5 - 4.0).tolist()
                kw = dict(variant="seed", seed_len=m, seed_step=0, behavior_logp=beh + [math.nan] * (L - m))
            elif algorithm == "luffy" and s == G - 1:
                kw = dict(variant="luffy_off")
            elif algorithm == "m2po":
                kw = dict(variant="stale", seed_step=0,
                          behavior_logp=(torch.randn(L, generator=extra) * 0.3 - 4.0).tolist())
            rows.append(Rollout(example_idx=grp, prompt_id=str(grp), group=grp, sample_idx=s, prompt_ids=prompt,
                                response_ids=resp, finish_reason="length",
                                advantage=float(torch.randn(1, generator=g)), **kw))
    return rows


def grads_for(micro_batch_size: int, **cfg_over):
    """The gradient (and summed loss) of one mini-batch through ``backward_minibatch``, as ``update`` drives it:
    with M2PO's keep-mask computed over the whole mini-batch from the log-probs before the update."""
    from inference.tiny import build_model, build_tokenizer
    from trainer.policy import score
    from trainer.update import m2po_keep_masks, m2po_log_ratio_caps, uses_m2po_mask
    tok = build_tokenizer()
    model = build_model("1m", tok, seed=3)
    cfg = load_config(None, [f"micro_batch_size={micro_batch_size}", *[f"{k}={v}" for k, v in cfg_over.items()]])
    rows = fixed_rollouts(tok, algorithm=cfg.algorithm)
    old = keep = cap = None
    if uses_m2po_mask(cfg):
        logp, _ = score(model, [r.prompt_ids for r in rows], [r.response_ids for r in rows], pad_id=tok.pad_token_id,
                        micro_batch_size=64, d=Dist())
        old = {id(r): lp.tolist() for r, lp in zip(rows, logp)}
        keep = m2po_keep_masks(cfg, rows, old)
        cap = m2po_log_ratio_caps(cfg, rows, old)
        if keep is not None:
            assert 0 < sum(x for v in keep.values() for x in v) < sum(len(v) for v in keep.values())  # M2PO drops some
        else:
            assert 0 < cap < 20   # the released clip binds somewhere
    total, records = backward_minibatch(model, cfg, rows, Dist(), pad_id=tok.pad_token_id, old=old, keep=keep,
                                        m2po_cap=cap)
    assert len(records) == len(rows)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, total
