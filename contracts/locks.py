"""One writer per output: the lock a process holds on a run folder or a results file while it writes it.

Two processes writing one output corrupt it without either failing: two ``eval.run`` on one ``--out`` append every
problem twice (a results file of 384 rows for 200 problems), two trainers on one run folder log the same steps twice
and overwrite each other's checkpoints. So every writer first takes its output's lock (``hold``), before it writes
anything, and holds it until it is done: the trainer one per run folder (``<run>/.train.lock``, taken by rank 0),
``eval.run`` one per results file (``<out>/<model>/.<benchmark>.jsonl.lock``, ``lock_file``). A second writer gets
``LockHeld`` (a ValueError: bad input, exit 2) whose one line names the output, the holder (its command, pid and
host, since when) and the lock file; nothing it would write has been touched.

The lock is ``fcntl.flock`` on the lock file, held through an open file: the operating system releases it when the
process ends, however it ends (SIGKILL, an OOM kill, a power cut of a node), so a dead writer never keeps the lock
(on NFS, Linux implements flock with the server's locks, so it holds across the hosts that share the mount). The
file records the holder (``{"pid", "host", "since", "command"}``) for the second writer's message and is removed on
a clean release; one still there with its lock free was left by a process that died, and the next writer takes it
over and says so (``Lock.stale``). A process forked by the writer (a grading pool's worker) shares its open file, so
the lock stays held while such a child outlives its parent, and the message says that too. The lock is not
re-entrant: a second ``hold`` of the same file in the same process is refused like any other writer.

Standard library only (contracts imports no torch).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

__all__ = ["LockHeld", "Lock", "lock_file", "acquire", "hold"]


class LockHeld(ValueError):
    """Another process holds the lock of an output this process was to write (the message says who and where)."""


def lock_file(target: str | os.PathLike) -> Path:
    """The lock file of an output file: a hidden sibling, ``.<name>.lock`` (``addition.jsonl`` ->
    ``.addition.jsonl.lock``; no reader's ``*.jsonl`` pattern matches it)."""
    target = Path(target)
    return target.with_name(f".{target.name}.lock")


@dataclass
class Lock:
    """A held lock: ``release()`` (or the end of ``hold``'s block) gives it back and removes the lock file."""

    path: Path
    fd: int
    created: list[Path] = field(default_factory=list)   # folders made to hold the lock file, deepest last
    stale: str | None = None    # a dead holder's record was taken over: the sentence that says so

    def release(self) -> None:
        """Remove the lock file (while still holding the lock, so a writer waiting on this very file sees it gone
        and opens a new one), unlock, close; then remove the folders made for it when nothing else was written
        there. Idempotent."""
        if self.fd < 0:
            return
        try:
            if _same_file(self.path, self.fd):
                self.path.unlink()
        except OSError:
            pass
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)   # also for the children that share the open file (fork)
            os.close(self.fd)
            self.fd = -1
        _remove_empty(self.created)


def _same_file(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a holder removes the file when it lets go)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _read(fd: int) -> dict:
    """The holder's record (``{}`` when the file is empty or not one: a holder between creating and writing it)."""
    try:
        data = os.pread(fd, 4096, 0)
        rec = json.loads(data.decode("utf-8")) if data.strip() else {}
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _alive(pid) -> bool:
    """Whether a process ``pid`` runs on this host (one of another user counts: it exists)."""
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True
    return True


def _holder(rec: dict, path: Path) -> str:
    """``eval.run (pid 4242 on host gpu1, since 2025-06-01T10:00:00+0200; lock file PATH)``, or what is known."""
    if not rec.get("pid"):
        return f"process that has not recorded itself yet (lock file {path})"
    return (f"{rec.get('command') or 'process'} (pid {rec['pid']} on host {rec.get('host', '?')}, since "
            f"{rec.get('since', '?')}; lock file {path})")


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; the ones created, outermost first."""
    missing = []
    p = folder
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    created = []
    for p in reversed(missing):
        try:
            p.mkdir()
            created.append(p)
        except FileExistsError:   # made by someone else meanwhile
            pass
    return created


def _remove_empty(created: list[Path]) -> None:
    for p in reversed(created):
        try:
            p.rmdir()
        except OSError:   # not empty: something was written there
            return


def acquire(path: str | os.PathLike, *, what: str, command: str, fix: str) -> Lock:
    """Take the lock file ``path`` (created, with its missing folders, when absent) for this process.

    ``what``: the output, as the refusal names it (``results/eval/m/addition.jsonl``, ``the run folder runs/x``);
    ``command``: this writer, recorded for a later one's message (``eval.run``, ``trainer.train``); ``fix``: what the
    second writer can do. ``LockHeld`` ``<what> is being written by <holder> (lock file <path>); <fix>`` when another
    process holds it; the folders made for the lock file are removed again. OSError when the filesystem cannot lock
    (ENOLCK)."""
    path = Path(path)
    created = _make_parents(path.parent)
    try:
        for _ in range(100):   # the file a holder removes as it lets go is opened again (see Lock.release)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                rec = _read(fd)
                current = _same_file(path, fd)
                os.close(fd)
                if not current:
                    continue
                gone = (rec.get("pid") and rec.get("host") == socket.gethostname() and not _alive(rec["pid"]))
                raise LockHeld(f"{what} is being written by another {_holder(rec, path)}"
                               + ("; that process has exited but one it started still holds the lock: stop it"
                                  if gone else "") + f"; {fix}") from None
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise OSError(e.errno, f"{path}: the filesystem cannot lock files ({e.strerror}), so one writer "
                                           f"per output cannot be ensured; write {what} on a local disk") from None
                raise
            if not _same_file(path, fd):   # its holder removed it between our open and our lock: open the new one
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                continue
            previous = _read(fd)
            record = {"pid": os.getpid(), "host": socket.gethostname(),
                      "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": command}
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
            stale = None
            if previous.get("pid"):
                stale = (f"took over a stale lock: {_holder(previous, path)} ended without releasing it (its "
                         f"lock was free: the process is gone)")
            return Lock(path, fd, created, stale)
        raise AssertionError(f"{path}: the lock file kept being replaced while it was being taken")
    except BaseException:
        _remove_empty(created)
        raise


@contextmanager
def hold(path: str | os.PathLike, *, what: str, command: str, fix: str) -> Iterator[Lock]:
    """``acquire`` for the block; released (and the lock file removed) when it ends, however it ends."""
    lock = acquire(path, what=what, command=command, fix=fix)
    try:
        yield lock
    finally:
        lock.release()
