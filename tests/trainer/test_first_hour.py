"""Issue #38, a user's first hour with ``python -m trainer.train``, continued from ``test_launch.py``: each case
asserts the exit code, the one line printed, and that nothing already written changed.

* Ctrl-C or SIGTERM during the supervised warm-up (``sft_steps``) says where it stopped (the warm-up's step) and that
  the same command builds the warm-up again from step 0 (it is saved only once finished), exits 130 / 143, and
  leaves no folder a later launch could read as a finished warm-up, nor an empty run folder.
* A launch refused after the preflight (a checkpoint, validation data, a changed resume: exit 2) leaves no
  ``runs/<run_name>/`` behind that did not exist, and one that existed unchanged.
* A finished run relaunched with a smaller ``total_steps``, or with validation on (docs/training.md's validation
  command), says so in one line (what was not trained, not validated, and the ``eval.run`` command that scores the
  checkpoint as validation would) and writes nothing: config.yaml keeps its ``val_every``.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

import trainer.warmup as warmup
from contracts.commands import Terminated
from contracts.config import dump_yaml
from tests.trainer.test_launch import _launch, _tree, tiny
from trainer.config import load_config
from trainer.train import main


def _lines(err: str) -> list[str]:
    return [x for x in err.splitlines() if x.strip()]


# ------------------------------------------------------------------------------- a signal during the warm-up
def _sft_stopped_at(step: int, exc: type[BaseException]):
    """An ``sft`` that runs ``step`` forwards of its model (sft's one per step), then is stopped by ``exc``."""
    def sft(model, tokenizer, examples, **kw):
        for _ in range(step):
            model(input_ids=torch.tensor([[1, 2, 3]]))
        raise exc()
    return sft


@pytest.mark.parametrize("exc, code, said", [(KeyboardInterrupt, 130, "interrupted (Ctrl-C)"),
                                             (Terminated, 143, "stopped (SIGTERM)")], ids=["ctrl-c", "sigterm"])
def test_a_signal_during_the_warm_up_says_its_step_and_leaves_nothing_read_as_finished(tmp_path, capsys, monkeypatch,
                                                                                        exc, code, said):
    out = tmp_path / "runs"
    (out / "earlier").mkdir(parents=True)
    (out / "earlier" / "metrics.jsonl").write_text('{"step": 0}\n')   # another run's folder: untouched
    before = _tree(out)
    monkeypatch.setattr(warmup, "sft", _sft_stopped_at(3, exc))
    argv = tiny(out, sft_steps=50)
    assert main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert _lines(err)[-1] == (f"{said}: during the supervised warm-up, at step 3 of at most 50; a warm-up is saved "
                               f"only once it finishes, so the same command builds it again from step 0, then trains "
                               f"the run from step 0")
    assert [x for x in _lines(err) if not x.startswith("supervised warm-up: tiny:1m")] == [_lines(err)[-1]]
    assert _tree(out) == before   # no run folder, no warm-up folder (nor its .tmp) a later launch would read
    cache = warmup.sft_cache_dir(load_config(None, argv))
    assert warmup.read_warmup(cache) is None and not cache.parent.exists()


def test_a_signal_before_the_warm_ups_first_step_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(warmup, "sft", _sft_stopped_at(0, Terminated))
    assert main(tiny(tmp_path / "runs", sft_steps=50)) == 143
    assert _lines(capsys.readouterr().err)[-1].startswith(
        "stopped (SIGTERM): during the supervised warm-up, before its first step; a warm-up is saved only once it "
        "finishes, so the same command builds it again from step 0")
    assert not (tmp_path / "runs").exists()


def test_a_warm_up_stopped_in_a_resumed_run_says_where_the_run_resumes(tmp_path, capsys, monkeypatch):
    run = tmp_path / "runs" / "run"
    _fake_checkpoint(run, 0)
    before = _tree(run)
    monkeypatch.setattr(warmup, "sft", _sft_stopped_at(2, Terminated))
    assert main(tiny(tmp_path / "runs", sft_steps=50)) == 143
    assert _lines(capsys.readouterr().err)[-1].endswith(
        f"then resumes the run from {run / 'checkpoints' / 'step_000000'} (step 1)")
    assert _tree(run) == before


def test_sigterm_while_loading_is_one_line_and_143(tmp_path, capsys, monkeypatch):
    import trainer.train as tt

    def loading(cfg, d):
        raise Terminated()   # what contracts.commands.sigterm_raises raises, outside the steps' loop

    monkeypatch.setattr(tt, "train", loading)
    assert main(tiny(tmp_path / "runs")) == 143
    assert _lines(capsys.readouterr().err) == [
        f"stopped (SIGTERM): no checkpoint in {tmp_path / 'runs' / 'run'} yet: the same command starts the run again "
        f"from step 0"]


@pytest.mark.slow   # a launch in a subprocess, stopped during its warm-up
def test_sigterm_during_a_real_warm_up_exits_143_with_the_line_and_leaves_nothing(tmp_path):
    out = tmp_path / "runs"
    proc = _launch(tiny(out, sft_steps=5000))
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.time() + 300
    while not any(x.startswith("supervised warm-up: tiny:1m") for x in err):
        assert proc.poll() is None and time.time() < deadline, "".join(err)[-2000:]
        time.sleep(0.05)
    time.sleep(1.0)   # a few sft steps
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    reader.join(timeout=10)
    text = "".join(err)
    assert proc.returncode == 143, text
    assert "Traceback" not in text
    assert re.fullmatch(r"stopped \(SIGTERM\): during the supervised warm-up, (at step \d+ of at most 5000|before its "
                        r"first step); a warm-up is saved only once it finishes, so the same command builds it again "
                        r"from step 0, then trains the run from step 0", _lines(text)[-1]), _lines(text)[-1]
    assert not out.exists()   # the lock's folders removed, no half warm-up folder


# ------------------------------------------------------------------------------- refused after the preflight
def _fake_checkpoint(run: Path, step: int, *, model: bool = False) -> Path:
    """A resumable checkpoint of ``step`` as ``check_format`` reads it (no weights: nothing here loads it)."""
    path = run / "checkpoints" / f"step_{step:06d}"
    state = path / "trainer_state"
    (state / "dcp").mkdir(parents=True)
    (state / "state.pt").write_bytes(b"")
    (state / "meta.json").write_text(json.dumps({"format": 2, "step": step}))
    (state / "dcp" / ".metadata").write_bytes(b"")
    if model:
        (path / "config.json").write_text("{}")
    return path


def _refused_after_preflight(tmp_path: Path) -> dict[str, list[str]]:
    not_a_checkpoint = tmp_path / "not_a_checkpoint"
    not_a_checkpoint.mkdir(exist_ok=True)
    return {   # each passes --dry-run's checks and is refused by the launch itself
        "validation-prompt-too-long": ["val_benchmarks=addition", "val_every=1", "val_n=2", "val_limit=4",
                                       "val_max_tokens=1020"],
        "resume-not-a-checkpoint": [f"resume={not_a_checkpoint}"],
    }


@pytest.mark.parametrize("case", ["validation-prompt-too-long", "resume-not-a-checkpoint"])
@pytest.mark.parametrize("output_dir_existed", [False, True], ids=["new-output-dir", "output-dir-with-a-run"])
def test_a_launch_refused_after_the_preflight_leaves_no_run_folder(tmp_path, capsys, case, output_dir_existed):
    out = tmp_path / "runs"
    if output_dir_existed:
        (out / "earlier").mkdir(parents=True)
        (out / "earlier" / "config.yaml").write_text("lr: 0.0001\n")
    before = _tree(out) if out.exists() else None
    argv = [*tiny(out), *_refused_after_preflight(tmp_path)[case]]
    assert main([*argv, "--dry-run"]) == 0   # not bad input the checks before the launch see
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(_lines(err)) == 1 and _lines(err)[0].startswith("error") and "Traceback" not in err, err
    assert not (out / "run").exists()
    assert (_tree(out) if out.exists() else None) == before


@pytest.mark.parametrize("case", ["changed-settings", "resume-not-a-checkpoint"])
def test_a_launch_refused_on_an_existing_run_folder_leaves_it_unchanged(tmp_path, capsys, case):
    out = tmp_path / "runs"
    run = out / "run"
    _fake_checkpoint(run, 0)
    dump_yaml(load_config(None, tiny(out)), run / "config.yaml")
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    before = _tree(run)
    refusals = {"changed-settings": ["lr=0.001"], **_refused_after_preflight(tmp_path)}
    assert main([*tiny(out, total_steps=4), *refusals[case]]) == 2
    err = capsys.readouterr().err
    assert len(_lines(err)) == 1 and _lines(err)[0].startswith("error") and "Traceback" not in err, err
    assert _tree(run) == before


# ------------------------------------------------------------------------------- a finished run relaunched
def _finished_run(out: Path, last: int) -> Path:
    """A run that trained steps 0..``last`` (checkpoints of every step: a model each, the last resumable), recorded
    with validation off."""
    run = out / "run"
    for step in range(last):
        (run / "checkpoints" / f"step_{step:06d}").mkdir(parents=True)
        (run / "checkpoints" / f"step_{step:06d}" / "config.json").write_text("{}")
    _fake_checkpoint(run, last, model=True)
    dump_yaml(load_config(None, tiny(out, total_steps=last + 1)), run / "config.yaml")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(last + 1)))
    return run


