"""One command grammar (docs/commands.md, ``contracts.commands``): bad input is one ``error:`` line and
exit 2 in every entry point, a failure inside a run one line and exit 1 (the traceback with THINKING_SEEDS_DEBUG=1),
Ctrl-C 130 and SIGTERM 143 with where the same command resumes; rates a person reads in percent; the relay takes
eval.run's ``--benchmarks`` and records the engine and dtype of its samples; the data messages say where the data
comes from and how to lay it out under $THINKING_SEEDS_DATA."""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import inference
from tests.conftest import SHARED_DATA
from contracts.commands import (DEBUG_ENV, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, pct, points,
                                run_command)
from eval import run
from scoring.benchmarks import get_benchmark
from scoring.benchmarks import humaneval, livecodebench, mathbench
from eval.report import format_report
from inference.tiny import build_model, build_tokenizer, save_pretrained_atomic
from tsanalysis import relay
from tsanalysis.cli import build_parser, format_passk
from tsanalysis.cli import main as tsanalysis_main
from tsanalysis.config import RelayConfig

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A saved 1m tiny model (float32)."""
    tok = build_tokenizer()
    return save_pretrained_atomic(build_model("1m", tok, seed=0), tok, tmp_path_factory.mktemp("ckpt") / "tiny-1m")


def _error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if "error:" in line]


# ---- percentages ----------------------------------------------------------------------------------------------------
def test_pct_and_points_with_real_numbers():
    assert [pct(13 / 30), pct(1 / 3), pct(2 / 3), pct(3 / 34), pct(0.0), pct(1.0)] == \
        ["43.3%", "33.3%", "66.7%", "8.8%", "0.0%", "100.0%"]
    assert (pct(None), pct(float("nan")), pct(0.5, unit=""), pct(1 / 8, digits=2)) == ("n/a", "n/a", "50.0", "12.50%")
    assert [points(-0.025), points(0.145), points(0.0), points(None)] == ["-2.5", "+14.5", "+0.0", "n/a"]
    # a table's empty cell: the demo pages' and summaries' cells (one formatter for every percentage)
    assert (pct(None, unit="", missing=""), pct(float("nan"), unit="", missing=""), pct(0.4375, unit="", missing="")) \
        == ("", "", "43.8")
    assert (points(float("nan"), missing=""), points(-0.0125, missing="")) == ("", "-1.2")


def test_eval_report_line_and_relay_table_print_percentages():
    report = {"benchmark": "aime24", "n_min": 32, "n_max": 32, "avg": 13 / 30, "avg_ci": (8 / 30, 18 / 30),
              "problems": 30, "grading_timeouts": 0, "disagreement_rate": 3 / 34, "disagreements": 3, "ungraded": 0}
    assert format_report(report) == ("aime24: avg@32 43.3% [26.7, 60.0] over 30 problems; grading timeouts this run: "
                                     "0; math-verify vs Qwen-style disagreement 8.8% (3 samples)")
    # two problems, n = 4: pass@1 early (0 + 1/4) / 2, relay (1/4 + 2/4) / 2, final (2/4 + 4/4) / 2
    pk = relay.pass_k_table([4, 4], [0, 1], [1, 2], [2, 4], n_boot=200, seed=0)
    text = format_passk(pk)
    row1 = text.splitlines()[2].split()
    assert row1[:6] == ["1", "2", "12.5", "37.5", "75.0", "-37.5"], text
    assert re.fullmatch(r"\[[-+]\d+\.\d, [-+]\d+\.\d\]", " ".join(row1[6:])), text
    assert "0.375" not in text and "relay pass@k, %" in text


# ---- the relay's flags, engine and dtype ----------------------------------------------------------------------------
def test_relay_takes_benchmarks_and_the_old_benchmark():
    base = ["relay", "--early", "a", "--final", "b"]
    assert build_parser().parse_args(base + ["--benchmarks", "aime24"]).benchmark == "aime24"
    assert build_parser().parse_args(base + ["--benchmark", "aime25"]).benchmark == "aime25"   # deprecated alias
    with pytest.raises(relay.RelayError, match="the relay takes one benchmark"):
        relay._load_problems("aime24,aime25", None, None)


def test_relay_resume_with_another_engine_or_dtype_is_refused(tiny, tmp_path, monkeypatch, capsys):
    out = tmp_path / "relay"
    cfg = RelayConfig(early=str(tiny), final=str(tiny), benchmark="addition", n=1, limit=1, max_tokens=4, engine="hf",
                      out=out)
    relay.run_relay(cfg, log=lambda s: None)
    marker = out / relay.SETTINGS_FILE
    recorded = json.loads(marker.read_text())
    assert (recorded["engine"], recorded["dtype"]) == ("hf", "float32")   # the tiny checkpoint is float32
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: pytest.fail("a model was loaded"))
    relay.run_relay(cfg, log=lambda s: None)   # the same engine and dtype: a finished folder, nothing generated again
    for key, value in (("dtype", "bfloat16"), ("engine", "vllm")):
        marker.write_text(json.dumps({**recorded, key: value}))
        with pytest.raises(relay.RelayError, match=rf"other settings \({key}: recorded '{value}', now "
                                                   rf"'{recorded[key]}'\); use another --out"):
            relay.run_relay(cfg, log=lambda s: None)
    rc = tsanalysis_main(["relay", "--early", str(tiny), "--final", str(tiny), "--benchmarks", "addition", "--n", "1",
                          "--limit", "1", "--max-tokens", "4", "--engine", "hf", "--out", str(out)])
    [line] = _error_lines(capsys.readouterr().err)
    assert rc == 2 and line.startswith(f"error: '{out}' was written with other settings (engine: recorded 'vllm'")
    # a folder from before engine and dtype were recorded: taken to match
    marker.write_text(json.dumps({k: v for k, v in recorded.items() if k not in ("engine", "dtype")}))
    tables, _, settings = relay.run_relay(cfg, log=lambda s: None)
    assert settings["args"]["dtype"] == "float32" and len(tables["relay_problems"]) == 1


# ---- failures inside a run, Ctrl-C, SIGTERM ---------------------------------------------------------------------------
def _eval_args(tiny, out):
    return ["--model", str(tiny), "--benchmarks", "addition", "--limit", "1", "--n", "1", "--max-tokens", "4",
            "--engine", "hf", "--out", str(out), "--no-progress"]


def test_eval_run_failure_interrupt_and_sigterm_are_one_line(tiny, tmp_path, monkeypatch, capsys):
    out = tmp_path / "eval"

    def stop(exc):
        def fail(*a, **k):
            if exc is signal.SIGTERM:   # what a scheduler sends: the handler raises at the next bytecode
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
                pytest.fail("SIGTERM did not stop the command")
            raise exc
        monkeypatch.setattr(run, "evaluate_model", fail)

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    stop(RuntimeError("engine process 0 died\n(exit code -9)"))
    assert run.main(_eval_args(tiny, out)) == EXIT_FAILURE == 1
    [line] = _error_lines(capsys.readouterr().err)
    assert line == (f"error: RuntimeError: engine process 0 died (exit code -9); the results written so far are kept "
                    f"under {out} and the same command resumes there (a failure inside the run, not bad input; rerun "
                    f"with THINKING_SEEDS_DEBUG=1 for the traceback)")
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert run.main(_eval_args(tiny, out)) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "engine process 0 died" in err
    monkeypatch.delenv(DEBUG_ENV)
    stop(KeyboardInterrupt())
    assert run.main(_eval_args(tiny, out)) == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err.strip() == (f"interrupted (Ctrl-C): the results written so far are under {out}; the "
                                               f"same command resumes there (problems already in a results file are "
                                               f"skipped)")
    stop(signal.SIGTERM)
    previous = signal.getsignal(signal.SIGTERM)
    assert run.main(_eval_args(tiny, out)) == EXIT_TERMINATED == 143
    assert capsys.readouterr().err.strip().startswith(f"stopped (SIGTERM): the results written so far are under {out}")
    assert signal.getsignal(signal.SIGTERM) is previous   # the handler is put back


def test_relay_interrupt_and_failure(tiny, tmp_path, monkeypatch, capsys):
    out = tmp_path / "relay"
    args = ["relay", "--early", str(tiny), "--final", str(tiny), "--benchmarks", "addition", "--n", "1", "--engine",
            "hf", "--out", str(out)]

    def raise_(exc):
        def f(*a, **k):
            raise exc
        return f

    monkeypatch.setattr(inference, "load_policy", raise_(KeyboardInterrupt()))
    assert tsanalysis_main(args) == 130
    warning, line = [x for x in capsys.readouterr().err.splitlines() if x.strip()]   # --early is --final: said first
    assert warning.startswith(f"warning: --early {tiny} and --final {tiny} are the same model")
    assert line == (f"interrupted (Ctrl-C): the relay's prefixes.jsonl and results.jsonl in {out} keep every finished "
                    f"chunk; the same command resumes from them")
    monkeypatch.setattr(inference, "load_policy", raise_(OSError("could not load policy: disk quota exceeded")))
    assert tsanalysis_main(args) == 1
    [line] = _error_lines(capsys.readouterr().err)
    assert line.startswith("error: OSError: could not load policy: disk quota exceeded; the relay's prefixes.jsonl")
    assert not out.exists()   # the claim of a folder that holds nothing is undone


def test_relay_refuses_a_code_benchmark_without_full_isolation(tiny, tmp_path, monkeypatch, capsys):
    """Fail closed, as eval.run: a code benchmark on a machine without the sandbox's namespaces (the probe's verdict
    replaced here) is one line and exit 2, before a model loads or the folder is claimed."""
    import dataclasses

    from scoring.sandbox import ALLOW_UNISOLATED_ENV, host
    monkeypatch.setattr(host, "_ISOLATION", dataclasses.replace(host.isolation(), namespaces=False,
                                                                reason="test: no unshare"))
    monkeypatch.delenv(ALLOW_UNISOLATED_ENV, raising=False)
    monkeypatch.setenv("THINKING_SEEDS_DATA", str(SHARED_DATA))
    monkeypatch.setattr(inference, "load_policy", lambda *a, **k: pytest.fail("a model was loaded"))
    out = tmp_path / "relay"
    rc = tsanalysis_main(["relay", "--early", str(tiny), "--final", str(tiny), "--benchmarks", "humaneval", "--n", "1",
                          "--limit", "1", "--engine", "hf", "--out", str(out)])
    [line] = _error_lines(capsys.readouterr().err)
    assert rc == EXIT_USAGE and line.startswith("error: code grading needs the full sandbox, which this machine does "
                                                "not give (test: no unshare)") and "--allow-unisolated" in line
    assert not out.exists()


def test_run_command_maps_input_errors_and_passes_system_exit(capsys):
    assert run_command(lambda: (_ for _ in ()).throw(ValueError("bad --n\n, got 0")), input_errors=(ValueError,)) \
        == EXIT_USAGE
    assert capsys.readouterr().err == "error: bad --n , got 0\n"
    class Exit(SystemExit, ValueError):   # eval.run's input errors are both
        pass

    with pytest.raises(SystemExit):
        run_command(lambda: sys.exit(2))
    with pytest.raises(Exit):
        run_command(lambda: (_ for _ in ()).throw(Exit(2)), input_errors=(ValueError,))
    assert run_command(lambda: None) == 0 and run_command(lambda: 3) == 3


# ---- every entry point, as a user starts it -----------------------------------------------------------------------
@pytest.mark.slow
def test_every_entry_point_refuses_bad_input_with_one_line_and_exit_2(tmp_path):
    """Ten processes, started together (each is mostly imports)."""
    py = sys.executable
    missing = "nobody/no-such-model"
    cases = {
        "eval.run": ([py, "-m", "eval.run", "--model", missing, "--benchmarks", "addition", "--out",
                      str(tmp_path / "eval")], missing),
        "eval.leaderboard": ([py, "-m", "eval.leaderboard", str(tmp_path / "none")], "is not a directory of eval"),
        "tsanalysis relay": ([py, "-m", "tsanalysis", "relay", "--early", missing, "--final", missing, "--benchmarks",
                              "addition", "--out", str(tmp_path / "relay")], missing),
        "trainer.train": ([py, "-m", "trainer.train", "--config", "trainer/configs/tiny.yaml", "no_such_field=1",
                           f"output_dir={tmp_path / 'runs'}"], "no_such_field"),
        "demo": ([py, "-m", "demo", "--seeds", "0", "--out", str(tmp_path / "demo")], "--seeds must be >= 1"),
        "demo.miniature": ([py, "-m", "demo.miniature", "--seeds", "0", "--out", str(tmp_path / "mini")],
                           "--seeds must be >= 1"),
        "demo.premise": ([py, "-m", "demo.premise", "--seeds", "0", "--out", str(tmp_path / "premise")],
                         "--seeds must be >= 1"),
        "demo.premise --extend-to": ([py, "-m", "demo.premise", "--extend-to", "40", "--out",
                                      str(tmp_path / "premise")], "--extend-to 40: give a step count of at least"),
        "figures.make_all": ([py, "-m", "figures.make_all", str(tmp_path), "--dpi", "0", "--out",
                              str(tmp_path / "figs")], "--dpi 0"),
        "figures.notebook": ([py, "-m", "figures.notebook", "no_such_notebook", str(tmp_path), "--out",
                              str(tmp_path / "nb")], "no_such_notebook"),
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    env.pop(DEBUG_ENV, None)
    procs = {name: subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True) for name, (cmd, _) in cases.items()}
    for name, p in procs.items():
        _, err = p.communicate(timeout=300)
        [line] = _error_lines(err)
        assert p.returncode == 2 and cases[name][1] in line, (name, err[-2000:])
    assert not any((tmp_path / d).exists() for d in ("eval", "relay", "runs", "demo", "mini", "premise", "figs", "nb"))


# ---- where the data comes from --------------------------------------------------------------------------------------
MATH = {"aime24": "aime24", "aime25": "aime25", "amc23": "amc23", "math500": "math500", "minerva": "minerva_math",
        "olympiadbench": "olympiadbench"}


def test_data_messages_say_where_the_data_comes_from_and_its_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("THINKING_SEEDS_DATA", str(tmp_path))   # an empty data folder
    msgs = {}
    for name, folder in MATH.items():
        with pytest.raises(FileNotFoundError) as e:
            get_benchmark(name).load()
        msgs[name] = str(e.value)
        source, fields = mathbench.STORED[folder]
        assert f"$THINKING_SEEDS_DATA/math/{folder}/test.jsonl" in msgs[name] and source in msgs[name]
        assert fields in msgs[name] and "docs/data.md" in msgs[name]
    for name in ("humaneval", "livecodebench"):
        with pytest.raises(FileNotFoundError) as e:
            get_benchmark(name).load()
        msgs[name] = str(e.value)
    assert "$THINKING_SEEDS_DATA/code/humaneval/HumanEval.jsonl.gz" in msgs["humaneval"] and \
        humaneval.SOURCE in msgs["humaneval"] and humaneval.FIELDS in msgs["humaneval"]
    assert "$THINKING_SEEDS_DATA/code/livecodebench" in msgs["livecodebench"] and \
        "hf download livecodebench/code_generation_lite test6.jsonl --repo-type dataset" in msgs["livecodebench"]
    monkeypatch.delenv("THINKING_SEEDS_DATA")
    for name in ("humaneval", "livecodebench"):
        with pytest.raises(FileNotFoundError, match="THINKING_SEEDS_DATA is not set") as e:
            get_benchmark(name).load()
        msgs[name + " unset"] = str(e.value)
        assert "$THINKING_SEEDS_DATA/code/" in msgs[name + " unset"]
    for name, msg in msgs.items():
        assert "shared/data" not in msg and "shared/" not in msg, (name, msg)
    assert livecodebench.HUB_DATASET == "livecodebench/code_generation_lite"


def test_docs_data_page_matches_the_sources_and_the_files():
    """docs/data.md names each stored file's repository, commit and path as STORED does, and its sha256 is the
    one of the copy the tests read (where that copy is next to the repository)."""
    page = (REPO / "docs" / "data.md").read_text()
    rows = {}
    for line in page.splitlines():
        m = re.match(r"\| `(\w+)` \| `([^`]+)` \| (.+?) \| (\d+)", line)
        if m:
            rows[m.group(2)] = line
    for folder, (source, _) in mathbench.STORED.items():
        repo_commit, path = source.split(" ")
        repo, commit = repo_commit.split("@")
        line = rows[f"math/{folder}/test.jsonl"]
        assert f"{repo} @ {commit}, `{path}`" in line, line
    assert "openai/human-eval @ 6d43fb980f9fee3c892a914eda09951f772ad10d, `data/HumanEval.jsonl.gz`" in \
        rows["code/humaneval/HumanEval.jsonl.gz"]
    if not SHARED_DATA.is_dir():
        pytest.skip(f"no data copy at {SHARED_DATA}")
    for stored, line in rows.items():
        f = SHARED_DATA / stored
        if f.is_file():
            digest = hashlib.sha256(f.read_bytes()).hexdigest()
            assert f"`{digest}`" in line, (stored, digest)
    assert sum((SHARED_DATA / s).is_file() for s in rows) == 7   # six math files and HumanEval


def test_a_failure_after_a_ctrl_c_is_the_interrupt_even_when_the_error_no_longer_carries_it(capsys):
    """torch's checkpoint writer stopped mid-file by Ctrl-C raises ``unexpected pos`` (which reads like a full disk)
    without the KeyboardInterrupt among its causes: run_command still says interrupted and exits 130, because the
    Ctrl-C was recorded when it arrived. Without a Ctrl-C the same error is a failure, exit 1."""
    from contracts.commands import sigint_arrived

    def body(send: bool):
        def run():
            stopped = False
            try:
                if send:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(1.0)
            except KeyboardInterrupt:
                stopped = True   # a library swallows it on its way out...
            if send:
                assert stopped
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")   # ...and fails
        return run

    assert run_command(body(True), resume=lambda: "the same command resumes") == EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert "interrupted (Ctrl-C): the same command resumes" in err and "error" not in err
    assert sigint_arrived()
    assert run_command(body(False)) == EXIT_FAILURE and not sigint_arrived()   # cleared when the next command starts
    assert "unexpected pos" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler   # the handler is put back
