"""The prepared GPU check (benchmarks/device_check.py, issue 21 item 9): its plan arithmetic against the model's own
parameter count, and a toy run in an environment shaped like the device machine's (no vLLM, no math-verify)."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from benchmarks.device_check import PROBE, QWEN25_MATH_7B, memory_plan

REPO = Path(__file__).resolve().parents[1]


def test_plan_counts_qwen25_math_7b_exactly():
    # 28 layers: Qwen2.5-Math-7B's published parameter count (model card: 7.62B; safetensors index: 7,615,616,512)
    assert memory_plan(QWEN25_MATH_7B, layers=28, tokens=1)["params"] == 7_615_616_512
    plan = memory_plan(QWEN25_MATH_7B, layers=2, tokens=8 * (1024 + 3072))
    assert plan["checkpointed_boundaries"] == 2 * 32768 * 3584 * 2                  # 0.47 GB
    assert plan["layer_recompute"] == 32768 * (3584 * 8 + 18944 * 4) * 2 == 6_845_104_128
    assert round(plan["logit_chunk"] / 1e9, 2) == 3.9


def test_plan_equals_the_built_model():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    spec = PROBE["toy"]
    model = Qwen2ForCausalLM(Qwen2Config(num_hidden_layers=spec["layers"], **spec["shape"]))
    assert memory_plan(spec["shape"], layers=spec["layers"], tokens=1)["params"] == sum(p.numel() for p in model.parameters())


def _device_like_python(tmp_path: Path) -> str:
    """A venv whose packages are this one's minus vLLM, math-verify and evalplus: what the device's python3 lacks."""
    site = Path(sysconfig.get_paths()["purelib"])
    farm = tmp_path / "site"
    farm.mkdir()
    for entry in site.iterdir():
        if entry.name.startswith(("vllm", "math_verify", "evalplus", "__editable__", "thinking_seeds", "_thinking")):
            continue
        (farm / entry.name).symlink_to(entry)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    py = tmp_path / "venv" / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "device_like.pth").write_text(str(farm) + "\n")
    return str(py)


@pytest.mark.slow
def test_toy_check_runs_where_vllm_and_math_verify_are_missing(tmp_path):
    py = _device_like_python(tmp_path)
    out = tmp_path / "check.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([py, "-m", "benchmarks.device_check", "--toy", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["environment"]["vllm_installed"] is False and r["environment"]["cuda"] is False
    mem = r["parts"]["memory"]
    assert mem["forward"] == "flat" and mem["grad_finite"] and mem["tokens"] == 2 * (16 + 48)
    assert mem["grads_bytes"] == mem["plan"]["grads_fp32"]   # fp32 gradients of every parameter, as planned
    step = r["parts"]["step"]
    for alg in ("seeds", "dapo"):
        assert len(step[alg]["step_s"]) == step["params"]["T"], step[alg]   # the second cycle's steps
    assert step["seeds_over_dapo"] > 0
