"""The relay matrix (``tsanalysis relay --matrix RUN_DIR``, tsanalysis.relay_matrix) on the real ``addition`` benchmark
with the HF engine, over a run folder of three checkpoints: step 0 an untrained tiny model, step 10 a LoRA adapter
(PEFT's format, as a LoRA run saves its checkpoints) over conftest's supervised warm-up ``sft_policy_dir``, slightly
perturbed, and step 20 that warm-up itself. The bad-input tests need no trained model."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

import inference
from contracts.files import atomic_write_jsonl
from contracts.passk import pass_at_k
from inference.tiny import save_tiny
from scoring.tasks import get_task
from tests.conftest import TASK_KWARGS
from tsanalysis import relay, relay_matrix
from tsanalysis.cli import main
from tsanalysis.config import RelayConfig

N = 4              # samples per problem and set
P = 5              # problems
MAX_TOKENS = 32    # the warm-up's 1-2 digit traces are at most 24 characters (tokens)
SEED = 3
STEPS = (0, 10, 20)
PAIRS = [(0, 10), (0, 20), (10, 20)]


def _ckpt(run, step):
    return run / "checkpoints" / f"step_{step:06d}"


def _lora_checkpoint(out, base):
    """A PEFT adapter folder over ``base``: rank 4 on q/v, A and B random, B scaled down (a model near the base)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base)),
                           LoraConfig(r=4, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.05)
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(out))
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(base)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory, sft_policy_dir):
    root = tmp_path_factory.mktemp("run") / "lora-run"
    save_tiny(_ckpt(root, 0), "1m", seed=0)
    _lora_checkpoint(_ckpt(root, 10), sft_policy_dir)
    shutil.copytree(sft_policy_dir, _ckpt(root, 20))
    (root / "checkpoints" / "best").symlink_to("step_000020")   # the trainer's best link: not a step of its own
    (root / "config.yaml").write_text("lora_rank: 4\n")
    return root


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    rows = get_task("addition").make_examples(P, seed=4242, **TASK_KWARGS)
    return atomic_write_jsonl(tmp_path_factory.mktemp("problems") / "addition_1-2.jsonl", rows), rows


def _flags(problems, out, *extra):
    return ["--benchmarks", "addition", "--problems", str(problems[0]), "--n", str(N), "--max-tokens",
            str(MAX_TOKENS), "--engine", "hf", "--seed", str(SEED), "--batch-problems", "1", "--out", str(out), *extra]


def _jsonl(path):
    return {json.loads(line)["problem_id"]: json.loads(line) for line in path.read_text().splitlines()}


@pytest.fixture(scope="module")
def matrix_run(run, problems, tmp_path_factory):
    """``tsanalysis relay --matrix RUN`` (cut 0.5) as the command runs it, with the checkpoints each call loaded."""
    out = tmp_path_factory.mktemp("matrix") / "o"
    loads, real = [], inference.load_policy
    mp = pytest.MonkeyPatch()
    mp.setattr(inference, "load_policy", lambda path, **kw: loads.append(str(path)) or real(path, **kw))
    try:
        assert main(["relay", "--matrix", str(run), *_flags(problems, out)]) == 0
    finally:
        mp.undo()
    return out, loads


