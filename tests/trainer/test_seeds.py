"""Thinking Seeds, LUFFY and M2PO inside the trainer: token accounting, records, and the loss variants."""

import json
import math

import pytest
import torch

from tests.conftest import TASK_KWARGS
from trainer import checkpoint as ckpt
from trainer.algos import LOSSES, loss_denominator, loss_mask, reduce_loss, token_factor
from trainer.config import load_config, loss_kwargs
from trainer.fsdp import Dist
from contracts.records import read_rollouts
from trainer.rollout import Rollout
from trainer.train import train
from trainer.update import rows_loss_mask, token_batch


def run(tmp_path, **over):
    base = {"output_dir": str(tmp_path), "run_name": "r", "model": "tiny:1m", "task": "addition",
            "prompts_per_step": 4, "samples_per_prompt": 4, "max_response_tokens": 16, "micro_batch_size": 64,
            "total_steps": 4, "progress": False, "save_every": 0, "lr": 1e-3}
    base.update(over)
    cfg = load_config(None, [f"{k}={v}" for k, v in base.items()])
    run_dir = train(cfg, Dist())
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return run_dir, metrics


@pytest.mark.parametrize("ratio, T", [(0.5, 4), (0.25, 2)])
def test_generated_tokens_follow_the_token_factor_exactly(tmp_path, ratio, T):
    # With EOS ignored every response has exactly L = 16 tokens: the refresh writes T·B·G·L tokens and each later
    # batch regenerates L - round(L·ratio) tokens per response, so one cycle costs token_factor(ratio, T).
    L, B, G = 16, 4, 4
    run_dir, metrics = run(tmp_path, algorithm="seeds", seed_ratio=ratio, seed_refresh_interval=T,
                           ignore_eos=True, dynamic_sampling=False, total_steps=T, max_response_tokens=L)
    per_step = [m["tokens/generated"] for m in metrics]
    assert per_step == [T * B * G * L] + [B * G * (L - round(L * ratio))] * (T - 1)
    assert metrics[-1]["seeds/token_factor"] == pytest.approx(token_factor(ratio, T), abs=1e-12)
    # the context the sampler was given: a seeded row prefills its prompt and its seed; the refresh step the
    # prompts of all T batches (its own batch's, recorded at step 0, and those the seeded steps continue)
    rows = read_rollouts(run_dir).to_pylist()
    prompt_tokens = {s: sum(len(r["prompt_ids"]) for r in rows if r["step"] == s) for s in range(T)}
    prefilled = [m["tokens/prefilled"] for m in metrics]
    assert prefilled[0] == sum(prompt_tokens.values())
    assert prefilled[1:] == [prompt_tokens[s] + B * G * round(L * ratio) for s in range(1, T)]


def test_seed_records_mark_seeds_cut_tokens_and_behavior(tmp_path):
    run_dir, metrics = run(tmp_path, algorithm="seeds", seed_ratio=0.5, seed_refresh_interval=4, ignore_eos=True,
                           dynamic_sampling=False, total_steps=4)
    rows = read_rollouts(run_dir).to_pylist()
    first = [r for r in rows if r["step"] == 0]
    seeded = [r for r in rows if r["step"] > 0]
    assert all(r["variant"] == "on_policy" and r["seed_len"] == 0 and r["seed_step"] is None for r in first)
    assert all(r["variant"] == "seed" and r["seed_step"] == 0 and r["seed_len"] == 8 for r in seeded)
    assert all(r["trunc_rule"] == "ratio" for r in seeded)
    for r in seeded:
        beh = r["logp_behavior"]
        assert len(beh) == len(r["response_ids"]) == 16
        assert all(math.isfinite(x) for x in beh[:8]) and all(math.isnan(x) for x in beh[8:])
        assert r["trunc_token_text"] is not None and r["trunc_token_id"] is not None
    # Independent truncation: within each group the seeds come from different cached responses.
    for step in (1, 2, 3):
        for pid in {r["prompt_id"] for r in seeded if r["step"] == step}:
            seeds = {tuple(r["response_ids"][:8]) for r in seeded if r["step"] == step and r["prompt_id"] == pid}
            assert len(seeds) > 1
    # The seed of a row at step j equals the first tokens of a response the policy of step 0 wrote for that prompt.
    assert {m["seeds/seed_tokens"] for m in metrics[1:]} == {4 * 4 * 8}


