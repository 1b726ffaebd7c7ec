"""torchrun worker for tests/test_multirank_train.py: the whole ``trainer.train.train`` on N ranks (gloo, FSDP2).

    torchrun --nproc_per_node 2 tests/multirank_worker.py OVERRIDES_JSON

OVERRIDES_JSON holds config fields; ``"_rank_output_dir": true`` gives each rank its own output_dir (node-local
``runs/`` on several nodes), which the trainer must refuse. The sampler draws each prompt from its own seed
(``PerPromptSampler``), so 1 and N ranks sample the same rows and the runs can be compared number for number.
"""

from __future__ import annotations

import json
import os
import sys

import torch


class PerPromptSampler:
    """The HF engine, one prompt per call with the seed ``RolloutBuilder.generate`` derives from the prompt's index
    in the step's whole list (``prompt_seeds``): a row's sample does not depend on which rank draws it or on what
    else is in the batch. Slow (no batching), which the tiny test model does not mind."""

    prompt_seeds = True

    def __init__(self, inner):
        self.inner = inner
        self.max_batch_size = inner.max_batch_size

    def update_weights(self, model) -> None:
        self.inner.update_weights(model)

    def generate(self, prompts, *, max_new_tokens, temperature=1.0, top_p=1.0, seed=None, logprobs=False,
                 prefix_lens=None, prompt_seeds=None):
        budgets = max_new_tokens if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
        assert prompt_seeds is not None and len(prompt_seeds) == len(prompts)
        out = []
        for p, b, s in zip(prompts, budgets, prompt_seeds):
            out += self.inner.generate([p], max_new_tokens=[b], temperature=temperature, top_p=top_p, seed=s,
                                       logprobs=logprobs)
        return out


def per_prompt_sampler(model, tokenizer, *, engine="hf", **kw):
    from inference import make_sampler
    assert engine == "hf", engine
    return PerPromptSampler(make_sampler(model, tokenizer, engine="hf", **kw))


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
        train(cfg, d, sampler_builder=per_prompt_sampler)
    finally:
        shutdown(d)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
