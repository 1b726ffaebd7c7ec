"""Hub ids, read from a local cache laid out as the hub lays it out (``HF_HOME/hub/models--org--name/`` with
``blobs/``, ``snapshots/<commit>/`` of symlinks into them, ``refs/main``; ``HF_HUB_OFFLINE=1``), through every
command that takes a model, each run as a user runs it (a subprocess, from a folder where ``org/name`` is no path):
``eval.run`` with the HF and the vLLM engine and with two data-parallel engines, ``tsanalysis relay`` between two
ids, a 2-rank ``torchrun`` training run whose per-node download outlasts the collective timeout, and a LoRA run
whose adapters name the hub id and are scored by ``eval.run`` and ``tsanalysis relay`` through the same cache. An id
that is neither cached nor downloadable ends each command with one line (no traceback) on every rank."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TASK_KWARGS

pytestmark = pytest.mark.slow
EARLY, FINAL = "org/tiny", "org/tiny-final"
MISSING = "nobody/not-cached"


def _rev(repo_id: str) -> str:
    return hashlib.sha1(repo_id.encode()).hexdigest()   # 40 hex digits, like a commit hash


def cache_model(hf_home: Path, repo_id: str, model_dir: Path) -> Path:
    """``model_dir``'s files as the hub's cache holds them: content-addressed blobs, a snapshot folder of relative
    symlinks named by the commit, and ``refs/main`` naming that commit. Returns the snapshot folder."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / _rev(repo_id)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for f in sorted(model_dir.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(_rev(repo_id))   # the hub writes it without a newline
    return snapshot


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    """HF_HOME holding two tiny models (different weights) under hub ids; nothing else."""
    from inference.tiny import build_model, build_tokenizer, save_pretrained_atomic
    root = tmp_path_factory.mktemp("hub")
    tokenizer = build_tokenizer()
    for seed, repo_id in enumerate((EARLY, FINAL)):
        local = root / "built" / repo_id.replace("/", "_")
        save_pretrained_atomic(build_model("1m", tokenizer, seed=seed), tokenizer, local)
        cache_model(root / "hf_home", repo_id, local)
    return root / "hf_home"


def _env(hf_home: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                                                              "TRANSFORMERS_CACHE")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", PYTHONPATH=f"{REPO}",
               TOKENIZERS_PARALLELISM="false", **extra)
    return env


def _run(args: list[str], hf_home: Path, cwd: Path, timeout: int = 600, **env) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=_env(hf_home, **env), capture_output=True, text=True, timeout=timeout)


def _ok(res: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    return res


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


EVAL = [sys.executable, "-m", "eval.run", "--benchmarks", "addition", "--n", "2", "--limit", "4", "--max-tokens",
        "12", "--chunk-sequences", "2", "--no-progress"]


def test_eval_run_reads_a_hub_id_with_one_and_two_engines_and_resumes(hub, tmp_path):
    one = tmp_path / "one"
    cmd = EVAL + ["--model", EARLY, "--engine", "hf", "--out", str(one)]
    _ok(_run(cmd, hub, tmp_path))
    path = one / "org__tiny" / "addition.jsonl"
    rows = _rows(path)
    assert len(rows) == 4 and all(len(r["responses"]) == 2 for r in rows)
    assert {r["settings"]["model_path"] for r in rows} == {f"{EARLY}@{_rev(EARLY)}"}
    before = path.read_bytes()
    _ok(_run(cmd, hub, tmp_path))   # the same id again: the recorded model matches, nothing is generated twice
    assert path.read_bytes() == before
    two = tmp_path / "two"
    _ok(_run(EVAL + ["--model", EARLY, "--engine", "hf", "--data-parallel-size", "2", "--out", str(two)], hub,
             tmp_path))
    rows2 = _rows(two / "org__tiny" / "addition.jsonl")
    # each engine process resolved the id to the same snapshot: chunk for chunk the same samples as one engine
    assert [(r["problem_id"], r["responses"]) for r in rows2] == [(r["problem_id"], r["responses"]) for r in rows]


def test_eval_run_with_the_vllm_engine_reads_a_hub_id(hub, tmp_path):
    # before: vLLM got the hub id, saw no folder and save_pretrained the meta-device skeleton
    out = tmp_path / "vllm"
    res = _ok(_run(EVAL + ["--model", EARLY, "--engine", "vllm", "--out", str(out)], hub, tmp_path,
                   VLLM_ENABLE_V1_MULTIPROCESSING="0"))
    rows = _rows(out / "org__tiny" / "addition.jsonl")
    assert len(rows) == 4 and all(len(r["responses"]) == 2 for r in rows)
    assert {r["settings"]["model_path"] for r in rows} == {f"{EARLY}@{_rev(EARLY)}"}
    assert "meta tensor" not in res.stderr


def test_relay_between_two_hub_ids(hub, tmp_path):
    out = tmp_path / "relay"
    _ok(_run([sys.executable, "-m", "tsanalysis", "relay", "--early", EARLY, "--final", FINAL, "--benchmark",
              "addition", "--n", "2", "--limit", "3", "--max-tokens", "12", "--engine", "hf", "--out", str(out)],
             hub, tmp_path))
    settings = json.loads((out / "relay_settings.json").read_text())
    assert settings["early"] == f"{EARLY}@{_rev(EARLY)}" and settings["final"] == f"{FINAL}@{_rev(FINAL)}"
    results = _rows(out / "results.jsonl")
    assert len(results) == 3 and all(len(r["relay_len"]) == len(r["final_len"]) == 2 for r in results)
    assert len(_rows(out / "prefixes.jsonl")) == 3


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
            str(free_port()), *args]


