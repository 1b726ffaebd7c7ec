"""Seeds from a mixture of past policies (``seed_source=mixture``, issue #41 item 5; ``trainer/mixture.py``).

A tiny run (T = 2, K = 2 plus the initial policy, 8 steps: refreshes at 0, 2, 4, 6) whose seeds come from several
checkpoints; the seeds an old snapshot wrote carry exactly that snapshot's log-probs (recomputed with it loaded),
the sampler drew them from it too, the current weights come back bit for bit after each refresh, and a run resumed
mid-way draws the same members and samples the same rows. The weight derivations by hand; the config's refusals.
"""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from contracts.config import ConfigError
from contracts.records import read_rollouts
from tests.helpers.models import tiny_llama
from trainer import checkpoint as ckpt
from trainer.config import load_config
from trainer.fsdp import Dist
from trainer.lora import add_adapters
from trainer.mixture import (draw_members, load_snapshot, member_weights, read_relay_matrix, relay_weights,
                             take_snapshot)
from trainer.policy import score
from trainer.rollout import RolloutBuilder
from trainer.train import train

T, B, G, STEPS = 2, 4, 4, 8
BASE = {"model": "tiny:1m", "task": "addition", "prompts_per_step": B, "samples_per_prompt": G,
        "max_response_tokens": 16, "micro_batch_size": 64, "total_steps": STEPS, "progress": False, "lr": 1e-3,
        "save_every": 4, "keep_checkpoints": 0, "keep_resume_states": 2, "dynamic_sampling": False,
        "deterministic": True, "algorithm": "seeds", "seed_source": "mixture", "seed_refresh_interval": T,
        "seed_mixture_size": 2, "seed_mixture_base": True, "reward_fn": "mixture_half_reward:half"}
# a reward right about half the time, so groups carry advantages and the policy moves between refreshes (a fresh
# tiny policy gets no addition right: every group all wrong, no update, every snapshot the same)
HALF = "def half(response, example):\n    return sum(map(ord, response)) % 2 == 0\n"


def _train(out, **over):
    cfg = load_config(None, [f"{k}={v}" for k, v in {**BASE, "output_dir": str(out), "run_name": "r", **over}.items()])
    return train(cfg, Dist())


def _flat_params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def mixture_run(tmp_path_factory):
    """The run, with every refresh's writing watched: the parameters before and after it, and what it returned."""
    seen = []
    write = RolloutBuilder._write_mixture

    def watched(self, step, flat, prompts, seeds):
        before = _flat_params(self.model)
        out = write(self, step, flat, prompts, seeds)
        seen.append({"step": step, "before": before, "after": _flat_params(self.model), "comps": out[0],
                     "writers": out[3]})
        return out

    out = tmp_path_factory.mktemp("mixture")
    (out / "mixture_half_reward.py").write_text(HALF)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(out))
        mp.setattr(RolloutBuilder, "_write_mixture", watched)
        run_dir = _train(out)
        yield run_dir, seen


def _rows(run_dir) -> list[dict]:
    return read_rollouts(run_dir).to_pylist()


def test_seeds_come_from_the_ring_of_refresh_checkpoints(mixture_run):
    run_dir, seen = mixture_run
    rows = _rows(run_dir)
    # refresh steps train on the current policy's own responses (on-policy rows, no seed)
    assert all(r["seed_step"] is None and r["variant"] == "on_policy" for r in rows if r["step"] % T == 0)
    # members at refresh s: s, s - T (K = 2) and the initial policy 0
    members = {1: {0}, 3: {2, 0}, 5: {4, 2, 0}, 7: {6, 4, 0}}
    by_step = {s: {r["seed_step"] for r in rows if r["step"] == s} for s in members}
    for s, got in by_step.items():
        assert got <= members[s], (s, got)
    assert len(set().union(*by_step.values())) >= 3
    assert any(s - min(got) > T for s, got in by_step.items()), "no seed older than the cycle's refresh"
    # one writer per prompt: a group's G seeds share their seed_step
    for s in members:
        for pid in {r["prompt_id"] for r in rows if r["step"] == s}:
            assert len({r["seed_step"] for r in rows if r["step"] == s and r["prompt_id"] == pid}) == 1
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m.get("seeds/mixture_members") for m in metrics[::T]] == [1, 2, 3, 3]
    # batch 0 of every cycle is the current policy's (it trains on-policy at the refresh step)
    for w in seen:
        assert w["writers"][:B] == [w["step"]] * B


def test_the_current_weights_come_back_bit_for_bit(mixture_run):
    _, seen = mixture_run
    swapped = [w for w in seen if any(x != w["step"] for x in w["writers"])]
    assert len(swapped) >= 2, "no refresh drew a past policy: the restore went untested"
    for w in seen:
        assert w["before"].keys() == w["after"].keys()
        for n in w["before"]:
            assert torch.equal(w["before"][n], w["after"][n]), f"step {w['step']}: {n} not restored exactly"


