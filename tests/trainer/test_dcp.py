"""Sharded checkpoints (``trainer/checkpoint.py``) on one process: DCP without a process group, the streamed
Hugging Face export, retention, atomic saves and the errors bad checkpoints give. Several ranks, resharding and
resume of the whole trainer: tests/e2e/test_multirank_train.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer import checkpoint as ckpt
from trainer.fsdp import Dist

REPO = Path(__file__).resolve().parents[2]


def _trained(seed: int = 3):
    """A tiny model and its AdamW after one step on a fixed batch (moments non-zero, step 1)."""
    from inference.tiny import build_model, build_tokenizer
    tok = build_tokenizer()
    model = build_model("1m", tok, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, fused=True)
    ids = torch.arange(5, 40).unsqueeze(0)
    model(ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt, tok


def _save(run_dir, step, model, opt, tok, **kw):
    return ckpt.save_checkpoint(run_dir, step, model=model, optimizer=opt, tokenizer=tok,
                                trainer_state={"step": step, "marker": "x"}, d=Dist(), **kw)


def test_one_process_round_trip_restores_model_and_optimizer_exactly(tmp_path):
    model, opt, tok = _trained()
    path = _save(tmp_path, 7, model, opt, tok)
    assert path == tmp_path / "checkpoints" / "step_000007" and not (path.parent / "step_000007.tmp").exists()
    meta = json.loads((path / "trainer_state" / "meta.json").read_text())
    assert meta == {"format": ckpt.FORMAT, "step": 7, "world_size": 1}
    assert (path / "trainer_state" / "dcp" / ".metadata").is_file()
    assert len(list((path / "trainer_state" / "dcp").glob("*.distcp"))) == 1   # one file per rank

    other, other_opt, _ = _trained(seed=11)    # different weights and moments, overwritten by the load
    assert not torch.equal(other.model.embed_tokens.weight, model.model.embed_tokens.weight)
    state = ckpt.load_checkpoint(path, model=other, optimizer=other_opt, d=Dist())
    assert state == {"step": 7, "marker": "x"}
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    sa, sb = opt.state_dict(), other_opt.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for k in sa["state"]:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(sa["state"][k][key], sb["state"][k][key]), (k, key)
    # the next step from the restored state is the next step of the original, to the bit
    ids = torch.arange(7, 30).unsqueeze(0)
    for m, o in ((model, opt), (other, other_opt)):
        m(ids, labels=ids).loss.backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))


def test_the_export_is_a_hugging_face_model_of_the_master_weights(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model, opt, tok = _trained()
    path = _save(tmp_path, 0, model, opt, tok)
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "trainer_state"} <= names
    loaded = AutoModelForCausalLM.from_pretrained(path)
    assert loaded.dtype == torch.float32 and loaded.config.tie_word_embeddings
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()   # re-tied on load
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    from safetensors.torch import load_file
    assert "lm_head.weight" not in load_file(path / "model.safetensors")   # tied: stored once, as save_pretrained
    assert AutoTokenizer.from_pretrained(path).decode(tok("12+7")["input_ids"]) == "12+7"


def test_an_export_above_the_shard_limit_is_split_with_an_index(tmp_path):
    from transformers import AutoModelForCausalLM
    model, _, tok = _trained()
    out = tmp_path / "export"
    out.mkdir()
    ckpt.write_hf_export(out, model, tok, Dist(), max_shard_bytes=300_000)
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == sum((out / s).stat().st_size for s in shards)
    assert not (out / "model.safetensors").exists() and not list(out.glob("part-*"))
    loaded = AutoModelForCausalLM.from_pretrained(out)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name


def test_retention_keeps_models_and_fewer_resume_states(tmp_path):
    model, opt, tok = _trained()
    for step in range(5):
        _save(tmp_path, step, model, opt, tok, keep=3, keep_resume=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_000002", "step_000003", "step_000004"]
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [3, 4]
    assert not (root / "step_000002" / "trainer_state").exists()
    assert (root / "step_000002" / "model.safetensors").is_file()   # still an evaluable model
    assert ckpt.find_resume_checkpoint(tmp_path, "auto") == root / "step_000004"
    with pytest.raises(ckpt.CheckpointError, match="pruned by keep_resume_states"):
        ckpt.find_resume_checkpoint(tmp_path, str(root / "step_000002"))
    # keep=0: every model stays; only the newest keeps its resume state
    for step in range(5, 8):
        _save(tmp_path, step, model, opt, tok, keep=0, keep_resume=1)
    assert len(list(root.iterdir())) == 6 and [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [7]


def test_a_killed_save_leaves_nothing_resume_would_pick(tmp_path, monkeypatch):
    model, opt, tok = _trained()
    _save(tmp_path, 0, model, opt, tok)

    def killed(*a, **k):
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(ckpt, "write_hf_export", killed)
    with pytest.raises(KeyboardInterrupt):
        _save(tmp_path, 1, model, opt, tok)
    root = tmp_path / "checkpoints"
    assert (root / "step_000001.tmp" / "trainer_state" / "dcp" / ".metadata").is_file()   # shards were written
    assert ckpt.find_resume_checkpoint(tmp_path, "auto") == root / "step_000000"
    ckpt.remove_partial_saves(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["step_000000"]


def _old_format(tmp_path) -> Path:
    """A checkpoint as the trainer wrote it before sharded checkpoints: full optimizer in state.pt, no meta.json."""
    model, opt, tok = _trained()
    path = tmp_path / "run" / "checkpoints" / "step_000003"
    (path / "trainer_state").mkdir(parents=True)
    model.save_pretrained(path)
    torch.save({"step": 3, "optimizer": opt.state_dict()}, path / "trainer_state" / "state.pt")
    return path


def test_checkpoints_of_other_versions_are_refused_with_what_to_do(tmp_path):
    path = _old_format(tmp_path)
    with pytest.raises(ckpt.CheckpointError, match=r"older version of the trainer \(format 1.*model=.*resume=never"):
        ckpt.agree_resume_checkpoint(tmp_path / "run", "auto", Dist())
    (path / "trainer_state" / "meta.json").write_text(json.dumps({"format": 99, "step": 3}))
    with pytest.raises(ckpt.CheckpointError, match="has checkpoint format 99, this trainer reads format 2"):
        ckpt.check_format(path)
    (path / "trainer_state" / "meta.json").write_text("{not json")
    with pytest.raises(ckpt.CheckpointError, match="not a checkpoint description"):
        ckpt.check_format(path)
    (path / "trainer_state" / "meta.json").write_text(json.dumps({"format": 2, "step": 3}))
    with pytest.raises(ckpt.CheckpointError, match=r"incomplete \(no .metadata\)"):
        ckpt.check_format(path)


@pytest.mark.slow
def test_the_cli_reports_an_old_checkpoint_in_one_line(tmp_path):
    _old_format(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "trainer.train", f"output_dir={tmp_path}", "run_name=run",
                          "model=tiny:1m", "total_steps=1", "progress=false", "num_train_examples=16"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "error: " in res.stderr and "older version of the trainer" in res.stderr
    assert "Traceback" not in res.stderr


def test_dcp_failures_leave_as_the_trainers_errors_and_a_ctrl_c_as_an_interrupt():
    # DCP's CheckpointException is a BaseException wrapping what each rank raised: a Ctrl-C during a save once left
    # the trainer as a traceback with exit 1 (tests/trainer/test_launch.py's Ctrl-C test, when the signal landed mid-save)
    import traceback

    from torch.distributed.checkpoint.api import CheckpointException

    from trainer.fsdp import ShardedCheckpointError, _quiet_single_process

    def raising(exc):
        with _quiet_single_process():
            raise CheckpointException("save", {0: (exc, traceback.StackSummary())})

    with pytest.raises(KeyboardInterrupt):
        raising(KeyboardInterrupt())
    with pytest.raises(ShardedCheckpointError, match=r"rank 0: OSError: No space left on device"):
        raising(OSError("No space left\non device"))