TIMEOUT_S, DELAY_S = 8, 20   # the collective timeout of these runs, and how much longer a download takes


def _train_overrides(out: Path, model: str) -> list[str]:
    kw = {"output_dir": str(out), "run_name": "run", "model": model, "task": "addition",
          "task_kwargs": json.dumps(TASK_KWARGS), "prompts_per_step": 2, "samples_per_prompt": 2,
          "max_response_tokens": 8, "micro_batch_size": 4, "total_steps": 2, "dynamic_sampling": False,
          "save_every": 0, "progress": False}
    return [f"{k}={v}" for k, v in kw.items()]


def _worker(mode: str, hub: Path, tmp_path: Path, overrides: list[str]) -> subprocess.CompletedProcess:
    calls = tmp_path / f"calls-{mode}"
    calls.mkdir()
    spec = {"mode": mode, "collective_timeout_s": TIMEOUT_S, "download_delay_s": DELAY_S, "calls_dir": str(calls),
            "overrides": overrides}
    return _run(_torchrun(str(REPO / "tests" / "helpers" / "hub_worker.py"), json.dumps(spec)), hub, tmp_path,
                OMP_NUM_THREADS="1")


def test_two_rank_training_from_a_hub_id_whose_download_outlasts_the_collective_timeout(hub, tmp_path):
    # the regime: a download taking DELAY_S > TIMEOUT_S while the other rank waits kills a job that waits for it
    # in a collective of the process group (the pattern hub_snapshot used) ...
    _worker("collective", hub, tmp_path, [EARLY])
    met = json.loads((tmp_path / "calls-collective" / "collective_rank1.json").read_text())
    assert met["error"] is not None and met["s"] < DELAY_S, met
    # ... and the trainer, which waits on a group of its own, trains through it
    _ok(_worker("train", hub, tmp_path, _train_overrides(tmp_path / "runs", EARLY)))
    run = tmp_path / "runs" / "run"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1]
    assert sorted(p.name for p in (tmp_path / "calls-train").iterdir()) == ["download_rank0"]   # once per node
    assert f"model: {EARLY}" in (run / "config.yaml").read_text()


