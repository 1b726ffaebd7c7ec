"""Relay inference (tsanalysis.relay) with two tiny checkpoints (inference.tiny) and a deterministic grader."""

import json
import shutil

import pandas as pd
import pytest

import eval.benchmarks
import inference
from eval.benchmarks.base import Benchmark, Problem, Verdict
from inference.tiny import save_tiny
from tsanalysis import relay
from tsanalysis.cli import main
from contracts.passk import pass_at_k

N = 4
MAX_TOKENS = 12


def _grade(response: str, problem: Problem) -> Verdict:
    ok = any(ch in response for ch in problem.gold)   # random tiny models: about half the samples pass
    return Verdict(ok, "pass" if ok else "wrong_answer", None)


FAKE = Benchmark(name="fake", version="1", kind="task",
                 load=lambda path=None: [Problem(f"q{i}", f"{i}+{i}=", "0123456") for i in range(2)],
                 grade=_grade, default_template="raw", generation={"max_tokens": MAX_TOKENS})


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    return save_tiny(root / "early", "1m", seed=1), save_tiny(root / "final", "1m", seed=2)


@pytest.fixture(autouse=True)
def fake_benchmark(monkeypatch):
    real = eval.benchmarks.get_benchmark
    monkeypatch.setattr(eval.benchmarks, "get_benchmark", lambda name: FAKE if name == "fake" else real(name))


def _run(ckpts, out, **kw):
    args = dict(early=str(ckpts[0]), final=str(ckpts[1]), benchmark="fake", n=N, cut=0.5, seed=3, engine="hf",
                out=out, batch_problems=1, log=lambda s: None)
    args.update(kw)
    return relay.run_relay(**args)


def _jsonl(path):
    return {json.loads(line)["problem_id"]: json.loads(line) for line in path.read_text().splitlines()}


@pytest.fixture(scope="module")
def relay_run(ckpts, tmp_path_factory):
    """One relay run (cut 0.5, per-problem seeds) shared by the tests that only read it."""
    mp = pytest.MonkeyPatch()
    mp.setattr(eval.benchmarks, "get_benchmark", lambda name: FAKE)
    try:
        tables, out, settings = _run(ckpts, tmp_path_factory.mktemp("relay") / "o")
    finally:
        mp.undo()
    return tables, out, settings


def test_cut_zero_equals_final_only(ckpts, tmp_path):
    tables, out, _ = _run(ckpts, tmp_path / "o", cut=0.0, batch_problems=2)
    res = _jsonl(out / "results.jsonl")
    assert len(res) == 2
    for r in res.values():
        assert r["prefix_len"] == [0] * N
        assert r["relay_correct_list"] == r["final_correct_list"]
        assert r["relay_len"] == r["final_len"]
    pp = tables["relay_problems"]
    assert (pp["relay_correct"] == pp["final_correct"]).all()
    assert 0 < pp["final_correct"].sum() < 2 * N             # the grader separates samples: the check means something
    assert (tables["relay_passk"]["diff"] == 0).all()


def test_relay_counts_prefixes_and_pass_k(relay_run):
    tables, out, settings = relay_run
    pre = _jsonl(out / "prefixes.jsonl")
    res = _jsonl(out / "results.jsonl")
    for pid, r in res.items():
        for pf, el, fin, rl in zip(pre[pid]["prefix_ids"], pre[pid]["early_len"], pre[pid]["early_finish"],
                                   r["relay_len"]):
            body = el - (fin == "stop")                     # a trailing EOS never enters the prefix
            assert len(pf) == body // 2
            assert 2 not in pf                              # <eos> id of the tiny tokenizer
            assert len(pf) <= rl <= MAX_TOKENS
        assert max(r["final_len"]) <= MAX_TOKENS
    pp = tables["relay_problems"]
    for col in ("early_correct", "relay_correct", "final_correct"):
        assert pp[col].between(0, N).all()
    pk = tables["relay_passk"]
    assert pk["k"].tolist() == [1, 2, 4]
    assert pk.loc[0, "relay"] == pytest.approx((pp["relay_correct"] / N).mean())
    assert pk.loc[1, "final"] == pytest.approx(pass_at_k(pp["n"], pp["final_correct"], 2).mean())
    assert pk["diff"].tolist() == pytest.approx((pk["relay"] - pk["final"]).tolist())
    assert (pk["diff_low"] <= pk["diff"] + 1e-12).all() and (pk["diff"] <= pk["diff_high"] + 1e-12).all()
    assert settings["args"]["cut"] == 0.5 and settings["problems_evaluated"] == 2


