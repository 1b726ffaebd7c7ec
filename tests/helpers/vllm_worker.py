"""vLLM scenarios for tests/inference/test_vllm.py, each run in its own interpreter: vLLM binds torch to one thread and seeds
the global RNG when it builds an engine, so it never runs inside the pytest process.

    python tests/helpers/vllm_worker.py SCENARIO[,SCENARIO...] OUT_DIR [POLICY]   # writes OUT_DIR/SCENARIO/result.json

Several scenarios share one interpreter, one after the other (vLLM's import paid once); each builds its own
engines and models, and one that raises writes ``{"error": traceback}`` as its result while the next ones still run.
POLICY (a checkpoint folder) goes to the scenarios that train from it (``POLICY_SCENARIOS``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from inference import load_policy, make_sampler  # noqa: E402
from inference.tiny import build_model, build_tokenizer, save_pretrained_atomic  # noqa: E402
from tests.helpers.models import TINY_ADDITION  # noqa: E402

ENGINE_KW = dict(gpu_memory_utilization=0.1, max_model_len=192, enforce_eager=True, max_batch_size=64)


def _tiny(out: Path):
    tok = build_tokenizer()
    save_pretrained_atomic(build_model("1m", tok, seed=0), tok, out / "tiny")
    return load_policy(str(out / "tiny"))


def _prompts(tok) -> list[list[int]]:
    qs = ["12+34=", "7+8=", "100+1=", "55+45=", "3+4=", "999+1=", "20+22=", "61+9="]
    return [[tok.bos_token_id] + tok(q, add_special_tokens=False)["input_ids"] for q in qs]


def _trainer_logprobs(model, tok, prompts, comps, temperature: float) -> list[list[float]]:
    from trainer.policy import response_logprobs
    with torch.no_grad():
        logp, _, mask = response_logprobs(model, prompts, [c.token_ids for c in comps], pad_id=tok.pad_token_id,
                                          device=torch.device("cpu"), temperature=temperature)
    return [logp[i][mask[i]].tolist() for i in range(len(prompts))]


def _max_diff(comps, ref) -> float:
    return max(abs(a - b) for c, r in zip(comps, ref) for a, b in zip(c.logprobs, r))


def agree(out: Path) -> dict:
    model, tok = _tiny(out)
    prompts = _prompts(tok)
    vl = make_sampler(model, tok, engine="vllm", **ENGINE_KW)
    hf = make_sampler(model, tok, engine="hf")
    greedy_v = vl.generate(prompts, max_new_tokens=24, temperature=0.0)
    greedy_h = hf.generate(prompts, max_new_tokens=24, temperature=0.0)
    # top-k 1 at temperature 1 (and under top-p): the greedy tokens, in either engine
    topk1_v = vl.generate(prompts, max_new_tokens=24, temperature=1.0, top_p=0.9, top_k=1, seed=11)
    topk1_h = hf.generate(prompts, max_new_tokens=24, temperature=1.0, top_p=0.9, top_k=1, seed=11)
    sampled = vl.generate(prompts * 4, max_new_tokens=24, temperature=0.7, seed=5, logprobs=True)
    again = vl.generate(prompts * 4, max_new_tokens=24, temperature=0.7, seed=5)
    ref = _trainer_logprobs(model, tok, prompts * 4, sampled, 0.7)
    ignore = make_sampler(model, tok, engine="vllm", ignore_eos=True, **ENGINE_KW)
    full = ignore.generate(prompts, max_new_tokens=[5, 9, 13, 17, 21, 25, 29, 33], temperature=1.0, seed=1)
    return {
        "greedy_equal": [c.token_ids for c in greedy_v] == [c.token_ids for c in greedy_h],
        "greedy_reasons_equal": [c.finish_reason for c in greedy_v] == [c.finish_reason for c in greedy_h],
        "top_k1_is_greedy": ([c.token_ids for c in topk1_v] == [c.token_ids for c in topk1_h]
                             == [c.token_ids for c in greedy_h]),
        "logp_diff_max": _max_diff(sampled, ref),
        "n_logprobs_match_tokens": all(len(c.logprobs) == len(c.token_ids) for c in sampled),
        "entropies": [c.entropies for c in sampled[:1]],
        "same_seed_same_output": [c.token_ids for c in sampled] == [c.token_ids for c in again],
        "distinct_in_group": len({tuple(c.token_ids) for c in sampled[0::8]}),
        "stop_ids": vl.eos_token_ids,
        "ignore_eos_lengths": [len(c.token_ids) for c in full],
        "ignore_eos_reasons": sorted({c.finish_reason for c in full}),
        "first_sync": vl.last_update,
    }


def sync(out: Path) -> dict:
    """An optimizer step on the trained module, then the in-place sync: the engine's log-probs follow."""
    model, tok = _tiny(out)
    prompts = _prompts(tok)
    vl = make_sampler(model, tok, engine="vllm", **ENGINE_KW)
    before = vl.generate(prompts, max_new_tokens=16, temperature=1.0, seed=2, logprobs=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-2)
    model.train()
    for p, c in zip(prompts, before):
        ids = torch.tensor([p + c.token_ids])
        model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    model.eval()
    stale = _trainer_logprobs(model, tok, prompts, before, 1.0)
    vl.update_weights(model)
    after = vl.generate(prompts, max_new_tokens=16, temperature=1.0, seed=2, logprobs=True)
    return {
        "stale_diff": _max_diff(before, stale),     # the step moved the policy
        "synced_diff": _max_diff(after, _trainer_logprobs(model, tok, prompts, after, 1.0)),
        "update": vl.last_update,
        "n_state": len([k for k in model.state_dict() if k != "lm_head.weight"]),
    }


