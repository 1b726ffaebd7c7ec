"""What a launch of ``python -m trainer.train`` refuses, records and does on a signal, as a user meets it: the exit
code, the line printed, the folder left behind.

* Bad input (data, model, output folder, settings that are invalid) is refused by the checks ``--dry-run`` makes,
  before anything is built: exit 2, one ``error:`` line naming the field or file, nothing written.
* A resume whose training settings changed is refused (exit 2, both values named) unless
  ``resume_with_changes=true``, and then ``config_history.jsonl`` keeps what the earlier steps ran with.
* SIGTERM saves a resume point and exits 143 with one line; Ctrl-C exits 130 with one line, no traceback; the same
  command resumes.
* One trainer per run folder: a launch into a folder another trainer writes is refused (exit 2, the holder named,
  nothing touched); a killed trainer's lock is taken over with a warning; a finished run relaunched says "already at
  total_steps" and writes nothing.

The runs are a fresh ``tiny:1m`` (no warm-up) for a few steps of 4 prompts x 2 samples: what is tested is the
launch, not learning.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.processes import died_holding, other_holder
from trainer.train import main, torch_threads

REPO = Path(__file__).resolve().parents[2]


def tiny(out: Path, **extra) -> list[str]:
    base = {"output_dir": str(out), "run_name": "run", "model": "tiny:1m", "task": "addition",
            "task_kwargs": json.dumps({"min_digits": 1, "max_digits": 1}), "num_train_examples": 64,
            "prompts_per_step": 4, "samples_per_prompt": 2, "max_response_tokens": 6, "lr": 1e-4,
            "total_steps": 2, "save_every": 1, "progress": False, "log_rollouts": False}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _refused(capsys, argv: list[str], *expected: str) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2, err
    assert lines and all(x.startswith("error") for x in lines), err
    assert "Traceback" not in err
    for text in expected:
        assert text in err, err
    return err


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("content, expected", [
    ('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2", answer: 4}\n', "train.jsonl:2: malformed JSON line"),
    ('{"prompt": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n', "train.jsonl:2: row has no field 'prompt'"),
    ("", "train.jsonl"),
], ids=["malformed", "field-missing", "empty"])
def test_a_bad_data_file_is_one_line_and_nothing_is_written(tmp_path, capsys, content, expected):
    data = tmp_path / "train.jsonl"
    data.write_text(content)
    out = tmp_path / "runs"
    _refused(capsys, tiny(out, train_file=str(data), task="math", template="qwen-math"), "error: data: ", expected)
    assert not out.exists()


def test_a_model_path_that_does_not_exist_or_is_a_run_folder_is_named(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "old" / "checkpoints" / "step_000009").mkdir(parents=True)
    (tmp_path / "runs" / "old" / "checkpoints" / "step_000009" / "config.json").write_text("{}")   # a saved model
    (tmp_path / "runs" / "old" / "config.yaml").write_text("lr: 1.0e-06\n")
    out = tmp_path / "out"
    err = _refused(capsys, tiny(out, model="runs/nothing"), "error: model: model=runs/nothing: no such model folder")
    assert "hub" not in err   # an existing local folder's child is a path, never a hub id
    _refused(capsys, tiny(out, model="runs/old"), "is a training run folder (config.yaml, checkpoints/), not a checkpoint",
             str(Path("runs/old/checkpoints/step_000009")))
    _refused(capsys, tiny(out, model="./missing-model"), "no such model folder")
    assert not out.exists()


def test_an_output_dir_that_is_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "runs"
    target.write_text("not a folder")
    _refused(capsys, tiny(target), f"output_dir={target} is a file")
    assert target.read_text() == "not a folder"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through a read-only mode")
def test_a_read_only_output_dir_is_refused(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        _refused(capsys, tiny(ro / "runs"), "is not writable")
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("override, expected", [
    ("lr=-1", "lr must be >= 0, got -1"),
    ("sft_steps=-10", "sft_steps must be >= 0"),
    ("save_every=-3", "save_every must be >= 0"),
    ("threads=-1", "threads must be >= 0"),
    ("max_grad_norm=0", "max_grad_norm must be > 0"),
])
def test_settings_that_cannot_run_are_config_errors(tmp_path, capsys, override, expected):
    _refused(capsys, [*tiny(tmp_path / "runs"), override], "error: config: ", expected)
    assert not (tmp_path / "runs").exists()


def test_a_tracker_whose_package_is_missing_is_named_with_the_install(tmp_path, capsys, monkeypatch):
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    _refused(capsys, tiny(tmp_path / "runs", tracker="wandb"), "error: packages: 'wandb' is not installed",
             "pip install -e '.[tracking]'")
    assert not (tmp_path / "runs").exists()


def test_temperature_zero_warns_once_that_nothing_is_learnt(tmp_path, capsys):
    assert main(["--dry-run", *tiny(tmp_path / "runs", temperature=0)]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: temperature=0 samples greedily") == 1


def test_threads_honour_the_setting_then_omp_num_threads_then_the_cores(monkeypatch):
    from trainer.config import Config
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert torch_threads(Config(threads=5), 1) == 5
    assert torch_threads(Config(), 2) == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert torch_threads(Config(), 1) == max(1, os.cpu_count() or 1)
    assert torch_threads(Config(), 64) == 1


# ------------------------------------------------------------------------------------- resume and history
@pytest.mark.slow   # four short runs
def test_a_resume_with_changed_settings_is_refused_then_recorded_when_asked(tmp_path, capsys):
    out = tmp_path / "runs"
    run = out / "run"
    assert main(tiny(out)) == 0
    capsys.readouterr()
    before = (run / "config.yaml").read_text()
    err = _refused(capsys, [*tiny(out, total_steps=4), "lr=0.001", "samples_per_prompt=4"],
                   "lr: recorded 0.0001, now 0.001", "samples_per_prompt: recorded 2, now 4", "resume_with_changes=true")
    assert (run / "config.yaml").read_text() == before   # the record is untouched
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 2
    assert "misdescribes" in err
    # operational settings (how far, how often to save, how to report) may change on any resume
    assert main(tiny(out, total_steps=3, save_every=0)) == 0
    capsys.readouterr()
    # asked for: the run continues with the new lr and the history keeps each launch's settings
    assert main([*tiny(out, total_steps=4), "lr=0.001", "resume_with_changes=true"]) == 0
    capsys.readouterr()
    history = [json.loads(x) for x in (run / "config_history.jsonl").read_text().splitlines()]
    assert [h["from_step"] for h in history] == [0, 2, 3]
    assert [h["config"]["lr"] for h in history] == [1e-4, 1e-4, 1e-3]
    assert history[1]["changed"] == {"total_steps": {"was": 2, "now": 3}, "save_every": {"was": 1, "now": 0}}
    assert history[2]["changed"]["lr"] == {"was": 1e-4, "now": 1e-3}
    assert yaml.safe_load((run / "config.yaml").read_text())["lr"] == 1e-3
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]


@pytest.mark.slow   # a short run
def test_a_copied_preset_that_keeps_the_run_name_does_not_continue_the_old_run(tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(tiny(out)) == 0
    capsys.readouterr()
    _refused(capsys, tiny(out, algorithm="seeds", seed_refresh_interval=2), "algorithm: recorded 'dapo', now 'seeds'")


# ------------------------------------------------------------------------------- one trainer per run folder
def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def _held_line(out: Path, pid: int) -> str:
    lock = out / "run" / ".train.lock"
    rec = json.loads(lock.read_text())
    return (f"error: the run folder {out / 'run'} is being written by another trainer.train (pid {pid} on host "
            f"{rec['host']}, since {rec['since']}; lock file {lock}); wait for that run to end (or stop it), or give "
            f"this one another run_name")


def test_a_second_trainer_on_a_run_folder_is_refused_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "runs"
    with other_holder(out / "run" / ".train.lock", "trainer.train") as pid:
        before = _tree(out)
        err = _refused(capsys, tiny(out))
        assert err.strip() == _held_line(out, pid)
        assert _tree(out) == before   # only the holder's lock file, as it was


def test_a_run_already_at_total_steps_says_so_and_writes_nothing(tmp_path, capsys):
    run = tmp_path / "runs" / "run"
    state = run / "checkpoints" / "step_000001" / "trainer_state"   # a resumable checkpoint of the last step
    (state / "dcp").mkdir(parents=True)
    (state / "state.pt").write_bytes(b"")
    (state / "meta.json").write_text('{"format": 2, "step": 1}')   # what check_format reads (trainer.checkpoint)
    (state / "dcp" / ".metadata").write_bytes(b"")
    before = _tree(run)
    assert main(tiny(tmp_path / "runs")) == 0   # total_steps=2: steps 0 and 1 are trained
    assert [x for x in capsys.readouterr().err.splitlines() if x.strip()] == [
        f"already at total_steps=2: {run} has trained steps 0-1 (checkpoint {run / 'checkpoints' / 'step_000001'}), "
        f"so there is nothing to train and nothing was written; to train further raise total_steps (total_steps=N: "
        f"a resume may change it), for a new run give another run_name"]
    assert _tree(run) == before


@pytest.mark.slow   # a short run, then three launches that train nothing
def test_a_finished_run_relaunched_says_so_and_a_killed_trainers_lock_is_taken_over(tmp_path, capsys):
    out = tmp_path / "runs"
    run = out / "run"
    dead = died_holding(run / ".train.lock", "trainer.train")   # a trainer SIGKILLed in this folder
    assert main(tiny(out)) == 0
    err = capsys.readouterr().err
    assert f"warning: took over a stale lock: trainer.train (pid {dead} on host " in err
    assert not (run / ".train.lock").exists()
    before = _tree(run)
    assert main(tiny(out)) == 0   # the same command again: nothing to train, nothing loaded or written
    assert [x for x in capsys.readouterr().err.splitlines() if x.strip()] == [
        f"already at total_steps=2: {run} has trained steps 0-1 (checkpoint {run / 'checkpoints' / 'step_000001'}), "
        f"so there is nothing to train and nothing was written; to train further raise total_steps (total_steps=N: "
        f"a resume may change it), for a new run give another run_name"]
    assert _tree(run) == before   # config_history.jsonl has no launch line for it
    # the run extended while another trainer writes it: refused, nothing touched
    with other_holder(run / ".train.lock", "trainer.train") as pid:
        held = _tree(run)
        assert _refused(capsys, tiny(out, total_steps=4)).strip() == _held_line(out, pid)
        assert _tree(run) == held
    assert main(tiny(out, total_steps=3)) == 0   # the holder gone: it extends the run
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]


# ------------------------------------------------------------------------------------------------ signals
def _default_signals() -> None:
    """In the child before exec: SIGINT and SIGTERM at their defaults, as a shell starts a command (a child inherits
    an ignored SIGINT, and Python then never raises KeyboardInterrupt: under pytest-xdist the worker's disposition
    is not always the default, and a Ctrl-C test's child once trained all its steps through the signal)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _launch(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "trainer.train", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)


def _after_first_step(proc: subprocess.Popen, metrics: Path) -> None:
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        if metrics.is_file() and metrics.read_text().strip():
            return
        time.sleep(0.05)
    raise AssertionError(f"no step finished (rc {proc.poll()}): {proc.communicate()[1][-2000:]}")


@pytest.mark.slow   # two launches in subprocesses
def test_sigterm_saves_a_resume_point_and_the_same_command_continues(tmp_path):
    out = tmp_path / "runs"
    args = tiny(out, total_steps=200, save_every=0, num_train_examples=2000)
    proc = _launch(args)
    _after_first_step(proc, out / "run" / "metrics.jsonl")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert "Traceback" not in err
    [line] = [x for x in err.splitlines() if "SIGTERM" in x]
    step = int(line.split("after step ")[1].split(",")[0])
    assert line == (f"stopped on SIGTERM after step {step}, resume point saved: the same command resumes from "
                    f"{out / 'run' / 'checkpoints' / f'step_{step:06d}'} (step {step + 1})")
    assert len((out / "run" / "metrics.jsonl").read_text().splitlines()) == step + 1
    again = _launch(tiny(out, total_steps=step + 2, save_every=0, num_train_examples=2000))
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert f"at step {step + 1}" in err
    assert [json.loads(x)["step"] for x in (out / "run" / "metrics.jsonl").read_text().splitlines()] == \
        list(range(step + 2))


@pytest.mark.slow   # a launch in a subprocess
def test_ctrl_c_exits_130_with_one_line_saying_how_to_resume(tmp_path):
    out = tmp_path / "runs"
    proc = _launch(tiny(out, total_steps=200, save_every=1, num_train_examples=2000))
    _after_first_step(proc, out / "run" / "metrics.jsonl")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    [line] = [x for x in err.splitlines() if x.startswith("interrupted")]
    assert line.startswith("interrupted (Ctrl-C): the same command resumes from ") or \
        line.startswith("interrupted (Ctrl-C): no checkpoint in"), line


def test_the_progress_line_shows_loss_entropy_and_skipped_updates(capsys):
    from trainer.tracking import ProgressBar
    bar = ProgressBar(total=3, initial=0, desc="run")
    bar.log({"reward/mean": 0.0, "time/step_s": 1.5, "sampling/skipped_update": 1}, 0)
    bar.log({"reward/mean": 0.25, "time/step_s": 1.25, "ppo/loss": -0.0123, "ppo/entropy": 1.75}, 1)
    assert bar.skipped == 1
    assert bar.bar.postfix == "reward=0.250, loss=-0.0123, entropy=1.75, skipped=1, step_s=1.25"
    bar.close()


def test_help_lists_every_config_field_with_its_default_and_comment(capsys):
    import dataclasses

    from trainer.config import Config
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    listed = {line.split("=", 1)[0].strip() for line in out.splitlines() if line.startswith("  ") and "=" in line}
    assert {f.name for f in dataclasses.fields(Config)} <= listed
    assert "  lr=1e-06" in out
    assert "  resume_with_changes=False  resume even where training settings differ" in out
    assert "130 Ctrl-C, 143 SIGTERM" in out and "2 bad input" in out   # contracts.commands.EXIT_CODES_HELP


def test_a_failure_inside_the_run_is_one_line_exit_1_and_the_traceback_on_request(tmp_path, capsys, monkeypatch):
    # the convention of every command (contracts.commands): not bad input, so exit 1, one line with the type, what
    # is kept and how to resume; THINKING_SEEDS_DEBUG=1 prints the traceback too
    import trainer.train as tt

    def broken(cfg, d):
        raise RuntimeError("CUDA error: an illegal memory access\nwas encountered")

    monkeypatch.setattr(tt, "train", broken)
    argv = tiny(tmp_path / "runs")
    assert main(argv) == 1
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: RuntimeError: CUDA error: an illegal memory access was encountered; "
                               "checkpoints so far kept;"), lines[0]
    assert "THINKING_SEEDS_DEBUG=1" in lines[0]
    monkeypatch.setenv("THINKING_SEEDS_DEBUG", "1")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("error: RuntimeError:")


