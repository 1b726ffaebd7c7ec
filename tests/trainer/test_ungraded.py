"""The trainer's rewards come from the grader's verdict; a response the grader could not grade is never a score.

A grader that crashes (``grader_error``) or runs out of its own time (``timeout``) is counted in
``reward/ungraded`` and ``sampling/groups_ungraded``, its group left out of the update (``ungraded=drop_group``)
or scored 0 on request (``ungraded=zero``); dynamic sampling and the records read the verdict, not the shaped
reward.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import TASK_KWARGS
from scoring import rewards
from scoring.verdict import GRADER_ERROR, Verdict
from trainer.config import ConfigError, load_config, validate
from trainer.fsdp import Dist
from trainer.rollout import Rollout
from trainer.sampling import filter_groups, filter_ungraded
from trainer.train import train
from contracts.records import read_rollouts


def _row(group: int, correct: bool, reward: float, verdict: str = "") -> Rollout:
    return Rollout(example_idx=0, prompt_id="p", group=group, sample_idx=0, prompt_ids=[1], response_ids=[2],
                   finish_reason="stop", reward=reward, correct=correct,
                   verdict=verdict or ("pass" if correct else "wrong_answer"))


def test_dynamic_sampling_filters_on_the_verdict_not_the_shaped_reward():
    # group 0: all wrong, overlong shaping spread the rewards (-0.5, 0): DAPO drops it (accuracy has no spread)
    # group 1: one right inside the overlong window (reward 0.7 < 1, still correct), one wrong: kept
    # group 2: both right with different penalties: dropped
    rows = [_row(0, False, -0.5), _row(0, False, 0.0), _row(1, True, 0.7), _row(1, False, 0.0),
            _row(2, True, 1.0), _row(2, True, 0.6)]
    kept, dropped = filter_groups(rows)
    assert [r.group for r in kept] == [1, 1] and dropped == 2


def test_ungraded_groups_are_left_out_or_zeroed_as_asked():
    rows = [_row(0, False, 0.0, GRADER_ERROR), _row(0, True, 1.0), _row(1, False, 0.0, "timeout"),
            _row(1, True, 1.0), _row(2, True, 1.0), _row(2, False, 0.0)]
    cfg = load_config(None, [])
    kept, dropped = filter_ungraded(cfg, rows)
    assert [r.group for r in kept] == [2, 2] and dropped == 2
    cfg = load_config(None, ["ungraded=zero"])
    assert filter_ungraded(cfg, rows) == (rows, 0)
    with pytest.raises(ConfigError, match="config field 'ungraded' must be one of drop_group, zero"):
        validate(load_config(None, ["ungraded=skip"]))


def test_a_crashing_grader_is_a_grader_error_not_a_wrong_answer(monkeypatch):
    def boom(response, example):
        if example["answer"] == "crash":
            raise RuntimeError("worker lost")
        return Verdict(response == example["answer"], "pass" if response == example["answer"] else "wrong_answer")
    monkeypatch.setitem(rewards.GRADERS, "addition", boom)
    out = rewards.grade_task_batch("addition", ["3", "4", "x"], [{"answer": "3"}, {"answer": "5"}, {"answer": "crash"}])
    assert [v.verdict for v in out] == ["pass", "wrong_answer", GRADER_ERROR]
    assert "RuntimeError: worker lost" in out[2].detail
    assert [rewards.reward_of(v) for v in out[:2]] == [1.0, 0.0]


def test_a_sandbox_that_cannot_start_is_a_grader_error(monkeypatch):
    from scoring.sandbox import SandboxError

    def no_sandbox(*a, **k):
        raise SandboxError("user namespaces are disabled")
    monkeypatch.setattr(rewards, "grade_code", no_sandbox)   # the name the code reward calls
    v = rewards.grade_code_example("```python\nprint(1)\n```", {"tests": [{"input": "", "output": "1"}]})
    assert (v.correct, v.verdict) == (False, GRADER_ERROR) and "namespaces" in v.detail


def test_training_counts_ungraded_rows_and_never_trains_on_them(tmp_path, sft_policy_dir, monkeypatch):
    """A grader that crashes on every third prompt: those groups are recorded with their verdict, counted in
    the metrics and get no loss mask; with ungraded=zero the same rows are trained with reward 0."""
    from scoring.tasks import get_task
    task = get_task("addition")

    def flaky(response, example):
        if int(example["id"].rsplit("-", 1)[-1]) % 3 == 0:
            raise OSError("grading worker died")
        ok = task.reward(response, example) > 0
        return Verdict(ok, "pass" if ok else "wrong_answer")
    monkeypatch.setitem(rewards.GRADERS, "addition", flaky)

    def run(name, **extra):
        over = {"output_dir": str(tmp_path), "run_name": name, "model": str(sft_policy_dir), "task": "addition",
                "task_kwargs": json.dumps(TASK_KWARGS), "prompts_per_step": 6, "samples_per_prompt": 4,
                "max_response_tokens": 24, "lr": 1e-4, "total_steps": 2, "progress": False, "save_every": 0,
                "dynamic_sampling": False, **extra}
        run_dir = train(load_config(None, [f"{k}={v}" for k, v in over.items()]), Dist())
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return metrics, read_rollouts(run_dir).to_pylist()

    metrics, rows = run("drop")
    bad = [r for r in rows if r["verdict"] == GRADER_ERROR]
    assert bad and all(int(r["prompt_id"].rsplit("-", 1)[-1]) % 3 == 0 for r in bad)
    assert sum(m["reward/ungraded"] for m in metrics) == len(bad)
    assert sum(m["sampling/groups_ungraded"] for m in metrics) == len(bad) // 4
    assert not any(any(r["loss_mask"]) for r in bad), "an ungraded row was trained"
    assert any(any(r["loss_mask"]) for r in rows if r["verdict"] != GRADER_ERROR)
    graded = [r for r in rows if r["verdict"] != GRADER_ERROR]
    assert all(r["correct"] == (r["verdict"] == "pass") for r in rows)
    for m in metrics:
        step_rows = [r for r in rows if r["step"] == m["step"]]
        assert m["reward/correct_frac"] == pytest.approx(sum(r["correct"] for r in step_rows) / len(step_rows))
    assert graded

    metrics, rows = run("zero", ungraded="zero")
    bad = [r for r in rows if r["verdict"] == GRADER_ERROR]
    assert bad and sum(m["sampling/groups_ungraded"] for m in metrics) == 0
    assert sum(m["reward/ungraded"] for m in metrics) == len(bad)
    assert all(r["reward"] == 0.0 for r in bad)