def test_an_id_neither_cached_nor_downloadable_is_one_line(hub, tmp_path):
    line = f"{MISSING}: not a local folder, and HF_HUB_OFFLINE=1 but the hub id is not in the local cache"
    cases = {
        "eval": ([sys.executable, "-m", "eval.run", "--model", MISSING, "--benchmarks", "addition", "--out",
                  str(tmp_path / "eval")], 2),   # eval.run's status for every input error
        "relay": ([sys.executable, "-m", "tsanalysis", "relay", "--early", EARLY, "--final", MISSING, "--benchmark",
                   "addition", "--out", str(tmp_path / "relay")], 2),
        "train": ([sys.executable, "-m", "trainer.train", *_train_overrides(tmp_path / "runs", MISSING)], 2),
    }
    for name, (cmd, status) in cases.items():
        res = _run(cmd, hub, tmp_path, timeout=300)
        assert res.returncode == status, (name, res.stderr[-3000:])
        lines = [x for x in res.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and line in lines[0] and str(hub / "hub") in lines[0], (name, res.stderr[-3000:])
    assert not (tmp_path / "eval").exists() and not (tmp_path / "relay").exists()
    # two ranks: the same line on each (local rank 0 met it, the other was told), and no hang
    res = _run(_torchrun("-m", "trainer.train", *_train_overrides(tmp_path / "runs", MISSING)), hub, tmp_path,
               timeout=300, OMP_NUM_THREADS="1")
    assert res.returncode != 0
    for rank in (0, 1):
        assert sum(f"error (rank {rank}): model={MISSING}" in x for x in res.stderr.splitlines()) == 1, res.stderr
    assert "exitcode  : 2" in res.stderr or "exitcode: 2" in res.stderr, res.stderr[-3000:]


def test_a_lora_run_from_a_hub_id_names_it_and_its_adapters_are_scored_through_the_cache(hub, tmp_path):
    """A LoRA run of ``model=org/tiny`` from the cache: its adapters name the hub id (not the snapshot path), and
    ``eval.run`` and ``tsanalysis relay`` read an adapter folder by resolving that id through the same cache."""
    import torch
    from safetensors.torch import load_file
    overrides = [x for x in _train_overrides(tmp_path / "runs", EARLY) if not x.startswith("save_every=")]
    # a random tiny model never adds correctly (every advantage 0): the entropy bonus moves the adapters all the same
    _ok(_run([sys.executable, "-m", "trainer.train", *overrides, "engine=hf", "lora_rank=4", "lr=1e-2",
              "entropy_coef=0.1", "save_every=1"], hub, tmp_path, OMP_NUM_THREADS="1"))
    ckpts = sorted((tmp_path / "runs" / "run" / "checkpoints").glob("step_*"))
    assert [c.name for c in ckpts] == ["step_000000", "step_000001"]
    for c in ckpts:
        adapter = json.loads((c / "adapter_config.json").read_text())
        assert (adapter["base_model_name_or_path"], adapter["r"]) == (EARLY, 4)
        assert (c / "adapter_model.safetensors").is_file() and not (c / "config.json").exists()
        B = [v for k, v in load_file(str(c / "adapter_model.safetensors")).items() if "lora_B" in k]
        assert len(B) == 4 * 7 and any(b.abs().max() > 0 for b in B)   # 4 layers x 7 projections, moved from 0
    early, final = ckpts
    # eval.run: the adapter's base resolved through the cache (the merged model is written into the folder once)
    out = tmp_path / "eval"
    _ok(_run(EVAL + ["--model", str(final), "--engine", "hf", "--out", str(out)], hub, tmp_path, OMP_NUM_THREADS="1"))
    [path] = out.glob("*/addition.jsonl")
    rows = _rows(path)
    assert len(rows) == 4 and all(len(r["responses"]) == 2 for r in rows)
    assert {r["settings"]["model_path"] for r in rows} == {str((final / "merged").resolve())}
    merged = json.loads((final / "merged" / "config.json").read_text())
    assert merged["architectures"] == ["LlamaForCausalLM"]
    # the merged model is the cached base with the adapter folded in: the projections moved, nothing else
    snapshot = hub / "hub" / "models--org--tiny" / "snapshots" / _rev(EARLY)
    base_w, merged_w = load_file(str(snapshot / "model.safetensors")), load_file(str(final / "merged" /
                                                                                       "model.safetensors"))
    assert base_w.keys() == merged_w.keys()
    moved = [k for k in base_w if not base_w[k].float().equal(merged_w[k].float())]
    assert len(moved) == 4 * 7 and all(k.endswith("proj.weight") for k in moved), moved
    adapter = load_file(str(final / "adapter_model.safetensors"))
    for k in moved:   # W + (alpha / r) B A, alpha = 2 r by default: scale 2
        stem = "base_model.model." + k.removesuffix(".weight")
        delta = 2.0 * adapter[f"{stem}.lora_B.weight"].float() @ adapter[f"{stem}.lora_A.weight"].float()
        assert torch.allclose(merged_w[k].float(), base_w[k].float() + delta, atol=1e-6), k
    # tsanalysis relay between the run's two adapter checkpoints
    relay = tmp_path / "relay"
    _ok(_run([sys.executable, "-m", "tsanalysis", "relay", "--early", str(early), "--final", str(final),
              "--benchmark", "addition", "--n", "2", "--limit", "3", "--max-tokens", "12", "--engine", "hf",
              "--out", str(relay)], hub, tmp_path, OMP_NUM_THREADS="1"))
    settings = json.loads((relay / "relay_settings.json").read_text())
    assert (settings["early"], settings["final"]) == (str((early / "merged").resolve()),
                                                      str((final / "merged").resolve()))
    results = _rows(relay / "results.jsonl")
    assert len(results) == 3 and all(len(r["relay_len"]) == len(r["final_len"]) == 2 for r in results)