def test_a_ctrl_c_a_library_wraps_in_its_own_error_is_still_an_interrupt(tmp_path, capsys, monkeypatch):
    import trainer.train as tt

    def wrapped(cfg, d):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("worker pool shut down") from None   # context kept: what a pool's cleanup raises

    monkeypatch.setattr(tt, "train", wrapped)
    assert main(tiny(tmp_path / "runs")) == 130
    err = capsys.readouterr().err
    assert "interrupted (Ctrl-C)" in err and "error:" not in err


# ---- #38 item 3: failures outside the preflight ---------------------------------------------------------------
@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b"])
def test_a_run_name_that_is_not_one_folder_is_bad_input(name, tmp_path, capsys):
    out = tmp_path / "runs"
    assert main(tiny(out) + [f"run_name={name}"]) == 2
    err = capsys.readouterr().err
    assert f"run_name={name!r} must name one folder under output_dir" in err
    assert not out.exists() and not (tmp_path / "x").exists()   # nothing written, inside or outside output_dir


def test_a_yaml_key_given_twice_names_both_lines(tmp_path, capsys):
    preset = tmp_path / "p.yaml"
    preset.write_text("model: tiny:1m\nlr: 1.0e-4\ntotal_steps: 2\nlr: 3.0e-4\n")
    assert main(["--config", str(preset), "--dry-run"]) == 2
    assert f"{preset}: line 4: key 'lr' is given twice (first on line 2); keep one" in capsys.readouterr().err