def dummy_load(out: Path, policy: str) -> dict:
    """A synced engine starts from dummy weights (``start_settings``), which its constructor's sync overwrites: it
    samples what an engine that read the checkpoint (the warmed policy) and was synced the same way samples, token
    for token and log-prob for log-prob. An engine left on its dummy weights (no sync) samples something else."""
    model, tok = load_policy(policy)
    prompts = _prompts(tok)
    engines = {"dummy": {}, "read": {"load_format": "auto"},
               "unsynced": {"load_format": "dummy", "sync_weights": False}}
    res = {}
    for name, kw in engines.items():
        s = make_sampler(model, tok, engine="vllm", **kw, **ENGINE_KW)
        greedy = s.generate(prompts, max_new_tokens=16, temperature=0.0)
        sampled = s.generate(prompts * 2, max_new_tokens=16, temperature=1.0, seed=3, logprobs=True)
        res[name] = {"load_format": str(s.llm.llm_engine.vllm_config.load_config.load_format),
                     "sleep_mode": s.sleep_mode, "greedy": [c.token_ids for c in greedy],
                     "sampled": [c.token_ids for c in sampled], "logprobs": [c.logprobs for c in sampled]}
        s.close()
    return res


def eval_and_relay(out: Path) -> dict:
    """``eval.run`` and the relay on two tiny checkpoints with each engine, greedy: the same verdicts and
    continuations whichever engine decodes."""
    from eval.config import EvalConfig
    from eval.run import run_eval
    from tsanalysis.config import RelayConfig
    from tsanalysis.relay import run_relay
    tok = build_tokenizer()
    for name, seed in (("early", 0), ("final", 1)):
        save_pretrained_atomic(build_model("1m", tok, seed=seed), tok, out / name)
    res = {}
    for engine in ("hf", "vllm"):
        ev = run_eval(EvalConfig(models=[str(out / "final")], benchmarks=["addition"], out=str(out / f"eval_{engine}"),
                                 n=2, temperature=0.0, max_tokens=24, limit=6, engine=engine, progress=False),
                      log=lambda m: None)
        rows = [json.loads(line) for line in (out / f"eval_{engine}" / "final" / "addition.jsonl").open()]
        tables, _, settings = run_relay(RelayConfig(early=str(out / "early"), final=str(out / "final"),
                                                    benchmark="addition", n=2, max_tokens=24, temperature=0.0, limit=4,
                                                    engine=engine, out=out / f"relay_{engine}"), log=lambda m: None)
        relay_rows = [json.loads(line) for line in (out / f"relay_{engine}" / "results.jsonl").open()]
        res[engine] = {"responses": [r["responses"] for r in rows], "verdicts": [r["verdicts"] for r in rows],
                       "settings_engine": settings["args"].get("engine_used"),
                       "relay": [{k: v for k, v in r.items() if not k.endswith("_s")} for r in relay_rows],
                       "reports": len(ev["reports"])}
    return res


