"""trainer.algos is a pure layer: importing it pulls in no orchestration, IO or tracking modules."""

import json
import pathlib
import subprocess
import sys

import pytest

import torch

import trainer.algos

FORBIDDEN_MODULES = ["vllm", "transformers", "pyarrow", "pandas", "yaml", "wandb", "trainer.fsdp", "trainer.train"]
ALGOS_DIR = pathlib.Path(trainer.algos.__file__).parent


@pytest.mark.slow
def test_import_in_fresh_interpreter_loads_no_forbidden_module():
    code = (
        "import json, sys\n"
        "import trainer.algos\n"
        f"print(json.dumps([m for m in {FORBIDDEN_MODULES!r} if m in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ALGOS_DIR.parents[1], timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_sources_use_no_distributed_or_file_io():
    files = sorted(ALGOS_DIR.glob("*.py"))
    assert {f.name for f in files} >= {"advantages.py", "losses.py", "entropy.py", "seeds.py", "m2po.py", "luffy.py",
                                       "cov.py", "high_entropy.py"}
    for f in files:
        text = f.read_text()
        for needle in ("torch.distributed", "open("):
            assert needle not in text, f"{f.name} contains {needle!r}"


def test_losses_table_covers_every_configured_algorithm():
    from trainer.config import ALGORITHMS
    assert set(trainer.algos.LOSSES) == set(ALGORITHMS) == {"dapo", "seeds", "luffy", "m2po", "clip_cov", "kl_cov"}
    assert all(callable(fn) for fn in trainer.algos.LOSSES.values())


def test_losses_share_calling_convention_and_stats():
    from trainer.config import load_config, loss_kwargs
    g = torch.Generator().manual_seed(0)
    logp = (torch.randn(3, 4, generator=g) * 0.3 - 1).requires_grad_(True)
    batch = trainer.algos.TokenBatch(
        logp=logp, old_logp=torch.randn(3, 4, generator=g) * 0.3 - 1, adv=torch.tensor([1.0, -1.0, 0.5]),
        response_mask=torch.ones(3, 4, dtype=torch.bool), seed_lens=torch.tensor([0, 2, 1]),
        behavior_logp=torch.randn(3, 4, generator=g) * 0.3 - 1, off_policy=torch.tensor([False, True, False]))
    for name, fn in trainer.algos.LOSSES.items():
        for stale in ("clip", "m2po"):
            # the hyperparameters come from the config's loss_kwargs, exactly as the trainer passes them
            loss, stats = fn(batch, **loss_kwargs(load_config(None, [f"algorithm={name}", f"seed_stale_loss={stale}"])))
            assert loss.shape == (3, 4) and loss.requires_grad, name
            for key in ("ratio", "clipped_low", "clipped_high"):
                assert stats[key].shape == (3, 4) and not stats[key].requires_grad, (name, key)
