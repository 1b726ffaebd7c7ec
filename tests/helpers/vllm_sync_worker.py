"""Scenarios for tests/inference/test_vllm_sync.py: the vLLM weight sync in the regime where it breaks (a bf16 engine over fp32
masters computing in bf16, a warmed model, high learning rates). Each runs in its own interpreter (vLLM binds torch
to one thread and seeds the global RNG when it builds an engine); ``stream_two_ranks`` runs under torchrun.

    python tests/helpers/vllm_sync_worker.py SCENARIO OUT_DIR [ARG]     # writes OUT_DIR/result.json (rank 0)
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from inference.vllm_engine import VLLMSampler  # noqa: E402
from tests.helpers.models import TINY_ADDITION  # noqa: E402

ENGINE_KW = dict(gpu_memory_utilization=0.1, max_model_len=192, enforce_eager=True, max_batch_size=64)
BF16 = torch.bfloat16


def _bf16_state(model) -> dict[str, torch.Tensor]:
    return dict(VLLMSampler.stream_weights(model, "cpu", BF16))


def _full_read_back(sampler, model) -> str | None:
    """Every tensor of the engine against the module's weights cast to bf16 (not the rotating sample)."""
    state = _bf16_state(model)
    return sampler.verify(sampler._runner().get_model(), list(state), state)


def train_bf16(out: Path, policy: str) -> dict:
    """The trainer (``trainer.train.train``, one process) with engine=vllm, dtype=bfloat16 over fp32 masters, from
    the warmed policy at lr 1e-3: every sync is checked (rotating read-back), and after each one the whole engine
    is read back against the module."""
    from inference import make_sampler
    from trainer.config import load_config, validate
    from trainer.fsdp import Dist
    from trainer.train import train

    record: dict = {"updates": [], "full_read_back": [], "sampler": None}

    def builder(model, tokenizer, *, engine, **kw):
        s = make_sampler(model, tokenizer, engine=engine, **kw)
        assert isinstance(s, VLLMSampler), type(s)
        record.update(sampler=s, engine_dtype=s.dtype, master_dtype=str(next(model.parameters()).dtype),
                      layout=list(s._layout), first=s.last_update, first_state=_bf16_state(model))
        record["full_read_back"].append(_full_read_back(s, model))
        real = s.update_weights

        def update_weights(m):
            real(m)
            record["updates"].append(s.last_update)
            record["full_read_back"].append(_full_read_back(s, m))
            record["last_state"] = _bf16_state(m)
        s.update_weights = update_weights
        return s

    steps = 6
    cfg = load_config(str(REPO / "trainer/configs/tiny.yaml"), [
        f"model={policy}", "sft_steps=0", "engine=vllm", "dtype=bfloat16", "master_dtype=float32", "lr=1e-3",
        "warmup_steps=0", f"total_steps={steps}", "prompts_per_step=8", "samples_per_prompt=4",
        "max_response_tokens=24", *TINY_ADDITION, "save_every=0",
        f"output_dir={out}", "run_name=bf16", "progress=false"])
    validate(cfg)
    run_dir = train(cfg, Dist(), sampler_builder=builder)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    first, last = record["first_state"], record["last_state"]
    changed = sum(int((first[k] != last[k]).sum()) for k in first)
    checked = {n for u in [record["first"], *record["updates"]] for n in u["checked"]}
    gaps = [m.get("rollout/sync_logp_gap_max") for m in metrics]
    return {
        "engine_dtype": record["engine_dtype"], "master_dtype": record["master_dtype"],
        "steps": len(metrics), "updated": sum("ppo/grad_norm" in m for m in metrics),
        "syncs": 1 + len(record["updates"]),
        "tensors": record["first"]["tensors"], "layout": len(record["layout"]),
        "checked_per_sync": [record["first"]["tensors_checked"]] + [u["tensors_checked"] for u in record["updates"]],
        "checked_all": sorted(checked) == sorted(record["layout"]),
        "full_read_back": record["full_read_back"],
        "bf16_elements_changed": changed, "elements": sum(t.numel() for t in first.values()),
        "sync_bytes": record["first"]["bytes"],
        "gap_first": record["first"]["probe_logp_diff_max"],
        "gaps": gaps, "tensors_checked_metric": [m.get("rollout/sync_tensors_checked") for m in metrics],
        "gaps_finite": all(g is not None and math.isfinite(g) for g in gaps),
        "logp_diff_max": [m.get("rollout/logp_diff_max") for m in metrics],
    }


