"""Restart distributions (``seed_source`` / ``seed_trigger`` / ``seed_rule=adaptive``, trainer/algos/restarts.py).

* The adaptive rule's pure pieces: the arms' ratios, Thompson sampling that settles on the arm whose success rate
  is nearest 1/2, counts that leave ungraded continuations out, the same draws from the same seed.
* One tiny run per ``mini_restart_*`` preset, its rollout records read back against what the source is:
  FR3E-like seeds are prefixes of the step's own responses (every prompt, seed_step = the step); Prefix-RFT-like
  seeds are the reference trace's first half (the prefix out of the loss) and only all-wrong prompts restart;
  PrefixRL-like seeds come from correct responses of a refresh step; adaptive cuts lie on the arms' ratios;
  the all-wrong trigger restarts exactly the prompts whose fresh group failed.
* A run resumed from a checkpoint mid-run continues the pool and the arm statistics it saved: the same metrics
  as the uninterrupted run.
* The paper's own configuration does not go through the new path (its numbers stay the tests' pins elsewhere).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.algos import adaptive_ratios, arm_means, choose_arms, new_arm_stats, ratio_seed_lengths, update_arm_stats
from trainer.config import ConfigError, load_config
from trainer.rollout import thinking_seeds
from trainer.train import main

REPO = Path(__file__).resolve().parents[2]
PRESETS = ["mini_restart_fr3e", "mini_restart_pool", "mini_restart_external", "mini_restart_adaptive",
           "mini_restart_all_wrong"]
# 4 prompts x 4 samples, 4 steps, refresh cycles of 2 (steps 0 and 2 refresh, 1 and 3 restart)
TINY = {"model": "tiny:1m", "sft_steps": 0, "task_kwargs": json.dumps({"min_digits": 1, "max_digits": 1}),
        "num_train_examples": 64, "prompts_per_step": 4, "samples_per_prompt": 4, "max_response_tokens": 6,
        "total_steps": 4, "seed_refresh_interval": 2, "save_every": 0, "progress": False, "dynamic_sampling": False,
        "log_rollouts": True}
# a reward right a quarter of the time: a fresh tiny policy's groups of 4 are all wrong about a third of the time
QUARTER = "def quarter(response, example):\n    return sum(map(ord, response)) % 4 == 0\n"


@pytest.fixture
def quarter_reward(tmp_path, monkeypatch) -> str:
    (tmp_path / "r25_restart_rewards.py").write_text(QUARTER)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "r25_restart_rewards:quarter"


def _preset(name: str) -> Path:
    return REPO / "trainer" / "configs" / f"{name}.yaml"


# ------------------------------------------------------------------------------------------- adaptive rule
def test_the_arms_are_evenly_spaced_ratios():
    assert adaptive_ratios(3) == [0.25, 0.5, 0.75]
    assert adaptive_ratios(4) == pytest.approx([0.2, 0.4, 0.6, 0.8])
    with pytest.raises(ValueError, match="at least one arm"):
        adaptive_ratios(0)


def test_thompson_sampling_settles_on_the_arm_nearest_one_half():
    stats = new_arm_stats(3)
    stats["wrong"] = {"wins": [2, 40, 95], "losses": [98, 40, 5]}    # p ~ 0.02, 0.5, 0.95
    stats["correct"] = {"wins": [95, 97, 50], "losses": [5, 3, 50]}  # p ~ 0.95, 0.97, 0.5
    arms = choose_arms(stats, [False] * 200 + [True] * 200, rng=np.random.default_rng(0))
    assert sum(a == 1 for a in arms[:200]) >= 195 and sum(a == 2 for a in arms[200:]) >= 195
    # no data: the uniform posterior explores every arm
    fresh = choose_arms(new_arm_stats(3), [None] * 300, rng=np.random.default_rng(1))
    assert {a: fresh.count(a) for a in range(3)} == pytest.approx({0: 100, 1: 100, 2: 100}, abs=30)
    # the same generator seed gives the same choices
    assert choose_arms(stats, [False, True, None] * 5, rng=np.random.default_rng(7)) == \
        choose_arms(stats, [False, True, None] * 5, rng=np.random.default_rng(7))


def test_counts_leave_ungraded_continuations_out():
    stats = new_arm_stats(2)
    update_arm_stats(stats, [0, 0, 1, 1, 1], [False, False, True, True, None], [True, False, None, True, False])
    assert stats["wrong"] == {"wins": [1, 0], "losses": [1, 0]}
    assert stats["correct"] == {"wins": [0, 1], "losses": [0, 0]}
    assert stats["ungraded"] == {"wins": [0, 0], "losses": [0, 1]}
    assert arm_means(stats)["wrong"] == [0.5, 0.5] and arm_means(stats)["correct"] == [0.5, 2 / 3]


def test_the_discount_forgets_old_outcomes():
    """seed_adaptive_discount: every count times γ before the step's outcomes are added. By hand at γ = 0.5:
    step 1 (arm 0, wrong sources): 3 wins, 1 loss -> wins [3, 0], losses [1, 0]; (arm 1, a correct source): 1 win
    step 2 (arm 0): 0 wins, 2 losses -> wins [1.5, 0], losses [0.5 + 2, 0] = [2.5, 0]; the posterior mean
    (1 + 1.5) / (2 + 4) = 5/12 (undiscounted: (1 + 3) / (2 + 6) = 0.5). Arms and verdicts with no new outcome decay too;
    γ = 1 is the plain count; γ outside (0, 1] is refused."""
    stats = new_arm_stats(2)
    update_arm_stats(stats, [0, 0, 0, 0, 1], [False] * 4 + [True], [True, True, True, False, True], discount=0.5)
    assert stats["wrong"] == {"wins": [3, 0], "losses": [1, 0]} and stats["correct"] == {"wins": [0, 1], "losses": [0, 0]}
    update_arm_stats(stats, [0, 0], [False, False], [False, False], discount=0.5)
    assert stats["wrong"] == {"wins": [1.5, 0], "losses": [2.5, 0]}
    assert stats["correct"] == {"wins": [0, 0.5], "losses": [0, 0]}
    assert arm_means(stats)["wrong"][0] == pytest.approx(5 / 12)
    plain = new_arm_stats(2)
    for outcomes in ([True, True, True, False], [False, False]):
        update_arm_stats(plain, [0] * len(outcomes), [False] * len(outcomes), outcomes, discount=1.0)
    assert plain["wrong"] == {"wins": [3, 0], "losses": [3, 0]} and arm_means(plain)["wrong"][0] == 0.5
    with pytest.raises(AssertionError, match="discount"):
        update_arm_stats(plain, [0], [False], [True], discount=0.0)


# ------------------------------------------------------------------------------------------------- config
def test_the_presets_are_what_their_comments_say():
    got = {p: (c.seed_source, c.seed_trigger, c.seed_rule, c.seed_loss)
           for p in PRESETS for c in [load_config(_preset(p))]}
    assert got == {"mini_restart_fr3e": ("current", "always", "entropy", "state+action"),
                   "mini_restart_pool": ("pool", "all_wrong", "ratio", "state+action"),
                   "mini_restart_external": ("external", "all_wrong", "ratio", "state"),
                   "mini_restart_adaptive": ("refresh", "always", "adaptive", "state+action"),
                   "mini_restart_all_wrong": ("refresh", "all_wrong", "ratio", "state+action")}
    assert not any(thinking_seeds(load_config(_preset(p))) for p in PRESETS)
    assert thinking_seeds(load_config(_preset("mini_seeds_ratio")))
    assert thinking_seeds(load_config(_preset("mini_seeds_entropy")))


@pytest.mark.parametrize("over, expected", [
    ({"seed_source": "external", "seed_loss": "state+action"}, "seed_source=external cuts seeds from reference"),
    ({"seed_rule": "adaptive", "seed_adaptive_arms": 1}, "seed_adaptive_arms must be >= 2"),
    ({"seed_source": "pool", "seed_pool_size": 0}, "seed_pool_size must be >= 1"),
    ({"seed_source": "previous"}, "seed_source"),
    ({"seed_trigger": "sometimes"}, "seed_trigger"),
])
def test_bad_values_are_config_errors(over, expected):
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace("+", r"\+")):
        load_config(None, {"algorithm": "seeds", **over})


# ----------------------------------------------------------------------------------------- tiny runs
def _run(tmp_path, preset, reward, name="run", **extra) -> Path:
    over = {**TINY, "output_dir": str(tmp_path), "run_name": name, "reward_fn": reward, **extra}
    assert main(["--config", str(_preset(preset)), *[f"{k}={v}" for k, v in over.items()]]) == 0
    return tmp_path / name


def _metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _records(run: Path, step: int) -> list[dict]:
    import pyarrow.parquet as pq
    return pq.read_table(run / "rollouts" / f"step_{step:06d}.parquet").to_pylist()


def _groups(rows: list[dict]) -> list[list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["prompt_id"], []).append(r)
    return list(out.values())


def _check_common(run: Path) -> list[dict]:
    lines = _metrics(run)
    assert [m["step"] for m in lines] == [0, 1, 2, 3]
    for m in lines:
        assert math.isfinite(m["ppo/loss"]) and math.isfinite(m["ppo/grad_norm"]), m
        for step_rows in [_records(run, m["step"])]:
            assert len(step_rows) == 16 and len(_groups(step_rows)) == 4
            for r in step_rows:
                if r["variant"] == "seed":
                    assert 0 <= r["seed_len"] <= r["source_len"] and r["source_len"] > 0
                    assert len(r["response_ids"]) >= r["seed_len"]
    return lines


@pytest.mark.slow
def test_fr3e_restarts_every_prompt_from_its_own_responses(tmp_path, quarter_reward):
    run = _run(tmp_path, "mini_restart_fr3e", quarter_reward)
    lines = _check_common(run)
    for m in lines:
        rows = _records(run, m["step"])
        assert m["seeds/restarted_share"] == 1.0 and all(r["variant"] == "seed" for r in rows)
        assert all(r["seed_step"] == m["step"] and r["trunc_rule"] == "entropy" for r in rows)
        assert 0 <= m["seeds/cut_ratio_mean"] < 1 and m["seeds/token_factor"] > 1   # a group plus its continuations
        assert 0 <= m["seeds/fresh_all_wrong_share"] <= 1


@pytest.mark.slow
def test_the_external_source_cuts_the_reference_trace_and_keeps_it_out_of_the_loss(tmp_path, quarter_reward):
    from transformers import AutoTokenizer
    from trainer.data import load_examples, off_policy_ids
    run = _run(tmp_path, "mini_restart_external", quarter_reward)
    lines = _check_common(run)
    cfg = load_config(run / "config.yaml")
    tok = AutoTokenizer.from_pretrained(run / "checkpoints" / "step_000003")
    examples = {ex["id"]: ex for ex in load_examples(cfg)}
    restarted = 0
    for m in lines:
        rows = _records(run, m["step"])
        seeded = [g for g in _groups(rows) if g[0]["variant"] == "seed"]
        assert m["seeds/restarted_share"] == len(seeded) / 4 <= m["seeds/fresh_all_wrong_share"]
        restarted += len(seeded)
        for g in seeded:
            trace = off_policy_ids(tok, examples[g[0]["prompt_id"]], "solution")
            half = int(ratio_seed_lengths(torch.tensor([len(trace)]), 0.5, ends_with_eos=torch.tensor([True])))
            want = min(half, cfg.max_response_tokens - 1)   # the whole trace is the source; the cut fits the budget
            for r in g:
                assert r["variant"] == "seed" and r["seed_step"] is None and r["source_len"] == len(trace)
                assert r["seed_len"] == want and r["response_ids"][:want] == trace[:want]
                assert not any(r["loss_mask"][:want])     # seed_loss=state: the prefix is context
        for g in _groups(rows):
            if g[0]["variant"] != "seed":
                assert all(r["variant"] == "on_policy" for r in g)
    assert restarted > 0, "the quarter reward leaves some group all wrong in four steps"


@pytest.mark.slow
def test_the_pool_restarts_failed_prompts_from_past_correct_responses(tmp_path, quarter_reward):
    run = _run(tmp_path, "mini_restart_pool", quarter_reward)
    lines = _check_common(run)
    seeded = [r for m in lines for r in _records(run, m["step"]) if r["variant"] == "seed"]
    assert seeded, "some prompt of steps 1 or 3 failed and had a correct cached response"
    assert all(r["source_correct"] is True and r["seed_step"] in (0, 2) and r["seed_step"] < r["step"]
               for r in seeded)
    for m in lines:
        if m["step"] % 2:
            assert m["seeds/pool_prompts"] > 0
            assert m["seeds/restarted_share"] <= m["seeds/fresh_all_wrong_share"]


@pytest.mark.slow
def test_adaptive_cuts_lie_on_the_arms(tmp_path, quarter_reward):
    run = _run(tmp_path, "mini_restart_adaptive", quarter_reward)
    lines = _check_common(run)
    for m in lines:
        rows = _records(run, m["step"])
        if m["step"] % 2 == 0:   # refresh steps: the cycle's responses, on-policy
            assert all(r["variant"] == "on_policy" for r in rows) and "seeds/adaptive_ratio_mean" not in m
            continue
        assert all(r["variant"] == "seed" and r["trunc_rule"] == "adaptive" for r in rows)
        for r in rows:   # the cached response ended in EOS or at the budget: both clamps are candidates
            cands = {int(ratio_seed_lengths(torch.tensor([r["source_len"]]), q, ends_with_eos=torch.tensor([e])))
                     for q in adaptive_ratios(3) for e in (True, False)}
            assert r["seed_len"] in cands, (r["seed_len"], r["source_len"])
        assert 0.25 <= m["seeds/adaptive_ratio_mean"] <= 0.75
        for v in ("wrong", "correct"):
            for q in ("0.25", "0.5", "0.75"):
                assert 0 < m[f"seeds/adaptive_p_{v}@{q}"] < 1


@pytest.mark.slow
def test_the_all_wrong_trigger_restarts_exactly_the_failed_prompts(tmp_path, quarter_reward):
    run = _run(tmp_path, "mini_restart_all_wrong", quarter_reward)
    lines = _check_common(run)
    for m in lines:
        rows = _records(run, m["step"])
        if m["step"] % 2 == 0:
            assert "seeds/restarted_share" not in m
            continue
        # every prompt of a refresh cycle has cached responses: all and only the failed fresh groups restart
        assert m["seeds/restarted_share"] == m["seeds/fresh_all_wrong_share"]
        seeded = [g for g in _groups(rows) if g[0]["variant"] == "seed"]
        assert len(seeded) == round(4 * m["seeds/restarted_share"])
        if seeded:
            solved = sum(any(r["correct"] for r in g) for g in seeded) / len(seeded)
            assert m["seeds/restart_solved_share"] == pytest.approx(solved)
            assert all(r["seed_step"] == m["step"] - 1 for g in seeded for r in g)


@pytest.mark.slow
def test_a_resumed_run_continues_the_pool_and_the_arm_statistics(tmp_path, quarter_reward):
    extra = {"seed_rule": "adaptive", "save_every": 1, "keep_checkpoints": 0}
    a = _run(tmp_path / "a", "mini_restart_pool", quarter_reward, **extra)
    b = _run(tmp_path / "b", "mini_restart_pool", quarter_reward, resume=str(a / "checkpoints" / "step_000002"),
             **extra)
    strip = lambda ms: [{k: v for k, v in m.items() if not k.startswith("time/")} for m in ms]  # noqa: E731
    got = strip(_metrics(b))
    assert [m["step"] for m in got] == [3]
    assert got == strip(_metrics(a))[3:]
    assert any(k.startswith("seeds/adaptive_p_") for k in got[0])
