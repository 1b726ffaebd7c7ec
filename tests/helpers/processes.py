"""Process helpers: whether a process is gone, a free port for torchrun, and another process holding (or having
died holding) an output's lock (``contracts.locks``)."""

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]


def dead(pid: int, within_s: float = 2.0) -> bool:
    """The process is gone (or a zombie: killed, waiting for its new parent, init, to collect it)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def free_port() -> int:
    """A port nobody listens on now (a fixed one collides with a second run of the suite on the machine)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lock_script(lock: Path, command: str, then: str) -> list[str]:
    code = (f"import os, signal, sys, time; from contracts.locks import acquire; "
            f"acquire({str(lock)!r}, what='x', command={command!r}, fix='x'); print('held', flush=True); {then}")
    return [sys.executable, "-c", code]


@contextmanager
def other_holder(lock: Path, command: str) -> Iterator[int]:
    """Another process holding the lock file ``lock`` (recorded as ``command``) for the block; yields its pid."""
    proc = subprocess.Popen(_lock_script(lock, command, "time.sleep(600)"), cwd=REPO, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def died_holding(lock: Path, command: str) -> int:
    """The pid of a process that took the lock file ``lock`` and was killed (SIGKILL) holding it: its record stays."""
    proc = subprocess.run(_lock_script(lock, command, "os.kill(os.getpid(), signal.SIGKILL)"), cwd=REPO,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60)
    assert proc.returncode == -9 and proc.stdout.strip() == "held", (proc.returncode, proc.stdout, proc.stderr)
    assert lock.is_file()
    return int(json.loads(lock.read_text())["pid"])


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...), from /proc: a launcher's workers may start
    sessions or process groups of their own (vLLM's engine processes, torchrun's), which ``os.killpg`` misses."""
    parent = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return out


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it (a kill -9 of a whole launch, as a node failure does), and wait
    until all are gone: no orphan keeps writing the run the test resumes next."""
    import signal
    procs = [pid, *descendants(pid)]
    for p in procs:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert all(dead(p, within_s=30.0) for p in procs), "a killed process outlived SIGKILL"
