"""The whole trainer on two ranks (torchrun, gloo, FSDP2) against one: rollouts, update, metrics, records,
sharded checkpoints, a SIGKILL and resume on 2 and on 1 ranks. The stock HF engine samples on both: every row
carries its own seed (``trainer.rollout.row_seeds``), so both world sizes draw the same rows and every number can
be compared.

Also here: what dynamic sampling refills (M2PO, Thinking Seeds) and LUFFY's traces longer than the budget."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, TASK_KWARGS
from tests.helpers.processes import kill_tree
from contracts.records import read_rollouts
from trainer.config import load_config
from trainer.fsdp import Dist
from trainer.train import train
from tests.helpers.multirank import G, _ENV, _metrics, _one_rank, _overrides, _torchrun, assert_same_run

pytestmark = pytest.mark.slow



def _two_ranks(overrides: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    res = subprocess.run(_torchrun(overrides), cwd=REPO, env=_ENV, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return res



def assert_records_complete(run: Path) -> dict:
    """Every row of a trained group carries every per-token column (finite, one value per token), the rows of
    dropped groups none, and ``tokens/trained`` counts exactly the trained rows' tokens. Returns counts."""
    rows = read_rollouts(run).to_pylist()
    metrics = {m["step"]: m for m in _metrics(run)}
    counts = {"rows": len(rows), "trained_rows": 0}
    for step, m in metrics.items():
        mine = [r for r in rows if r["step"] == step]
        trained = [r for r in mine if any(r["loss_mask"])]
        assert len(trained) == m["sampling/groups_kept"] * G, (step, len(trained), m["sampling/groups_kept"])
        assert m["tokens/trained"] == sum(len(r["response_ids"]) for r in trained), step
        for r in trained:
            L = len(r["response_ids"])
            assert all(r["loss_mask"]) and len(r["loss_mask"]) == L
            for k in ("entropy", "logp_old", "ratio"):
                assert len(r[k]) == L and all(math.isfinite(v) for v in r[k]), (step, k)
        for r in mine:
            if r not in trained:
                assert all(math.isnan(v) for v in r["entropy"]) and not any(r["loss_mask"])
        counts["trained_rows"] += len(trained)
    return counts


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory, sft_policy_dir):
    """The same run on one rank (in this process) and on two (torchrun), uninterrupted."""
    root = tmp_path_factory.mktemp("multirank")
    one = _one_rank(_overrides(root / "one", sft_policy_dir))
    res = _two_ranks(_overrides(root / "two", sft_policy_dir))
    return {"root": root, "one": one, "two": root / "two" / "run", "policy": sft_policy_dir, "stderr": res.stderr}


def test_two_ranks_train_the_same_rows_and_numbers_as_one(reference_runs):
    one, two = reference_runs["one"], reference_runs["two"]
    # the sharded policy trains through the padding-free forward (FSDP's hooks around inference.flat's methods)
    assert "training forward: flat (inference/flat.py)" in reference_runs["stderr"]
    worst = assert_same_run(one, two)
    counts = assert_records_complete(two)
    assert counts == assert_records_complete(one)
    metrics = _metrics(two)
    assert sum("ppo/loss" in m for m in metrics) >= 3, "the warmed policy should update on most steps"
    assert counts["trained_rows"] >= 3 * 4 * G and counts["rows"] >= 4 * 4 * G
    print(f"1 vs 2 ranks: {counts}, worst loss gap {worst['loss']:.2e}, per-token {worst['per_token']:.2e}")
    # the checkpoints written by both world sizes are the same Hugging Face model
    from safetensors.torch import load_file
    wa = load_file(one / "checkpoints" / "step_000003" / "model.safetensors")
    wb = load_file(two / "checkpoints" / "step_000003" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(v.dtype == torch.float32 for v in wb.values())
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) <= 1e-5
    # two ranks wrote one shard file each; every older step kept its model but not its resume state
    ckpts = sorted((two / "checkpoints").iterdir())
    assert [p.name for p in ckpts] == [f"step_{s:06d}" for s in range(4)]
    assert len(list((ckpts[-1] / "trainer_state" / "dcp").glob("*.distcp"))) == 2
    assert all(not (p / "trainer_state").exists() for p in ckpts[:-1])


