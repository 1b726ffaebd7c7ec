"""What a checkpoint holds besides the sharded state: the Hugging Face export in the compute dtype (``export_dtype``)
over fp32 masters that resume restores exactly, and CUDA RNG states saved and restored per device, so a run saved
with 8 GPUs visible resumes where one is (no GPU here: torch.cuda is monkeypatched)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import TASK_KWARGS
from trainer import checkpoint as ckpt
from trainer.config import ConfigError, load_config
from trainer.fsdp import Dist


# ---------------------------------------------------------------------------------------------------------
# the export's dtype
# ---------------------------------------------------------------------------------------------------------
def _config(out, **extra):
    over = {"output_dir": str(out), "run_name": "run", "model": "tiny:1m", "task": "addition",
            "task_kwargs": json.dumps(TASK_KWARGS), "prompts_per_step": 4, "samples_per_prompt": 4,
            "max_response_tokens": 16, "total_steps": 3, "dtype": "bfloat16", "master_dtype": "float32",
            "lr": 1e-3, "progress": False, "save_every": 1, "keep_checkpoints": 0, "keep_resume_states": 3,
            "dynamic_sampling": False, "deterministic": True, "log_rollouts": False}
    over.update(extra)
    return load_config(None, [f"{k}={v}" for k, v in over.items()])


def _masters(step_dir):
    """The fp32 masters a resume reads from ``trainer_state/`` (DCP), loaded into a fresh model."""
    from inference.tiny import build_model, build_tokenizer
    model = build_model("1m", build_tokenizer(), seed=123)   # other weights: all overwritten by the load
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)
    ckpt.load_checkpoint(step_dir, model=model, optimizer=opt, d=Dist())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    from trainer.train import train
    return train(_config(tmp_path_factory.mktemp("export") / "a"), Dist())


def test_a_bf16_run_exports_bf16_that_transformers_loads(bf16_run):
    from transformers import AutoModelForCausalLM
    step = bf16_run / "checkpoints" / "step_000002"
    files = load_file(step / "model.safetensors")
    assert {t.dtype for t in files.values()} == {torch.bfloat16}
    assert json.loads((step / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = AutoModelForCausalLM.from_pretrained(step)   # dtype from config.json
    assert loaded.dtype == torch.bfloat16
    state = loaded.state_dict()
    assert all(torch.equal(state[k], v) for k, v in files.items())
    # the export is the fp32 masters rounded to bf16, and the masters are not bf16 values: the export lost bits
    # that the resume state kept
    masters = _masters(step)
    assert {v.dtype for v in masters.values()} == {torch.float32}
    assert all(torch.equal(masters[k].to(torch.bfloat16), v) for k, v in files.items())
    off = sum(int((m != m.to(torch.bfloat16).float()).sum()) for m in masters.values())
    assert off > 0.9 * sum(m.numel() for m in masters.values()), off
    assert (step / "model.safetensors").stat().st_size < 0.55 * sum(4 * m.numel() for k, m in masters.items()
                                                                     if k in files)


def test_resume_restores_the_fp32_masters_not_the_export(bf16_run, tmp_path):
    """A copy of the run without its last checkpoint resumes from step 1 and writes step 2's masters bit for bit:
    resuming from the bf16 export (or a master rounded through it) would land elsewhere."""
    from trainer.train import train
    copy = tmp_path / "b"
    shutil.copytree(bf16_run.parent, copy)
    shutil.rmtree(copy / "run" / "checkpoints" / "step_000002")
    train(_config(copy), Dist())
    want, got = _masters(bf16_run / "checkpoints" / "step_000002"), _masters(copy / "run" / "checkpoints" / "step_000002")
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    metrics = [json.loads(x) for x in (copy / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2]


def test_export_dtype_float32_keeps_the_masters_and_is_validated(tmp_path):
    from inference.tiny import build_model, build_tokenizer
    tok = build_tokenizer()
    model = build_model("1m", tok, seed=3)
    opt = torch.optim.AdamW(model.parameters())
    for dtype, want in ((None, torch.float32), (torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16)):
        out = tmp_path / str(dtype)
        path = ckpt.save_checkpoint(out, 0, model=model, optimizer=opt, tokenizer=tok, trainer_state={}, d=Dist(),
                                    export_dtype=dtype)
        files = load_file(path / "model.safetensors")
        assert {t.dtype for t in files.values()} == {want}
        assert json.loads((path / "config.json").read_text())["dtype"] == str(want).removeprefix("torch.")
    assert load_config(None, []).export_dtype == "auto"
    with pytest.raises(ConfigError, match="config field .export_dtype. must be one of auto, float32, bfloat16"):
        load_config(None, ["export_dtype=fp16"])


# ---------------------------------------------------------------------------------------------------------
# CUDA RNG: this device's state, per rank
# ---------------------------------------------------------------------------------------------------------
class FakeCuda:
    """torch.cuda's RNG calls on ``devices`` visible GPUs, the current one being ``current``; every-device calls
    fail as the real ones fail beyond the visible count."""

    def __init__(self, monkeypatch, devices: int, current: int = 0):
        self.devices, self.current, self.set_calls = devices, current, []
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.devices)
        monkeypatch.setattr(torch.cuda, "get_rng_state", self.get)
        monkeypatch.setattr(torch.cuda, "set_rng_state", self.set)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [self.get(i) for i in range(self.devices)])
        monkeypatch.setattr(torch.cuda, "set_rng_state_all",
                            lambda states: [self.set(s, i) for i, s in enumerate(states)])

    def _index(self, device) -> int:
        i = self.current if device == "cuda" else int(device)
        if i >= self.devices:
            raise RuntimeError(f"CUDA error: invalid device ordinal {i} (of {self.devices})")
        return i

    def get(self, device="cuda"):
        return torch.full((16,), self._index(device), dtype=torch.uint8)   # a state that names its device

    def set(self, state, device="cuda"):
        self.set_calls.append((self._index(device), int(state[0])))


def _cpu_state():
    return ckpt.rng_state(Dist()) | {"cuda": None}


def test_a_checkpoint_of_8_devices_restores_on_1_with_its_own_entry(monkeypatch):
    """A state written where 8 GPUs were visible (as ``get_rng_state_all`` wrote it, and as 8 ranks write it now)
    restores on a machine with 1 GPU: the current device gets entry 0, nothing else is touched."""
    saved = _cpu_state() | {"cuda": [torch.full((16,), 10 + i, dtype=torch.uint8) for i in range(8)]}
    cuda = FakeCuda(monkeypatch, devices=1)
    ckpt.set_rng_state(saved, rank=0)
    assert cuda.set_calls == [(0, 10)]
    # rank 3 of a 4-GPU resume takes entry 3 on its own (current) device
    cuda = FakeCuda(monkeypatch, devices=4, current=3)
    ckpt.set_rng_state(saved, rank=3)
    assert cuda.set_calls == [(3, 13)]
    # a rank the checkpoint did not have keeps its seeded state
    cuda = FakeCuda(monkeypatch, devices=16, current=9)
    ckpt.set_rng_state(saved, rank=9)
    assert cuda.set_calls == []


def test_the_saved_cuda_state_is_this_devices_only(monkeypatch):
    cuda = FakeCuda(monkeypatch, devices=8, current=0)
    state = ckpt.rng_state(Dist())
    assert len(state["cuda"]) == 1 and int(state["cuda"][0][0]) == 0   # one entry per rank, not per device
    resumed = FakeCuda(monkeypatch, devices=1)   # on a machine with one GPU
    ckpt.set_rng_state(state, rank=0)
    assert resumed.set_calls == [(0, 0)] and cuda.set_calls == []


def test_no_cuda_state_is_saved_or_restored_without_cuda():
    state = ckpt.rng_state(Dist())
    assert state["cuda"] == [None]
    before = torch.get_rng_state()
    torch.rand(3)
    ckpt.set_rng_state(state | {"torch": before}, rank=0)
    assert torch.equal(torch.get_rng_state(), before)