def test_resume_skips_done_problems_and_refuses_other_settings(ckpts, relay_run, tmp_path, monkeypatch):
    first, src, _ = relay_run
    out = tmp_path / "o"
    shutil.copytree(src, out)
    before = _jsonl(out / "results.jsonl")
    # a finished run: nothing is generated again
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: pytest.fail("model loaded on resume"))
    again, _, _ = _run(ckpts, out)
    pd.testing.assert_frame_equal(first["relay_passk"], again["relay_passk"])
    monkeypatch.undo()
    monkeypatch.setattr(eval.benchmarks, "get_benchmark", lambda name: FAKE)
    # an interrupted run (torn last line): only that problem is redone, with the same per-problem seed
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    _run(ckpts, out)
    assert _jsonl(out / "results.jsonl") == before
    with pytest.raises(relay.RelayError, match=r"other settings \(n: 4 vs 2\)"):
        _run(ckpts, out, n=2)


def test_mismatched_tokenizers_are_refused_before_loading_models(ckpts, tmp_path, monkeypatch, capsys):
    from transformers import AutoTokenizer

    other = tmp_path / "other"
    shutil.copytree(ckpts[1], other)
    tok = AutoTokenizer.from_pretrained(other)
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(other)
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: pytest.fail("model loaded"))
    rc = main(["relay", "--early", str(ckpts[0]), "--final", str(other), "--benchmark", "fake", "--n", "2",
               "--out", str(tmp_path / "o")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "different tokenizers" in err and "vocabulary sizes 100 vs 101" in err


def test_cli_relay_writes_tables(ckpts, tmp_path, capsys):
    out = tmp_path / "o"
    rc = main(["relay", "--early", str(ckpts[0]), "--final", str(ckpts[1]), "--benchmark", "fake", "--n", "2",
               "--limit", "1", "--max-tokens", "6", "--engine", "hf", "--out", str(out)])
    assert rc == 0
    assert "wrote" in capsys.readouterr().out
    pk = pd.read_csv(out / "relay_passk.csv")
    assert pk["k"].tolist() == [1, 2] and pk["problems"].tolist() == [1, 1]
    assert json.loads((out / "settings.json").read_text())["args"]["max_tokens"] == 6
    assert main(["relay", "--early", str(ckpts[0]), "--final", str(ckpts[1]), "--n", "2"]) == 2   # no benchmark


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


def test_real_registry_with_a_problems_file(ckpts, tmp_path):
    """The eval registry's ``addition`` benchmark, its problems replaced by a file (--problems)."""
    probs = tmp_path / "probs.jsonl"
    probs.write_text(json.dumps({"id": "x1", "prompt": "63+4\n", "answer": "67"}) + "\n")
    out = tmp_path / "o"
    rc = main(["relay", "--early", str(ckpts[0]), "--final", str(ckpts[1]), "--benchmark", "addition",
               "--problems", str(probs), "--n", "2", "--max-tokens", "6", "--engine", "hf", "--out", str(out)])
    assert rc == 0
    pp = pd.read_parquet(out / "relay_problems.parquet")
    assert pp["problem_id"].tolist() == ["x1"] and pp["relay_correct"].between(0, 2).all()
    s = json.loads((out / "settings.json").read_text())
    assert s["args"]["benchmark"] == "addition" and s["args"]["problems"] == str(probs.resolve())
    assert s["args"]["template"] == "raw"
