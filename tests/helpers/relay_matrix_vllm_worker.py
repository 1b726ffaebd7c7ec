"""The relay matrix over a LoRA run with the vLLM CPU engine (tests/tsanalysis/test_relay_matrix_vllm.py), in its own
interpreter (vLLM binds torch to one thread and seeds the global RNG when it builds an engine, which must not leak
into pytest's process).

    python tests/helpers/relay_matrix_vllm_worker.py OUT_DIR POLICY PROBLEMS     # writes OUT_DIR/result.json

A 3-step LoRA run (rank 4, lr 1e-2, the HF engine) from ``POLICY`` saves its adapter at every step; the matrix runs
over it greedily, once with ``engine=vllm`` (one engine over the base, each checkpoint a ``LoRARequest``) and once
with ``engine=hf`` (each checkpoint's merged model), with the engine's constructions, weight pushes and adapters
counted.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.helpers.models import TINY_ADDITION  # noqa: E402

RANK = 4
STEPS = 3
SAMPLING = ["--n", "2", "--max-tokens", "32", "--temperature", "0", "--seed", "3", "--batch-problems", "2",
            "--cut", "0.5"]


def _lora_run(out: Path, policy: str) -> Path:
    from trainer.config import load_config, validate
    from trainer.fsdp import Dist
    from trainer.train import train

    cfg = load_config(str(REPO / "trainer/configs/tiny.yaml"), [
        f"model={policy}", "sft_steps=0", "engine=hf", f"lora_rank={RANK}", "lr=1e-2", "warmup_steps=0",
        f"total_steps={STEPS}", "prompts_per_step=8", "samples_per_prompt=4", "max_response_tokens=24",
        *TINY_ADDITION, "save_every=1", f"output_dir={out}", "run_name=lora", "progress=false",
        "log_rollouts=false"])
    validate(cfg)
    return train(cfg, Dist())


def _phases(out: Path) -> dict:
    """Every phase file's records, keyed by file name and problem id: the fields that do not name the engine."""
    keep = ("correct", "correct_list", "len", "finish", "prefix_ids", "prefix_len", "early_len", "early_correct")
    return {f"{d.name}/{f.name}": {r["problem_id"]: {k: r[k] for k in keep if k in r}
                                   for r in map(json.loads, f.read_text().splitlines())}
            for d in sorted(p for p in out.iterdir() if p.is_dir()) for f in sorted(d.glob("*.jsonl"))}


def main(out: Path, policy: str, problems: str) -> dict:
    from inference import vllm_engine
    from tsanalysis.cli import main as cli

    run = _lora_run(out / "runs", policy)
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith("step_"))
    counts = {"engines": 0, "update_weights": 0, "adapters": []}
    cls = vllm_engine.VLLMSampler
    init, update, use = cls.__init__, cls.update_weights, cls.use_adapter

    def counted_init(self, *a, **kw):
        counts["engines"] += 1
        counts["engine_kw"] = {k: kw.get(k) for k in ("lora_rank", "sync_weights", "model_path")}
        init(self, *a, **kw)
        counts["lora_config"] = {k: getattr(self.llm.llm_engine.vllm_config.lora_config, k)
                                 for k in ("max_lora_rank", "max_loras")}

    def counted_update(self, *a, **kw):
        counts["update_weights"] += 1
        return update(self, *a, **kw)

    def counted_use(self, name, folder):
        lora_id = use(self, name, folder)
        counts["adapters"].append([name, str(folder), lora_id, sorted(self.llm.llm_engine.list_loras())])
        return lora_id

    cls.__init__, cls.update_weights, cls.use_adapter = counted_init, counted_update, counted_use
    res = {"checkpoints": ckpts, "base": json.loads((run / "checkpoints" / ckpts[0] / "adapter_config.json")
                                                     .read_text())["base_model_name_or_path"]}
    for engine in ("vllm", "hf"):
        dest = out / engine
        code = cli(["relay", "--matrix", str(run), "--benchmarks", "addition", "--problems", problems,
                    "--engine", engine, "--out", str(dest), *SAMPLING])
        assert code == 0, (engine, code)
        settings = json.loads((dest / "settings.json").read_text())
        res[engine] = {"phases": _phases(dest), "loaded": settings["loaded"],
                       "matrix_settings": json.loads((dest / "matrix_settings.json").read_text())}
        if engine == "vllm":
            res["counts"] = dict(counts)
    return res


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    result = main(out, *sys.argv[2:])
    (out / "result.json").write_text(json.dumps(result))