def test_every_ordered_pair_in_step_order_with_its_counts(matrix_run, run, capsys):
    out, loads = matrix_run
    # each checkpoint loaded once, in step order (the adapter as its merged model); best is no step of its own
    assert loads == [str(_ckpt(run, 0)), str(_ckpt(run, 10) / "merged"), str(_ckpt(run, 20))]
    assert sorted(p.name for p in (out / "prefixes").iterdir()) == ["step_000000.jsonl", "step_000010.jsonl"]
    assert sorted(p.name for p in (out / "alone").iterdir()) == ["step_000010.jsonl", "step_000020.jsonl"]
    assert sorted(p.name for p in (out / "relay").iterdir()) == [
        "step_000000-to-step_000010.jsonl", "step_000000-to-step_000020.jsonl", "step_000010-to-step_000020.jsonl"]
    m = pd.read_csv(out / "matrix.csv")
    assert list(m.columns) == ["writer", "continuer", "k", "problems", "relay", "alone", "gain", "gain_low",
                               "gain_high", "p_value"]
    assert list(zip(m["writer"], m["continuer"], m["k"])) == [(w, c, k) for w, c in PAIRS for k in (1, 2, 4)]
    assert (m["problems"] == P).all()
    for (w, c), d in m.groupby(["writer", "continuer"]):
        rel = _jsonl(out / "relay" / f"step_{w:06d}-to-step_{c:06d}.jsonl")
        alone = _jsonl(out / "alone" / f"step_{c:06d}.jsonl")
        pre = _jsonl(out / "prefixes" / f"step_{w:06d}.jsonl")
        assert list(rel) == list(alone) == list(pre) and len(rel) == P
        for pid, r in rel.items():   # the relay row starts with the writer's prefix, within the budget
            assert r["prefix_len"] == [len(x) for x in pre[pid]["prefix_ids"]]
            assert all(pl <= ln <= MAX_TOKENS for pl, ln in zip(r["prefix_len"], r["len"]))
            assert r["correct"] == sum(r["correct_list"]) and alone[pid]["correct"] == sum(alone[pid]["correct_list"])
        rc = np.array([r["correct"] for r in rel.values()])
        ac = np.array([a["correct"] for a in alone.values()])
        for row in d.itertuples():
            assert row.relay == pytest.approx(pass_at_k(N, rc, row.k).mean(), abs=1e-12)
            assert row.alone == pytest.approx(pass_at_k(N, ac, row.k).mean(), abs=1e-12)
            assert row.gain == pytest.approx(row.relay - row.alone, abs=1e-12)
            assert row.gain_low - 1e-12 <= row.gain <= row.gain_high + 1e-12
    k1 = m[m["k"] == 1].set_index(["writer", "continuer"])
    # the warm-up alone solves about 60 % of its samples; the untrained model's garbage as a prefix ruins its answers
    assert k1.loc[(0, 20), "alone"] >= 0.35 and k1.loc[(0, 20), "gain"] <= -0.25
    assert k1.loc[(0, 20), "gain_high"] < 0          # and the interval says so
    s = json.loads((out / "settings.json").read_text())
    assert s["command"] == "relay" and s["args"]["checkpoints"] == list(STEPS) and s["tables"] == ["matrix",
                                                                                                 "matrix_problems"]
    assert s["loaded"] == ["step_000000", "step_000010", "step_000020"] and s["run_dir"] == str(run.resolve())
    # the trainer's relay-weighted seed mixture reads matrix.csv: weight ∝ max(mean pass@1 gain at the lag, 0) + floor
    from trainer.mixture import read_relay_matrix, relay_weights

    g10 = max((k1.loc[(0, 10), "gain"] + k1.loc[(10, 20), "gain"]) / 2, 0.0)   # lag 10; lag 20's gain is < 0
    w = relay_weights(read_relay_matrix(out / "matrix.csv"), [10, 20], floor=0.01)
    assert w.tolist() == pytest.approx([(g10 + 0.01) / (g10 + 0.02), 0.01 / (g10 + 0.02)])


def test_the_first_last_cell_is_figure_2(matrix_run, run, problems, tmp_path):
    """``tsanalysis relay --early step_0 --final step_20`` with the same settings: the same samples, the same numbers."""
    out, _ = matrix_run
    tables, rout, _ = relay.run_relay(RelayConfig(
        early=str(_ckpt(run, 0)), final=str(_ckpt(run, 20)), benchmark="addition", problems=str(problems[0]), n=N,
        max_tokens=MAX_TOKENS, engine="hf", seed=SEED, batch_problems=1, out=tmp_path / "r"), log=lambda m: None)
    assert _jsonl(rout / "prefixes.jsonl") == _jsonl(out / "prefixes" / "step_000000.jsonl")
    res, rel = _jsonl(rout / "results.jsonl"), _jsonl(out / "relay" / "step_000000-to-step_000020.jsonl")
    alone = _jsonl(out / "alone" / "step_000020.jsonl")
    for pid, r in res.items():
        assert r["relay_correct_list"] == rel[pid]["correct_list"] and r["relay_len"] == rel[pid]["len"]
        assert r["final_correct_list"] == alone[pid]["correct_list"] and r["final_len"] == alone[pid]["len"]
    pk = tables["relay_passk"]
    cell = pd.read_parquet(out / "matrix.parquet").query("writer == 0 and continuer == 20").reset_index(drop=True)
    assert cell["k"].tolist() == pk["k"].tolist()
    for mine, theirs in (("relay", "relay"), ("alone", "final"), ("gain", "diff"), ("gain_low", "diff_low"),
                         ("gain_high", "diff_high"), ("p_value", "p_value")):
        assert cell[mine].tolist() == pk[theirs].tolist(), mine


