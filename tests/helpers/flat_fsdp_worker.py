"""torchrun worker for test_flat_forward_under_fsdp_on_two_ranks: the padding-free forward through FSDP2's hooks.

For each compute dtype (fp32, and bf16 over fp32 masters) and each forward (flat, model): the log-probs and
entropies of every row (no grad, all ranks) and the gradient of one mini-batch through ``backward_minibatch`` (rows
split across the ranks by whole groups), gathered to full tensors; rank 0 saves them.
"""

import sys

import torch

from tests.helpers.rollouts import fixed_rollouts
from inference.flat import unsupported_reason
from inference.tiny import build_model, build_tokenizer
from trainer.config import load_config
from trainer.fsdp import init_distributed, shard_model, shutdown
from trainer.policy import response_logprobs
from trainer.update import backward_minibatch


def main(out: str) -> None:
    d = init_distributed()
    tok = build_tokenizer()
    rows = fixed_rollouts(tok)
    result = {}
    for dtype in (torch.float32, torch.bfloat16):
        for forward in ("flat", "model"):
            model = shard_model(build_model("1m", tok, seed=3), d, param_dtype=dtype)
            assert unsupported_reason(model) is None, unsupported_reason(model)
            with torch.no_grad():
                logp, ent, mask = response_logprobs(model, [r.prompt_ids for r in rows],
                                                    [r.response_ids for r in rows], pad_id=tok.pad_token_id,
                                                    device=d.device, forward=forward)
            cfg = load_config(None, ["micro_batch_size=2", f"train_forward={forward}"])
            backward_minibatch(model, cfg, rows, d, pad_id=tok.pad_token_id)
            grads = {n: p.grad.full_tensor().detach().clone() for n, p in model.named_parameters()
                     if p.grad is not None}
            result[(str(dtype), forward)] = {"logp": logp[mask], "ent": ent[mask], "grads": grads}
    if d.is_main:
        torch.save(result, out)
    # the ranks tear gloo down together: one clean-clone CI run (181c6b7) saw rank 1 abort in its teardown
    # ("terminate called without an active exception") while rank 0 was still saving; it passed 4 of 4 reruns
    torch.distributed.barrier()
    shutdown(d)


if __name__ == "__main__":
    main(sys.argv[1])
