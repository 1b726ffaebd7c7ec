"""Shared fixtures: the shared data folder and one supervised tiny policy reused by the end-to-end tests."""

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

torch.set_num_threads(2)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

# The embedded task and warm-up every trainer end-to-end test uses: 1-2 digit addition, short responses.
TASK_KWARGS = {"min_digits": 1, "max_digits": 2}


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    assert SHARED_DATA.is_dir(), f"tests read benchmark data from {SHARED_DATA} (the repo sits next to shared/)"
    return SHARED_DATA


@pytest.fixture(scope="session")
def sft_policy_dir(tmp_path_factory) -> Path:
    """A 1m tiny model after a short supervised warm-up on addition: usable but imperfect (built once)."""
    from trainer.sft import sft
    from scoring.tasks import get_task
    from inference.tiny import build_model, build_tokenizer, save_pretrained_atomic

    out = tmp_path_factory.mktemp("policy") / "sft-1m-addition"
    tokenizer = build_tokenizer()
    model = build_model("1m", tokenizer, seed=0)
    examples = get_task("addition").make_examples(2000, seed=123, **TASK_KWARGS)
    # Stop on the loss, not a step count: addition is learnt abruptly, and the loss stop lands the policy
    # reliably in the imperfect middle (about 70 % sampled accuracy), leaving RL room to improve.
    sft(model, tokenizer, examples, steps=600, batch_size=64, lr=3e-3, seed=0, stop_loss=0.04, log=None)
    save_pretrained_atomic(model, tokenizer, out)
    return out