def test_old_seeds_carry_their_writers_logprobs(mixture_run):
    # The checkpoint after step 7 holds refresh 6's buffer (each prompt's writer) and the mixture's snapshots. Each
    # member's rows, scored with that member loaded as the refresh scored them (one call, in order), give exactly the
    # cached behavior log-probs; the sampler's own log-probs of those rows agree to float rounding (it generated
    # with the member's weights); an old member's differ from the current policy's.
    run_dir, seen = mixture_run
    path = ckpt.checkpoint_dir(run_dir, 7)
    state = ckpt.load_trainer_state(path)["rollouts"]
    buf, mix = state["seed_buffer"], state["mixture"]
    assert buf["step"] == 6 and [s["step"] for s in mix["ring"]] == [6, 4] and mix["base"]["step"] == 0
    snaps = {s["step"]: s for s in [*mix["ring"], mix["base"]]}
    comps = next(w for w in seen if w["step"] == 6)["comps"]
    rows = _rows(run_dir)
    prompts = [r["prompt_ids"] for s in (6, 7) for r in rows if r["step"] == s][::G]   # batch 0, then batch 1
    writers = [w for batch in buf["writers"] for w in batch]
    cache = [c for batch in buf["cache"] for c in batch]
    assert len(prompts) == len(writers) == T * B and len(cache) == T * B * G
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    pad = AutoTokenizer.from_pretrained(path).pad_token_id
    old_gap = 0.0
    for step in sorted(set(writers), reverse=True):   # 6 (current) first
        idx = [k * G + g for k, w in enumerate(writers) if w == step for g in range(G)]
        ps, rs = [prompts[i // G] for i in idx], [cache[i]["response_ids"] for i in idx]
        load_snapshot(model, snaps[step])
        logp, _ = score(model, ps, rs, pad_id=pad, micro_batch_size=64, d=Dist(), forward="auto")
        for i, lp in zip(idx, logp):
            assert torch.equal(lp, cache[i]["logp"]), f"row {i} (writer {step}): not its writer's log-probs"
            assert np.allclose(comps[i].logprobs, lp.numpy(), atol=1e-4), f"row {i}: sampled by another policy"
        if step != 6:
            load_snapshot(model, snaps[6])
            now, _ = score(model, ps, rs, pad_id=pad, micro_batch_size=64, d=Dist(), forward="auto")
            old_gap = max(old_gap, max(float((a - b).abs().max()) for a, b in zip(now, logp)))
    assert len(set(writers)) >= 2 and old_gap > 1e-3, (set(writers), old_gap)
    # and the seeded rows of step 7 carry those log-probs on their seed tokens, with their writer as seed_step
    step7 = [r for r in rows if r["step"] == 7]
    for i, r in enumerate(step7):
        m = r["seed_len"]
        assert r["seed_step"] == buf["writers"][1][i // G]
        assert r["logp_behavior"][:m] == pytest.approx(cache[B * G + i]["logp"][:m].tolist(), abs=0)


def test_a_resumed_run_draws_the_same_members_and_rows(mixture_run, tmp_path):
    run_dir, _ = mixture_run
    resumed = _train(tmp_path, resume=str(ckpt.checkpoint_dir(run_dir, 3)))
    keys = ("step", "prompt_id", "sample_idx", "seed_step", "seed_len", "response_ids", "reward")
    a = [{k: r[k] for k in keys} for r in _rows(run_dir) if r["step"] >= 4]
    b = [{k: r[k] for k in keys} for r in _rows(resumed)]
    assert [r["step"] for r in b] == [r["step"] for r in a] and a == b
    assert {r["seed_step"] for r in b if r["step"] == 5} == {r["seed_step"] for r in a if r["step"] == 5}


def test_a_lora_snapshot_is_the_adapter_and_restores_exactly():
    cfg = load_config(None, ["lora_rank=4", "lora_targets=[q_proj,v_proj]"])
    model = add_adapters(tiny_llama(), cfg, compute=torch.float32, master=torch.float32, base=None)
    snap = take_snapshot(model, 3)
    assert snap["step"] == 3 and snap["tensors"] and all(".lora_" in n for n in snap["tensors"])
    assert len(snap["tensors"]) == 2 * 2 * 2   # 2 layers x (q, v) x (A, B)
    before = _flat_params(model)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    load_snapshot(model, snap)
    after = _flat_params(model)
    assert all(torch.equal(before[n], after[n]) for n in before)


# ------------------------------------------------------------------------------------------- weights by hand
def _matrix(rows):
    return pd.DataFrame(rows, columns=["writer", "continuer", "k", "relay", "alone", "gain", "gain_low", "gain_high",
                                       "problems"])


def test_relay_weights_by_hand():
    m = _matrix([(0, 4, 1, .5, .4, 0.10, 0, .2, 30), (4, 8, 1, .5, .44, 0.06, 0, .1, 30),
                 (0, 8, 1, .4, .42, -0.02, -.1, .05, 30), (0, 4, 2, .9, .4, 0.50, .4, .6, 30)])
    # pass@1 (the smallest k): lag 4 -> mean(0.10, 0.06) = 0.08, lag 8 -> max(-0.02, 0) = 0, age 0 unmeasured -> 0;
    # ages 12 -> nearest 8, 5 -> 4, 6 -> a tie between 4 and 8 -> the shorter, 4. Floor 0.01, then normalised.
    w = relay_weights(m, [0, 4, 8, 12, 5, 6], floor=0.01)
    raw = np.array([0.01, 0.09, 0.01, 0.01, 0.09, 0.09])
    assert w == pytest.approx(raw / 0.30, abs=1e-12)
    # pass@2: lag 4 alone measured (0.50); age 0 is 0 and age 8 takes the nearest, lag 4
    assert relay_weights(m, [0, 4, 8], floor=0.01, k=2) == pytest.approx([0.01 / 1.03, 0.51 / 1.03, 0.51 / 1.03],
                                                                         abs=1e-12)
    # a measured lag 0 (the diagonal) is used
    diag = _matrix([(4, 4, 1, .5, .5, 0.03, 0, .1, 30), (0, 4, 1, .5, .4, 0.07, 0, .2, 30)])
    assert relay_weights(diag, [0, 4], floor=0.01) == pytest.approx([0.04 / 0.12, 0.08 / 0.12], abs=1e-12)
    # no lag gains: the floor alone, uniform
    assert relay_weights(_matrix([(0, 4, 1, .3, .4, -0.1, -.2, 0, 30)]), [0, 4, 8], floor=0.01) \
        == pytest.approx([1 / 3] * 3, abs=1e-12)


def test_member_weights_and_draws_by_hand():
    # K = 2 plus the base: by_age [4, 2, 1]; all three members, then a first cycle with only the newest and the base
    assert member_weights([0, 2, 6], base=[False, False, True], mode="age", by_age=[4, 2, 1], size=2) \
        == pytest.approx([4 / 7, 2 / 7, 1 / 7])
    assert member_weights([0, 2], base=[False, True], mode="age", by_age=[4, 2, 1], size=2) \
        == pytest.approx([4 / 5, 1 / 5])
    assert member_weights([0, 2, 4], base=[False] * 3, mode="uniform", size=3) == pytest.approx([1 / 3] * 3)
    w = np.array([0.5, 0.3, 0.2])
    a, b = draw_members(w, 20000, seed=7), draw_members(w, 20000, seed=7)
    assert np.array_equal(a, b) and not np.array_equal(a, draw_members(w, 20000, seed=8))
    assert np.bincount(a, minlength=3) / 20000 == pytest.approx(w, abs=0.015)


def test_the_relay_matrix_file_is_read_and_checked(tmp_path):
    good = tmp_path / "matrix.csv"
    _matrix([(0, 4, 1, .5, .4, 0.1, 0, .2, 30)]).to_csv(good, index=False)
    assert list(read_relay_matrix(good)["gain"]) == [0.1]
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"writer": [0], "continuer": [4]}).to_csv(bad, index=False)
    with pytest.raises(ConfigError, match="no column k, gain"):
        read_relay_matrix(bad)
    cfg = load_config(None, ["algorithm=seeds", "seed_source=mixture", "seed_mixture_weights=relay",
                             f"seed_mixture_matrix={good}"])
    assert cfg.seed_mixture_matrix == str(good)


@pytest.mark.parametrize("over, expected", [
    (["seed_source=mixture"], "seed_source=mixture draws Thinking Seeds' seeds from past policies, but algorithm=dapo"),
    (["seed_mixture_size=1"], "seed_mixture_size must be >= 2"),
    (["seed_mixture_weights=age", "seed_mixture_age_weights=[2,1]"],
     "seed_mixture_age_weights must be 3 weights >= 0, newest first"),
    (["seed_mixture_weights=age", "seed_mixture_base=true", "seed_mixture_age_weights=[3,2,1]"],
     "seed_mixture_age_weights must be 4 weights >= 0, newest first (seed_mixture_size=3 plus the base's, last)"),
    (["seed_mixture_age_weights=[3,2,1]"], "seed_mixture_age_weights=[3, 2, 1] is read with seed_mixture_weights=age"),
    (["seed_mixture_weights=relay", "seed_mixture_matrix=/no/such/matrix.csv"],
     "seed_mixture_matrix=/no/such/matrix.csv: no such file"),
    (["seed_mixture_weights=relay"], "seed_mixture_weights=relay needs seed_mixture_matrix="),
])
def test_bad_mixture_settings_are_one_line(over, expected):
    algo = [] if over == ["seed_source=mixture"] else ["algorithm=seeds", "seed_source=mixture"]
    with pytest.raises(ConfigError) as exc:
        load_config(None, algo + over)
    assert expected in str(exc.value) and "\n" not in str(exc.value)

