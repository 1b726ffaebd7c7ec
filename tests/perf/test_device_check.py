"""The prepared GPU check (perf/device_check.py, issue 21 item 9): its plan arithmetic against the model's own
parameter count, and a toy run in an environment shaped like the device machine's (no vLLM, no math-verify)."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from perf.device_check import PROBE, memory_plan, qwen2_config
from trainer.plan import SHAPES, params

REPO = Path(__file__).resolve().parents[2]


def test_plan_counts_the_backbones_exactly():
    # the model cards' 7.62B / 1.78B / 4.02B, to the parameter from each config.json's shapes (7,615,616,512 is
    # also Qwen2.5-7B's safetensors index total / 2 bytes)
    assert params(SHAPES["Qwen/Qwen2.5-Math-7B"]) == 7_615_616_512
    assert params(SHAPES["deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"]) == 1_777_088_000
    assert params(SHAPES["Qwen/Qwen3-4B-Thinking-2507"]) == 4_022_468_096
    plan = memory_plan(PROBE["full"]["shape"], tokens=8 * (1024 + 3072))
    assert plan["boundaries"] == 2 * 32768 * 3584 * 2                               # 0.47 GB
    assert plan["layer_recompute"] == 32768 * (3584 * 16 + 3584 * 8 + 512 * 6 + 18944 * 8)
    assert round(plan["logit_chunk"] / 1e9, 2) == 3.9
    # what FSDP2 adds above the resident fp32 weights and gradients (the fsdp part's activation peak), at the last
    # layer's backward: the root unit's bf16 gather (2 x 2 x 152064 x 3584 + the final norm), the boundaries, both
    # layers' gathers, one layer recomputed, its gradients before the reduce-scatter (bf16 + fp32), the head gradient
    assert plan["fsdp_transient_at"] == "last layer"
    assert plan["root_unsharded"] == 2 * (2 * 152064 * 3584 + 3584)
    parts = ("root_unsharded", "boundaries", "layers_in_flight", "layer_recompute", "layer_grads", "head_grad")
    assert abs(plan["fsdp_transient"] - sum(plan[k] for k in parts)) <= len(parts)
    assert round(plan["fsdp_transient"] / 1e9, 2) == 13.96


@pytest.mark.parametrize("shape", [PROBE["toy"]["shape"], {**SHAPES["Qwen/Qwen3-4B-Thinking-2507"], "layers": 1,
                                                           "hidden": 64, "mlp": 96, "heads": 4, "kv_heads": 2,
                                                           "head_dim": 16, "vocab": 300}])
def test_plan_equals_the_built_model(shape):
    """The plan's parameter count is the model's: a Qwen2 (q/k/v biases, untied head) and a Qwen3 (q/k norms,
    tied embeddings) built from the same shapes."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers import Qwen2ForCausalLM
    if shape.get("qk_norm"):
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                                             intermediate_size=shape["mlp"], num_hidden_layers=shape["layers"],
                                             num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                                             head_dim=shape["head_dim"], tie_word_embeddings=True))
    else:
        model = Qwen2ForCausalLM(qwen2_config(shape))
    assert params(shape) == sum(p.numel() for p in model.parameters())


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
    proc = subprocess.run([py, "-m", "perf.device_check", "--toy", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["environment"]["vllm_installed"] is False and r["environment"]["cuda"] is False
    mem = r["parts"]["memory"]
    assert mem["forward"] == "flat" and mem["grad_finite"] and mem["tokens"] == 2 * (16 + 48)
    assert mem["grads_bytes"] == mem["plan"]["grads_fp32"]   # fp32 gradients of every parameter, as planned
    assert not mem["sharded"] and mem["fsdp_units"] == 0
    assert set(mem["attention_backends"]) == {"cpu/blocks"} and mem["attention_backends"]["cpu/blocks"]
    # the multi-GPU path on one rank: fully_shard on both layers and the root, the flat forward through FSDP's hooks
    fsdp = r["parts"]["fsdp"]
    flat, model = fsdp["flat"], fsdp["model"]
    for probe, forward in ((flat, "flat"), (model, "model")):
        assert probe["sharded"] and probe["fsdp_units"] == PROBE["toy"]["shape"]["layers"] + 1, probe
        assert probe["forward"] == forward and probe["grad_finite"] and probe["tokens"] == mem["tokens"]
        assert probe["grads_bytes"] == probe["plan"]["grads_fp32"]   # the fp32 gradient shards (one rank: all)
    assert flat["attention_backends"] == mem["attention_backends"] and model["attention_backends"] == {}
    assert model["attn_implementation"] == "sdpa"
    # bf16 over fp32 masters: FSDP2's flat forward is the one-process one, and the model's own within bf16 rounding
    assert abs(flat["loss"] - mem["loss"]) <= 1e-6 * abs(mem["loss"])
    assert abs(flat["loss"] - model["loss"]) <= 1e-3 * abs(mem["loss"])
    step = r["parts"]["step"]
    for alg in ("seeds", "dapo"):
        assert len(step[alg]["step_s"]) == step["params"]["T"], step[alg]   # the second cycle's steps
    assert step["seeds_over_dapo"] > 0


def test_the_memory_page_shows_the_plan_of_the_presets_as_they_are():
    """docs/gpu_memory.md's table is perf.gpu_plan's rendering of today's presets: a preset whose budget or
    engine share changes without `python -m perf.gpu_plan --write` fails here."""
    from perf.gpu_plan import BEGIN, END, render
    page = (REPO / "docs" / "gpu_memory.md").read_text()
    assert BEGIN in page and END in page
    assert page[page.index(BEGIN):page.index(END) + len(END)] == render()
    # what the page's prose says of the table
    from perf.gpu_plan import PRESETS, plan
    plans = {k: plan(v) for k, v in PRESETS.items()}
    card = plans["7B"]["card"]
    assert all(p["generation"] < card and p["update_peak"] < card for p in plans.values())   # sleep on: both fit
    assert plans["7B"]["sleep_off"] > card and card - 2 < plans["4B"]["sleep_off"]          # sleep off: they do not


def test_a_child_is_not_started_past_the_checks_time_limit(tmp_path):
    """The check must end within the device's 6 minutes: a child that would start past ``--limit-s`` is not
    started, its part says so, and the JSON is still written (with every part's outcome)."""
    import time
    from perf.device_check import _call, main
    assert _call("perf.device_check:memory_probe", {}, timeout=600, deadline=time.perf_counter() + 1) == {
        "error": "skipped: the check's time limit is reached"}
    out = tmp_path / "check.json"
    assert main(["--toy", "--parts", "fsdp", "--limit-s", "0", "--out", str(out)]) == 1
    fsdp = json.loads(out.read_text())["parts"]["fsdp"]
    assert fsdp["flat"] == fsdp["model"] == {"error": "skipped: the check's time limit is reached"}