def test_entropy_rule_cuts_at_top_k_positions(tmp_path):
    k = 3
    run_dir, _ = run(tmp_path, algorithm="seeds", seed_rule="entropy", seed_topk=k, seed_refresh_interval=2,
                     dynamic_sampling=False, total_steps=2, save_every=1, keep_checkpoints=0)
    rows = read_rollouts(run_dir).to_pylist()
    seeded = [r for r in rows if r["step"] == 1]
    assert len(seeded) == 4 * 4 and all(r["trunc_rule"] == "entropy" for r in seeded)
    assert len({r["seed_len"] for r in seeded}) > 1  # cut positions vary across responses
    # The cached responses of batch 1 (written and scored by the step-0 policy) are in the seed buffer the run
    # checkpoints; row i of step 1 was cut from cached response i.
    cache = ckpt.load_trainer_state(ckpt.checkpoint_dir(run_dir, 0))["rollouts"]["seed_buffer"]["cache"][1]
    assert len(cache) == len(seeded)
    n_eos = n_long = 0
    for r, c in zip(seeded, cache):
        m, ids = r["seed_len"], c["response_ids"]
        assert r["response_ids"][:m] == ids[:m] and r["trunc_token_id"] == ids[m]  # the record's seed is this one
        eos = c["finish_reason"] == "stop"
        n_eos += eos
        ent = c["entropy"][: len(ids) - eos].tolist()  # the EOS position is never a candidate
        n_long += len(ent) > k   # a shorter response has all its positions as candidates
        top_k = sorted(range(len(ent)), key=lambda t: (-ent[t], t))[:k]
        assert m in top_k, f"cut at {m}, but the {k} highest-entropy positions are {top_k}"
        assert r["logp_behavior"][:m] == pytest.approx(c["logp"][:m].tolist(), abs=0)
    assert n_eos >= 1, "no cached response ended with EOS: the EOS exclusion went untested"
    assert n_long >= len(seeded) // 2, "too few responses longer than k: the top-k choice went untested"


def _row(seed_len, behavior, adv=1.0, L=4):
    return Rollout(example_idx=0, prompt_id="p", group=0, sample_idx=0, prompt_ids=[1], response_ids=[5] * L,
                   finish_reason="length", variant="seed", seed_len=seed_len,
                   behavior_logp=behavior + [math.nan] * (L - len(behavior)), advantage=adv)


def _seed_loss(cfg, rows, logp, old_logp, mask):
    """The trainer's loss for one micro-batch holding all rows: the table entry reduced over the step's denominator."""
    batch = token_batch(rows, logp, old_logp, mask)
    lmask = loss_mask(mask, batch.seed_lens, seed_loss=cfg.seed_loss)
    loss_mat, stats = LOSSES[cfg.algorithm](batch, **loss_kwargs(cfg))
    denom = loss_denominator(rows_loss_mask(cfg, rows), mode=cfg.loss_agg, max_len=cfg.max_response_tokens)
    return reduce_loss(loss_mat, lmask, mode=cfg.loss_agg, denominator=denom), lmask, stats


def test_state_and_state_action_losses_by_hand():
    # One response of 4 tokens, seed of 2, A = +1. Current and old log-prob log 0.5 everywhere (r = 1 on the
    # continuation); the cached behavior probability of the two seed tokens is 0.25, so r_seed = 2 -> clipped at 1.28.
    logp = torch.full((1, 4), math.log(0.5), requires_grad=True)
    mask = torch.ones(1, 4, dtype=torch.bool)
    rows = [_row(2, [math.log(0.25)] * 2)]
    # state+action: token-mean over all four tokens of -A * min(r, clip(r)): (-1.28 - 1.28 - 1 - 1) / 4
    cfg = load_config(None, ["algorithm=seeds", "seed_loss=state+action"])
    loss, lmask, stats = _seed_loss(cfg, rows, logp, logp.detach(), mask)
    assert float(loss.detach()) == pytest.approx((-1.28 * 2 - 2) / 4, abs=1e-6)
    assert lmask[0].tolist() == [True] * 4
    assert stats["clipped_high"][0].tolist() == [True, True, False, False]
    assert stats["ratio"][0, :2].tolist() == pytest.approx([2.0, 2.0])
    # state: seed tokens leave the loss and the denominator: (-1 - 1) / 2
    cfg = load_config(None, ["algorithm=seeds", "seed_loss=state"])
    loss, lmask, _ = _seed_loss(cfg, rows, logp, logp.detach(), mask)
    assert lmask[0].tolist() == [False, False, True, True]
    assert float(loss.detach()) == pytest.approx(-1.0, abs=1e-6)
    # Gradient of the state loss touches continuation tokens only: d/dlogp of -A*r/2 = -0.5 there, 0 on seeds.
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, -0.5, -0.5])


def test_state_action_uses_cached_behavior_logprobs_on_seed_tokens():
    # r on seed tokens is pi_theta / pi_behavior, not pi_theta / pi_old: change the behavior cache, the ratio follows.
    logp = torch.full((1, 4), math.log(0.5))
    mask = torch.ones(1, 4, dtype=torch.bool)
    cfg = load_config(None, ["algorithm=seeds", "seed_loss=state+action", "clip_high=10", "clip_low=0.99"])
    for p_b in (0.25, 0.4, 0.8):
        _, _, stats = _seed_loss(cfg, [_row(3, [math.log(p_b)] * 3)], logp, logp, mask)
        assert stats["ratio"][0].tolist() == pytest.approx([0.5 / p_b] * 3 + [1.0], rel=1e-6)


