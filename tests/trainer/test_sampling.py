"""Dynamic sampling in one round (``trainer.sampling``, config ``oversample``).

* ``round_prompts``: the fewest prompts that fill the missing groups with 90 % probability at a keep rate
  (binomial tails checked against exact sums), or a fixed multiple.
* The selection is the first ``prompts_per_step`` informative groups in loader order, and the prompts after the
  last one go back to the cursor: for verdicts fixed per prompt, oversampling trains the same prompts and leaves
  the cursor where ``oversample=1`` (one prompt per missing group) leaves it, in fewer rounds.
* At a 50 % keep rate the default averages at most 0.5 extra rounds per step; ``oversample=1`` 2 to 5.
* Under advantage=passk / grpo_passk a verdict-mixed group whose advantages are all 0 is dropped too (hand
  values of Pass@k Training's advantage).
* A tiny CPU run (a fresh tiny model, a grader that makes about half the groups verdict-mixed): the rounds, the
  metrics, the trained groups are the mixed ones, and a resumed run reproduces the uninterrupted one.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from perf.bench_dynamic_sampling import half_mixed
from contracts.records import read_rollouts
from scoring.verdict import GRADER_ERROR, Verdict
from trainer.config import ConfigError, load_config
from trainer.data import PromptLoader
from trainer.fsdp import Dist
from trainer.rollout import Rollout, fresh_first_round
from trainer.sampling import (binomial_tail, collect_step, keep_rate, round_prompts, update_keep_counts,
                              zero_advantage)


# ---------------------------------------------------------------------------------------------- round sizes
def test_round_prompts_are_the_fewest_that_fill_the_step_with_90_percent_probability():
    def exact(n, p, need):
        return sum(math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(need, n + 1))
    for n, p, need in ((20, 0.5, 8), (21, 0.5, 8), (75, 0.5, 32), (10, 0.9, 8), (3, 0.2, 1)):
        assert binomial_tail(n, p, need) == pytest.approx(exact(n, p, need), abs=1e-12)
    assert binomial_tail(21, 0.5, 8) == pytest.approx(0.905376, abs=1e-6)   # 1 - sum_{k<8} C(21,k) / 2^21
    assert binomial_tail(20, 0.5, 8) == pytest.approx(0.868412, abs=1e-6)
    auto = dict(oversample=0.0)
    assert round_prompts(8, keep_rate=0.5, **auto) == 21
    assert round_prompts(32, keep_rate=0.5, **auto) == 75
    assert round_prompts(1, keep_rate=0.5, **auto) == 4      # 1 - 0.5^4 = 0.94 >= 0.9 > 1 - 0.5^3
    assert round_prompts(8, keep_rate=1.0, **auto) == 8      # every group informative: no oversampling
    assert round_prompts(8, keep_rate=0.0, **auto) == 32     # nothing informative seen: the cap, 4x
    assert round_prompts(10, oversample=1.1, keep_rate=0.5) == 11   # not 12 from 11.000000000000002
    assert round_prompts(8, oversample=3, keep_rate=0.9) == 24      # verl's DAPO recipe: 3x, whatever the rate
    assert round_prompts(8, oversample=1, keep_rate=0.1) == 8       # the refills before oversampling


def test_the_keep_rate_is_a_decayed_count_that_starts_at_one_half():
    assert keep_rate(None) == 0.5
    counts = update_keep_counts(None, 3, 21)   # 0.8 * (1, 2) + (3, 21)
    assert counts == pytest.approx((3.8, 22.6))
    assert keep_rate(counts) == pytest.approx(3.8 / 22.6)
    assert update_keep_counts(counts, 10, 10) == pytest.approx((0.8 * 3.8 + 10, 0.8 * 22.6 + 10))


def test_oversample_is_zero_or_at_least_one():
    assert load_config(None, []).oversample == 0.0
    assert load_config(None, ["oversample=3"]).oversample == 3.0
    with pytest.raises(ConfigError, match="oversample must be 0 .auto"):
        load_config(None, ["oversample=0.5"])


# ---------------------------------------------------------------------------------------------- zero advantages
def _group(n_correct: int, n: int = 8) -> list[Rollout]:
    return [Rollout(example_idx=0, prompt_id="p", group=0, sample_idx=i, prompt_ids=[1], response_ids=[2],
                    finish_reason="stop", reward=float(i < n_correct), correct=i < n_correct,
                    verdict="pass" if i < n_correct else "wrong_answer") for i in range(n)]


def test_verdict_mixed_groups_with_zero_advantages_are_dropped():
    """Pass@k Training, k = 4 over G = 8 (R̄ = 1 − C(N_neg, 4) / C(8, 4)): 7 correct / 1 wrong has N_neg = 1 < 4, so
    R̄ = 1, σ = 0 and every Â = 0 -> dropped; 3 correct / 5 wrong has R̄ = 1 − 5/70 = 13/14 -> kept (Â_correct =
    (1/14) / sqrt(13/14 · 1/14) ≈ 0.277). verl's grpo_passk: two correct tie at the best (R_max − R_2nd = 0) ->
    dropped; one correct -> kept. grpo never drops a mixed group (its advantages are non-zero)."""
    cfg = load_config(None, ["advantage=passk", "passk_k=4", "samples_per_prompt=8"])
    assert zero_advantage(cfg, _group(7)) and not zero_advantage(cfg, _group(3))
    assert zero_advantage(cfg, _group(4)) is False          # N_neg = 4 = k: one 4-subset is all wrong
    cfg = load_config(None, ["advantage=grpo_passk", "samples_per_prompt=8"])
    assert zero_advantage(cfg, _group(2)) and not zero_advantage(cfg, _group(1))
    cfg = load_config(None, ["advantage=grpo", "samples_per_prompt=8"])
    assert not any(zero_advantage(cfg, _group(c)) for c in range(1, 8))


def test_passk_dynamic_sampling_keeps_only_groups_with_signal():
    """collect_step under passk (k = 4, G = 4): the fake builder's "informative" groups hold 1 correct and 3 wrong, so
    N_neg = 3 < 4 and every Â = 0: none is trained, every one counts as dropped; at k = 2 they all carry signal."""
    cfg = _cfg(advantage="passk", passk_k=4, max_sampling_rounds=2, oversample=1)
    out = collect_step(FakeBuilder(cfg, lambda ex, s, r: "informative"), cfg, 0)
    assert out.kept == [] and out.metrics["sampling/groups_kept"] == 0
    assert out.metrics["sampling/groups_dropped"] == 2 * cfg.prompts_per_step
    cfg = _cfg(advantage="passk", passk_k=2, max_sampling_rounds=2, oversample=1)
    out = collect_step(FakeBuilder(cfg, lambda ex, s, r: "informative"), cfg, 0)
    assert out.metrics["sampling/groups_kept"] == cfg.prompts_per_step and out.metrics["sampling/extra_rounds"] == 0


# ---------------------------------------------------------------------------------------------- the selection
G = 4


class FakeBuilder:
    """What ``collect_step`` reads of a ``RolloutBuilder``: the loader, ``collect`` (fresh prompts from the loader
    for on-policy algorithms; for ``seeds`` a batch of B prompts it draws itself, never oversampled), ``fresh``
    and ``keep_counts``. ``fate(example, step, round)`` says a group's verdicts: informative, dropped or
    ungraded."""

    def __init__(self, cfg, fate, n_examples=10_000):
        self.cfg, self.fate = cfg, fate
        self.loader = PromptLoader(n_examples, seed=cfg.seed)
        self.keep_counts = None
        self.calls: list[int] = []   # prompts per generation round
        self._next_group = 0

    def collect(self, step, *, fresh_prompts=None):
        self._next_group = 0
        if fresh_first_round(self.cfg):
            return self.fresh(self.loader.next(fresh_prompts or self.cfg.prompts_per_step), step, round_=0)
        return self.fresh(self.loader.next(self.cfg.prompts_per_step), step, round_=0)   # a seeded batch

    def fresh(self, exs, step, round_):
        self.calls.append(len(exs))
        rows = []
        for ex in exs:
            group, fate = self._next_group, self.fate(ex, step, round_)
            self._next_group += 1
            correct = [True] + [False] * (G - 1) if fate == "informative" else [False] * G
            for i, ok in enumerate(correct):
                verdict = GRADER_ERROR if fate == "ungraded" and i == 0 else ("pass" if ok else "wrong_answer")
                rows.append(Rollout(example_idx=ex, prompt_id=str(ex), group=group, sample_idx=i, prompt_ids=[1],
                                    response_ids=[2], finish_reason="stop", reward=float(ok), correct=ok,
                                    verdict=verdict))
        return rows


def _cfg(**over):
    base = {"prompts_per_step": 8, "samples_per_prompt": G, "max_sampling_rounds": 20, "seed": 3}
    return load_config(None, [f"{k}={v}" for k, v in {**base, **over}.items()])


def _by_example(ex, step, round_):   # a prompt's fate is its own, whatever the step: 1/2 informative, 1/7 ungraded
    return "ungraded" if ex % 7 == 0 else "informative" if ex % 2 == 0 else "dropped"


@pytest.mark.parametrize("algorithm", ["dapo", "seeds"])
def test_oversampling_trains_the_prompts_and_leaves_the_cursor_as_one_prompt_per_missing_group(algorithm):
    one, auto = (FakeBuilder(_cfg(algorithm=algorithm, oversample=k), _by_example) for k in (1, 0))
    reference = PromptLoader(10_000, seed=3)   # the cursor's order: the step must train its first informative
    for step in range(6):
        a, b = collect_step(one, one.cfg, step), collect_step(auto, auto.cfg, step)
        trained = [r.example_idx for r in b.kept if r.sample_idx == 0]
        assert trained == [r.example_idx for r in a.kept if r.sample_idx == 0]
        assert one.loader.state_dict() == auto.loader.state_dict()
        # the first 8 informative prompts in loader order; the cursor stops right after the last of them
        drawn = []
        while sum(_by_example(ex, 0, 0) == "informative" for ex in drawn) < 8:
            drawn += reference.next(1)
        assert trained == [ex for ex in drawn if _by_example(ex, 0, 0) == "informative"]
        assert reference.state_dict() == auto.loader.state_dict()
        m = b.metrics
        groups = len({r.group for r in b.rows})
        assert m["sampling/groups_kept"] == 8
        assert m["sampling/groups_kept"] + m["sampling/groups_dropped"] + m["sampling/groups_ungraded"] \
            + m["sampling/groups_surplus"] == groups
        assert a.metrics["sampling/groups_surplus"] == 0 and a.metrics["sampling/unused_share"] < b.metrics[
            "sampling/unused_share"]
        assert m["sampling/unused_share"] == pytest.approx(1 - 8 * G / len(b.rows))
        # drop/ungraded counts are of the consumed prompts, which both runs judged alike
        for k in ("sampling/groups_dropped", "sampling/groups_ungraded"):
            assert a.metrics[k] == m[k]
    assert sum(one.calls) < sum(auto.calls) and len(auto.calls) < len(one.calls)
    if algorithm == "seeds":   # the seeded batch is the step's own: never oversampled, refills are
        assert auto.calls[0] == 8 and max(auto.calls) > 8


def _coin(ex, step, round_):   # each group informative with probability 1/2, independently of everything else
    return "informative" if np.random.default_rng([ex, step, round_]).random() < 0.5 else "dropped"


@pytest.mark.parametrize("prompts", [8, 32])
def test_at_a_half_keep_rate_one_round_usually_fills_the_step(prompts):
    extra = {}
    for k in (0, 1, 3):
        b = FakeBuilder(_cfg(oversample=k, prompts_per_step=prompts, max_sampling_rounds=10), _coin)
        steps = [collect_step(b, b.cfg, s).metrics for s in range(60)]
        extra[k] = sum(m["sampling/extra_rounds"] for m in steps) / len(steps)
        assert all(m["sampling/groups_kept"] == prompts for m in steps)
        if k == 0:
            assert 0.4 < steps[-1]["sampling/keep_rate"] < 0.6
    print(f"B={prompts}: extra rounds per step, auto {extra[0]:.2f}, oversample=1 {extra[1]:.2f}, 3x {extra[3]:.2f}")
    assert extra[0] <= 0.5 and extra[3] <= 0.1
    assert 2 <= extra[1] <= (5 if prompts == 8 else 6)   # about one round per halving of the missing count


def test_without_refills_the_first_round_is_not_oversampled():
    b = FakeBuilder(_cfg(refill="none"), _coin)
    out = collect_step(b, b.cfg, 0)
    assert b.calls == [8] and out.metrics["sampling/extra_rounds"] == 0 and b.keep_counts is None


# ---------------------------------------------------------------------------------------------- a tiny run
def _half_mixed(task, responses, examples, **kw):
    """The grader in place of the task's, in process: the benchmark's ``half_mixed`` (prompts whose id hashes odd are
    never solved, the others' responses are right when their text hashes even: with 8 samples about half the groups
    are mixed, whatever a fresh tiny model learns)."""
    oks = [half_mixed(text, ex) for text, ex in zip(responses, examples)]
    return [Verdict(ok, "pass" if ok else "wrong_answer") for ok in oks]


def _tiny(tmp_path, **over):
    base = {"output_dir": str(tmp_path), "run_name": "run", "model": "tiny:1m", "num_train_examples": 256,
            "prompts_per_step": 8, "samples_per_prompt": 8, "max_response_tokens": 6, "micro_batch_size": 64,
            "lr": 1e-3, "total_steps": 4, "save_every": 0, "progress": False, "deterministic": True,
            "max_sampling_rounds": 10}
    return load_config(None, [f"{k}={v}" for k, v in {**base, **over}.items()])


def _metrics(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def half_mixed_grader(monkeypatch):
    monkeypatch.setattr("trainer.rollout.grade_task_batch", _half_mixed)


@pytest.mark.slow   # two tiny training runs
def test_a_tiny_run_at_a_half_keep_rate_samples_one_round_and_trains_the_mixed_groups(tmp_path, half_mixed_grader):
    from trainer.train import train
    extra = {}
    for k in (0, 1):
        run = train(_tiny(tmp_path / f"k{k}", oversample=k), Dist())
        metrics, rows = _metrics(run), read_rollouts(run).to_pylist()
        extra[k] = sum(m["sampling/extra_rounds"] for m in metrics) / len(metrics)
        for m in metrics:
            assert m["sampling/groups_kept"] == 8
            groups: dict = {}   # the step's groups in the order they were sampled (a prompt once per step here)
            for r in rows:
                if r["step"] == m["step"]:
                    groups.setdefault(r["prompt_id"], []).append(r)
            assert all(len(g) == 8 for g in groups.values())
            mixed = [p for p, g in groups.items() if len({r["correct"] for r in g}) == 2]
            trained = [p for p, g in groups.items() if any(r["advantage"] != 0 for r in g)]   # GRPO: 0 only untrained
            assert trained == mixed[:8]   # the verdict-mixed groups, the first ones in loader order
            assert m["sampling/groups_surplus"] == len(groups) - 8 - m["sampling/groups_dropped"] \
                - m["sampling/groups_ungraded"]
            assert m["sampling/unused_share"] == pytest.approx(1 - 64 / (8 * len(groups)))
            assert 0 < m["sampling/keep_rate"] < 1
        print(f"tiny run, oversample={k}: {extra[k]:.2f} extra rounds per step, keep rate "
              f"{metrics[-1]['sampling/keep_rate']:.2f}, unused share "
              f"{sum(m['sampling/unused_share'] for m in metrics) / len(metrics):.2f}")
    assert extra[0] <= 0.5 and 2 <= extra[1] <= 5


@pytest.mark.slow   # three tiny training runs
def test_a_resumed_run_sizes_its_rounds_as_the_uninterrupted_one(tmp_path, half_mixed_grader):
    from trainer.train import train
    whole = train(_tiny(tmp_path / "a", total_steps=4), Dist())
    train(_tiny(tmp_path / "b", total_steps=2), Dist())
    resumed = train(_tiny(tmp_path / "b", total_steps=4), Dist())
    strip = lambda ms: [{k: v for k, v in m.items() if not k.startswith("time/")} for m in ms]  # noqa: E731
    a, b = strip(_metrics(whole)), strip(_metrics(resumed))
    assert a == b
    assert len({m["sampling/keep_rate"] for m in a}) == 4   # the estimate moved, and the resumed run continued it
    wa = load_file(whole / "checkpoints" / "step_000003" / "model.safetensors")
    wb = load_file(resumed / "checkpoints" / "step_000003" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
