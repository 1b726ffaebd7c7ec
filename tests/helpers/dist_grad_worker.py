"""torchrun worker for test_gradient_invariant_to_world_size: FSDP2-sharded gradient of a fixed batch."""

import sys

import torch

from tests.helpers.rollouts import fixed_rollouts
from trainer.config import load_config
from trainer.fsdp import init_distributed, shard_model, shutdown
from inference.tiny import build_model, build_tokenizer
from trainer.update import backward_minibatch


def main(out: str) -> None:
    d = init_distributed()
    tok = build_tokenizer()
    model = shard_model(build_model("1m", tok, seed=3), d, param_dtype=torch.float32)
    cfg = load_config(None, ["micro_batch_size=2"])
    backward_minibatch(model, cfg, fixed_rollouts(tok), d, pad_id=tok.pad_token_id)
    grads = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            grads[name] = g.detach().clone()
    if d.is_main:
        torch.save(grads, out)
    shutdown(d)


if __name__ == "__main__":
    main(sys.argv[1])