def test_luffy_run_mixes_one_off_policy_trace_per_group(tmp_path):
    run_dir, metrics = run(tmp_path, algorithm="luffy", total_steps=2, dynamic_sampling=False, off_policy_key="solution",
                           max_response_tokens=64,
                           adv_scale="none", loss_agg="token-sum-norm")
    rows = read_rollouts(run_dir).to_pylist()
    for step in (0, 1):
        for pid in {r["prompt_id"] for r in rows if r["step"] == step}:
            grp = [r for r in rows if r["step"] == step and r["prompt_id"] == pid]
            assert [r["variant"] for r in grp].count("luffy_off") == 1 and len(grp) == 4
            off = next(r for r in grp if r["variant"] == "luffy_off")
            assert off["reward"] == 1.0  # the task solver's trace is correct
            mean = sum(r["reward"] for r in grp) / 4
            assert off["advantage"] == pytest.approx(1.0 - mean, abs=1e-6)  # adv_scale=none: R - group mean
    assert all(math.isfinite(m["ppo/loss"]) for m in metrics)


def test_m2po_trains_on_stale_rollouts(tmp_path, sft_policy_dir):
    run_dir, metrics = run(tmp_path, algorithm="m2po", m2po_staleness=2, total_steps=4, dynamic_sampling=False,
                           model=str(sft_policy_dir), task_kwargs=json.dumps(TASK_KWARGS), max_response_tokens=32,
                           prompts_per_step=8)
    rows = read_rollouts(run_dir).to_pylist()
    # Steps 0..2 train on batches written at step 0 (queue warm-up); step 3 on the batch written at step 1.
    assert [sorted({r["seed_step"] for r in rows if r["step"] == s}) for s in range(4)] == [[0], [0], [0], [1]]
    assert all(r["variant"] == "stale" and len(r["logp_behavior"]) == len(r["response_ids"]) for r in rows)
    stale = [r for r in rows if r["step"] == 3]
    # The policy moved since the batch was written: ratios pi_theta/pi_behavior differ from 1.
    assert max(abs(x - 1.0) for r in stale for x in r["ratio"]) > 1e-4


def test_behavior_logprobs_from_the_sampler_match_the_trainer_forward(tmp_path):
    """behavior_logprobs=sampler takes the seed tokens' behavior log-probs from the sampler instead of a second
    forward: same samples (same seeds), the same numbers up to float rounding, and no scoring pass (the trainer's
    time/behavior_s metric times that forward: positive on the refresh step of the default, 0 with the sampler)."""
    common = dict(algorithm="seeds", seed_ratio=0.5, seed_refresh_interval=2, ignore_eos=True, dynamic_sampling=False,
                  total_steps=2, lr=0.0)
    run_t, metrics_t = run(tmp_path / "trainer", **common)
    run_s, metrics_s = run(tmp_path / "sampler", behavior_logprobs="sampler", **common)
    assert metrics_t[0]["time/behavior_s"] > 0 and metrics_t[1]["time/behavior_s"] == 0.0  # refresh step only
    assert [m["time/behavior_s"] for m in metrics_s] == [0.0, 0.0], "the sampler mode must not run the behavior forward"
    a = [r for r in read_rollouts(run_t).to_pylist() if r["step"] == 1]
    b = [r for r in read_rollouts(run_s).to_pylist() if r["step"] == 1]
    assert [r["response_ids"] for r in a] == [r["response_ids"] for r in b]
    beh_a = torch.tensor([r["logp_behavior"][:r["seed_len"]] for r in a])
    beh_b = torch.tensor([r["logp_behavior"][:r["seed_len"]] for r in b])
    assert beh_a.shape == (16, 8) and torch.isfinite(beh_a).all()
    torch.testing.assert_close(beh_b, beh_a, atol=1e-4, rtol=0)


def test_behavior_logprobs_setting_is_validated():
    from trainer.config import ConfigError
    with pytest.raises(ConfigError, match="config field 'behavior_logprobs' must be one of trainer, sampler"):
        load_config(None, ["behavior_logprobs=engine"])
    # vLLM gives log-probs (after temperature) but no entropy: only the entropy rule needs the trainer's forward
    load_config(None, ["behavior_logprobs=sampler", "engine=vllm", "algorithm=seeds", "seed_rule=ratio"])
    with pytest.raises(ConfigError, match="seed_rule=entropy needs the behavior policy's entropies"):
        load_config(None, ["behavior_logprobs=sampler", "engine=vllm", "algorithm=seeds", "seed_rule=entropy"])
    with pytest.raises(ConfigError, match="config field 'vllm_sleep_mode' must be one of auto, on, off"):
        load_config(None, ["vllm_sleep_mode=maybe"])
    with pytest.raises(ConfigError, match="vllm_max_model_len=100 cannot hold"):
        load_config(None, ["vllm_max_model_len=100", "max_prompt_tokens=90", "max_response_tokens=20"])
