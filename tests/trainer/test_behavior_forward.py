"""The refresh's behavior forward runs only where something reads pi_b (``trainer.rollout.behavior_forward_reason``),
skipping it trains bit for bit the same, no-grad forwards leave the FSDP2 policy sharded, and the GPU memory
metrics (``trainer.fsdp.gpu_memory_metrics``) on a fake CUDA device."""

import dataclasses
import functools
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import REPO
from contracts.records import read_rollouts
from trainer import checkpoint as ckpt
from trainer.config import ConfigError, load_config
from trainer.fsdp import Dist, gpu_memory_metrics
from trainer.rollout import RolloutBuilder, behavior_forward_reason
from trainer.train import train

BASE = {"run_name": "r", "model": "tiny:1m", "task": "addition", "prompts_per_step": 4, "samples_per_prompt": 4,
        "max_response_tokens": 16, "micro_batch_size": 64, "progress": False, "save_every": 0, "lr": 1e-3,
        "algorithm": "seeds", "seed_refresh_interval": 2, "seed_ratio": 0.5, "ignore_eos": True,
        "dynamic_sampling": False, "total_steps": 3}


def run(out, monkeypatch, *, sampler_builder=None, **over):
    """A tiny seeds run (refreshes at steps 0 and 2); returns its folder, metrics and the builder's scoring calls."""
    calls = []
    real = RolloutBuilder._score

    def spy(self, prompts, responses):
        calls.append(len(prompts))
        return real(self, prompts, responses)

    monkeypatch.setattr(RolloutBuilder, "_score", spy)
    cfg = load_config(None, [f"{k}={v}" for k, v in {**BASE, "output_dir": str(out), **over}.items()])
    run_dir = train(cfg, Dist(), sampler_builder=sampler_builder)
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, metrics, calls


def test_what_reads_the_behavior_policy():
    def why(*over):
        return behavior_forward_reason(load_config(None, ["algorithm=seeds", *over]))
    assert "state+action" in why("seed_loss=state+action")
    assert "entropy" in why("seed_loss=state", "seed_rule=entropy")
    assert "record_behavior_logprobs" in why("seed_loss=state", "record_behavior_logprobs=true")
    # seed tokens out of the loss (state): neither their ratio nor M2PO's mask on them reaches the gradient
    assert why("seed_loss=state") is None
    assert why("seed_loss=state", "seed_stale_loss=m2po") is None
    assert why("seed_loss=state", "seed_rule=adaptive", "seed_source=pool") is None
    with pytest.raises(ConfigError, match="record_behavior_logprobs=true records the trainer's forward"):
        load_config(None, ["record_behavior_logprobs=true", "behavior_logprobs=sampler"])


@pytest.mark.slow
@pytest.mark.parametrize("stale_loss", ["clip", "m2po"])
def test_state_with_the_ratio_rule_skips_the_forward_and_trains_the_same(tmp_path, monkeypatch, capsys, stale_loss):
    """seed_loss=state with the ratio rule: no scoring forward at either refresh, and the same losses, gradient norms
    and final weights, bit for bit, as the run that forces the forward (record_behavior_logprobs=true). Only the
    records' pi_b on seed tokens changes: the sampler's log-probs instead of the trainer's (the same up to rounding)."""
    common = dict(seed_loss="state", seed_stale_loss=stale_loss)
    run_on, m_on, calls_on = run(tmp_path / "on", monkeypatch, record_behavior_logprobs=True, **common)
    assert "pi_b's log-probs from the trainer's no-grad forward (record_behavior_logprobs" in capsys.readouterr().err
    run_off, m_off, calls_off = run(tmp_path / "off", monkeypatch, **common)
    assert "no forward: nothing reads them" in capsys.readouterr().err
    assert calls_on == [4 * 2 * 4] * 2 and calls_off == []        # T·B·G rows at each refresh, or none
    assert [m["seeds/behavior_forward"] for m in m_on if "seeds/behavior_forward" in m] == [1.0, 1.0]
    assert [m["seeds/behavior_forward"] for m in m_off if "seeds/behavior_forward" in m] == [0.0, 0.0]
    assert [m["time/behavior_s"] > 0 for m in m_on] == [True, False, True]
    assert [m["time/behavior_s"] for m in m_off] == [0.0] * 3
    for key in ("ppo/loss", "ppo/grad_norm", "reward/mean", "tokens/trained", "seeds/entropy_cont"):
        assert [m.get(key) for m in m_off] == [m.get(key) for m in m_on], key
    assert not any(k.startswith("memory/") for m in m_off for k in m)   # no CUDA: no memory numbers
    w_on = load_file(ckpt.checkpoint_dir(run_on, 2) / "model.safetensors")
    w_off = load_file(ckpt.checkpoint_dir(run_off, 2) / "model.safetensors")
    assert w_on.keys() == w_off.keys() and all(torch.equal(w_on[k], w_off[k]) for k in w_on)
    a = [r for r in read_rollouts(run_on).to_pylist() if r["variant"] == "seed"]
    b = [r for r in read_rollouts(run_off).to_pylist() if r["variant"] == "seed"]
    assert len(a) == len(b) == 16
    for ra, rb in zip(a, b):
        assert ra["response_ids"] == rb["response_ids"] and ra["loss_mask"] == rb["loss_mask"]
        assert ra["logp_old"] == rb["logp_old"] and ra["entropy"] == rb["entropy"]
        m = ra["seed_len"]
        assert m == 8 and not any(ra["loss_mask"][:m])
        assert rb["logp_behavior"][:m] == pytest.approx(ra["logp_behavior"][:m], abs=1e-4)   # sampler vs trainer
        assert all(math.isnan(x) for x in rb["logp_behavior"][m:])


