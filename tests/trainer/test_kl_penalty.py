"""The KL penalty to a frozen reference policy (config ``kl_coef``, ``kl_estimator``) in the trainer's update.

* The reference is the policy the run starts from, in the compute dtype, without gradients, built only when
  ``kl_coef > 0``; on two ranks it is sharded as the policy is and gives the one-rank numbers.
* ``backward_minibatch`` adds ``kl_coef`` times the estimate over the policy loss's tokens and denominator: the loss
  and gradient are the hand-computed ones, and do not depend on the micro-batch size.
* A tiny run logs ``actor/kl``: 0 at step 0 (policy == reference), positive once the policy has moved.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from inference.tiny import build_model, build_tokenizer
from trainer.algos import kl_penalty
from trainer.config import load_config
from trainer.fsdp import Dist
from trainer.policy import load_for_training, load_reference, response_logprobs, score
from trainer.rollout import Rollout
from trainer.train import train
from trainer.update import backward_minibatch

REPO = Path(__file__).resolve().parents[2]


def _rows(n_groups: int = 3, G: int = 4, seed: int = 0) -> list[Rollout]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for grp in range(n_groups):
        prompt = torch.randint(5, 60, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
        for s in range(G):
            resp = torch.randint(5, 60, (int(torch.randint(2, 14, (1,), generator=g)),), generator=g).tolist()
            rows.append(Rollout(example_idx=grp, prompt_id=str(grp), group=grp, sample_idx=s, prompt_ids=prompt,
                                response_ids=resp, finish_reason="length",
                                advantage=float(torch.randn(1, generator=g))))
    return rows


def _ref_logprobs(rows, tok) -> dict:
    ref_model = build_model("1m", tok, seed=4)   # another initialisation: the KL is far from 0
    logp, _ = score(ref_model, [r.prompt_ids for r in rows], [r.response_ids for r in rows], pad_id=tok.pad_token_id,
                    micro_batch_size=64, d=Dist())
    return {id(r): lp.tolist() for r, lp in zip(rows, logp)}


def _backward(rows, tok, ref, **over):
    cfg = load_config(None, [f"{k}={v}" for k, v in over.items()])
    model = build_model("1m", tok, seed=3)
    total, records = backward_minibatch(model, cfg, rows, Dist(), pad_id=tok.pad_token_id, ref=ref)
    return total, records, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_the_kl_term_is_kl_coef_times_the_estimate_over_the_steps_denominator(estimator):
    tok = build_tokenizer()
    rows = _rows()
    ref = _ref_logprobs(rows, tok)
    base, _, g0 = _backward(rows, tok, None, micro_batch_size=64)
    total, records, g1 = _backward(rows, tok, ref, micro_batch_size=64, kl_coef=0.5, kl_estimator=estimator)
    # by hand: the estimate on every response token, summed, over the token count (token-mean's denominator)
    model = build_model("1m", tok, seed=3)
    logp, _, mask = response_logprobs(model, [r.prompt_ids for r in rows], [r.response_ids for r in rows],
                                      pad_id=tok.pad_token_id, device="cpu", forward="model")
    R = logp.shape[1]
    ref_t = torch.tensor([ref[id(r)] + [0.0] * (R - len(ref[id(r)])) for r in rows])
    kl = torch.where(mask, kl_penalty(logp, ref_t, estimator=estimator), torch.zeros(()))
    n_tokens = sum(len(r.response_ids) for r in rows)
    term = 0.5 * kl.sum() / n_tokens
    assert float(kl.detach().abs().sum()) / n_tokens > 0.02   # two initialisations: the term is not a rounding error
    assert total == pytest.approx(base + float(term.detach()), abs=1e-5)
    term.backward()
    for name, p in model.named_parameters():
        assert torch.allclose(g1[name] - g0[name], p.grad, atol=1e-6), name
    # the per-token estimates the update records (actor/kl's numerator), row by row
    for i, r in enumerate(rows):
        assert records[id(r)].kl == pytest.approx(kl[i, :len(r.response_ids)].tolist(), abs=1e-5)


def test_the_kl_gradient_does_not_depend_on_the_micro_batch_size():
    tok = build_tokenizer()
    rows = _rows()
    ref = _ref_logprobs(rows, tok)
    whole, _, g12 = _backward(rows, tok, ref, micro_batch_size=12, kl_coef=0.3)
    for mb in (1, 5):
        loss, _, g = _backward(rows, tok, ref, micro_batch_size=mb, kl_coef=0.3)
        assert loss == pytest.approx(whole, abs=1e-6)
        assert max(float((g[k] - g12[k]).abs().max()) for k in g12) <= 1e-6


def test_the_reference_is_the_starting_policy_in_the_compute_dtype_without_gradients():
    """bf16 compute over fp32 masters: the reference holds the bf16 cast of the policy's weights (2 B/param) and the
    policy's own fp32 buffers, no parameter wants a gradient (so no optimizer state could be built on it), and it
    computes the policy's log-probs exactly (with RoPE's inv_freq rounded to bf16 they differed by 2.8e-3)."""
    policy, tok = load_for_training("tiny:1m", Dist(), master=torch.float32, compute=torch.bfloat16, seed=7)
    ref = load_reference("tiny:1m", Dist(), compute=torch.bfloat16, seed=7, like=policy)
    params = dict(ref.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in params.values()) and not ref.training
    for name, p in policy.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(params[name], p.detach().to(torch.bfloat16)), name
    bufs = dict(ref.named_buffers())
    assert {b.dtype for b in bufs.values()} == {torch.float32}
    for name, b in policy.named_buffers():
        assert torch.equal(bufs[name], b), name
    rows = _rows()
    prompts, responses = [r.prompt_ids for r in rows], [r.response_ids for r in rows]
    for forward in ("flat", "model"):
        a, _, mask = response_logprobs(policy, prompts, responses, pad_id=tok.pad_token_id, device="cpu",
                                       forward=forward, entropy_grad=False)
        with torch.no_grad():
            b, _, _ = response_logprobs(ref, prompts, responses, pad_id=tok.pad_token_id, device="cpu", forward=forward)
        assert torch.equal(a.detach()[mask], b[mask]), forward


# a fresh tiny model never adds digits: a reward it meets half the time gives the policy loss a gradient, so the
# policy moves away from the reference (the k3 term's own gradient is 0 at the reference)
PARITY = "def parity(response, example):\n    return sum(map(ord, response)) % 2 == 0\n"


@pytest.fixture
def parity_reward(tmp_path, monkeypatch) -> str:
    (tmp_path / "r9_kl_rewards.py").write_text(PARITY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "r9_kl_rewards:parity"


def _tiny(out: Path, **extra) -> dict:
    base = {"output_dir": str(out), "run_name": "run", "model": "tiny:1m", "task": "addition",
            "task_kwargs": json.dumps({"min_digits": 1, "max_digits": 1}), "num_train_examples": 64,
            "prompts_per_step": 4, "samples_per_prompt": 4, "max_response_tokens": 6, "lr": 1e-3,
            "total_steps": 3, "save_every": 0, "progress": False, "log_rollouts": False, "deterministic": True,
            "dynamic_sampling": False}
    base.update(extra)
    return base


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow   # two short runs
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])   # bf16: compute in bf16 over fp32 masters, as on GPUs
def test_a_run_logs_kl_zero_at_step_0_and_positive_once_the_policy_moved(tmp_path, monkeypatch, parity_reward, dtype):
    import trainer.train as entry
    built = []
    real = entry.load_reference
    monkeypatch.setattr(entry, "load_reference", lambda *a, **k: built.append(a) or real(*a, **k))
    off_over = _tiny(tmp_path / "off", total_steps=1, dtype=dtype)
    off = _metrics(train(load_config(None, [f"{k}={v}" for k, v in off_over.items()]), Dist()))
    assert built == [] and "actor/kl" not in off[0]   # kl_coef=0: no reference, nothing logged
    on_over = _tiny(tmp_path / "on", kl_coef=0.1, reward_fn=parity_reward, dtype=dtype)
    on = _metrics(train(load_config(None, [f"{k}={v}" for k, v in on_over.items()]), Dist()))
    assert len(built) == 1
    kls = [m["actor/kl"] for m in on]
    assert abs(kls[0]) <= 1e-6, kls                      # step 0: the policy is the reference
    assert all(k > 1e-5 for k in kls[1:]), kls           # later: it moved (lr 1e-3), k3 >= 0
    assert kls[2] > kls[1]                               # and keeps moving away over these steps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow   # torchrun, two ranks
def test_on_two_ranks_the_sharded_reference_gives_the_one_rank_kl(tmp_path, parity_reward):
    over = _tiny(tmp_path / "one", kl_coef=0.1, micro_batch_size=5, reward_fn=parity_reward)
    one = _metrics(train(load_config(None, [f"{k}={v}" for k, v in over.items()]), Dist()))
    two_over = dict(over, output_dir=str(tmp_path / "two"))
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{tmp_path}", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(free_port()), str(REPO / "tests" / "helpers" / "multirank_worker.py"), json.dumps(two_over)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    two = _metrics(tmp_path / "two" / "run")
    assert [m["step"] for m in two] == [0, 1, 2]
    assert abs(two[0]["actor/kl"]) <= 1e-6
    for a, b in zip(one, two):
        # a grading timeout on a loaded machine would leave a group out on one side only: say so, not a KL gap
        assert a["reward/ungraded"] == b["reward/ungraded"] == 0, "a reward call timed out (machine overloaded?)"
        assert b["reward/mean"] == a["reward/mean"]
        assert b["actor/kl"] == pytest.approx(a["actor/kl"], rel=1e-4, abs=1e-7), (a["actor/kl"], b["actor/kl"])
        assert b["ppo/loss"] == pytest.approx(a["ppo/loss"], abs=1e-5)