def test_a_command_line_key_is_blamed_on_the_command_line_not_the_file(tmp_path, capsys):
    preset = tmp_path / "p.yaml"
    preset.write_text("model: tiny:1m\n")
    assert main(["--config", str(preset), "--dry-run", "total_steps=many"]) == 2
    err = capsys.readouterr().err
    assert "total_steps" in err and str(preset) not in err


def test_threads_above_the_cores_is_a_warning(tmp_path, capsys):
    import os
    many = 4 * (os.cpu_count() or 1)
    assert main(tiny(tmp_path / "runs") + [f"threads={many}", "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert f"WARN threads: threads={many} x 1 rank(s) on this node is more than its {os.cpu_count()} cores" in err


def test_a_full_disk_is_said_as_such_with_the_folder():
    from contracts.commands import failure_line
    torch_says = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    line = failure_line(torch_says, kept="checkpoints so far kept", writing="runs/x")
    assert line.startswith("error: no space left on device while writing runs/x: free space there or set another "
                           "output folder; checkpoints so far kept (RuntimeError: ")
    enospc = OSError(28, "No space left on device")
    assert failure_line(enospc, writing="runs/x").startswith("error: no space left on device while writing runs/x")
    other = failure_line(ValueError("boom"), writing="runs/x")
    assert other.startswith("error: ValueError: boom") and "space" not in other


# ---- #38 item 2: a damaged model folder is bad input ----------------------------------------------------------
def test_a_model_folder_with_a_corrupt_config_json_is_bad_input_in_trainer_and_eval(tmp_path, capsys):
    from eval.run import main as eval_main
    from inference.tiny import build_model, build_tokenizer, save_pretrained_atomic
    tok = build_tokenizer()
    model = tmp_path / "m"
    save_pretrained_atomic(build_model("1m", tok, seed=0), tok, model)
    (model / "config.json").write_text('{"model_type": "llama", ')   # cut off mid-write
    out = tmp_path / "runs"
    assert main(tiny(out, model=str(model))) == 2
    line = f"{model / 'config.json'} is not valid JSON (JSONDecodeError: "
    assert line in capsys.readouterr().err and not out.exists()
    res = tmp_path / "res"
    with pytest.raises(SystemExit) as exc:   # eval.run's input errors leave as SystemExit(2) (eval.run.main)
        eval_main(["--model", str(model), "--benchmarks", "addition", "--n", "1", "--out", str(res)])
    assert exc.value.code == 2
    assert line in capsys.readouterr().err and not res.exists()


def test_the_demo_refuses_an_out_that_is_a_file(tmp_path, capsys):
    from demo.__main__ import main as demo_main
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    with pytest.raises(SystemExit) as exc:
        demo_main(["--quick", "--out", str(f / "demo")])
    assert exc.value.code == 2
    assert f"{f} is a file, not a folder" in capsys.readouterr().err and f.read_text() == "mine"


def test_a_start_from_step_0_replaces_what_an_earlier_start_logged(tmp_path, capsys):
    """A run stopped before its first checkpoint (Ctrl-C at step 3) and started again: metrics.jsonl holds the new
    start's steps only (it held 0, 1, 2, 3, 0, 1 before), and the start says so."""
    run = tmp_path / "runs" / "run"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.5}) + "\n" for s in range(4)))
    assert main(tiny(tmp_path / "runs", save_every=0)) == 0
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]
    assert (f"starting at step 0: the 4 metric line(s) an earlier start logged in {run / 'metrics.jsonl'} are "
            f"replaced") in capsys.readouterr().err


