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

REPO = Path(__file__).resolve().parents[1]
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
