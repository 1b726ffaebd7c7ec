"""Relay inference (tsanalysis.relay) on the real ``addition`` benchmark of ``scoring.benchmarks``, graded by the task's
reward: the early checkpoint is an untrained tiny model, the final one the supervised warm-up of conftest's
``sft_policy_dir`` (the same 1m model and tokenizer after a short ``trainer.sft`` warm-up on 1-2 digit addition)."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

import inference
import scoring.tasks.addition as addition
from tests.conftest import TASK_KWARGS
from contracts.files import atomic_write_jsonl
from contracts.locks import hold, lock_file
from contracts.passk import pass_at_k
from inference.tiny import build_tokenizer, save_tiny
from scoring.tasks import get_task
from tsanalysis import relay
from tsanalysis.cli import main
from tsanalysis.config import RelayConfig

N = 8              # samples per problem and set
P = 6              # problems
MAX_TOKENS = 32    # the warm-up's 1-2 digit traces are at most 24 characters (tokens)
EOS = 2            # <eos> id of the tiny tokenizer


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory, sft_policy_dir):
    """(early, final): a random 1m model (seed 0, the warm-up's own initialisation) and the warm-up."""
    return save_tiny(tmp_path_factory.mktemp("ckpt") / "random", "1m", seed=0), sft_policy_dir


@pytest.fixture(scope="module")
def problems(tmp_path_factory):
    """P held-out problems of the warm-up's difficulty, as a ``--problems`` file for the addition benchmark."""
    rows = get_task("addition").make_examples(P, seed=4242, **TASK_KWARGS)
    return atomic_write_jsonl(tmp_path_factory.mktemp("problems") / "addition_1-2.jsonl", rows), rows


def _run(ckpts, problems, out, **kw):
    args = dict(early=str(ckpts[0]), final=str(ckpts[1]), benchmark="addition", problems=str(problems[0]), n=N,
                cut=0.5, max_tokens=MAX_TOKENS, seed=3, engine="hf", out=out, batch_problems=1)
    args.update(kw)
    return relay.run_relay(RelayConfig(**args), log=lambda s: None)


def _jsonl(path):
    return {json.loads(line)["problem_id"]: json.loads(line) for line in path.read_text().splitlines()}


@pytest.fixture(scope="module")
def relay_run(ckpts, problems, tmp_path_factory):
    """One relay run (cut 0.5, per-problem seeds) shared by the tests that only read it, with every call of the
    addition reward recorded (response text, gold, reward) in the order the relay graded them."""
    graded = []
    real = addition.reward

    def spy(response, example):
        r = real(response, example)
        graded.append((response, example["answer"], r))
        return r

    mp = pytest.MonkeyPatch()
    mp.setattr(addition, "reward", spy)
    try:
        tables, out, settings = _run(ckpts, problems, tmp_path_factory.mktemp("relay") / "o")
    finally:
        mp.undo()
    return tables, out, settings, graded


def test_relay_grades_with_the_addition_reward(relay_run, problems):
    """Early phase: P x N responses; final phase per problem: N relay then N final-only responses. Every verdict
    in results.jsonl is the task reward of a response the checkpoints wrote."""
    tables, out, _, graded = relay_run
    rows = {r["id"]: r for r in problems[1]}
    pre, res = _jsonl(out / "prefixes.jsonl"), _jsonl(out / "results.jsonl")
    assert list(res) == list(rows) and len(graded) == 3 * P * N
    early, final_phase = graded[:P * N], graded[P * N:]
    tok = build_tokenizer()
    for j, (pid, row) in enumerate(rows.items()):
        e = early[j * N:(j + 1) * N]
        assert [g for _, g, _ in e] == [row["answer"]] * N
        assert pre[pid]["early_correct"] == [r > 0 for _, _, r in e]
        rl, fo = final_phase[2 * j * N:(2 * j + 1) * N], final_phase[(2 * j + 1) * N:(2 * j + 2) * N]
        r = res[pid]
        assert r["relay_correct_list"] == [x > 0 for _, _, x in rl]
        assert r["final_correct_list"] == [x > 0 for _, _, x in fo]
        assert (r["early_correct"], r["relay_correct"], r["final_correct"]) == (
            sum(pre[pid]["early_correct"]), sum(r["relay_correct_list"]), sum(r["final_correct_list"]))
        assert [v == "pass" for v in r["final_verdicts"]] == r["final_correct_list"]
        for (text, _, _), pf in zip(rl, pre[pid]["prefix_ids"]):   # the relay response starts with the prefix
            assert text.startswith(tok.decode(pf, skip_special_tokens=True))
        for text, _, x in fo:   # the reward by hand: the last non-blank line is "= <a+b>"
            lines = [line.replace(" ", "") for line in text.splitlines() if line.strip()]
            assert x == float(lines[-1:] == [f"={row['a'] + row['b']}"]), text
    # the warm-up solves about 60 % of the samples (28 of 48 on the development machine); the random model none,
    # and half of its garbage as a prefix ruins the final model's answers (1 of 48 there)
    pp = tables["relay_problems"]
    assert pp["final_correct"].sum() >= 0.35 * P * N and pp["early_correct"].sum() == 0
    assert pp["relay_correct"].sum() < 0.5 * pp["final_correct"].sum()


def test_pass_k_from_the_per_problem_counts(relay_run):
    tables, out, settings, _ = relay_run
    res = _jsonl(out / "results.jsonl")
    n = np.array([r["n"] for r in res.values()])
    assert (n == N).all()
    pk = tables["relay_passk"].set_index("k")
    assert pk.index.tolist() == [1, 2, 4, 8] and (pk["problems"] == P).all()
    for name in ("early", "relay", "final"):
        c = np.array([r[f"{name}_correct"] for r in res.values()])
        for k in pk.index:
            assert pk.loc[k, name] == pytest.approx(pass_at_k(n, c, k).mean(), abs=1e-12), (name, k)
            assert pk.loc[k, f"{name}_low"] <= pk.loc[k, name] + 1e-12 <= pk.loc[k, f"{name}_high"] + 2e-12
        assert pk[name].is_monotonic_increasing
    assert pk.loc[1, "final"] == pytest.approx(sum(r["final_correct"] for r in res.values()) / (P * N))
    assert pk.loc[1, "final"] > pk.loc[1, "early"] + 0.3            # warmed final vs the random model
    assert pk["diff"].tolist() == pytest.approx((pk["relay"] - pk["final"]).tolist())
    assert (pk["diff_low"] <= pk["diff"] + 1e-12).all() and (pk["diff"] <= pk["diff_high"] + 1e-12).all()
    assert settings["args"]["cut"] == 0.5 and settings["problems_evaluated"] == P
    assert settings["args"]["engine_used"] == "hf"


def test_relay_counts_prefixes(relay_run):
    _, out, _, _ = relay_run
    pre, res = _jsonl(out / "prefixes.jsonl"), _jsonl(out / "results.jsonl")
    for pid, r in res.items():
        assert len(pre[pid]["prefix_ids"]) == N
        for pf, el, fin, rl in zip(pre[pid]["prefix_ids"], pre[pid]["early_len"], pre[pid]["early_finish"],
                                   r["relay_len"]):
            body = el - (fin == "stop")                     # a trailing EOS never enters the prefix
            assert len(pf) == body // 2 and EOS not in pf
            assert len(pf) <= rl <= MAX_TOKENS
        assert r["prefix_len"] == [len(pf) for pf in pre[pid]["prefix_ids"]]
        assert max(r["final_len"]) <= MAX_TOKENS


def test_cut_zero_equals_final_only(ckpts, problems, tmp_path):
    tables, out, _ = _run(ckpts, problems, tmp_path / "o", cut=0.0, batch_problems=2, limit=4)
    res = _jsonl(out / "results.jsonl")
    assert len(res) == 4
    for r in res.values():
        assert r["prefix_len"] == [0] * N
        assert r["relay_correct_list"] == r["final_correct_list"]
        assert r["relay_len"] == r["final_len"]
    pp = tables["relay_problems"]
    assert (pp["relay_correct"] == pp["final_correct"]).all()
    assert 0 < pp["final_correct"].sum() < 4 * N             # the grader separates samples: the check means something
    assert (tables["relay_passk"]["diff"] == 0).all()


def test_resume_skips_done_problems_and_refuses_other_settings(ckpts, problems, relay_run, tmp_path, monkeypatch):
    first, src, _, _ = relay_run
    out = tmp_path / "o"
    shutil.copytree(src, out)
    before = _jsonl(out / "results.jsonl")
    # a finished run: nothing is generated again
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: pytest.fail("model loaded on resume"))
    again, _, _ = _run(ckpts, problems, out)
    pd.testing.assert_frame_equal(first["relay_passk"], again["relay_passk"])
    monkeypatch.undo()
    # an interrupted run (torn last line): only that problem is redone, with the same per-problem seed
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    _run(ckpts, problems, out)
    assert _jsonl(out / "results.jsonl") == before
    with pytest.raises(relay.RelayError, match=r"other settings \(n: recorded 8, now 2\); use another --out"):
        _run(ckpts, problems, out, n=2)


