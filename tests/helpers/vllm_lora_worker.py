"""Scenarios for tests/inference/test_vllm_lora.py: LoRA with the vLLM engine, the adapter alone synced each update
(``VLLMSampler``'s LoRA mode). Each runs in its own interpreter (vLLM binds torch to one thread and seeds the global
RNG when it builds an engine, which must not leak into pytest's process).

    python tests/helpers/vllm_lora_worker.py SCENARIO OUT_DIR POLICY     # writes OUT_DIR/result.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from inference.vllm_engine import VLLMSampler, adapter_tensors  # noqa: E402
from tests.helpers.models import TINY_ADDITION  # noqa: E402

ENGINE_KW = dict(gpu_memory_utilization=0.1, max_model_len=192, enforce_eager=True, max_batch_size=64)
RANK = 4


def _prompts(tok) -> list[list[int]]:
    qs = ["12+34=", "7+8=", "100+1=", "55+45=", "3+4=", "999+1=", "20+22=", "61+9="]
    return [[tok.bos_token_id] + tok(q, add_special_tokens=False)["input_ids"] for q in qs]


def _trainer_logprobs(model, tok, prompts, comps) -> list[list[float]]:
    from trainer.policy import response_logprobs
    with torch.no_grad():
        logp, _, mask = response_logprobs(model.eval(), prompts, [c.token_ids for c in comps], pad_id=tok.pad_token_id,
                                          device=torch.device("cpu"), temperature=1.0)
    return [logp[i][mask[i]].tolist() for i in range(len(prompts))]


def _max_diff(comps, ref) -> float:
    return max(abs(a - b) for c, r in zip(comps, ref) for a, b in zip(c.logprobs, r))


def _engine_scores(vl, prompts, comps) -> list[list[float]]:
    """The engine's log-probs (temperature 1, the current adapter) of each completion's tokens after its prompt.
    One request per call: vLLM 0.32 fails prompt log-probs of a batch with a LoRA request (the LoRA logits mapping
    is per request, not per prompt token: vllm-project/vllm#29955, #16668)."""
    params = vl._vllm.SamplingParams(n=1, max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
    outs = [vl.llm.generate([{"prompt_token_ids": p + c.token_ids}], params, use_tqdm=False,
                            lora_request=vl._lora_request)[0] for p, c in zip(prompts, comps)]
    return [[d[t].logprob for d, t in zip(o.prompt_logprobs[len(p):], c.token_ids)]
            for o, p, c in zip(outs, prompts, comps)]


def _summary(update: dict) -> dict:
    return {k: v for k, v in update.items() if k != "checked"}


def sync(out: Path, policy: str) -> dict:
    """Adapters on the warmed policy, an engine over its base: an optimizer step on the adapters (lr 1e-2), then
    the sync sends the adapter alone (a new LoRARequest) and the engine's log-probs follow the trainer's. The exact
    check catches an engine slot that differs in one element, and an adapter loaded under an id the engine already
    holds (vLLM keeps the cached one: why each sync takes a new id)."""
    from vllm.lora.request import LoRARequest

    from inference import load_policy, make_sampler
    from trainer.config import load_config
    from trainer.lora import add_adapters

    model, tok = load_policy(policy)
    cfg = load_config(None, [f"lora_rank={RANK}"])
    model = add_adapters(model, cfg, compute=torch.float32, master=torch.float32, base=policy)
    prompts = _prompts(tok)
    vl = make_sampler(model, tok, engine="vllm", **ENGINE_KW)
    assert isinstance(vl, VLLMSampler) and vl.lora is not None
    res = {"first": _summary(vl.last_update), "lora_kwargs": {
        k: getattr(vl.llm.llm_engine.vllm_config.lora_config, k) for k in ("max_lora_rank", "max_loras")}}
    before = vl.generate(prompts, max_new_tokens=16, temperature=1.0, seed=2, logprobs=True)
    res["first_diff"] = _max_diff(before, _trainer_logprobs(model, tok, prompts, before))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    for p, c in zip(prompts, before):
        ids = torch.tensor([p + c.token_ids])
        model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    stale = _trainer_logprobs(model, tok, prompts, before)
    res["stale_diff"] = _max_diff(before, stale)        # the step moved the policy away from the engine's adapter
    vl.update_weights(model)
    res["update"] = _summary(vl.last_update)
    after = vl.generate(prompts, max_new_tokens=16, temperature=1.0, seed=2, logprobs=True)
    res["synced_diff"] = _max_diff(after, _trainer_logprobs(model, tok, prompts, after))
    # the tokens sampled before the steps, scored by the engine now: moved with the adapter, onto the trainer's
    rescored = _engine_scores(vl, prompts, before)
    res["engine_moved"] = max(abs(a - b) for c, r in zip(before, rescored) for a, b in zip(c.logprobs, r))
    res["rescored_diff"] = max(abs(a - b) for r, t in zip(rescored, stale) for a, b in zip(r, t))
    res["loras"] = sorted(vl.llm.llm_engine.list_loras())
    res["folders"] = sorted(os.listdir(vl._lora_dir))
    state = adapter_tensors(model)
    res["adapter"] = {"tensors": len(state), "numel": sum(t.numel() for t in state.values()),
                      "base_numel": sum(p.numel() for n, p in model.named_parameters() if not p.requires_grad)}
    res["clean_check"] = vl.verify_adapter(adapter_tensors(model, torch.float32))

    # one element of one slice of the engine's slot, changed: named
    layer = vl._runner().get_model().get_submodule("model.layers.1.mlp.gate_up_proj")
    slot = vl._lora_slot(vl._lora_request.lora_int_id)
    saved = layer.lora_b_stacked[1][slot, 0, 7, 2].item()
    layer.lora_b_stacked[1][slot, 0, 7, 2] += 1e-3
    res["corrupted"] = vl.verify_adapter(adapter_tensors(model, torch.float32))
    layer.lora_b_stacked[1][slot, 0, 7, 2] = saved
    res["after_repair"] = vl.verify_adapter(adapter_tensors(model, torch.float32))

    # a new adapter under the id the engine holds: vLLM serves its cached copy, and the check says so
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.add_(0.01)
    newer = adapter_tensors(model, torch.float32)
    folder = out / "same_id"
    from safetensors.torch import save_file
    folder.mkdir()
    save_file(newer, str(folder / "adapter_model.safetensors"))
    vl.lora.save_pretrained(str(folder))
    held = vl._lora_request
    vl.llm.llm_engine.add_lora(LoRARequest(held.lora_name, held.lora_int_id, str(folder)))
    res["same_id"] = vl.verify_adapter(newer)
    vl.update_weights(model)   # the next sync, a new id: the engine has it
    res["next"] = _summary(vl.last_update)
    res["loras_after"] = sorted(vl.llm.llm_engine.list_loras())
    lora_dir = vl._lora_dir
    vl.close()
    res["lora_dir_removed"] = not os.path.exists(lora_dir)
    return res


def train(out: Path, policy: str, *extra: str) -> dict:
    """The trainer (one process) with lora_rank=4 and engine=vllm, 3 steps from the warmed policy: every sync sends
    the adapter alone and the engine samples what the trainer scores (the rollout check). ``extra``: overrides
    (``train_bf16``: a bf16 engine and compute over fp32 adapters)."""
    from inference import make_sampler
    from trainer.config import load_config, validate
    from trainer.fsdp import Dist
    from trainer.train import train as run_train

    record: dict = {"updates": [], "adapters": [], "loras": [], "folders": []}

    def builder(model, tokenizer, *, engine, **kw):
        s = make_sampler(model, tokenizer, engine=engine, **kw)
        assert isinstance(s, VLLMSampler), type(s)
        record.update(first=_summary(s.last_update), engine_dtype=s.dtype)
        record["adapters"].append(adapter_tensors(model))
        real = s.update_weights

        def update_weights(m, **kw):
            real(m, **kw)
            record["updates"].append(_summary(s.last_update))
            record["adapters"].append(adapter_tensors(m))
            record["loras"].append(sorted(s.llm.llm_engine.list_loras()))
            record["folders"].append(sorted(os.listdir(s._lora_dir)))
        s.update_weights = update_weights
        return s

    cfg = load_config(str(REPO / "trainer/configs/tiny.yaml"), [
        f"model={policy}", "sft_steps=0", "engine=vllm", f"lora_rank={RANK}", "lr=1e-2", "warmup_steps=0",
        "total_steps=3", "prompts_per_step=8", "samples_per_prompt=4", "max_response_tokens=24",
        *TINY_ADDITION, "save_every=0", f"output_dir={out}",
        "run_name=lora", "progress=false", *extra])
    validate(cfg)
    run_dir = run_train(cfg, Dist(), sampler_builder=builder)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    adapters = record["adapters"]
    moved = [max((b[k] - a[k]).abs().max().item() for k in a) for a, b in zip(adapters, adapters[1:])]
    return {
        "steps": len(metrics), "engine_dtype": record["engine_dtype"], "first": record["first"],
        "updates": record["updates"], "loras": record["loras"], "folders": record["folders"],
        "adapter_moved": moved,
        "adapter_numel": sum(t.numel() for t in adapters[-1].values()),
        "logp_diff_mean": [m.get("rollout/logp_diff_mean") for m in metrics],
        "logp_diff_max": [m.get("rollout/logp_diff_max") for m in metrics],
        "grad_norm": [m.get("ppo/grad_norm") for m in metrics],
        "reward": [m["reward/mean"] for m in metrics],
        "sync_bytes": [m.get("sync/bytes") for m in metrics],
        "sync_seconds": [m.get("sync/seconds") for m in metrics],
        "tensors_checked": [m.get("rollout/sync_tensors_checked") for m in metrics],
        "gap": [m.get("rollout/sync_logp_gap_max") for m in metrics],
    }


def train_bf16(out: Path, policy: str) -> dict:
    return train(out, policy, "dtype=bfloat16", "master_dtype=float32")


SCENARIOS = {"sync": sync, "train": train, "train_bf16": train_bf16}

if __name__ == "__main__":
    name, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    result = SCENARIOS[name](out, *sys.argv[3:])
    (out / "result.json").write_text(json.dumps(result))
