"""vLLM scenario for tests/trainer/test_validate.py, in its own interpreter (vLLM binds torch to one thread and seeds the
global RNG when it builds an engine; tests/helpers/vllm_worker.py says why that stays out of pytest's process).

    python tests/helpers/val_vllm_worker.py OUT_DIR POLICY     # writes OUT_DIR/result.json

A training run with engine=vllm (vLLM's CPU build) validates its last step with the engine it trains with; eval.run
then scores that step's checkpoint with a vLLM engine of its own, loaded from the export, in the same dtype.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.helpers.models import TINY_ADDITION  # noqa: E402


def run(out: Path, policy: str) -> dict:
    from eval.config import EvalConfig
    from eval.run import run_eval
    from trainer.train import main
    args = ["--config", str(REPO / "trainer/configs/tiny.yaml"), f"model={policy}", "sft_steps=0", "engine=vllm",
            "lr=1e-4", "total_steps=2", "prompts_per_step=8", "samples_per_prompt=4", "max_response_tokens=24",
            *TINY_ADDITION, "save_every=0", f"output_dir={out}", "run_name=run",
            "progress=false", "val_benchmarks=addition", "val_every=2", "val_n=4", "val_limit=16",
            "max_prompt_tokens=64", "vllm_max_model_len=128"]
    assert main(args) == 0
    run_dir = out / "run"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    ours = [json.loads(line) for line in (run_dir / "validation" / "step_000001" / "addition.jsonl").open()]
    ev = run_eval(EvalConfig(models=[str(run_dir / "checkpoints" / "best")], benchmarks=["addition"], n=4, limit=16,
                             engine="vllm", dtype=ours[0]["settings"]["dtype"], out=str(out / "eval"),
                             progress=False, gpu_memory_utilization=0.1), log=lambda m: None)
    (report,) = ev["reports"]
    theirs = [json.loads(line) for line in (out / "eval" / report["model"] / "addition.jsonl").open()]
    return {"validated": [m["step"] for m in metrics if "val/select" in m], "engine": ours[0]["settings"]["engine"],
            "dtype": ours[0]["settings"]["dtype"], "eval_dtype": theirs[0]["settings"]["dtype"],
            "val_avg": metrics[-1]["val/addition/avg@4"], "eval_avg": report["avg"], "model": report["model"],
            "ours": [(r["problem_id"], r["responses"], r["verdicts"]) for r in ours],
            "theirs": [(r["problem_id"], r["responses"], r["verdicts"]) for r in theirs]}


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    try:
        result = run(out, sys.argv[2])
    except Exception:
        result = {"error": traceback.format_exc()[-4000:]}
    (out / "result.json").write_text(json.dumps(result))
