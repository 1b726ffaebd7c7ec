"""Process helpers: whether a process is gone, and a free port for torchrun."""

import os
import time


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
