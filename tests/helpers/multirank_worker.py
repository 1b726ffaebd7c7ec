"""torchrun worker for tests/e2e/test_multirank_train.py: the whole ``trainer.train.train`` on N ranks (gloo, FSDP2).

    torchrun --nproc_per_node 2 tests/helpers/multirank_worker.py OVERRIDES_JSON

OVERRIDES_JSON holds config fields; ``"_rank_output_dir": true`` gives each rank its own output_dir (node-local
``runs/`` on several nodes), which the trainer must refuse. The stock engine (``make_sampler``) samples: every row
carries its own seed, so 1 and N ranks sample the same rows and the runs can be compared number for number.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def main(overrides: dict) -> None:
    from trainer.config import load_config
    from trainer.fsdp import init_distributed, shutdown
    from trainer.train import main as train_main, train
    torch.set_num_threads(1)
    overrides = dict(overrides)
    if overrides.pop("_rank_output_dir", False):
        overrides["output_dir"] = f"{overrides['output_dir']}/node{os.environ['RANK']}"
    if overrides.pop("_cli", False):   # through trainer.train.main's error handling (the process exit code)
        sys.exit(train_main([f"{k}={v}" for k, v in overrides.items()]))
    d = init_distributed()
    cfg = load_config(None, [f"{k}={v}" for k, v in overrides.items()])
    try:
        train(cfg, d)
    finally:
        shutdown(d)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