def test_one_relay_writes_a_folder_at_a_time_and_each_problem_counts_once(ckpts, problems, relay_run, tmp_path,
                                                                          monkeypatch):
    first, src, _, _ = relay_run
    out = tmp_path / "o"
    shutil.copytree(src, out)
    before = (out / "results.jsonl").read_bytes()
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: pytest.fail("model loaded"))
    # a second relay on a folder another process writes: refused before it reads or writes anything
    with hold(lock_file(out), what="x", command="tsanalysis relay", fix="y"):
        with pytest.raises(relay.RelayError, match=rf"the relay folder {out} is being written by another "
                                                   r"tsanalysis relay \(pid \d+ .*or give another --out"):
            _run(ckpts, problems, out)
    assert (out / "results.jsonl").read_bytes() == before
    assert not lock_file(out).exists()           # released: the folder holds only results, no lock file beside it
    # two relays appended one problem twice: its first line counts, the second leaves the file, with a warning
    lines = (out / "results.jsonl").read_text().splitlines()
    dup = json.loads(lines[0])
    dup["relay_correct"] = -1
    (out / "results.jsonl").write_text("\n".join(lines + [json.dumps(dup)]) + "\n")
    said = []
    again, _, _ = relay.run_relay(RelayConfig(early=str(ckpts[0]), final=str(ckpts[1]), benchmark="addition",
                                              problems=str(problems[0]), n=N, cut=0.5, max_tokens=MAX_TOKENS, seed=3,
                                              engine="hf", out=out, batch_problems=1), log=said.append)
    pd.testing.assert_frame_equal(first["relay_passk"], again["relay_passk"])
    assert (out / "results.jsonl").read_bytes() == before
    assert any("1 duplicate row of problems already in the file" in m and f"line {len(lines) + 1}" in m
               for m in said), said


