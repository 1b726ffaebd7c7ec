"""One trainer run on two torchrun ranks (gloo) against the same run on one, and the comparison of the two runs'
metrics and records (tests/e2e/test_multirank_train.py, tests/trainer/test_hsdp.py)."""

import json
import math
import os
import sys
from pathlib import Path

from contracts.records import read_rollouts
from tests.conftest import REPO, TASK_KWARGS
from tests.helpers.processes import free_port
from trainer.config import load_config
from trainer.fsdp import Dist
from trainer.train import train


WORKER = REPO / "tests" / "helpers" / "multirank_worker.py"


TOL = 1e-5


G = 4


def _overrides(out: Path, policy: Path, **extra) -> dict:
    base = {"output_dir": str(out), "run_name": "run", "model": str(policy), "task": "addition",
            "task_kwargs": json.dumps(TASK_KWARGS), "prompts_per_step": 4, "samples_per_prompt": G,
            "max_response_tokens": 24, "micro_batch_size": 5, "lr": 1e-4, "total_steps": 4, "progress": False,
            "deterministic": True, "save_every": 1, "keep_checkpoints": 0, "keep_resume_states": 1}
    base.update(extra)
    return base


def _torchrun(overrides: dict) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
            str(free_port()), str(WORKER), json.dumps(overrides)]


_ENV = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")


def _one_rank(overrides: dict) -> Path:
    cfg = load_config(None, [f"{k}={v}" for k, v in overrides.items()])
    return train(cfg, Dist())


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _close(a, b, tol=TOL) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return abs(a - b) <= tol


def assert_same_run(a: Path, b: Path, tol: float = TOL) -> dict:
    """Metrics and records of two runs agree: counts exactly, floats within ``tol``; returns the worst gaps."""
    ma, mb = _metrics(a), _metrics(b)
    assert [m["step"] for m in ma] == [m["step"] for m in mb]
    worst = {"loss": 0.0, "per_token": 0.0}
    for x, y in zip(ma, mb):
        keys = {k for k in x if not k.startswith("time/")}
        assert keys == {k for k in y if not k.startswith("time/")}, x["step"]
        for k in keys:
            if k.startswith(("tokens/", "sampling/")) or isinstance(x[k], int):
                assert x[k] == y[k], (x["step"], k, x[k], y[k])
            else:
                assert _close(x[k], y[k], tol), (x["step"], k, x[k], y[k])
        if "ppo/loss" in x:
            worst["loss"] = max(worst["loss"], abs(x["ppo/loss"] - y["ppo/loss"]))
    ra, rb = read_rollouts(a).to_pylist(), read_rollouts(b).to_pylist()
    assert len(ra) == len(rb)
    for x, y in zip(ra, rb):
        for k in ("step", "prompt_id", "sample_idx", "variant", "response_ids", "reward", "correct", "verdict",
                  "finish_reason", "loss_mask", "clipped_low", "clipped_high", "seed_len"):
            assert x[k] == y[k], (x["step"], x["prompt_id"], x["sample_idx"], k)
        assert _close(x["advantage"], y["advantage"], tol)
        for k in ("entropy", "logp_old", "ratio"):
            gaps = [abs(u - v) for u, v in zip(x[k], y[k]) if not (math.isnan(u) and math.isnan(v))]
            assert len(x[k]) == len(y[k]) and all(g <= tol for g in gaps), (x["step"], k, max(gaps, default=0))
            worst["per_token"] = max([worst["per_token"], *gaps])
    return worst
