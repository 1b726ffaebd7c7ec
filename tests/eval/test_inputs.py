"""What a user meets in the first hour of ``python -m eval.run``, ``python -m eval.leaderboard`` and ``tsanalysis
relay``: a damaged or wrong checkpoint, a training run folder given as a checkpoint, bad sampling values, an
``--out`` that is a file, nothing to score, an unknown baseline or lm-eval task, a stray file in the results, a
resume in another engine or dtype, a results file another process is writing, a benchmark or model named twice.
Each is one line (exit 2, no traceback), found before any model loads, with nothing left on disk; the checkpoints
are tiny ones built here (``inference.tiny``), never the hub. Also here, what is said rather than refused: a problem
written twice (counted once, with a warning, and removed by the next run), the leaderboard's order and baseline
(the same from ``eval.run`` and ``eval.leaderboard``), and a relay of a model with itself."""

import json
import os
import shutil
import time
from pathlib import Path

import pytest

import inference
from contracts.samples import read_samples
from eval import leaderboard, run
from eval.config import EvalConfig
from eval.leaderboard import build_leaderboard
from eval.parallel import generation_dtype
from inference.hub import checkpoint_dtype
from inference.tiny import build_model, build_tokenizer, save_pretrained_atomic
from tests.helpers.processes import died_holding, other_holder
from tsanalysis import relay
from tsanalysis.cli import main as tsanalysis_main
from tsanalysis.config import RelayConfig


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A saved 1m tiny model (float32): config.json, model.safetensors, tokenizer files."""
    tok = build_tokenizer()
    return save_pretrained_atomic(build_model("1m", tok, seed=0), tok, tmp_path_factory.mktemp("ckpt") / "tiny-1m")


@pytest.fixture
def no_model_loads(monkeypatch):
    """Any model load fails the test: every error here must come first."""
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.setattr(run, "evaluate_model", lambda *a, **k: pytest.fail("generation started"))


def _eval(args) -> tuple[int, str]:
    """(exit status, stderr) of ``python -m eval.run`` in this process (its input errors raise SystemExit(2))."""
    try:
        return run.main(args), ""
    except SystemExit as e:
        return e.code, str(e)


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith(("grade ", "warning:"))]
    assert len(lines) == 1, err
    return lines[0]


def _damage(tiny: Path, where: Path, how: str) -> Path:
    ckpt = where / f"ckpt-{how}"
    shutil.copytree(tiny, ckpt)
    if how == "no-weights":
        (ckpt / "model.safetensors").unlink()
    elif how == "no-tokenizer":
        (ckpt / "tokenizer.json").unlink()
    elif how == "truncated":
        data = (ckpt / "model.safetensors").read_bytes()
        (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif how == "header-cut":
        (ckpt / "model.safetensors").write_bytes((ckpt / "model.safetensors").read_bytes()[:6])
    elif how == "missing-shard":   # sharded as trainer.checkpoint exports a large model, one shard not copied
        (ckpt / "model.safetensors").rename(ckpt / "model-00001-of-00002.safetensors")
        (ckpt / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
            "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
            "model.norm.weight": "model-00002-of-00002.safetensors"}}))
    return ckpt


DAMAGE = {  # how -> the key phrase of the line (after "--model <path>: <folder>")
    "no-weights": " has no weights (model.safetensors, or model.safetensors.index.json and its shards): the "
                  "checkpoint was not saved completely; save or copy the checkpoint again, or use another one",
    "no-tokenizer": " has no tokenizer files (none of tokenizer.json, tokenizer.model, vocab.json, vocab.txt, "
                    "spiece.model); save the tokenizer into the folder with the model (tokenizer.save_pretrained)",
    "truncated": "/model.safetensors is damaged (its safetensors header cannot be read: Error while deserializing "
                 "header: incomplete metadata, file not fully covered; a truncated copy?); save or copy the "
                 "checkpoint again, or use another one",
    "header-cut": "/model.safetensors is damaged (its safetensors header cannot be read: Error while deserializing "
                  "header: header too small; a truncated copy?)",
    "missing-shard": " is missing the weight shard model-00002-of-00002.safetensors that "
                     "model.safetensors.index.json lists; save or copy the checkpoint again, or use another one",
}


def _run_folder(root: Path) -> Path:
    """A training run folder as trainer.train leaves it: config.yaml, checkpoints/step_N (a model each), and a
    checkpoint still being written (no config.json yet)."""
    run_dir = root / "runs" / "tiny"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("model: tiny:1m\n")
    for step in (10, 30, 20):
        (run_dir / "checkpoints" / f"step_{step:06d}").mkdir()
        (run_dir / "checkpoints" / f"step_{step:06d}" / "config.json").write_text("{}")
    (run_dir / "checkpoints" / "step_000040").mkdir()   # being saved: not a checkpoint yet
    return run_dir


# ---- damaged and wrong checkpoints --------------------------------------------------------------------------------

@pytest.mark.parametrize("how", list(DAMAGE))
def test_eval_names_a_damaged_checkpoint_before_anything_is_written(tiny, tmp_path, how, no_model_loads, capsys):
    ckpt = _damage(tiny, tmp_path, how)
    out = tmp_path / "out"
    rc, _ = _eval(["--model", str(ckpt), "--benchmarks", "addition", "--out", str(out), "--no-progress"])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2
    assert line.startswith(f"error: --model {ckpt}: {ckpt}") and DAMAGE[how] in line, line
    assert not out.exists()


def test_eval_names_a_run_folder_and_its_newest_checkpoint(tmp_path, no_model_loads, capsys, monkeypatch):
    _run_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    rc, _ = _eval(["--model", "runs/tiny", "--benchmarks", "addition", "--out", "o", "--no-progress"])
    assert rc == 2
    assert _one_line(capsys.readouterr().err) == (
        "error: --model runs/tiny: runs/tiny is a training run folder (config.yaml, checkpoints/), not a checkpoint; "
        "give one of its checkpoints instead, e.g. the newest: runs/tiny/checkpoints/step_000030")
    assert not (tmp_path / "o").exists()
    shutil.rmtree(tmp_path / "runs" / "tiny" / "checkpoints")
    (tmp_path / "runs" / "tiny" / "checkpoints").mkdir()
    rc, _ = _eval(["--model", "runs/tiny", "--benchmarks", "addition", "--out", "o", "--no-progress"])
    assert rc == 2 and _one_line(capsys.readouterr().err).endswith(
        "not a checkpoint; it holds no saved checkpoint yet (checkpoints/step_N with a config.json)")


@pytest.mark.parametrize("how", ["no-weights", "no-tokenizer", "truncated"])
def test_relay_names_a_damaged_early_checkpoint_and_claims_no_folder(tiny, tmp_path, how, no_model_loads, capsys):
    ckpt = _damage(tiny, tmp_path, how)
    out = tmp_path / "relay"
    rc = tsanalysis_main(["relay", "--early", str(ckpt), "--final", str(tiny), "--benchmark", "addition", "--n", "2",
                          "--out", str(out)])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and line.startswith(f"error: --early {ckpt}: {ckpt}"), line
    assert DAMAGE[how] in line
    assert not out.exists()   # no folder holding only relay_settings.json


def test_relay_names_a_run_folder_and_its_newest_checkpoint(tiny, tmp_path, no_model_loads, capsys, monkeypatch):
    _run_folder(tmp_path)
    monkeypatch.chdir(tmp_path)
    rc = tsanalysis_main(["relay", "--early", "runs/tiny", "--final", str(tiny), "--benchmark", "addition",
                          "--out", "o"])
    assert rc == 2
    assert _one_line(capsys.readouterr().err) == (
        "error: --early runs/tiny: runs/tiny is a training run folder (config.yaml, checkpoints/), "
        "not a checkpoint; give one of its checkpoints instead, e.g. the newest: runs/tiny/checkpoints/step_000030")
    assert not (tmp_path / "o").exists()


def test_relay_that_fails_to_start_leaves_no_claimed_folder(tiny, tmp_path, monkeypatch):
    """A load that fails after the checks (here: any error from the loader) takes back the folder it claimed, so a
    corrected rerun with other settings is not refused; a folder that already held results is left as it was."""
    def broken(*a, **k):
        raise RuntimeError("the loader failed")

    monkeypatch.setattr(inference, "load_policy", broken)
    out = tmp_path / "relay"
    kw = dict(early=str(tiny), final=str(tiny), benchmark="addition", n=2, limit=1, max_tokens=4, engine="hf")
    with pytest.raises(RuntimeError, match="the loader failed"):
        relay.run_relay(RelayConfig(out=out, **kw), log=lambda m: None)
    assert not out.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "relay_settings.json").write_text("{}")   # another run's folder: its own marker, settings differ
    with pytest.raises(relay.RelayError, match="other settings"):
        relay.run_relay(RelayConfig(out=kept, **kw), log=lambda m: None)
    assert sorted(p.name for p in kept.iterdir()) == ["relay_settings.json"]


# ---- bad arguments: sampling values, --out, nothing to score ------------------------------------------------------

@pytest.mark.parametrize("flag,value,phrase", [
    ("--temperature", "-1", "--temperature must be >= 0"),
    ("--top-p", "0", "--top-p must lie in (0, 1]"),
    ("--top-p", "1.5", "--top-p must lie in (0, 1]"),
])
def test_sampling_values_are_refused_before_any_model_loads(tiny, tmp_path, flag, value, phrase, no_model_loads,
                                                             capsys):
    rc, _ = _eval(["--model", str(tiny), "--benchmarks", "addition", flag, value, "--out", str(tmp_path / "e")])
    assert rc == 2 and phrase in _one_line(capsys.readouterr().err)
    rc = tsanalysis_main(["relay", "--early", str(tiny), "--final", str(tiny), "--benchmark", "addition", flag, value,
                          "--out", str(tmp_path / "r")])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and line == f"error: {phrase}, got {float(value)}" + (
        " (0 is greedy)" if flag == "--temperature" else "")
    assert not (tmp_path / "e").exists() and not (tmp_path / "r").exists()


def test_an_out_path_that_is_a_file_is_refused(tiny, tmp_path, no_model_loads, capsys):
    f = tmp_path / "results.txt"
    f.write_text("mine\n")
    rc, _ = _eval(["--model", str(tiny), "--benchmarks", "addition", "--out", str(f)])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        f"error: --out {f}: is a file, not a results folder; choose another --out")
    rc = tsanalysis_main(["relay", "--early", str(tiny), "--final", str(tiny), "--benchmark", "addition",
                          "--out", str(f)])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        f"error: --out {f} is a file, not a folder; choose another --out")
    # a file where a model's results folder goes
    out = tmp_path / "out"
    out.mkdir()
    (out / "tiny-1m").write_text("x")
    rc, _ = _eval(["--model", str(tiny), "--benchmarks", "addition", "--out", str(out)])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        f"error: {out / 'tiny-1m'} is a file, not a results folder; move it away or choose another --out")
    assert f.read_text() == "mine\n" and sorted(p.name for p in out.iterdir()) == ["tiny-1m"]


def test_nothing_to_score_is_an_error_not_an_empty_leaderboard(tiny, tmp_path, no_model_loads, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    out = tmp_path / "out"
    rc, _ = _eval(["--model", str(tiny), "--benchmarks", "addition", "--problems", str(empty), "--out", str(out)])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        f"error: addition: no problems in {empty}; give a problems file with at least one problem")
    lcb = Path(__file__).resolve().parents[1] / "fixtures" / "lcb"
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"problem_id": "abc395_a", "responses": ["x"]}) + "\n")
    rc, _ = _eval(["--model", "m", "--benchmarks", "livecodebench", "--problems", str(lcb), "--samples", str(samples),
                   "--lcb-start-date", "2099-01-01", "--out", str(out)])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        f"error: livecodebench: no problems in {lcb} with the selection start_date=2099-01-01; widen the selection")
    rc, _ = _eval(["--model", "m", "--benchmarks", "addition", "--samples", str(empty), "--out", str(out)])
    assert rc == 2 and _one_line(capsys.readouterr().err).startswith(f"error: --samples {empty}: holds no rows")
    assert not out.exists()
    rc = tsanalysis_main(["relay", "--early", str(tiny), "--final", str(tiny), "--benchmark", "addition",
                          "--problems", str(empty), "--out", str(out)])
    assert rc == 2 and _one_line(capsys.readouterr().err) == f"error: no problems loaded from {empty}"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "1+2\\n", "answer": "3"}\n{broken\n')
    rc = tsanalysis_main(["relay", "--early", str(tiny), "--final", str(tiny), "--benchmark", "addition",
                          "--problems", str(bad), "--out", str(out)])
    assert rc == 2 and f"error: addition: {bad}:2: malformed JSON" in _one_line(
        capsys.readouterr().err)
    assert not out.exists()


# ---- the leaderboard: an unknown baseline, a stray file; an unknown lm-eval task ----------------------------------

def _result_line(pid: str, correct: list[bool], model: str = "a") -> dict:
    return {"problem_id": pid, "correct": correct, "verdicts": ["pass" if c else "wrong_answer" for c in correct],
            "settings": {"model": model, "benchmark": "addition", "benchmark_version": "1"}}


def _results(root: Path) -> Path:
    for model, bits in (("a", [True, False]), ("b", [True, True])):
        (root / model).mkdir(parents=True)
        (root / model / "addition.jsonl").write_text(
            "".join(json.dumps(_result_line(f"p{i}", [b], model)) + "\n" for i, b in enumerate(bits)))
    return root


def test_leaderboard_unknown_baseline_lists_the_models(tmp_path, capsys):
    root = _results(tmp_path / "res")
    assert leaderboard.main([str(root), "--baseline", "c"]) == 2
    assert _one_line(capsys.readouterr().err) == (
        f"error: --baseline 'c' is not among the models under {root}; choose one of: a, b")
    assert not (root / "leaderboard.md").exists()
    assert leaderboard.main([str(tmp_path / "nowhere")]) == 2
    assert "is not a directory of eval results" in _one_line(capsys.readouterr().err)
    # eval.run checks it before any work: the models under --out and this run's
    samples = tmp_path / "s.jsonl"
    samples.write_text(json.dumps({"problem_id": "addition-s10000-000000", "responses": ["3"]}) + "\n")
    rc, _ = _eval(["--model", "m", "--benchmarks", "addition", "--samples", str(samples), "--out", str(root),
                   "--baseline", "c"])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        f"error: --baseline 'c' is not a model of this run or under {root}; choose one of: a, b, m")
    assert sorted(p.name for p in root.iterdir()) == ["a", "b"]


def test_a_stray_jsonl_in_the_results_is_skipped_with_a_warning(tmp_path, capsys):
    root = _results(tmp_path / "res")
    (root / "a" / "notes.jsonl").write_text('{"todo": "rerun with n=32"}\n')
    (root / "b" / "broken.jsonl").write_text('{"problem_id": "p0"\n{"x": 1}\n')
    (root / "b" / "lm_eval.json").write_text("{not json")
    assert leaderboard.main([str(root)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines() == [
        f"warning: skipped {root / 'a' / 'notes.jsonl'}: not an eval.run results file (its row 1 lacks problem_id, "
        f"correct or settings); move it out of the results folder",
        f"warning: skipped {root / 'b' / 'broken.jsonl'}: {root / 'b' / 'broken.jsonl'}:1: malformed sample line "
        f"(Expecting ',' delimiter: line 1 column 20 (char 19)); the file is corrupt — delete it or choose a new "
        f"--out",
        f"warning: skipped {root / 'b' / 'lm_eval.json'}: not an lm-eval results file (JSONDecodeError: Expecting "
        f"property name enclosed in double quotes: line 1 column 2 (char 1))"]
    md = (root / "leaderboard.md").read_text()
    assert "| a | 50.0" in md and "| b | 100.0" in md and "notes" not in md


def test_an_unknown_lm_eval_task_is_refused_before_any_model_loads(tiny, tmp_path, monkeypatch, no_model_loads,
                                                                   capsys):
    import eval.lm_eval_bridge as bridge

    class Index:   # lm-eval's TaskManager as unknown_tasks reads it (building the real one takes seconds)
        all_tasks = ["gsm8k", "gsm8k_cot", "mmlu"]

        def match_tasks(self, names):
            import fnmatch
            return [t for t in self.all_tasks if any(fnmatch.fnmatch(t, n) for n in names)]

    monkeypatch.setattr(bridge, "task_manager", lambda include_path=None: Index())
    assert bridge.unknown_tasks(["gsm8k", "gsm8k_*", "gsm9k", "nope_*", str(tiny / "config.json")]) == [
        "gsm9k", "nope_*"]
    rc, _ = _eval(["--model", str(tiny), "--lm-eval-tasks", "gsm8k,gsm9k", "--out", str(tmp_path / "o")])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        "error: --lm-eval-tasks: lm-eval knows no task 'gsm9k'; see `lm_eval ls tasks`, or give "
        "--lm-eval-include-path FOLDER of task YAMLs")
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_lm_eval_task_names_are_checked_against_its_real_index():
    pytest.importorskip("lm_eval")
    from eval.lm_eval_bridge import unknown_tasks
    assert unknown_tasks(["gsm8k", "arc_easy", "gsm9k"]) == ["gsm9k"]


# ---- one engine and one precision per results file ----------------------------------------------------------------

def test_generation_dtype_per_engine(tiny, tmp_path):
    assert checkpoint_dtype(tiny) == "float32"
    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    (bf16 / "config.json").write_text(json.dumps({"torch_dtype": "bfloat16"}))   # as transformers 4 wrote it
    (tmp_path / "config.json").write_text("{}")
    assert (checkpoint_dtype(bf16), checkpoint_dtype(tmp_path)) == ("bfloat16", "float32")
    table = {(engine, dtype, cuda): generation_dtype(engine, dtype, tiny, cuda=cuda)
             for engine in ("hf", "vllm") for dtype in (None, "auto", "float16") for cuda in (False, True)}
    assert table == {("hf", None, False): "float32", ("hf", None, True): "bfloat16",
                     ("hf", "auto", False): "float32", ("hf", "auto", True): "float32",
                     ("hf", "float16", False): "float16", ("hf", "float16", True): "float16",
                     ("vllm", None, False): "bfloat16", ("vllm", None, True): "bfloat16",   # a CPU too
                     ("vllm", "auto", False): "float32", ("vllm", "auto", True): "float32",
                     ("vllm", "float16", False): "float16", ("vllm", "float16", True): "float16"}
    help_text = " ".join(run.build_parser().format_help().split())
    assert "Unset: bfloat16 with vllm on every machine (its CPU build too, even for a float32 checkpoint)" in help_text


def test_a_resume_in_another_engine_or_dtype_is_refused(tiny, tmp_path, capsys):
    """The file records the engine and dtype its samples were generated in; a resume that would append samples of
    another engine or precision is refused, naming both; lines written before these were recorded are accepted."""
    out = tmp_path / "out"
    args = ["--model", str(tiny), "--benchmarks", "addition", "--n", "1", "--max-tokens", "4", "--engine", "hf",
            "--out", str(out), "--no-progress"]
    assert run.main(args + ["--limit", "1"]) == 0
    path = out / "tiny-1m" / "addition.jsonl"
    [row] = [json.loads(x) for x in path.read_text().splitlines()]
    assert (row["settings"]["engine"], row["settings"]["dtype"]) == ("hf", "float32")
    # the same file as a vLLM run would have written it (bfloat16 even on a CPU)
    row["settings"].update(engine="vllm", dtype="bfloat16")
    path.write_text(json.dumps(row) + "\n")
    before = path.read_bytes()
    capsys.readouterr()
    rc, _ = _eval(args + ["--limit", "2"])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        f"error: {path} (problem 'addition-s10000-000000') was written with other settings (engine: recorded "
        f"'vllm', now 'hf'; dtype: recorded 'bfloat16', now 'float32'); its samples would mix engines or precisions: "
        f"use another --out, or the file's engine and dtype (--engine vllm --dtype bfloat16)")
    assert path.read_bytes() == before
    # a file from before engine and dtype were recorded: nothing to compare, resumed; the new line records them
    del row["settings"]["engine"], row["settings"]["dtype"]
    path.write_text(json.dumps(row) + "\n")
    assert run.main(args + ["--limit", "2"]) == 0
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [("engine" in r["settings"], r["settings"].get("dtype")) for r in rows] == [(False, None),
                                                                                       (True, "float32")]
    capsys.readouterr()
    rc, _ = _eval(args + ["--limit", "2", "--dtype", "bfloat16"])
    assert rc == 2 and _one_line(capsys.readouterr().err).startswith(
        f"error: {path} (problem 'addition-s10000-000001') was written with other settings (dtype: recorded "
        f"'float32', now 'bfloat16')")


# ---- one writer per results file, each name once, each problem once, one baseline ---------------------------------

def _addition_samples(path: Path, k: int) -> Path:
    """Completions of the first k addition problems, two each."""
    path.write_text("".join(json.dumps({"problem_id": f"addition-s10000-{i:06d}", "responses": ["3", "7"]}) + "\n"
                            for i in range(k)))
    return path


def _grade(samples: Path, out: Path, model: str = "m") -> list[str]:
    return ["--model", model, "--benchmarks", "addition", "--samples", str(samples), "--out", str(out),
            "--no-progress"]


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


def test_a_second_eval_run_on_a_results_file_is_refused_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "out"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()   # one file name: the results record it, and a resume compares it
    three, five = _addition_samples(tmp_path / "a" / "s.jsonl", 3), _addition_samples(tmp_path / "b" / "s.jsonl", 5)
    assert run.main(_grade(three, out)) == 0
    path = out / "m" / "addition.jsonl"
    lock = out / "m" / ".addition.jsonl.lock"
    assert not lock.exists()   # released at the end
    # its last line says where it wrote: the results file, then the leaderboard
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote: {path}; {out / 'leaderboard.md'} (.csv, .json)"
    with other_holder(lock, "eval.run") as pid:   # another eval.run writing m/addition.jsonl
        before = _tree(out)
        rec = json.loads(lock.read_text())
        rc, _ = _eval(_grade(five, out))   # two more problems: it would append them
        assert rc == 2 and _one_line(capsys.readouterr().err) == (
            f"error: {path} is being written by another eval.run (pid {pid} on host {rec['host']}, since "
            f"{rec['since']}; lock file {lock}); wait for it to finish (or stop it), or write to another --out")
        assert _tree(out) == before   # the results, the leaderboard and the holder's lock file as they were
        # one lock per results file: another model into the same --out goes on beside it
        assert run.main(_grade(three, out, model="m2")) == 0
        assert len(read_samples(out / "m2" / "addition.jsonl")) == 3
    # the holder killed (SIGKILL, no cleanup: its record stays, its lock is free): the next run takes it over,
    # says so, and resumes
    dead = died_holding(lock, "eval.run")
    capsys.readouterr()
    assert run.main(_grade(five, out)) == 0
    assert f"warning: took over a stale lock: eval.run (pid {dead} on host " in capsys.readouterr().out
    assert [r["problem_id"] for r in read_samples(path)] == [f"addition-s10000-{i:06d}" for i in range(5)]
    assert not lock.exists()


def test_a_benchmark_or_a_model_named_twice_is_refused(tiny, tmp_path, no_model_loads, capsys):
    out = tmp_path / "out"
    rc, _ = _eval(["--model", str(tiny), "--benchmarks", "addition,countdown,addition", "--out", str(out)])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        "error: --benchmarks addition,countdown,addition: names 'addition' twice; list each once")
    preset = tmp_path / "twice.yaml"   # the same in an eval config
    preset.write_text("benchmarks: [addition, addition]\n")
    rc, _ = _eval(["--config", str(preset), "--model", str(tiny), "--out", str(out)])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        "error: --benchmarks addition,addition: names 'addition' twice; list each once")
    rc, _ = _eval(["--model", str(tiny), "--lm-eval-tasks", "gsm8k,gsm8k", "--out", str(out)])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        "error: --lm-eval-tasks gsm8k,gsm8k: names 'gsm8k' twice; list each once")
    rc, _ = _eval(["--model", str(tiny), "--model", str(tiny), "--benchmarks", "addition", "--out", str(out)])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        f"error: --model {tiny} is given twice; list each model once")
    copy = tmp_path / "copy"
    shutil.copytree(tiny, copy)
    rc, _ = _eval(["--model", str(tiny), "--model", str(copy), "--name", "x", "--name", "x", "--benchmarks",
                   "addition", "--out", str(out)])
    assert rc == 2 and _one_line(capsys.readouterr().err) == (
        f"error: --model {tiny} and --model {copy} would both write {out / 'x'}; give each its own --name")
    assert not out.exists()


def test_a_problem_written_twice_counts_once_and_the_next_run_removes_it(tmp_path, capsys):
    out = tmp_path / "out"
    samples = _addition_samples(tmp_path / "s.jsonl", 3)
    assert run.main(_grade(samples, out)) == 0
    path = out / "m" / "addition.jsonl"
    clean = path.read_bytes()
    lines = clean.splitlines(keepends=True)
    path.write_bytes(clean + lines[0] + lines[2])   # what two writers left: lines 4 and 5 repeat problems 0 and 2
    damaged = path.read_bytes()
    capsys.readouterr()
    assert leaderboard.main([str(out)]) == 0
    dropped = (f"{path}: 2 duplicate rows of problems already in the file, dropped (each problem counts once, from "
               f"its first line): problem 'addition-s10000-000000' at line 4, first at line 1 and 1 more (lines 5); "
               f"two writers appended the same problems")
    assert capsys.readouterr().err.splitlines() == [
        f"warning: {dropped}; the next eval.run of this model and benchmark on this folder removes them from the file"]
    [entry] = json.loads((out / "leaderboard.json").read_text())["entries"]
    assert entry["problems"] == 3 and "(P=3, n=2)" in (out / "leaderboard.md").read_text()   # not P=5
    assert path.read_bytes() == damaged   # the leaderboard reads, it does not mend
    # the next eval.run of that model and benchmark holds the file's lock: it removes them, and says so
    assert run.main(_grade(samples, out)) == 0
    assert path.read_bytes() == clean
    assert capsys.readouterr().err.splitlines() == [f"warning: {dropped}; removed from the file"]


def test_eval_run_and_the_leaderboard_choose_the_same_order_and_baseline(tmp_path, capsys):
    out = tmp_path / "out"
    samples = _addition_samples(tmp_path / "s.jsonl", 3)
    assert run.main(_grade(samples, out, model="zeta")) == 0   # an earlier model's results
    hour_ago = time.time() - 3600
    os.utime(out / "zeta" / "addition.jsonl", (hour_ago, hour_ago))
    result = run.run_eval(EvalConfig(models=["alpha"], benchmarks=["addition"], samples=str(samples), out=str(out),
                                     progress=False), log=lambda m: None)
    board = result["leaderboard"]   # before: eval.run's baseline was its own first --model, alpha
    assert (board["models"], board["baseline"]) == (["zeta", "alpha"], "zeta")
    written = (out / "leaderboard.md").read_text()
    capsys.readouterr()
    assert leaderboard.main([str(out)]) == 0
    assert (out / "leaderboard.md").read_text() == written == capsys.readouterr().out[:-1]
    assert "## paired bootstrap vs zeta" in written
    # --baseline chooses, in both commands alike
    result = run.run_eval(EvalConfig(models=["alpha"], benchmarks=["addition"], samples=str(samples), out=str(out),
                                     baseline="alpha", progress=False), log=lambda m: None)
    assert result["leaderboard"]["baseline"] == "alpha"
    assert build_leaderboard(out, baseline="alpha")["paired"] == result["leaderboard"]["paired"]


def test_relay_says_when_early_and_final_are_the_same_model(tiny, tmp_path, monkeypatch, capsys):
    """A warning before any model loads, not an error: the relay of a model with itself is a null control (with
    cut 0, relay and final-only are the same samples), and the settings record it."""
    best = tmp_path / "best"
    best.symlink_to(tiny)   # as checkpoints/best links a step
    kw = dict(benchmark="addition", n=2, limit=2, max_tokens=4, engine="hf", cut=0.0)
    lines: list[str] = []
    tables, _, settings = relay.run_relay(RelayConfig(early=str(tiny), final=str(best), out=tmp_path / "r", **kw),
                                          log=lines.append)
    assert lines[0] == (
        f"warning: --early {tiny} and --final {best} are the same model ({tiny.resolve()}): the relay is that model "
        f"continuing its own prefixes, so relay and final-only sample one distribution and differ by sampling noise "
        f"only (a null control, not Figure 2); for Figure 2 give an earlier checkpoint as --early")
    assert settings["same_model"] is True
    per = tables["relay_problems"]
    assert list(per["relay_correct"]) == list(per["final_correct"])   # cut 0: the same samples
    # two checkpoints: no warning, and the settings say so
    other = tmp_path / "other"
    shutil.copytree(tiny, other)
    lines.clear()
    _, _, settings = relay.run_relay(RelayConfig(early=str(other), final=str(tiny), out=tmp_path / "r2", **kw),
                                     log=lines.append)
    assert settings["same_model"] is False and not [x for x in lines if x.startswith("warning")]
    # the command says it on stderr, first
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop")))
    capsys.readouterr()
    rc = tsanalysis_main(["relay", "--early", str(tiny), "--final", str(tiny), "--benchmark", "addition", "--n", "2",
                          "--limit", "1", "--engine", "hf", "--out", str(tmp_path / "r3")])
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert rc == 1 and err[0].startswith(f"warning: --early {tiny} and --final {tiny} are the same model (")
    assert err[1].startswith("error: RuntimeError: stop")