def test_a_two_rank_run_killed_resumes_on_two_and_on_one_rank(reference_runs):
    root, policy = reference_runs["root"], reference_runs["policy"]
    victim = _overrides(root / "victim", policy, keep_resume_states=4)
    proc = subprocess.Popen(_torchrun(victim), cwd=REPO, env=_ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    ckpt = root / "victim" / "run" / "checkpoints" / "step_000001"
    deadline = time.monotonic() + 900
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    kill_tree(proc.pid)
    proc.wait()
    assert ckpt.exists(), "the run never checkpointed step 1"
    done = sorted(p.name for p in ckpt.parent.iterdir())
    assert "step_000003" not in done, f"killed too late to test resume: {done}"
    shutil.copytree(root / "victim", root / "victim1")

    res = _two_ranks(victim)
    assert "saved on 2 ranks, resumed on 2" in res.stderr
    worst2 = assert_same_run(reference_runs["two"], root / "victim" / "run", tol=1e-6)

    _one_rank(_overrides(root / "victim1", policy, keep_resume_states=4))
    worst1 = assert_same_run(reference_runs["two"], root / "victim1" / "run")
    assert_records_complete(root / "victim1" / "run")
    print(f"killed after {done}; resumed on 2: {worst2}; on 1: {worst1}")
    from safetensors.torch import load_file
    ref = load_file(reference_runs["two"] / "checkpoints" / "step_000003" / "model.safetensors")
    for name, tol in (("victim", 0.0), ("victim1", 1e-5)):
        w = load_file(root / name / "run" / "checkpoints" / "step_000003" / "model.safetensors")
        assert max(float((ref[k] - w[k]).abs().max()) for k in ref) <= tol, name


def test_ranks_that_see_different_output_dirs_stop_with_a_clear_error(tmp_path):
    over = _overrides(tmp_path, Path("unused"), model="tiny:1m", _rank_output_dir=True, _cli=True,
                      num_train_examples=16, save_every=0)
    res = subprocess.run(_torchrun(over), cwd=REPO, env=_ENV, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert "rank 1 (" in res.stderr and "cannot see" in res.stderr and "same output_dir" in res.stderr
    assert res.stderr.count("error (rank ") == 2 and "exitcode  : 2" in res.stderr   # main's message, on each rank
    # no traceback from the trainer (torchrun prints its own summary of the failed children)
    assert "CheckpointError" not in res.stderr and str(REPO / "trainer") not in res.stderr
    assert not (tmp_path / "node0" / "run" / "metrics.jsonl").exists()   # stopped before any step


# ---------------------------------------------------------------------------------------------------------
# what dynamic sampling refills; LUFFY traces longer than the budget (one process)
# ---------------------------------------------------------------------------------------------------------
def _run(tmp_path, policy, **over):
    base = _overrides(tmp_path, policy, save_every=0, micro_batch_size=64, lr=1e-3, prompts_per_step=8,
                      max_sampling_rounds=4, **over)
    cfg = load_config(None, [f"{k}={v}" for k, v in base.items()])
    run = train(cfg, Dist())
    return _metrics(run), read_rollouts(run).to_pylist()


def test_m2po_refills_no_stale_groups_unless_asked_and_then_with_behavior_logprobs(tmp_path, sft_policy_dir):
    metrics, rows = _run(tmp_path / "auto", sft_policy_dir, algorithm="m2po", m2po_staleness=1, total_steps=3)
    assert all(m["sampling/extra_rounds"] == 0 for m in metrics)
    assert {r["variant"] for r in rows} == {"stale"}
    assert any(m["sampling/groups_kept"] < 8 for m in metrics), "no group was dropped: the refill went untested"
    metrics, rows = _run(tmp_path / "fresh", sft_policy_dir, algorithm="m2po", m2po_staleness=1, total_steps=3,
                         refill="fresh")
    fresh = [r for r in rows if r["variant"] == "on_policy" and any(r["loss_mask"])]
    assert fresh and sum(m["sampling/extra_rounds"] for m in metrics) > 0
    for r in fresh:   # behavior policy = the policy of this step: log-probs equal pi_old's, ratio 1 on every token
        assert r["logp_behavior"] == pytest.approx(r["logp_old"], abs=1e-6)
        assert r["ratio"] == pytest.approx([1.0] * len(r["ratio"]), abs=1e-5)


def test_seeded_steps_refill_with_fresh_prompts_only_when_asked(tmp_path, sft_policy_dir):
    over = dict(algorithm="seeds", seed_refresh_interval=3, total_steps=3)
    metrics, rows = _run(tmp_path / "fresh", sft_policy_dir, **over)
    seeded_steps = [m for m in metrics if m["step"] > 0]
    assert any(m["sampling/extra_rounds"] > 0 for m in seeded_steps)
    assert {r["variant"] for r in rows if r["step"] > 0} == {"seed", "on_policy"}   # refills are fresh prompts
    metrics, rows = _run(tmp_path / "none", sft_policy_dir, refill="none", **over)
    assert all(m["sampling/extra_rounds"] == 0 for m in metrics)
    assert {r["variant"] for r in rows if r["step"] > 0} == {"seed"}


def test_luffy_drops_prompts_whose_trace_exceeds_the_budget(tmp_path, sft_policy_dir):
    from scoring.tasks import get_task
    from trainer.data import off_policy_ids
    from inference.tiny import build_tokenizer
    tok = build_tokenizer()
    exs = get_task("addition").make_examples(64, seed=5, **TASK_KWARGS)
    for i, ex in enumerate(exs):   # every third solution padded past the 24-token budget
        if i % 3 == 0:
            ex["solution"] = "x" * 30 + ex["solution"]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(ex) + "\n" for ex in exs))
    too_long = sum(len(off_policy_ids(tok, ex, "solution")) > 24 for ex in exs)
    assert too_long >= 64 // 3
    metrics, rows = _run(tmp_path / "drop", sft_policy_dir, algorithm="luffy", train_file=str(data), total_steps=2)
    assert all(m["data/luffy_prompts_dropped"] == too_long for m in metrics)
    off = [r for r in rows if r["variant"] == "luffy_off"]
    assert off and all(r["finish_reason"] == "stop" and len(r["response_ids"]) <= 24 for r in off)
    metrics, rows = _run(tmp_path / "cut", sft_policy_dir, algorithm="luffy", train_file=str(data), total_steps=2,
                         luffy_long_traces="truncate")
    assert all(m["data/luffy_prompts_dropped"] == 0 for m in metrics)
    assert any(r["variant"] == "luffy_off" and r["finish_reason"] == "length" for r in rows)