def broken(out: Path, policy: str) -> dict:
    """A bf16 engine over the warmed fp32 model computing in bf16, one optimizer step at lr 1e-3 between syncs:
    a sync that skips a tensor and a sync whose engine copy differs in one element are both caught and named; a
    sharpened model (final norm x 8, exactly synced) has a probe gap above the old tolerance and is not refused."""
    import inspect

    import vllm

    from inference import load_policy, make_sampler
    from trainer.fsdp import cast_for_compute
    from trainer.policy import compute_dtype_engines

    model, tok = load_policy(policy)
    cast_for_compute(model, BF16)   # as the trainer builds it: fp32 parameters, bf16 forward
    vl = compute_dtype_engines(make_sampler, BF16)(model, tok, engine="vllm", **ENGINE_KW)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.tensor([[tok.bos_token_id] + tok(f"{a}+{b}={a + b}\n", add_special_tokens=False)["input_ids"]
                        for a, b in ((12, 34), (56, 17), (28, 40), (41, 41))])

    def step():
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()

    def sync() -> str | None:
        try:
            vl.update_weights(model)
        except RuntimeError as exc:
            return str(exc)
        return None

    res = {"sleep_signature": list(inspect.signature(vllm.LLM.sleep).parameters),
           "wake_up_signature": list(inspect.signature(vllm.LLM.wake_up).parameters),
           "engine_dtype": vl.dtype, "first": vl.last_update}
    step()
    res["clean"] = sync()

    # a stream that drops one tensor: its engine copy would stay stale
    dropped = "model.layers.1.mlp.down_proj.weight"
    real_stream = VLLMSampler.stream_weights

    def lossy(m, device, dtype=None):
        for name, t in real_stream(m, device, dtype):
            if name != dropped:
                yield name, t

    step()
    VLLMSampler.stream_weights = staticmethod(lossy)
    res["skipped"] = sync()
    VLLMSampler.stream_weights = staticmethod(real_stream)
    res["after_skip"] = sync()

    # the engine's copy of one fused slice differs by one bf16 ulp in one element after the reload
    target = "model.layers.2.self_attn.k_proj.weight"
    runner = vl._runner()
    real_reload = runner.reload_weights

    def corrupting(**kw):
        real_reload(**kw)
        qkv = runner.get_model().get_parameter("model.layers.2.self_attn.qkv_proj.weight")
        row = vl._layout[target][1]
        qkv.data.view(torch.int16)[row + 3, 5] ^= 1   # the lowest mantissa bit of one element

    step()
    vl._check_cursor = list(vl._layout).index(target)   # the target is in this update's sample
    runner.reload_weights = corrupting
    res["corrupted"] = sync()
    runner.reload_weights = real_reload
    res["after_corruption"] = sync()

    # sharpen: a legitimate weight change that makes the distributions peaked, so bf16 kernel differences between
    # the engine and the trainer show as a larger probe gap; the sync itself is exact and must go through
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    res["sharpened"] = sync()
    res["sharpened_update"] = vl.last_update
    res["sharpened_full_read_back"] = _full_read_back(vl, model)
    return res


def stream_two_ranks(out: Path) -> dict | None:
    """torchrun, 2 ranks, gloo: FSDP2 over fp32 masters computing in bf16 (the trainer's ``shard_model``), after one
    AdamW step at lr 1e-3: ``stream_weights`` casts each shard to bf16 before gathering it."""
    from torch.distributed.tensor import DTensor

    from inference.tiny import build_model, build_tokenizer
    from trainer.fsdp import init_distributed, shard_model, shutdown

    d = init_distributed()
    tok = build_tokenizer()
    model = shard_model(build_model("1m", tok, seed=4), d, param_dtype=BF16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(4, 100, (4, 24), generator=torch.Generator().manual_seed(d.rank))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()

    gathered = []   # (dtype, bytes) of the local shard of every DTensor gathered
    real = DTensor.full_tensor

    def spy(self, *a, **kw):
        local = self.to_local()
        gathered.append((str(local.dtype), local.numel() * local.element_size()))
        return real(self, *a, **kw)

    DTensor.full_tensor = spy
    streamed = list(VLLMSampler.stream_weights(model, "cpu", BF16))
    DTensor.full_tensor = real
    n_gathers = len(gathered)
    reference = {}   # the full fp32 masters, gathered the old way (after the spy is gone)
    for name, t in model.state_dict().items():
        reference[name] = (t.full_tensor() if isinstance(t, DTensor) else t).detach()
    res = {
        "rank": d.rank, "world_size": d.world_size,
        "names": [n for n, _ in streamed],
        "dtypes": sorted({str(t.dtype) for _, t in streamed}),
        "equal": all(torch.equal(t, reference[n].to(BF16)) for n, t in streamed),
        "master_dtypes": sorted({str(t.dtype) for t in reference.values()}),
        "rounding_changed": sum(int((reference[n].to(BF16).float() != reference[n]).sum()) for n, _ in streamed),
        "gathered_dtypes": sorted({g[0] for g in gathered}), "gathers": n_gathers,
        "gathered_local_bytes": sum(g[1] for g in gathered),
        "streamed_bytes": sum(t.numel() * t.element_size() for _, t in streamed),
        "fp32_bytes": sum(reference[n].numel() * 4 for n, _ in streamed),
    }
    results = [None] * d.world_size
    torch.distributed.all_gather_object(results, res)
    shutdown(d)
    return {"ranks": results} if d.is_main else None


SCENARIOS = {"train_bf16": train_bf16, "broken": broken, "stream_two_ranks": stream_two_ranks}

if __name__ == "__main__":
    name, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    result = SCENARIOS[name](out, *sys.argv[3:])
    if result is not None:
        (out / "result.json").write_text(json.dumps(result))
