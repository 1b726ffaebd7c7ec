"""Writing what ``figures.make_all`` and ``figures.notebook`` produce: output folders checked before anything is
computed, files written whole (``contracts.files``: a temporary sibling, then ``os.replace``), and a failed write
said in one line with the exit status of ``contracts.commands``:

- :class:`InputError` (exit 2): bad input, such as ``--dpi 0`` or an output folder that this user cannot write
  (a file there, a read-only folder or file system); raised by :func:`check_writable` before anything is written,
  and by :func:`writing` when the file system refuses a write later (EROFS, EACCES, EPERM);
- :class:`WriteFailed` (exit 1): any other OSError while writing, a full disk above all; it names the folder, so
  the command can print ``contracts.commands.failure_line(..., writing=folder)``.

A file that was being written when the error came is never left half-written: the previous version (a PNG of an
earlier call) stays as it was, and every file written before stays whole.
"""

from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from contracts.files import atomic_path

__all__ = ["InputError", "WriteFailed", "check_writable", "writing", "save_png", "write_bytes"]

REFUSED = (errno.EROFS, errno.EACCES, errno.EPERM)   # the file system refuses the folder: bad input, not a failure


class InputError(ValueError):
    """Bad input (exit 2): printed as its message, one ``error:`` line saying what is wrong and what to do."""


class WriteFailed(Exception):
    """A write into ``folder`` failed inside the run (a full disk, an I/O error): exit 1, the folder named."""

    def __init__(self, folder: str | os.PathLike, error: OSError):
        super().__init__(f"writing {folder}: {error}")
        self.folder = Path(folder)
        self.error = error


def _refused(flag: str, folder: Path, why: str) -> InputError:
    return InputError(f"error: {flag} {folder}: {why}; choose a folder you can write ({flag} DIR)")


def check_writable(folder: str | os.PathLike, flag: str) -> None:
    """InputError unless ``folder`` is a folder this process can write, or can be created as one (its nearest
    existing parent is a writable folder). Nothing is created."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise _refused(flag, folder, "is a file, not a folder")
    existing = next((q for q in (folder, *folder.absolute().parents) if q.exists()), None)
    if existing is None or not existing.is_dir():
        raise _refused(flag, folder, f"'{existing}' is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):   # False on a read-only file system, for root too
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        raise _refused(flag, folder, f"'{existing}' is on a read-only file system" if read_only
                       else f"'{existing}' is not writable by this user")


@contextmanager
def writing(folder: str | os.PathLike, flag: str) -> Iterator[None]:
    """Writes into ``folder`` (the output of ``flag``): an OSError the file system raises because the folder cannot
    be written becomes an InputError, any other (a full disk) a WriteFailed naming the folder."""
    try:
        yield
    except OSError as exc:
        if exc.errno in REFUSED:
            raise _refused(flag, Path(folder), f"cannot be written ({exc.strerror or exc})") from exc
        raise WriteFailed(folder, exc) from exc


def save_png(fig, path: str | os.PathLike, *, dpi: int) -> Path:
    """``fig`` as a PNG at ``path``, written whole or not at all (an earlier file there stays until the new one is
    complete)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png")   # the temporary name has no .png suffix: the format is explicit
    return path


def write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """``data`` at ``path``, written whole or not at all."""
    path = Path(path)
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return path
