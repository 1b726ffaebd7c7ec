"""torchrun worker for test_no_grad_forwards_leave_the_policy_sharded: whether the root unit of an FSDP2-sharded policy
(embeddings, LM head, final norm) is still all-gathered after each no-grad forward the trainer runs outside the
update: the plain ``trainer.policy.score`` (FSDP2 keeps the root gathered after a forward, for a backward that never
comes), the rollout builder's ``_score`` (a refresh's scoring) and ``sync_rollout_weights`` with an engine whose
sync runs a no-grad forward of the module, as vLLM's probe does. Rank 0 writes a JSON of the answers.
"""

import json
import sys

import torch
from torch.distributed.tensor import DTensor

from inference.tiny import build_model, build_tokenizer
from tests.helpers.rollouts import fixed_rollouts
from trainer.config import load_config
from trainer.fsdp import init_distributed, shard_model, shutdown
from trainer.policy import score
from trainer.rollout import RolloutBuilder, sync_rollout_weights


class ProbingEngine:
    """An engine whose ``update_weights`` runs one no-grad forward of the module (``VLLMSampler.probe_logp_gap``)."""

    def update_weights(self, model):
        with torch.no_grad():
            model(torch.tensor([[5, 6, 7, 8]]))


def root_sharded(model) -> bool:
    """Every root-unit parameter is its DTensor shard again (FSDP2 swaps in plain tensors while it is gathered)."""
    root = [model.get_input_embeddings().weight, model.get_output_embeddings().weight, model.model.norm.weight]
    return all(isinstance(p, DTensor) for p in root)


def main(out: str) -> None:
    d = init_distributed()
    tok = build_tokenizer()
    rows = fixed_rollouts(tok)
    prompts, responses = [r.prompt_ids for r in rows], [r.response_ids for r in rows]
    result = {}
    for forward in ("model", "flat"):
        model = shard_model(build_model("1m", tok, seed=3), d, param_dtype=torch.float32)
        cfg = load_config(None, ["micro_batch_size=4", f"train_forward={forward}"])
        builder = RolloutBuilder(cfg=cfg, examples=[], prompt_ids=[], loader=None, sampler=None, tokenizer=tok,
                                 model=model, d=d)
        got = {"before": root_sharded(model)}
        score(model, prompts, responses, pad_id=tok.pad_token_id, micro_batch_size=4, d=d, forward=forward)
        got["after_plain_score"] = root_sharded(model)
        builder._score(prompts, responses)
        got["after_refresh_score"] = root_sharded(model)
        ProbingEngine().update_weights(model)
        got["after_bare_probe"] = root_sharded(model)
        sync_rollout_weights(ProbingEngine(), model, model)
        got["after_sync_probe"] = root_sharded(model)
        result[forward] = got
    if d.is_main:
        with open(out, "w") as f:
            json.dump(result, f)
    shutdown(d)


if __name__ == "__main__":
    main(sys.argv[1])
