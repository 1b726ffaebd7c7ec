"""Every tensor handed to a collective lives on the rank's device (NCCL refuses CPU tensors; gloo, which the CPU
tests use, accepts them, so the bug only showed at the end of step 0 of a multi-GPU run). ``Dist`` carries the
device; ``trainer.fsdp.check_device`` compares. Checked here on CPU with a Dist whose device is ``meta``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from trainer import fsdp
from trainer.fsdp import Dist, all_reduce_sum, all_reduce_values, check_device

REPO = Path(__file__).resolve().parents[2]
META = Dist(rank=0, world_size=2, device=torch.device("meta"))


def test_a_cpu_tensor_is_refused_on_another_device():
    with pytest.raises(ValueError, match=r"all_reduce_sum got a tensor on cpu, but this rank's device is meta"):
        all_reduce_sum(torch.tensor([1.0, 2.0]), META)
    # one process too: a one-GPU run fails the same way as eight
    with pytest.raises(ValueError, match="device is meta"):
        all_reduce_sum(torch.tensor(1.0), Dist(device=torch.device("meta")))
    check_device(torch.empty(2, device="meta"), META)   # the right device passes


def test_all_reduce_values_builds_its_tensor_on_the_rank_device(monkeypatch):
    seen = []

    def fake_all_reduce(t, op=None):
        seen.append((t.device, t.dtype, op))

    monkeypatch.setattr(fsdp.dist, "all_reduce", fake_all_reduce)
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: ["read"] * self.numel())  # meta holds no values
    assert all_reduce_values([1.5, 2], META) == ["read", "read"]
    all_reduce_values([3.0], META, op="max")
    assert seen == [(torch.device("meta"), torch.float64, fsdp.dist.ReduceOp.SUM),
                    (torch.device("meta"), torch.float64, fsdp.dist.ReduceOp.MAX)]


def test_one_process_values_round_trip():
    assert all_reduce_values([1.5, 2, 7], Dist()) == [1.5, 2.0, 7.0]
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(all_reduce_sum(t, Dist()), t)


def _tensor_without_device(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in
            ("tensor", "zeros", "ones", "full", "empty", "as_tensor") and
            not any(k.arg == "device" for k in node.keywords))


def test_no_trainer_call_hands_a_collective_a_tensor_built_without_a_device():
    """The bug's shape: ``all_reduce_sum(torch.tensor(x), d)``. Every call site in the trainer either passes
    Python numbers to ``all_reduce_values`` or builds its tensor with ``device=``."""
    offenders = []
    for path in sorted((REPO / "trainer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "all_reduce_sum":
                if node.args and _tensor_without_device(node.args[0]):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, f"tensor built without device= handed to all_reduce_sum at {offenders}"
    # and the detector itself finds the bug's shape
    bad = ast.parse("all_reduce_sum(torch.tensor(sum(losses) / len(losses)), d)").body[0].value
    assert _tensor_without_device(bad.args[0])
    good = ast.parse("all_reduce_sum(torch.tensor([1.0], device=d.device), d)").body[0].value
    assert not _tensor_without_device(good.args[0])


def _two_ranks(worker: str, *args: str) -> None:
    import os
    import socket
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(port), str(REPO / "tests" / "helpers" / worker), *args], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=f"{REPO}", OMP_NUM_THREADS="1"),
                         timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]


@pytest.mark.slow   # torchrun, two ranks
def test_tensor_gathers_equal_the_object_gather_on_two_ranks(tmp_path):
    import json
    _two_ranks("collectives_worker.py", str(tmp_path))
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    f32 = [float(x) for x in torch.tensor([-0.1, -1.3, -2.7, 0.1, 0.2, 0.3])]
    want = {"0": [[5, 151_000, 7], "stop", f32[:3], f32[3:]], "1": [[4, 3, 2, 1], "length", None, None],
            "2": [[], "length", [], []], "3": [[9, 9], "length", [None, -0.25], None]}   # None: NaN
    for r in (r0, r1):   # every rank gets every row, as the object gather gave them, bit for bit
        assert r["completions"] == r["reference"] == want
        assert r["row_dtypes"] == ["torch.int32"]
    # the records go to rank 0 only: the other ranks unpickle nothing
    assert r0["records"] == {"10": "record of rank 0", "11": "record of rank 1"} and r1["records"] == {}
    assert (r0["to_main"], r1["to_main"]) == ([0, 10], None)


def test_rollout_rows_as_tensors_send_fewer_bytes_than_a_pickle():
    """A refresh's rows at paper scale (512 rows x 4k tokens, vLLM's float32 log-probs): what the object gather
    pickles and unpickles against the tensor gather's bytes (a benchmark-style print; the byte counts are exact)."""
    import pickle
    import time

    from inference.protocol import Completion
    g = torch.Generator().manual_seed(0)
    rows, T = 512, 4096
    ids = torch.randint(0, 151_000, (rows, T), generator=g, dtype=torch.int32)
    lps = -torch.rand(rows, T, generator=g) * 3
    comps = {i: Completion(a, "length", b, None) for i, (a, b) in enumerate(zip(ids.tolist(), lps.tolist()))}
    t0 = time.perf_counter()
    blob = pickle.dumps(comps)
    back = pickle.loads(blob)
    t_pickle = time.perf_counter() - t0
    t0 = time.perf_counter()
    local = fsdp.all_gather_rows({i: c.token_ids for i, c in comps.items()}, Dist(), dtype=torch.int32)
    local_lp = fsdp.all_gather_rows({i: c.logprobs for i, c in comps.items()}, Dist(), dtype=torch.float32)
    tensor_bytes = sum(v.numel() * v.element_size() for x in (local, local_lp) for v in x.values())
    back2 = {i: (local[i].tolist(), local_lp[i].tolist()) for i in comps}
    t_tensor = time.perf_counter() - t0
    assert back2[7] == (back[7].token_ids, back[7].logprobs)   # lossless: the values are float32 already
    print(f"\n512 rows x 4096 tokens: pickled {len(blob) / 1e6:.1f} MB ({t_pickle:.2f} s dumps+loads), "
          f"as int32/float32 tensors {tensor_bytes / 1e6:.1f} MB ({t_tensor:.2f} s build+tolist)")
    assert tensor_bytes == rows * T * 8
    assert len(blob) > 1.5 * tensor_bytes   # 5-byte ids above 2^16 (3 below) and 9-byte floats, pickled