@pytest.mark.slow
@pytest.mark.parametrize("over", [{"seed_loss": "state", "seed_rule": "entropy", "seed_topk": 4},
                                  {"seed_loss": "state+action"}])
def test_a_config_that_reads_the_behavior_policy_still_runs_the_forward(tmp_path, monkeypatch, over):
    _, metrics, calls = run(tmp_path, monkeypatch, total_steps=2, **over)
    assert calls == [4 * 2 * 4]
    assert metrics[0]["seeds/behavior_forward"] == 1.0 and metrics[0]["time/behavior_s"] > 0


class NoLogprobs:
    """An engine that returns no log-probs (the Completion's optional field left None)."""

    def __init__(self, sampler):
        self.sampler = sampler

    def generate(self, prompts, **kw):
        return [dataclasses.replace(c, logprobs=None, entropies=None) for c in self.sampler.generate(prompts, **kw)]

    def __getattr__(self, name):
        return getattr(self.sampler, name)


@pytest.mark.slow
def test_a_sampler_without_logprobs_leaves_pi_b_unknown(tmp_path, monkeypatch):
    """Nothing reads pi_b and the sampler gave none: the seeded rows carry no behavior log-probs (the records'
    logp_behavior is null), and the run trains as one with them."""
    from inference import make_sampler
    build = lambda *a, **kw: NoLogprobs(make_sampler(*a, **kw))   # noqa: E731
    run_dir, metrics, calls = run(tmp_path, monkeypatch, sampler_builder=build, seed_loss="state", total_steps=2)
    assert calls == [] and metrics[0]["seeds/behavior_forward"] == 0.0
    seeded = [r for r in read_rollouts(run_dir).to_pylist() if r["variant"] == "seed"]
    assert len(seeded) == 16 and all(r["logp_behavior"] is None for r in seeded)
    assert all(math.isfinite(m["ppo/loss"]) for m in metrics)


@pytest.mark.slow
def test_no_grad_forwards_leave_the_policy_sharded(tmp_path):
    """FSDP2 keeps the root unit (embeddings, head, final norm) all-gathered after a forward with no backward; the
    refresh's scoring and the weight sync (whose vLLM probe is such a forward) reshard it, with either forward."""
    from tests.helpers.processes import free_port
    env = dict(os.environ, PYTHONPATH=f"{REPO}", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(free_port()), str(REPO / "tests" / "helpers" / "reshard_worker.py"), str(tmp_path / "out.json")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    got = json.loads((tmp_path / "out.json").read_text())
    for forward in ("model", "flat"):
        assert got[forward] == {"before": True, "after_plain_score": False, "after_refresh_score": True,
                                "after_bare_probe": False, "after_sync_probe": True}, forward


class FakeCuda:
    """``torch.cuda``'s memory calls, with set numbers (bytes) and a count of the peak resets."""

    def __init__(self, allocated=3e9, reserved=4.5e9, free=20e9):
        self.allocated, self.reserved, self.free, self.resets = allocated, reserved, free, 0

    def is_available(self):
        return True

    def max_memory_allocated(self):
        return self.allocated

    def max_memory_reserved(self):
        return self.reserved

    def mem_get_info(self):
        return self.free, 80e9

    def memory_reserved(self):   # now: 1.5 GB of it cached and unused
        return 2.5e9

    def memory_allocated(self):
        return 1e9

    def reset_peak_memory_stats(self):
        self.resets += 1


def test_gpu_memory_metrics_read_peaks_and_free_memory_and_reset_the_peaks():
    cuda = FakeCuda()
    assert gpu_memory_metrics("gen", Dist(), cuda=cuda) == {"memory/gen_peak_allocated_gb": 3.0,
                                                            "memory/gen_peak_reserved_gb": 4.5}
    assert gpu_memory_metrics("wake", Dist(), free=True, cuda=cuda) == {"memory/wake_free_gb": 21.5}   # + cached
    assert cuda.resets == 2
    cuda.is_available = lambda: False
    assert gpu_memory_metrics("gen", Dist(), cuda=cuda) == {} and cuda.resets == 2   # no CUDA: nothing logged


@pytest.mark.slow
def test_each_step_logs_memory_before_the_wake_and_per_phase(tmp_path, monkeypatch):
    """The trainer's calls, on a fake CUDA device: free memory before each sync wakes the engine, the peaks after
    generation and after the update, every step (and each call starts the peaks afresh)."""
    import trainer.train as train_module
    cuda = FakeCuda()
    monkeypatch.setattr(train_module, "gpu_memory_metrics", functools.partial(gpu_memory_metrics, cuda=cuda))
    _, metrics, _ = run(tmp_path, monkeypatch, total_steps=2, seed_loss="state")
    keys = {"memory/wake_free_gb": 21.5, "memory/gen_peak_allocated_gb": 3.0, "memory/gen_peak_reserved_gb": 4.5,
            "memory/update_peak_allocated_gb": 3.0, "memory/update_peak_reserved_gb": 4.5}
    for m in metrics:
        assert {k: v for k, v in m.items() if k.startswith("memory/")} == keys
    assert cuda.resets == 3 * len(metrics)
