"""torchrun worker for tests/trainer/test_hsdp.py: 2 gloo ranks as an HSDP mesh of 2 replicas x 1 shard
(``THINKING_SEEDS_HSDP_REPLICAS=2``), the layout two nodes of one GPU each would get.

    torchrun --nproc_per_node 2 tests/helpers/hsdp_worker.py MODEL_DIR OUT_DIR

The model is built on the meta device, sharded on the mesh and read from MODEL_DIR's safetensors (``load_shards``:
each rank the rows of its shard); then the gradient of the fixed batch (``backward_minibatch``), its global norm,
one AdamW step and a sharded checkpoint (``save_sharded``) into OUT_DIR/dcp. Rank 0 saves the full tensors of it
all to OUT_DIR/hsdp.pt.
"""

import sys
from pathlib import Path

import torch

from tests.helpers.rollouts import fixed_rollouts
from inference.tiny import build_model, build_tokenizer
from trainer.config import load_config
from trainer.fsdp import (clip_grad_norm, init_distributed, load_shards, params_on_meta, save_sharded, shard_model,
                          shutdown)
from trainer.update import backward_minibatch


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def main(model_dir: str, out: str) -> None:
    d = init_distributed()
    tok = build_tokenizer()
    with params_on_meta():
        model = build_model("1m", tok, seed=3)
    model = load_shards(shard_model(model, d, param_dtype=torch.float32), model_dir, d)
    loaded = {n: full(p) for n, p in model.named_parameters()}
    placements = {n: [f"{type(x).__name__}{getattr(x, 'dim', '')}" for x in p.placements]
                  for n, p in model.named_parameters()}
    cfg = load_config(None, ["micro_batch_size=2"])
    backward_minibatch(model, cfg, fixed_rollouts(tok), d, pad_id=tok.pad_token_id)
    grads = {n: full(p.grad) for n, p in model.named_parameters() if p.grad is not None}
    norm = float(clip_grad_norm(model, 0.0))   # max_norm 0: the norm, nothing clipped
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()
    save_sharded(model, optimizer, Path(out) / "dcp", d)
    names = {id(p): n for n, p in model.named_parameters()}
    state = {names[id(p)]: {k: full(v) for k, v in s.items() if k != "step"} for p, s in optimizer.state.items()}
    params = {n: full(p) for n, p in model.named_parameters()}   # collective: every rank gathers
    if d.is_main:
        torch.save({"mesh": (list(d.mesh.shape), list(d.mesh.mesh_dim_names)), "placements": placements,
                    "loaded": loaded, "grads": grads, "norm": norm, "params": params, "optimizer": state},
                   Path(out) / "hsdp.pt")
    shutdown(d)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