def test_a_finished_run_relaunched_with_fewer_steps_says_it_is_past_them_and_writes_nothing(tmp_path, capsys):
    run = _finished_run(tmp_path / "runs", 3)
    before = _tree(run)
    assert main(tiny(tmp_path / "runs", total_steps=2)) == 0   # as "already at total_steps": nothing to do is no error
    ckpts = run / "checkpoints"
    assert _lines(capsys.readouterr().err) == [
        f"already past total_steps=2: {run} is at step 3 (trained steps 0-3, checkpoint {ckpts / 'step_000003'}) and a "
        f"relaunch does not shorten a run, so nothing was trained and nothing was written; its model after step 1 is "
        f"{ckpts / 'step_000001'}; to train further set total_steps above 4 (total_steps=N: a resume may change it), "
        f"for a new run give another run_name"]
    assert _tree(run) == before   # config.yaml (total_steps: 4) and metrics.jsonl as they were


def test_validation_asked_of_a_finished_run_says_none_ran_and_how_and_keeps_config_yaml(tmp_path, capsys):
    from eval.run import parse_config
    run = _finished_run(tmp_path / "runs", 1)
    before = _tree(run)
    # docs/training.md's validation command, on the finished run
    argv = tiny(tmp_path / "runs", val_benchmarks="addition", val_every=10, val_before_train="true", val_limit=50)
    assert main(argv) == 0
    [line] = _lines(capsys.readouterr().err)
    ckpt = run / "checkpoints" / "step_000001"
    assert line.startswith(f"already at total_steps=2: {run} has trained steps 0-1 (checkpoint {ckpt}), so there is "
                           f"nothing to train and nothing was written; ")
    command = f"python -m eval.run --model {ckpt} --benchmarks addition --limit 50"
    assert line.endswith(f"; validation scores only the steps a launch trains, so nothing was validated: to score "
                         f"{ckpt} as validation would, run {command}")
    said = parse_config(command.split()[3:])   # the command it gives is one eval.run takes
    assert (said.models, said.benchmarks, said.limit) == ([str(ckpt)], ["addition"], 50)
    assert _tree(run) == before
    assert "val_every: 0" in (run / "config.yaml").read_text()