def test_cut_zero_is_the_continuer_alone_and_every_gain_is_zero(run, problems, tmp_path):
    tables, out, _ = relay_matrix.run_relay_matrix(RelayConfig(
        matrix=str(run), benchmark="addition", problems=str(problems[0]), limit=3, n=N, cut=0.0,
        max_tokens=MAX_TOKENS, engine="hf", seed=SEED, batch_problems=2, out=tmp_path / "o"), log=lambda m: None)
    for w, c in PAIRS:
        rel = _jsonl(out / "relay" / f"step_{w:06d}-to-step_{c:06d}.jsonl")
        alone = _jsonl(out / "alone" / f"step_{c:06d}.jsonl")
        for pid, r in rel.items():
            assert r["prefix_len"] == [0] * N
            assert (r["correct_list"], r["len"]) == (alone[pid]["correct_list"], alone[pid]["len"])
    m = tables["matrix"]
    assert len(m) == 3 * 3 and (m["gain"] == 0).all() and (m["gain_low"] == 0).all() and (m["gain_high"] == 0).all()
    alone20 = tables["matrix_problems"].query("writer == 0 and continuer == 20")["alone_correct"]
    assert 0 < alone20.sum() < 3 * N   # the grader separates samples: the check means something


def test_resume_skips_finished_phases_and_extends(matrix_run, run, problems, tmp_path, monkeypatch):
    src, _ = matrix_run
    out = tmp_path / "o"
    shutil.copytree(src, out)
    before = {p.relative_to(out): p.read_text() for p in out.rglob("*.jsonl")}
    first = pd.read_parquet(src / "matrix.parquet")
    cfg = RelayConfig(matrix=str(run), benchmark="addition", problems=str(problems[0]), n=N, max_tokens=MAX_TOKENS,
                      engine="hf", seed=SEED, batch_problems=1, out=str(out))
    # finished: no checkpoint is loaded, the same matrix
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: pytest.fail("model loaded on resume"))
    again, _, settings = relay_matrix.run_relay_matrix(cfg, log=lambda m: None)
    pd.testing.assert_frame_equal(first, again["matrix"])
    assert settings["loaded"] == []
    # a sub-matrix of a finished folder (the checkpoints are not among its settings): read, not sampled again
    sub, _, _ = relay_matrix.run_relay_matrix(RelayConfig(**{**cfg.__dict__, "checkpoints": ["0", "step_000020"]}),
                                              log=lambda m: None)
    pd.testing.assert_frame_equal(sub["matrix"], first.query("writer == 0 and continuer == 20").reset_index(drop=True))
    monkeypatch.undo()
    # interrupted (torn last lines): only the checkpoints with an unfinished phase load, and redo the same samples
    for name in ("relay/step_000000-to-step_000020.jsonl", "prefixes/step_000010.jsonl"):
        lines = (out / name).read_text().splitlines()
        (out / name).write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    loads, real = [], inference.load_policy
    monkeypatch.setattr(inference, "load_policy", lambda path, **kw: loads.append(str(path)) or real(path, **kw))
    again, _, settings = relay_matrix.run_relay_matrix(cfg, log=lambda m: None)
    assert loads == [str(_ckpt(run, 10) / "merged"), str(_ckpt(run, 20))]
    assert settings["loaded"] == ["step_000010", "step_000020"]
    assert {p.relative_to(out): p.read_text() for p in out.rglob("*.jsonl")} == before
    pd.testing.assert_frame_equal(first, again["matrix"])
    with pytest.raises(relay.RelayError, match=r"other settings \(n: recorded 4, now 2\); use another --out"):
        relay_matrix.run_relay_matrix(RelayConfig(**{**cfg.__dict__, "n": 2}), log=lambda m: None)


