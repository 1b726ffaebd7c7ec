"""contracts.locks: one writer per output. A second writer (in this process, or another) is refused with one line
naming the holder and the lock file, and touches nothing; a released lock leaves no file and no folder it made; a
lock whose process was killed is free at once and taken over, saying so."""

from __future__ import annotations

import json
import os
import socket

import pytest

from contracts.locks import LockHeld, acquire, hold, lock_file
from tests.helpers.processes import died_holding, other_holder


def _take(path, command="eval.run"):
    return acquire(path, what="results/m/addition.jsonl", command=command, fix="choose another --out")


def test_a_second_writer_is_refused_naming_the_holder_and_nothing_changes(tmp_path):
    path = tmp_path / "m" / ".addition.jsonl.lock"
    first = _take(path)
    record = path.read_bytes()
    rec = json.loads(record)
    assert (rec["pid"], rec["host"], rec["command"]) == (os.getpid(), socket.gethostname(), "eval.run")
    with pytest.raises(LockHeld) as exc:   # not re-entrant: the same process is a second writer too
        _take(path)
    assert str(exc.value) == (f"results/m/addition.jsonl is being written by another eval.run (pid {os.getpid()} on "
                              f"host {socket.gethostname()}, since {rec['since']}; lock file {path}); choose "
                              f"another --out")
    assert path.read_bytes() == record   # the refused writer did not touch the holder's record
    first.release()
    first.release()   # idempotent


def test_a_released_lock_leaves_no_file_and_no_folder_it_made(tmp_path):
    target = tmp_path / "out" / "m" / "addition.jsonl"
    assert lock_file(target) == tmp_path / "out" / "m" / ".addition.jsonl.lock"
    with hold(lock_file(target), what=str(target), command="eval.run", fix="x") as lock:
        assert lock.created == [tmp_path / "out", tmp_path / "out" / "m"] and lock.stale is None
    assert list(tmp_path.iterdir()) == []
    with hold(lock_file(target), what=str(target), command="eval.run", fix="x"):
        target.write_text("{}\n")   # something written: that folder stays
    assert sorted(p.name for p in (tmp_path / "out" / "m").iterdir()) == ["addition.jsonl"]
    with pytest.raises(RuntimeError):   # released however the block ends
        with hold(lock_file(target), what=str(target), command="eval.run", fix="x"):
            raise RuntimeError("a failure inside the run")
    assert sorted(p.name for p in (tmp_path / "out" / "m").iterdir()) == ["addition.jsonl"]


def test_another_process_holding_the_lock_is_named_and_a_killed_one_frees_it(tmp_path):
    path = tmp_path / "run" / ".train.lock"
    with other_holder(path, "trainer.train") as pid:
        with pytest.raises(LockHeld, match=rf"is being written by another trainer.train \(pid {pid} on host "):
            _take(path, "trainer.train")
    # killed holding it (SIGKILL: no cleanup ran): the kernel released the lock, the record stays and is taken over
    dead = died_holding(path, "trainer.train")
    lock = _take(path, "trainer.train")
    assert lock.stale.startswith(f"took over a stale lock: trainer.train (pid {dead} on host ")
    assert lock.stale.endswith(f"; lock file {path}) ended without releasing it (its lock was free: the process is "
                               f"gone)")
    assert json.loads(path.read_text())["pid"] == os.getpid()
    lock.release()
    assert not path.exists()