@pytest.mark.slow   # torchrun, two ranks
def test_the_wait_after_a_long_generation_outlasts_the_process_groups_timeout(tmp_path):
    import json

    from tests.helpers.collectives_worker import LONG_S, PG_TIMEOUT_S
    _two_ranks("collectives_worker.py", str(tmp_path), "patient")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # the process group keeps its short timeout; the patient group waits THINKING_SEEDS_GENERATION_TIMEOUT_MIN=1
    assert r0["timeouts_s"] == r1["timeouts_s"] == [PG_TIMEOUT_S, 60.0]
    # rank 1 generated for LONG_S > the process group's timeout: rank 0 waited it out, and the gather that
    # follows, on the process group, went through
    assert r0["after_patient_wait"] == r1["after_patient_wait"] == [0, 1]
    assert r0["patient_wait_s"] >= LONG_S - 0.5
    # the same wait in a collective of the process group kills the job (the regime the patient group is for)
    assert r0["process_group_wait"] is not None


def test_generation_timeout_env(monkeypatch):
    import datetime
    monkeypatch.delenv(fsdp.GENERATION_TIMEOUT_ENV, raising=False)
    assert fsdp.generation_timeout() == datetime.timedelta(hours=2) > fsdp.COLLECTIVE_TIMEOUT
    monkeypatch.setenv(fsdp.GENERATION_TIMEOUT_ENV, "240")
    assert fsdp.generation_timeout() == datetime.timedelta(hours=4)
    for bad in ("0", "-5", "2h"):
        monkeypatch.setenv(fsdp.GENERATION_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=f"THINKING_SEEDS_GENERATION_TIMEOUT_MIN='{bad}': set it to a positive"):
            fsdp.generation_timeout()


def _spy(monkeypatch, module, calls: list, *names):
    for name in names:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _n=name, _f=real, **k: calls.append(_n) or _f(*a, **k))


def test_the_gathers_after_a_generation_wait_on_the_patient_group_first(monkeypatch):
    """``RolloutBuilder.generate`` (fresh rows, the seeds refresh, seeded continuations) and validation wait for
    every rank on the patient group before they gather on the process group."""
    import trainer.rollout as rollout
    import trainer.validate as validate
    from inference.protocol import Completion

    calls: list = []
    _spy(monkeypatch, rollout, calls, "wait_for_generation", "gather_completions")

    class Sampler:
        def generate(self, prompts, **kw):
            calls.append("generate")
            return [Completion([7] * n, "length") for n in kw["max_new_tokens"]]

    class Cfg:
        temperature, top_p = 1.0, 1.0

    b = object.__new__(rollout.RolloutBuilder)   # only what generate reads
    b.cfg, b.sampler, b.d, b.generated_tokens, b.prefilled_tokens = Cfg(), Sampler(), Dist(), 0, 0
    comps = b.generate([[1, 2], [3]], [2, 3], seeds=[0, 1])
    assert [c.token_ids for c in comps] == [[7, 7], [7, 7, 7]]
    assert calls == ["generate", "wait_for_generation", "gather_completions"]

    calls.clear()
    _spy(monkeypatch, validate, calls, "wait_for_generation", "gather_objects_to_main")
    v = object.__new__(validate.Validator)
    v.d, v.plan, v.sync = Dist(), [], lambda: calls.append("sync")
    v._sample_and_grade = lambda: calls.append("generate") or {}
    v.selection = type("Sel", (), {"value": staticmethod(lambda m: None)})()
    assert set(v(3)) == {"val/seconds"}
    assert calls == ["sync", "generate", "wait_for_generation", "gather_objects_to_main"]