# ---- bad input: one line, exit 2, before any model loads ----------------------------------------------------------
@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("small") / "run"
    save_tiny(_ckpt(root, 0), "1m", seed=0)
    (root / "checkpoints" / "step_000005").mkdir()   # a step folder without a model (an interrupted save)
    return root


def test_bad_input_is_one_line_exit_2_before_any_model_loads(small_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: pytest.fail("model loaded"))
    two = tmp_path / "two"
    shutil.copytree(small_run, two, symlinks=True)
    shutil.copytree(_ckpt(small_run, 0), _ckpt(two, 30))
    out = tmp_path / "o"
    base = ["--benchmarks", "addition", "--n", "2", "--out", str(out)]
    for argv, msg in (
            (["--matrix", str(small_run)], f"the relay matrix needs at least two checkpoints (a writer and a later "
                                           f"continuer); {small_run} has 1 (checkpoints/step_N holding a model: 0)"),
            (["--matrix", str(two), "--checkpoints", "0,7"], f"--checkpoints: step 7 is not a checkpoint of {two} "
                                                             f"(its checkpoints: 0, 30); choose from those"),
            (["--matrix", str(two), "--checkpoints", "30"], "the relay matrix needs at least two checkpoints (a writer "
                                                            "and a later continuer); --checkpoints names 1"),
            (["--matrix", str(two), "--checkpoints", "0,x"], "--checkpoints 0,x: each must be a step of the run"),
            (["--matrix", str(two), "--checkpoints", "0,step_000000"], "--checkpoints 0,step_000000 names a step twice"),
            (["--matrix", str(tmp_path)], f"--matrix {tmp_path}: no checkpoints/ folder there"),
            (["--matrix", str(two), "--early", "a"], f"--matrix {two} relays every pair of the run's checkpoints: "
                                                     f"give it without --early and --final"),
            (["--early", "a", "--final", "b", "--checkpoints", "1,2"], "--checkpoints chooses the steps of --matrix"),
            (["--matrix", str(two), "--cut", "2"], "--cut must lie in [0, 1], got 2.0")):
        assert main(["relay", *argv, *base]) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {msg}"), (argv, err)
    assert not out.exists()
    with pytest.raises(relay.RelayError, match="a --matrix RUN_DIR config goes to"):
        relay.run_relay(RelayConfig(matrix=str(two), benchmark="addition"))


# ---- pure pieces ---------------------------------------------------------------------------------------------------
def test_gain_table_by_hand_and_equal_to_the_relay_table():
    # two problems, n = 2: relay solves 2/2 and 0/2, alone 1/2 and 0/2
    d = pd.DataFrame({"writer": [0, 0], "continuer": [1, 1], "n": [2, 2], "relay_correct": [2, 0],
                      "alone_correct": [1, 0]})
    t = relay_matrix.gain_table(d)
    assert t["k"].tolist() == [1, 2]
    assert t["relay"].tolist() == [0.5, 0.5] and t["alone"].tolist() == [0.25, 0.5]   # pass@2 of 1/2 is 1
    assert t["gain"].tolist() == [0.25, 0.0]
    rng = np.random.default_rng(0)
    n, early, r, f = np.full(30, 6), rng.integers(0, 7, 30), rng.integers(0, 7, 30), rng.integers(0, 7, 30)
    pk = relay.pass_k_table(n, early, r, f, seed=5)
    mine = relay_matrix.gain_table(pd.DataFrame({"writer": 0, "continuer": 9, "n": n, "relay_correct": r,
                                                 "alone_correct": f}), seed=5)
    for a, b in (("relay", "relay"), ("alone", "final"), ("gain", "diff"), ("gain_low", "diff_low"),
                 ("gain_high", "diff_high")):
        assert mine[a].tolist() == pytest.approx(pk[b].tolist(), abs=1e-15), a
    text = relay_matrix.format_matrix(mine)
    assert "pass@6" in text and "writer" in text


def test_select_checkpoints():
    have = {0: None, 10: None, 20: None}
    assert relay_matrix.select_checkpoints(have, None, run="r") == [0, 10, 20]
    assert relay_matrix.select_checkpoints(have, ["20", "step_000000"], run="r") == [0, 20]
    with pytest.raises(relay.RelayError, match="step 5 is not a checkpoint of r"):
        relay_matrix.select_checkpoints(have, ["0", "5"], run="r")
