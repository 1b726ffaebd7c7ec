"""Two nodes (issue "Paper scale at verl's speed", item 7): the HSDP mesh (shard within a node, replicate across
nodes), its gradient against one process, its checkpoints, and the launch checks a multi-node run needs.

Two nodes cannot be had here, so ``THINKING_SEEDS_HSDP_REPLICAS=2`` makes 2 gloo ranks of one machine the mesh that
2 nodes of 1 GPU each get: 2 replicas x 1 shard, every parameter ``(Replicate(), Shard(0))``, its gradient
reduce-scattered within the replica and all-reduced across the two."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.fsdp import HSDP_REPLICAS_ENV, hsdp_shape
from trainer.preflight import check_nodes

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------- the mesh
def test_the_mesh_shards_within_a_node_and_replicates_across_nodes():
    assert hsdp_shape(8, 8) == (1, 8)           # one node: plain FSDP, as before
    assert hsdp_shape(16, 8) == (2, 8)          # 2 x 8: two replicas of an 8-way shard
    assert hsdp_shape(32, 8) == (4, 8)
    assert hsdp_shape(16, 8, "1") == (1, 16)    # the override: shard over all 16 (more memory, more traffic)
    assert hsdp_shape(2, 2, "2") == (2, 1)      # the test's layout: 2 ranks of one machine as 2 replicas
    for world, local, override, text in [(12, 8, None, "WORLD_SIZE=12 is not a multiple of LOCAL_WORLD_SIZE=8"),
                                         (16, 8, "3", f"{HSDP_REPLICAS_ENV}=3 must be a positive divisor"),
                                         (16, 8, "0", "positive divisor"), (16, 8, "two", "positive divisor")]:
        with pytest.raises(ValueError, match=text):
            hsdp_shape(world, local, override)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_hsdp_gradient_equals_one_process_and_its_checkpoint_loads_on_one(tmp_path):
    """On the (2 replicas x 1 shard) mesh: weights read shard by shard from safetensors equal the model's; the
    gradient of the fixed batch and its norm equal one process's within 1e-5 (the all-reduce across replicas sums,
    as the reduce-scatter does: the loss is already divided by the global token count); the DCP checkpoint written
    on the mesh loads on one process with the same weights and AdamW moments, bit for bit."""
    from tests.helpers.rollouts import grads_for
    from inference.tiny import build_model, build_tokenizer
    from trainer.fsdp import Dist, load_sharded
    tok = build_tokenizer()
    build_model("1m", tok, seed=3).save_pretrained(tmp_path / "init")
    single, _ = grads_for(2)
    env = dict(os.environ, PYTHONPATH=f"{REPO}", OMP_NUM_THREADS="1", **{HSDP_REPLICAS_ENV: "2"})
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(free_port()), str(REPO / "tests" / "helpers" / "hsdp_worker.py"), str(tmp_path / "init"),
                          str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    got = torch.load(tmp_path / "hsdp.pt")
    assert got["mesh"] == ([2, 1], ["replicate", "shard"])
    assert all(p == ["Replicate", "Shard0"] for p in got["placements"].values()), got["placements"]
    reference = build_model("1m", tok, seed=3)
    assert all(torch.equal(got["loaded"][n], p) for n, p in reference.named_parameters())
    assert single.keys() == got["grads"].keys()
    gap = max(float((single[k] - got["grads"][k]).abs().max()) for k in single)
    assert gap <= 1e-5, f"HSDP changes the gradient by {gap}"
    norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in single.values()])))
    assert abs(got["norm"] - norm) <= 1e-5 * norm
    # the mesh's checkpoint on one process
    model = build_model("1m", tok, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    load_sharded(model, optimizer, tmp_path / "dcp", Dist())
    assert all(torch.equal(p, got["params"][n]) for n, p in model.named_parameters())
    names = {id(p): n for n, p in model.named_parameters()}
    moments = {names[id(p)]: s for p, s in optimizer.state.items()}
    assert moments.keys() == got["optimizer"].keys()
    for n, s in got["optimizer"].items():
        assert torch.equal(moments[n]["exp_avg"], s["exp_avg"]) and torch.equal(moments[n]["exp_avg_sq"], s["exp_avg_sq"])
        assert float(s["exp_avg"].abs().max()) > 0   # a step was taken: the moments are not their zero init


# -------------------------------------------------------------------------------------------- the checks
TWO_NODES = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "10.0.0.1",
             "NCCL_SOCKET_IFNAME": "ib0", "GLOO_SOCKET_IFNAME": "ib0"}


@pytest.fixture
def network(monkeypatch):
    """This node named ``node1``, resolving through a table the test sets (``hosts``)."""
    import ipaddress
    hosts = {"node1": "10.0.0.2", "localhost": "127.0.0.1"}

    def resolve(name):
        try:
            return str(ipaddress.IPv4Address(name))   # an address resolves to itself, as gethostbyname does
        except ValueError:
            pass
        if name not in hosts:
            raise socket.gaierror(f"unknown host {name}")
        return hosts[name]
    monkeypatch.setattr(socket, "gethostname", lambda: "node1")
    monkeypatch.setattr(socket, "gethostbyname", resolve)
    monkeypatch.setattr(socket, "if_nameindex", lambda: [(1, "lo"), (2, "eth0"), (3, "ib0")])
    return hosts


def test_one_node_needs_nothing(network):
    network["node1"] = "127.0.1.1"   # a loopback hostname does not matter on one node
    assert check_nodes(world_size=1, env={}).status == "ok"
    c = check_nodes(world_size=8, env={"LOCAL_WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1"})
    assert (c.status, c.detail) == ("ok", "one node, FSDP over 8 ranks")


def test_two_nodes_set_up_as_documented_pass(network):
    c = check_nodes(world_size=16, env=TWO_NODES)
    assert c.status == "ok", c.detail
    assert c.detail.startswith("2 nodes x 8 ranks, HSDP, 2 replicas x 8 shards")


@pytest.mark.parametrize("change, expected", [
    ({"MASTER_ADDR": "localhost"}, "MASTER_ADDR=localhost is a loopback address (127.0.0.1)"),
    ({"MASTER_ADDR": "127.0.0.1"}, "--rdzv_endpoint HOST:PORT"),
    ({"MASTER_ADDR": "node0"}, "MASTER_ADDR=node0 does not resolve on this node"),
    ({"MASTER_ADDR": ""}, "MASTER_ADDR is not set"),
    ({HSDP_REPLICAS_ENV: "3"}, f"{HSDP_REPLICAS_ENV}=3 must be a positive divisor of the world size 16"),
    ({"LOCAL_WORLD_SIZE": "6"}, "WORLD_SIZE=16 is not a multiple of LOCAL_WORLD_SIZE=6"),
], ids=["localhost", "127", "unresolved", "unset", "replicas", "uneven"])
def test_what_the_other_nodes_cannot_reach_fails(network, change, expected):
    c = check_nodes(world_size=16, env={**TWO_NODES, **change})
    assert c.status == "fail" and expected in c.detail, c.detail


@pytest.mark.parametrize("address", ["127.0.1.1", None])   # Debian's /etc/hosts line; a name that does not resolve
def test_a_loopback_hostname_fails_unless_gloo_is_told_the_interface(network, address):
    if address is None:
        del network["node1"]
    else:
        network["node1"] = address
    env = {k: v for k, v in TWO_NODES.items() if k != "GLOO_SOCKET_IFNAME"}
    c = check_nodes(world_size=16, env=env)
    assert c.status == "fail" and "this node's hostname node1" in c.detail, c.detail
    assert "set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME) to the interface between the nodes (eth0, ib0)" in c.detail
    assert check_nodes(world_size=16, env=TWO_NODES).status == "ok"   # with it, gloo binds there


def test_unset_interfaces_warn_with_what_to_set(network):
    env = {k: v for k, v in TWO_NODES.items() if not k.endswith("_SOCKET_IFNAME")}
    c = check_nodes(world_size=16, env=env)
    assert c.status == "warn", c.detail
    assert "set NCCL_SOCKET_IFNAME=<interface> GLOO_SOCKET_IFNAME=<interface> (here: eth0, ib0)" in c.detail
    c = check_nodes(world_size=16, env={k: v for k, v in TWO_NODES.items() if k != "NCCL_SOCKET_IFNAME"})
    assert c.status == "warn" and "NCCL_SOCKET_IFNAME unset" in c.detail and "GLOO_SOCKET_IFNAME=<" not in c.detail


def test_a_launch_on_the_second_node_says_what_fails_there(tmp_path, capsys, monkeypatch, network):
    """Rank 8 (the second node's first rank) prints its node's failure itself, before any process group is made:
    rank 0, on the other node, cannot see it."""
    from trainer.train import main
    network["node1"] = "127.0.1.1"
    env = {k: v for k, v in TWO_NODES.items() if k != "GLOO_SOCKET_IFNAME"}
    for k, v in {**env, "RANK": "8", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    argv = [f"output_dir={tmp_path / 'runs'}", "model=tiny:1m", "task=addition", "prompts_per_step=16",
            "samples_per_prompt=2", "max_response_tokens=6", "progress=false"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "error: nodes: this node's hostname node1 resolves to the loopback address 127.0.1.1" in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_training_run_on_the_hsdp_mesh_equals_one_process(tmp_path, sft_policy_dir):
    """The whole trainer (``trainer.train.train``: shard-wise load from the policy's safetensors, rollouts through
    the engine synced from the sharded weights, update, metrics, records, sharded checkpoints) on 2 gloo ranks as
    2 replicas x 1 shard: every metric and per-token record equals the one-process run within 1e-5."""
    from tests.helpers.multirank import _ENV, _one_rank, _overrides, _torchrun, assert_same_run
    one = _one_rank(_overrides(tmp_path / "one", sft_policy_dir))
    res = subprocess.run(_torchrun(_overrides(tmp_path / "hsdp", sft_policy_dir)), cwd=REPO, timeout=900,
                         env={**_ENV, HSDP_REPLICAS_ENV: "2"}, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
    assert "sharding: HSDP, 2 replicas x 1 shards" in res.stderr
    worst = assert_same_run(one, tmp_path / "hsdp" / "run")
    assert worst["per_token"] <= 1e-5


def test_what_two_nodes_buy_is_the_step_models_arithmetic(monkeypatch):
    """docs/recipes.md's 2 x 8 table is ``perf.step_model`` at 8 and at 16 GPUs, term by term, and its link
    numbers are 4 B per parameter each way per all-reduce."""
    import re
    import perf.step_model as sm
    from trainer.plan import SHAPES, params
    page = (REPO / "docs" / "recipes.md").read_text()
    section = page[page.index("## Two nodes"):]
    section = section[:section.index("\n## ")]
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) s \| ([^|]+) s \| ([\d.]+) × \|$", section, flags=re.M)
    assert len(rows) == 5
    for preset, eight, sixteen, speedup in rows:
        cfg = sm.load_preset(preset)
        assert cfg.prompts_per_step % 16 == 0
        totals = []
        for gpus, cell in ((8, eight), (16, sixteen)):
            t = sm.step_time(cfg, gpus=gpus)
            terms = [t.generation_s, t.update_s, t.refresh_s, t.validation_s, t.sync_s]
            expected = " + ".join(f"{x:.1f}" if x else "0" for x in terms) + f" = {t.total_s:.1f}"
            assert cell == expected, (preset, gpus)
            totals.append(t.total_s)
        assert speedup == f"{totals[0] / totals[1]:.2f}"
    P = params(SHAPES["Qwen/Qwen2.5-Math-7B"])
    words = " ".join(section.split())
    assert f"{4 * P / 1e9:.1f} GB each way at 7B" in words and f"{2 * 4 * P / 1e9:.0f} GB each way per step" in words