@pytest.mark.slow   # a short run with a checkpoint per step, then a resume
def test_a_launch_in_process_gives_the_callers_thread_count_back(tmp_path, monkeypatch):
    """main() sets torch's threads for the run (threads=, else OMP_NUM_THREADS) and gives the caller's count back on
    return, a finished run and a failed one alike: a notebook or test that launches in its own process keeps its
    count (before, a run at OMP_NUM_THREADS=1 left a suite at 2 threads running at 1)."""
    import torch
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    monkeypatch.setenv("OMP_NUM_THREADS", str(other))
    seen = []
    monkeypatch.setattr("trainer.train.train", lambda cfg, d, **kw: seen.append(torch.get_num_threads()) or cfg.run_dir)
    assert main(tiny(tmp_path / "runs", total_steps=1)) == 0
    assert seen == [other] and torch.get_num_threads() == before

    def fails(cfg, d, **kw):
        seen.append(torch.get_num_threads())
        raise RuntimeError("a failure inside the run")
    monkeypatch.setattr("trainer.train.train", fails)
    assert main(tiny(tmp_path / "runs", total_steps=1)) == 1
    assert seen == [other, other] and torch.get_num_threads() == before


def test_a_checkpoint_missing_a_shard_is_skipped_for_the_newest_complete_one(tmp_path, capsys):
    """The newest checkpoint lost a rank's shard: the hint and the resume both take the one before it (said on
    stderr), instead of naming a checkpoint that fails the same way at every launch."""
    from trainer.signals import resume_hint
    out = tmp_path / "runs"
    assert main(tiny(out, total_steps=2)) == 0
    run = out / "run"
    newest, before = run / "checkpoints" / "step_000001", run / "checkpoints" / "step_000000"
    (newest / "trainer_state" / "dcp" / "__0_0.distcp").unlink()
    assert resume_hint(run) == f"the same command resumes from {before} (step 1)"
    capsys.readouterr()
    assert main(tiny(out, total_steps=3)) == 0
    err = capsys.readouterr().err
    said = (f"warning: resuming from {before} (step 1), the newest complete checkpoint: {newest} cannot be resumed "
            f"({newest / 'trainer_state' / 'dcp'} is missing the shard(s) __0_0.distcp of its 1 rank(s))")
    assert err.count(said) == 1, err     # once, though the launch looks for its checkpoint three times
    assert f"resumed from {before} at step 1" in err
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]
