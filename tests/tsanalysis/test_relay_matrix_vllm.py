"""The relay matrix over a LoRA run with the vLLM engine (real vLLM CPU engine, in a subprocess:
tests/helpers/relay_matrix_vllm_worker.py): one engine over the adapters' base, each checkpoint served as its saved
adapter folder (``VLLMSampler.use_adapter``), no weight pushed. Greedy, fp32: every phase file equals the HF
engine's matrix over the merged adapters, token for token."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.files import atomic_write_jsonl
from scoring.tasks import get_task
from tests.conftest import TASK_KWARGS

HERE = Path(__file__).resolve().parents[1]
REPO = HERE.parent
P = 6   # problems
STEPS = ["step_000000", "step_000001", "step_000002"]


@pytest.mark.slow
def test_lora_checkpoints_served_as_adapters_of_one_vllm_engine_match_the_hf_matrix(tmp_path, sft_policy_dir):
    rows = get_task("addition").make_examples(P, seed=4242, **TASK_KWARGS)
    problems = atomic_write_jsonl(tmp_path / "addition_1-2.jsonl", rows)
    res = subprocess.run([sys.executable, str(HERE / "helpers" / "relay_matrix_vllm_worker.py"), str(tmp_path / "w"),
                          str(sft_policy_dir), str(problems)], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    r = json.loads((tmp_path / "w" / "result.json").read_text())
    assert r["checkpoints"] == STEPS and r["base"] == str(Path(sft_policy_dir).resolve())
    # one engine over the base (its own weights: nothing pushed), LoRA on at vLLM's smallest rank above 4
    c = r["counts"]
    assert c["engines"] == 1 and c["update_weights"] == 0
    assert c["engine_kw"] == {"lora_rank": 4, "sync_weights": False, "model_path": r["base"]}
    assert c["lora_config"] == {"max_lora_rank": 8, "max_loras": 1}
    # each checkpoint once, in step order, as its own folder under a new id; the engine holds the current one alone
    run = tmp_path / "w" / "runs" / "lora" / "checkpoints"
    assert c["adapters"] == [[s, str((run / s).resolve()), i + 1, [i + 1]] for i, s in enumerate(STEPS)]
    v, h = r["vllm"], r["hf"]
    assert v["loaded"] == h["loaded"] == STEPS
    assert (v["matrix_settings"]["engine"], v["matrix_settings"]["lora"]) == ("vllm", True)
    assert (h["matrix_settings"]["engine"], h["matrix_settings"]["lora"]) == ("hf", False)
    # every phase file of every checkpoint and pair: the same tokens (prefixes), lengths, finishes and verdicts
    files = ["alone/step_000001.jsonl", "alone/step_000002.jsonl", "prefixes/step_000000.jsonl",
             "prefixes/step_000001.jsonl", "relay/step_000000-to-step_000001.jsonl",
             "relay/step_000000-to-step_000002.jsonl", "relay/step_000001-to-step_000002.jsonl"]
    assert sorted(v["phases"]) == sorted(h["phases"]) == files
    for f in files:
        assert len(v["phases"][f]) == P and v["phases"][f] == h["phases"][f], f
    # the adapters differ in what they generate, so the equality above follows each checkpoint's own adapter (a
    # stale or missing one would give two checkpoints the same samples)
    alone1, alone2 = (v["phases"][f"alone/{s}.jsonl"] for s in STEPS[1:])
    assert [a["len"] for a in alone1.values()] != [a["len"] for a in alone2.values()] \
        or [a["correct"] for a in alone1.values()] != [a["correct"] for a in alone2.values()]
    pre0, pre1 = (v["phases"][f"prefixes/{s}.jsonl"] for s in STEPS[:2])
    assert any(pre0[k]["prefix_ids"] != pre1[k]["prefix_ids"] for k in pre0)
