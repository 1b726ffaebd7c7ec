"""fp32 master weights with bf16 compute (``master_dtype``, ``trainer.fsdp.shard_model``), on the CPU in bf16.

At lr 1e-6 AdamW's first steps move every weight by ~1e-6, below half a bf16 ulp for any weight of magnitude
above ~2.6e-4: pure bf16 training leaves almost every weight where it was. The runs below go through the trainer's
own update (``shard_model`` -> ``make_optimizer`` -> ``update``, three optimizer steps on a fixed batch) and
compare each one's weight change with an fp32 run's.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import REPO, TASK_KWARGS
from tests.helpers.processes import free_port
from tests.helpers.rollouts import fixed_rollouts
from trainer.config import ConfigError, load_config
from trainer.fsdp import Dist, compute_dtype, shard_model
from trainer.update import make_optimizer, make_scheduler, update

NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def tiny_qwen2(tok, seed: int = 0):
    """A 2-layer Qwen2 (q/k/v biases, grouped-query attention, untied head) from a config."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2ForCausalLM(cfg)


def three_steps(master, compute, d=None, *, forward="auto", micro_batch_size=6, grads=None):
    """Per-step weight changes (a list of 3 flat float32 vectors over all parameters, full tensors); each step's
    gradient is appended to ``grads`` when given."""
    from inference.tiny import build_tokenizer
    d = d or Dist()
    tok = build_tokenizer()
    cfg = load_config(None, [f"dtype={NAMES[compute]}", f"master_dtype={NAMES[master]}", "lr=1e-6",
                             f"train_forward={forward}", f"micro_batch_size={micro_batch_size}"])
    model = shard_model(tiny_qwen2(tok).to(master), d, param_dtype=compute)
    assert compute_dtype(model) == compute
    optimizer = make_optimizer(model, cfg)
    scheduler = make_scheduler(optimizer, cfg)

    def flat(grad=False):
        ts = [p.grad if grad else p for p in model.parameters()]
        return torch.cat([(t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().flatten()
                          for t in ts])

    rows, steps, before = fixed_rollouts(tok), [], flat()
    for _ in range(3):
        update(model, optimizer, scheduler, cfg, rows, d, pad_id=tok.pad_token_id)
        after = flat()
        steps.append(after - before)
        if grads is not None:   # one mini-batch per step: .grad still holds the step's gradient
            grads.append(flat(grad=True))
        before = after
    assert all(p.dtype == master for p in model.parameters()), "the parameters stay in the master dtype"
    assert all(s.dtype == master for st in optimizer.state.values() for s in st.values() if s.dim() > 0)
    return steps


def cosine(a, b) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


@pytest.fixture(scope="module")
def fp32_steps():
    return three_steps(torch.float32, torch.float32)


@pytest.mark.parametrize("forward", ["flat", "model"])
def test_fp32_masters_with_bf16_compute_follow_the_fp32_update(fp32_steps, forward):
    ref = sum(fp32_steps)
    assert float((ref != 0).float().mean()) > 0.9, "fp32: nearly every weight moves at lr 1e-6"
    grads = []
    mixed_steps = three_steps(torch.float32, torch.bfloat16, forward=forward, grads=grads)
    mixed = sum(mixed_steps)
    assert cosine(ref, mixed) >= 0.99, f"bf16 compute + fp32 masters: cosine {cosine(ref, mixed):.4f} to fp32"
    # AdamW's first step moves every weight with a non-zero gradient by lr * sign(g): with fp32 masters it lands
    # (later steps mix in the momentum, which can cancel)
    stuck = int(((grads[0] != 0) & (mixed_steps[0] == 0)).sum())
    assert stuck == 0, f"{stuck} weights with a gradient did not move at the first step with fp32 masters"
    for i, (r, m) in enumerate(zip(fp32_steps, mixed_steps)):
        # and nearly everything fp32 moves does (the rest: bf16 gradients that sum to exactly 0; measured 2e-4)
        frozen = float(((r != 0) & (m == 0)).sum() / (r != 0).sum())
        assert frozen <= 1e-3, f"step {i}: {frozen:.2%} of the weights fp32 moves stay put with fp32 masters"


def test_pure_bf16_leaves_most_weights_frozen(fp32_steps):
    ref = sum(fp32_steps)
    grads = []
    steps = three_steps(torch.bfloat16, torch.bfloat16, grads=grads)
    pure = sum(steps)
    moved = float((pure[ref != 0] != 0).float().mean())
    assert moved < 0.1, f"pure bf16 moved {moved:.1%} of the weights fp32 moves (expected a few %)"
    assert cosine(ref, pure) < 0.5, f"pure bf16 update has cosine {cosine(ref, pure):.3f} to the fp32 one"
    stuck = float(((grads[0] != 0) & (steps[0] == 0)).sum() / (grads[0] != 0).sum())
    assert stuck > 0.9, f"pure bf16: only {stuck:.1%} of the weights with a gradient fail to move at step 1"


def _fsdp_worker(out: str) -> None:   # torchrun entry: the same three steps sharded over the ranks with FSDP2
    from trainer.fsdp import init_distributed, shutdown
    d = init_distributed()
    steps = three_steps(torch.float32, torch.bfloat16, d, forward="model", micro_batch_size=3)
    if d.is_main:
        torch.save(steps, out)
    shutdown(d)


@pytest.mark.slow
def test_fsdp2_mixed_precision_matches_the_one_process_path(tmp_path):
    """FSDP2 (MixedPrecisionPolicy bf16 / fp32 reduce over fp32 shards, 2 ranks, gloo) and the one-process casts
    compute the same update: the two differ only by the order of bf16 gradient sums."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(free_port()), str(REPO / "tests" / "trainer" / "test_precision.py"), str(tmp_path / "steps.pt")],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    sharded = sum(torch.load(tmp_path / "steps.pt"))
    single = sum(three_steps(torch.float32, torch.bfloat16, forward="model", micro_batch_size=6))
    assert cosine(sharded, single) >= 0.999, f"FSDP2 vs one process: cosine {cosine(sharded, single):.5f}"
    assert float(((single != 0) & (sharded == 0)).float().mean()) < 1e-3


def test_hf_engine_samples_in_the_compute_dtype():
    """The HF engine over fp32 masters (``compute_dtype_engines``) samples what the same engine samples from a
    bf16 copy of the weights, and leaves the masters fp32; vLLM is asked for the compute dtype."""
    from inference import make_sampler
    from inference.tiny import build_model, build_tokenizer
    from trainer.policy import ComputeDtypeSampler, compute_dtype_engines
    tok = build_tokenizer()
    model = build_model("1m", tok, seed=1)
    shard_model(model, Dist(), param_dtype=torch.bfloat16)
    sampler = compute_dtype_engines(make_sampler, torch.bfloat16)(model, tok, engine="hf")
    assert isinstance(sampler, ComputeDtypeSampler)
    prompts = [tok("12+7=", add_special_tokens=False)["input_ids"]] * 4
    got = [c.token_ids for c in sampler.generate(prompts, max_new_tokens=12, temperature=1.0, seed=3)]
    bf16 = build_model("1m", tok, seed=1).to(torch.bfloat16)
    want = [c.token_ids for c in make_sampler(bf16, tok, engine="hf").generate(prompts, max_new_tokens=12,
                                                                              temperature=1.0, seed=3)]
    assert got == want
    assert all(p.dtype == torch.float32 and isinstance(p, torch.nn.Parameter) for p in model.parameters())
    seen = {}
    compute_dtype_engines(lambda m, t, *, engine, **kw: seen.update(kw), torch.bfloat16)(model, tok, engine="vllm")
    assert seen["dtype"] == "bfloat16"


def test_a_bf16_run_trains_and_checkpoints_fp32_masters(tmp_path):
    """``train`` with dtype=bfloat16 on the CPU: the checkpoint's export is bf16 (``export_dtype=auto``: the compute
    dtype; the fp32 masters stay in trainer_state/, tests/trainer/test_checkpoint.py), and the HF engine's sampling
    log-probs match the trainer's bf16 forward to bf16 precision (both compute in bf16)."""
    from trainer.train import train
    over = {"output_dir": str(tmp_path), "model": "tiny:1m", "task": "addition", "task_kwargs": json.dumps(TASK_KWARGS),
            "prompts_per_step": 4, "samples_per_prompt": 4, "max_response_tokens": 16, "total_steps": 2,
            "dtype": "bfloat16", "progress": False, "save_every": 0, "dynamic_sampling": False, "lr": 1e-4,
            "behavior_logprobs": "sampler"}
    run = train(load_config(None, [f"{k}={v}" for k, v in over.items()]), Dist())
    weights = load_file(str(run / "checkpoints" / "step_000001" / "model.safetensors"))
    assert weights and {t.dtype for t in weights.values()} == {torch.bfloat16}
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2
    for m in metrics:
        if "rollout/logp_diff_max" in m and m.get("rollout/logp_tokens", 0):
            assert m["rollout/logp_diff_mean"] < 0.05, m


def test_master_dtype_is_validated():
    assert load_config(None, []).master_dtype == "float32"
    with pytest.raises(ConfigError, match="master_dtype=bfloat16 .* needs dtype=bfloat16"):
        load_config(None, ["master_dtype=bfloat16"])
    with pytest.raises(ConfigError, match="config field 'master_dtype' must be one of float32, bfloat16"):
        load_config(None, ["master_dtype=float16"])
    assert load_config(None, ["master_dtype=bfloat16", "dtype=bfloat16"]).master_dtype == "bfloat16"


if __name__ == "__main__":
    _fsdp_worker(sys.argv[1])