def test_mismatched_tokenizers_are_refused_before_loading_models(ckpts, tmp_path, monkeypatch, capsys):
    from transformers import AutoTokenizer

    other = tmp_path / "other"
    shutil.copytree(ckpts[1], other)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other)
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: pytest.fail("model loaded"))
    rc = main(["relay", "--early", str(ckpts[0]), "--final", str(other), "--benchmark", "addition", "--n", "2",
               "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "error: " in err and "different tokenizers" in err and "vocabulary sizes 100 vs 101" in err


def test_cli_relay_on_the_benchmark_split_writes_tables(ckpts, tmp_path, capsys):
    """The addition benchmark's own held-out split (no --problems), engine auto (hf on this machine)."""
    out = tmp_path / "o"
    rc = main(["relay", "--early", str(ckpts[0]), "--final", str(ckpts[1]), "--benchmark", "addition", "--n", "2",
               "--limit", "1", "--max-tokens", "6", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert f"wrote 5 files to {out}/" in printed and "relay_settings.json" in printed
    pk = pd.read_csv(out / "relay_passk.csv")
    assert pk["k"].tolist() == [1, 2] and pk["problems"].tolist() == [1, 1]
    pp = pd.read_parquet(out / "relay_problems.parquet")
    assert pp["problem_id"].tolist() == ["addition-s10000-000000"]
    s = json.loads((out / "settings.json").read_text())
    assert (s["args"]["benchmark"], s["args"]["problems"], s["args"]["template"]) == ("addition", None, "raw")
    assert s["args"]["max_tokens"] == 6 and s["args"]["engine"] == "auto"
    assert s["args"]["engine_used"] == inference.resolve_engine("auto")
    [r] = _jsonl(out / "results.jsonl").values()
    assert r["n"] == 2 and max(r["final_len"]) <= 6 and max(r["relay_len"]) <= 6


def test_cli_relay_with_a_problems_file(ckpts, problems, tmp_path):
    out = tmp_path / "o"
    rc = main(["relay", "--early", str(ckpts[0]), "--final", str(ckpts[1]), "--benchmark", "addition",
               "--problems", str(problems[0]), "--limit", "2", "--n", "2", "--max-tokens", str(MAX_TOKENS),
               "--engine", "hf", "--out", str(out)])
    assert rc == 0
    pp = pd.read_parquet(out / "relay_problems.parquet")
    assert pp["problem_id"].tolist() == [r["id"] for r in problems[1][:2]] and pp["relay_correct"].between(0, 2).all()
    s = json.loads((out / "settings.json").read_text())
    assert s["args"]["benchmark"] == "addition" and s["args"]["problems"] == str(problems[0].resolve())


def test_usage_errors_exit_2_before_any_model_loads(ckpts, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: pytest.fail("model loaded"))
    base = ["relay", "--early", str(ckpts[0]), "--final", str(ckpts[1]), "--n", "2", "--out", str(tmp_path / "o")]
    for extra, msg in (([], "relay needs --benchmarks NAME"),
                       (["--benchmark", "nope"], "unknown benchmark 'nope'"),
                       (["--benchmark", "addition", "--cut", "1.5"], "--cut must lie in [0, 1], got 1.5"),
                       (["--benchmark", "addition", "--problems", str(tmp_path / "missing.jsonl")], "does not exist")):
        assert main(base + extra) == 2, extra
        assert msg in capsys.readouterr().err, extra
    with pytest.raises(relay.RelayError, match="engine must be one of"):
        relay.run_relay(RelayConfig(early=str(ckpts[0]), final=str(ckpts[1]), benchmark="addition", engine="tpu",
                                    out=tmp_path))


# ---- pure pieces ---------------------------------------------------------------------------------------------------
def test_cut_prefix():
    assert relay.cut_prefix([5, 6, 7, 8, 2], 0.5, eos_ids=[2]) == [5, 6]            # |õ| = 4 without the EOS
    assert relay.cut_prefix([5, 6, 7, 8, 9], 0.5, eos_ids=[2]) == [5, 6]            # floor(2.5)
    assert relay.cut_prefix([5, 6, 7, 2], 1.0, eos_ids=[2]) == [5, 6, 7]
    assert relay.cut_prefix([5, 6, 7, 2], 0.0, eos_ids=[2]) == []
    assert len(relay.cut_prefix(list(range(10, 110)), 0.29)) == 29                  # no floating-point undercut
    with pytest.raises(relay.RelayError):
        relay.cut_prefix([1], 1.5)


def test_pass_k_table_and_seeds():
    t = relay.pass_k_table([4, 4], [0, 4], [1, 4], [0, 4])
    assert t["k"].tolist() == [1, 2, 4]
    assert t.loc[0, "relay"] == pytest.approx((0.25 + 1) / 2)
    assert t.loc[0, "diff"] == pytest.approx(0.125)
    assert relay.pass_k_table([6], [1], [1], [1])["k"].tolist() == [1, 2, 4, 6]
    assert relay.derive_seed(0, "a") == relay.derive_seed(0, "a") != relay.derive_seed(1, "a")