def eval_data_parallel(out: Path) -> dict:
    """``eval.run --engine vllm`` with one engine and with two engine processes sharing the chunks, sampling at
    temperature 1: the same result file."""
    from eval.config import EvalConfig
    from eval.run import run_eval
    tok = build_tokenizer()
    save_pretrained_atomic(build_model("1m", tok, seed=0), tok, out / "m")
    res = {}
    for dp in (1, 2):
        ev = run_eval(EvalConfig(models=[str(out / "m")], benchmarks=["addition"], out=str(out / f"dp{dp}"), n=4,
                                 temperature=1.0, max_tokens=16, limit=8, chunk_sequences=8, engine="vllm",
                                 data_parallel_size=dp, progress=False), log=lambda m: None)
        rows = [json.loads(line) for line in (out / f"dp{dp}" / "m" / "addition.jsonl").open()]
        res[dp] = {"ids": [r["problem_id"] for r in rows], "responses": [r["responses"] for r in rows],
                   "verdicts": [r["verdicts"] for r in rows], "avg": ev["reports"][0]["avg"]}
    return res


TRAIN_RUNS = {   # name -> overrides; each trains 3 steps from the warmed policy at a high learning rate
    "dapo": [],
    "seeds": ["algorithm=seeds", "seed_refresh_interval=2", "seed_ratio=0.5"],
    "seeds_sampler": ["algorithm=seeds", "seed_refresh_interval=2", "behavior_logprobs=sampler"],
    # refill=fresh: dynamic sampling adds fresh groups to the stale batch, whose tokens the rollout check reads
    "m2po": ["algorithm=m2po", "m2po_staleness=1", "refill=fresh"],
}


def train_runs(out: Path, policy: str) -> dict:
    """Whole trainer runs with engine=vllm: every step's rollout check, and the run's outputs."""
    from trainer.train import main
    res = {}
    for name, extra in TRAIN_RUNS.items():
        args = ["--config", str(Path(__file__).resolve().parents[2] / "trainer/configs/tiny.yaml"),
                f"model={policy}", "sft_steps=0", "engine=vllm", "lr=2e-3", "total_steps=3", "prompts_per_step=8",
                "samples_per_prompt=4", "max_response_tokens=24", *TINY_ADDITION,
                "save_every=0", f"output_dir={out / name}", f"run_name={name}", "progress=false", *extra]
        assert main(args) == 0
        metrics = [json.loads(line) for line in (out / name / name / "metrics.jsonl").open()]
        res[name] = {"steps": len(metrics),
                     "logp_diff_mean": [m.get("rollout/logp_diff_mean") for m in metrics],
                     "logp_diff_max": [m.get("rollout/logp_diff_max") for m in metrics],
                     "logp_tokens": [m.get("rollout/logp_tokens") for m in metrics],
                     "reward": [m["reward/mean"] for m in metrics],
                     "grad_norm": [m.get("ppo/grad_norm") for m in metrics],
                     "rollout_files": len(list((out / name / name / "rollouts").glob("*.parquet")))}
    return res


SCENARIOS = {"train_runs": train_runs, "agree": agree, "sync": sync, "dummy_load": dummy_load,
             "eval_and_relay": eval_and_relay, "eval_data_parallel": eval_data_parallel}
POLICY_SCENARIOS = {"train_runs", "dummy_load"}

if __name__ == "__main__":
    import traceback
    names, out, policy = sys.argv[1].split(","), Path(sys.argv[2]), sys.argv[3:]
    import time
    for name in names:
        (out / name).mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        try:
            result = SCENARIOS[name](out / name, *(policy if name in POLICY_SCENARIOS else []))
        except Exception:
            result = {"error": traceback.format_exc()[-4000:]}
        result["seconds"] = time.perf_counter() - t0   # where the module's time goes (read by hand; no assertion)
        (out / name / "result.json").write_text(json.dumps(result))
