"""The grader's side of the sandbox: probe what isolation this machine gives (and refuse to run without it unless
the user allowed that), claim a uid of its own for each call, launch the trusted runner (``runner.py``) for it,
read its reports into ``RunResult`` and clean up whatever the call left.

``scoring.sandbox`` (the package docstring) describes the isolation; ``protocol`` holds what this side and the
runner agree on (exit codes, jail paths, the tagged values).
"""

from __future__ import annotations

import ast
import fcntl
import importlib.util
import json
import marshal
import os
import re
import selectors
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from scoring.sandbox import syscall_filter
from scoring.sandbox.protocol import HARNESS_MODES, MEMORY_EXIT, TEST_MODES, decode_tagged, jail_path

__all__ = ["SandboxError", "Isolation", "RunResult", "isolation", "check_isolation", "run_program", "run_function",
           "run_cases", "run_many", "run_harness", "parse_json"]

CHILD = str(Path(__file__).with_name("runner.py"))   # the trusted runner, run as ``python -I -S -B CHILD ...``
SANDBOX_GID = 65534                   # "nogroup": the group of every call's programs
DEFAULT_UIDS = range(200000, 201024)  # the uids calls claim, one each while it runs (``_claim_uid``)
UIDS_ENV = "THINKING_SEEDS_SANDBOX_UIDS"   # FIRST-LAST: other uids (none a user or a service of the machine has)
ALLOW_UNISOLATED_ENV = "THINKING_SEEDS_SANDBOX_ALLOW_UNISOLATED"   # 1: the user's --allow-unisolated
REQUIRE_ISOLATION_ENV = "THINKING_SEEDS_SANDBOX_REQUIRE_ISOLATION"  # 1: refuse even when allowed (the old switch)
DEFAULT_MAX_OUTPUT = 1 << 20          # 1 MiB per stream
DEFAULT_NPROC = 32                    # RLIMIT_NPROC: processes and threads of one call (its uid is its own)
SETUP_GRACE_S = 15.0                  # generous: start-up under a loaded machine; the runner enforces case limits
CASE_GRACE_S = 2.0
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
_UNSHARE_FLAGS = ["--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "--kill-child", "--propagation", "private"]


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the program): never score the run, fix the machine or the call."""


@dataclass(frozen=True)
class Isolation:
    namespaces: bool        # new net/pid/mount/ipc/uts namespaces and the chroot jail
    uids: range | None      # the uids programs run as, one claimed per call; None: the grader's own uid (not root)
    cgroup: str | None      # the pids cgroup under which each call gets its own group; None: unavailable
    reason: str             # what is missing and why ("" when fully isolated)

    @property
    def full(self) -> bool:
        return self.namespaces and self.uids is not None


@dataclass
class RunResult:
    status: str                 # ok | runtime_error | time_limit | memory_limit | output_limit
    exit_code: int | None       # None when killed by a signal
    signal: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    wall_s: float
    cpu_s: float
    maxrss_kb: int
    isolated: bool              # False: namespaces or the uid drop were unavailable (see isolation().reason)
    value: Any = None           # function mode: the returned value parsed from JSON (when value_ok)
    value_ok: bool = False      # function mode: a value came back and parsed as JSON
    detail: str = ""
    completed: bool | None = None   # test modes (checks, assert): the epilogue's token closed the run; else None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ----------------------------------------------------------------------------------------------- probing

_ISOLATION: Isolation | None = None
_PROBE_LOCK = threading.Lock()
_JAIL: dict | None = None
_CALLS = 0
_CALLS_LOCK = threading.Lock()
_UID_LOCK_DIRS = ("/run/thinking-seeds-sandbox", os.path.join(tempfile.gettempdir(), "thinking-seeds-sandbox"))
_UID_LOCK_DIR: str | None = None
_UIDS_HELD: dict[int, int] = {}    # uid -> the descriptor of its locked lock file, for this process's calls
_UIDS_LOCK = threading.Lock()
_FILTER: bytes | None = None      # the case processes' seccomp filter (``syscall_filter.program``), built once


def _jail_layout(extra_dirs: Sequence[str] = (), extra_files: Sequence[str] = ()) -> dict:
    """The host paths the jail shows read-only: /usr, the top-level lib/bin links, the standard library (and the
    extra directories and single files a call asks for: a package the programs may import, a harness module)."""
    links, ro_dirs = [], []
    for top in ("/usr", "/lib", "/lib64", "/lib32", "/libx32", "/bin", "/sbin"):
        if os.path.islink(top):
            links.append((top, os.readlink(top)))
        elif os.path.isdir(top):
            ro_dirs.append(top)
    for p in [*_runner_sys_path(), *extra_dirs]:
        if not p or not os.path.isdir(p):
            continue
        p = os.path.realpath(p)
        if not any(p == d or p.startswith(d + "/") for d in ro_dirs):
            ro_dirs.append(p)
    files = [(f, False) for f in ("/etc/ld.so.cache",) if os.path.exists(f)]
    files += [(os.path.realpath(f), False) for f in extra_files
              if os.path.isfile(f) and not any(os.path.realpath(f).startswith(d + "/") for d in ro_dirs)]
    files += [(f, True) for f in ("/dev/null", "/dev/zero", "/dev/urandom", "/dev/random") if os.path.exists(f)]
    return {"links": links, "ro_dirs": ro_dirs, "files": files}


_RUNNER_PATH: list[str] | None = None
_LAYOUTS: dict[tuple, dict] = {}


def _runner_sys_path() -> list[str]:
    """``sys.path`` of ``python -I -S`` (the runner's): exactly the standard library directories the jail needs."""
    global _RUNNER_PATH
    if _RUNNER_PATH is None:
        out = subprocess.run([sys.executable, "-I", "-S", "-c", "import sys; print(repr(sys.path))"],
                             capture_output=True, text=True, env=dict(_ENV), timeout=60)
        if out.returncode != 0:
            raise SandboxError(f"cannot run {sys.executable} -I -S: {out.stderr[-1000:]}")
        _RUNNER_PATH = [p for p in ast.literal_eval(out.stdout.strip()) if p]
    return _RUNNER_PATH


def _pids_cgroup_root() -> str | None:
    """A writable pids cgroup directory for per-call groups (v1 ``pids`` hierarchy, else v2), or None."""
    candidates = []
    if os.path.isdir("/sys/fs/cgroup/pids"):
        candidates.append(("/sys/fs/cgroup/pids", False))
    if os.path.exists("/sys/fs/cgroup/cgroup.subtree_control"):
        candidates.append(("/sys/fs/cgroup", True))
    for base, v2 in candidates:
        root = os.path.join(base, "thinking-seeds-sandbox")
        try:
            os.makedirs(root, exist_ok=True)
            if v2:
                with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                    f.write("+pids")
            probe = os.path.join(root, f"probe-{os.getpid()}")
            os.mkdir(probe)
            ok = os.path.exists(os.path.join(probe, "pids.max"))
            os.rmdir(probe)
            if ok:
                return root
        except OSError:
            continue
    return None


def _stdlib_world_readable() -> bool:
    """Can uid 65534 reach the standard library without the jail (every directory on the way o+x)?"""
    dirs = [Path(os.path.realpath(p)) for p in _runner_sys_path() if os.path.isdir(p)]
    for d in {q for p in dirs for q in (p, *p.parents)}:
        try:
            if not d.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return True


def isolation(*, refresh: bool = False) -> Isolation:
    """Probe once per process what isolation this machine gives, by running a tiny program through it."""
    global _ISOLATION, _JAIL
    with _PROBE_LOCK:
        if _ISOLATION is not None and not refresh:
            return _ISOLATION
        reasons = []
        cgroup = _pids_cgroup_root() if os.geteuid() == 0 else None
        if cgroup is None:
            reasons.append("no writable pids cgroup")
        iso = None
        if os.geteuid() != 0:
            reasons.append("not root: no namespaces, programs run as the grader's own uid")
        elif shutil.which("unshare") is None:
            reasons.append("the unshare command is missing (util-linux)")
        else:
            _JAIL = _jail_layout()
            candidate = Isolation(True, _uid_range(), cgroup, "")
            err = _probe(candidate)
            if err is None:
                iso = candidate
            else:
                reasons.append(f"namespaces/jail unavailable: {err}")
        if iso is None:
            uids = _uid_range() if os.geteuid() == 0 and _stdlib_world_readable() else None
            if os.geteuid() == 0 and uids is None:
                reasons.append("the standard library is not readable by other users outside the jail, so programs "
                               "run AS ROOT")
            iso = Isolation(False, uids, cgroup, "; ".join(reasons))
            err = _probe(iso)
            if err is not None:
                raise SandboxError(f"the sandbox cannot run even a trivial program: {err}")
        elif reasons:
            iso = Isolation(iso.namespaces, iso.uids, iso.cgroup, "; ".join(reasons))
        _ISOLATION = iso
        return iso


def _probe(iso: Isolation) -> str | None:
    try:
        [r] = _execute(iso, source="import fractions, json\nprint(sum([1, 2]))", cases=[b""], mode="stdin",
                       fn_name=None, prelude="", timeout_s=20.0, memory_mb=512, max_output_bytes=4096,
                       nproc=16, disk_mb=4, python_path=(), on_case=None)
    except SandboxError as e:
        return str(e)
    if r.status != "ok" or r.stdout != "3\n":
        return f"probe program gave status={r.status} stdout={r.stdout!r} stderr={r.stderr[-500:]!r}"
    return None


def check_isolation(*, allow_unisolated: bool = False) -> Isolation:
    """Fail closed before any work: this machine's isolation, or a ``SandboxError`` of one line saying what is
    missing and naming ``--allow-unisolated``, where it is not full and the user did not allow that. Every sandbox
    call makes the same check; a command that will grade code makes it first, so it stops before a model loads.

    ``allow_unisolated=True`` is the user's ``--allow-unisolated`` (``allow_unisolated=true``): from then on this
    process, and every process it starts (grading workers), runs programs without full isolation, with a warning.
    It is recorded as ``ALLOW_UNISOLATED_ENV=1`` in the environment, which the workers inherit."""
    if allow_unisolated:
        os.environ[ALLOW_UNISOLATED_ENV] = "1"
    return _require(None)


def _require(require_isolation: bool | None) -> Isolation:
    """The isolation to run with: the machine's when full; otherwise a refusal, unless unisolated runs are allowed
    (``require_isolation=False``; by default ``ALLOW_UNISOLATED_ENV=1`` without ``REQUIRE_ISOLATION_ENV=1``), which
    warns."""
    iso = isolation()
    if iso.full:
        return iso
    if require_isolation is None:
        require_isolation = (os.environ.get(ALLOW_UNISOLATED_ENV, "") in ("", "0")
                             or os.environ.get(REQUIRE_ISOLATION_ENV, "") not in ("", "0"))
    reason = " ".join(iso.reason.split())
    reason = reason if len(reason) <= 300 else reason[:297] + "..."
    if require_isolation:
        raise SandboxError(f"code grading needs the full sandbox, which this machine does not give ({reason}); run "
                           f"as root with util-linux's unshare, or pass --allow-unisolated (allow_unisolated=true in "
                           f"a trainer config, {ALLOW_UNISOLATED_ENV}=1 in the environment) to run model-written "
                           f"programs with less containment")
    warnings.warn(f"code sandbox NOT fully isolated ({reason}): model-written programs run with less containment "
                  f"(--allow-unisolated)", RuntimeWarning, stacklevel=3)
    return iso


# ----------------------------------------------------------------------------------------------- running

def run_program(source: str, *, stdin: str | bytes = "", timeout_s: float = 6.0, memory_mb: int = 1024,
                prelude: str = "", max_output_bytes: int = DEFAULT_MAX_OUTPUT, nproc: int = DEFAULT_NPROC,
                disk_mb: int = 64, python_path: Sequence[str] = (),
                require_isolation: bool | None = None) -> RunResult:
    """Run ``source`` as ``__main__`` with ``stdin`` (after ``prelude``, see the module docstring); one fresh,
    isolated process. ``timeout_s`` is wall-clock; ``memory_mb`` is the address-space limit."""
    [r] = run_cases(source, [stdin], mode="stdin", timeout_s=timeout_s, memory_mb=memory_mb, prelude=prelude,
                    max_output_bytes=max_output_bytes, nproc=nproc, disk_mb=disk_mb, python_path=python_path,
                    require_isolation=require_isolation)
    return r


def run_function(source: str, fn_name: str, args: Sequence[Any], *, timeout_s: float = 6.0,
                 memory_mb: int = 1024, prelude: str = "", max_output_bytes: int = DEFAULT_MAX_OUTPUT,
                 nproc: int = DEFAULT_NPROC, disk_mb: int = 64, python_path: Sequence[str] = (),
                 require_isolation: bool | None = None) -> RunResult:
    """Load ``prelude + source``, call ``fn_name(*args)`` (``Solution().fn_name`` when the program defines class
    ``Solution``, as LiveCodeBench does) and return the value as JSON data in ``RunResult.value``."""
    line = "\n".join(json.dumps(a) for a in args)
    [r] = run_cases(source, [line], mode="function", fn_name=fn_name, timeout_s=timeout_s, memory_mb=memory_mb,
                    prelude=prelude, max_output_bytes=max_output_bytes, nproc=nproc, disk_mb=disk_mb,
                    python_path=python_path, require_isolation=require_isolation)
    return r


def run_cases(source: str, cases: Sequence[str | bytes], *, mode: str = "stdin", fn_name: str | None = None,
              on_case: Callable[[int, RunResult], bool] | None = None, timeout_s: float = 6.0,
              memory_mb: int = 1024, prelude: str = "", max_output_bytes: int = DEFAULT_MAX_OUTPUT,
              nproc: int = DEFAULT_NPROC, disk_mb: int = 64, python_path: Sequence[str] = (),
              require_isolation: bool | None = None, packages: Sequence[str] = (),
              watch: Sequence[str] = ()) -> list[RunResult]:
    """Run one program on several test cases in one sandbox call; every case gets a fresh process.

    ``mode="stdin"``: each case is the program's stdin. ``mode="function"``: each case is LiveCodeBench's
    functional input, one JSON value per line, the positional arguments of ``fn_name``; ``RunResult.value`` is the
    returned value as JSON data (a returned tuple becomes a list; values JSON cannot hold become a marker object
    no gold equals). ``mode="calls"`` (EvalPlus): each case is a JSON array of argument lists, ``fn_name`` is
    called on each in one process and ``RunResult.value`` is the list of returned values with Python types kept
    (see ``decode_tagged``); the first exception ends the list with ``{"__exception__": "..."}``.
    ``timeout_s`` is the wall-clock limit of each case (the CPU limit is ``ceil(timeout_s) + 1`` s).
    The test modes (``scoring/sandbox/epilogue.py``) run a program and then its tests, and pass only when the
    trusted epilogue's completion token closed the run (``RunResult.completed``; an exit before it, of any status,
    is a ``runtime_error``): ``mode="checks"``: each case is ``{"calls": [[target, tagged args], ...]}`` (JSON),
    ``target`` one of ``["name", f]``, ``["new", cls, method]`` (a new instance per call), ``["shared", cls,
    method]`` (one instance per case); ``RunResult.value`` is the list of returned values as Python values
    (``decode_tagged``), ending with a ``CallException`` when a call raised. ``mode="assert"``: each case is test
    code (``scoring.asserts.harden``-ed) run after the program in its own namespace; ``watch`` names the modules it
    imports, which the program must leave as they were.
    ``on_case(i, result)`` is called as each case finishes; returning False stops the call there (the rest of
    the namespace is killed) and the returned list ends at that case. ``packages``: installed packages (e.g.
    ``"numpy"``) the jail shows to the program, read-only (``python_path`` shows whole folders).
    """
    if mode not in ("stdin", "function", "calls", *TEST_MODES):
        raise ValueError(f"mode must be 'stdin', 'function', 'calls', 'checks' or 'assert', got {mode!r}")
    if mode in ("function", "calls") and not fn_name:
        raise ValueError(f"mode={mode!r} needs fn_name")
    iso = _require(require_isolation)
    return _execute(iso, source=source, cases=cases, mode=mode, fn_name=fn_name, prelude=prelude,
                    timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes, nproc=nproc,
                    disk_mb=disk_mb, python_path=python_path, on_case=on_case, packages=tuple(packages),
                    watch=tuple(watch))


def run_harness(source: str, payloads: Sequence[Any], *, harness: str, fn_name: str | None = None,
                options: Mapping[str, Any] | None = None, timeout_s: float = 60.0, memory_mb: int = 1024,
                max_output_bytes: int = DEFAULT_MAX_OUTPUT, packages: Sequence[str] = (),
                preimport: Sequence[str] = (), load_files: Sequence[tuple[str, str]] = (),
                nproc: int = DEFAULT_NPROC, disk_mb: int = 64,
                require_isolation: bool | None = None) -> list[RunResult]:
    """Run ``source`` under a reference grader's harness (``harness_lcb.py``, ``harness_evalplus.py``): each
    payload (JSON data, e.g. ``{"inputs": [...]}``) is one case process that runs ALL its tests in order, the
    way LiveCodeBench's lcb_runner (``harness="lcb_stdin"`` / ``"lcb_call"``) or EvalPlus (``"evalplus"``) does,
    sharing state between tests. ``RunResult.value`` is the list of per-test records (``value_ok``: they parsed), each
    ``{"i", "s": ok|error|timeout|memory|fatal|output_limit, "out"|"v"|"e"|"t"...}``, kept even when the process
    was then killed; everything in them came from the program's process, so they are data to check, never a
    verdict. ``timeout_s`` bounds each case process as a whole (the harness times each test itself);
    ``max_output_bytes`` bounds the records of a case. ``packages``: importable packages (e.g. ``"numpy"``) the
    jail shows to programs read-only; ``preimport``: modules the runner imports once before forking cases;
    ``load_files``: ``(name, path)`` modules the runner loads from a file for the harness.
    """
    if harness not in HARNESS_MODES:
        raise ValueError(f"harness must be one of {HARNESS_MODES}, got {harness!r}")
    if harness != "lcb_stdin" and not fn_name:
        raise ValueError(f"harness={harness!r} needs fn_name")
    iso = _require(require_isolation)
    cases = [json.dumps(p, allow_nan=True) for p in payloads]
    return _execute(iso, source=source, cases=cases, mode=harness, fn_name=fn_name, prelude="",
                    timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=max_output_bytes, nproc=nproc,
                    disk_mb=disk_mb, python_path=(), on_case=None, harness=dict(options or {}),
                    packages=tuple(packages), preimport=tuple(preimport), load_files=tuple(load_files))


_PACKAGES: dict[str, tuple[list[str], list[str]]] = {}


def _package_dirs(name: str) -> tuple[list[str], list[str]]:
    """(directories to show in the jail, sys.path entries) for an installed top-level package: its own folder and
    a wheel's ``<name>.libs`` beside it (bundled shared libraries), and the folder holding them for sys.path."""
    if name not in _PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SandboxError(f"package {name!r} is not installed in {sys.executable}'s environment")
        pkg = os.path.realpath(list(spec.submodule_search_locations)[0])
        site = os.path.dirname(pkg)
        dirs = [pkg] + [d for d in (os.path.join(site, f"{name}.libs"),) if os.path.isdir(d)]
        _PACKAGES[name] = (dirs, [site])
    return _PACKAGES[name]


def run_many(jobs: Iterable[Callable[[], Any] | Mapping[str, Any]], *, workers: int | None = None) -> list:
    """Run jobs concurrently on a thread pool (each sandbox call is its own subprocess); results in job order.

    A job is a zero-argument callable (e.g. ``functools.partial(grade_code, ...)``) or a mapping of keyword
    arguments for ``run_program`` (``run_function`` when it has ``fn_name``). Exceptions propagate.
    """
    jobs = list(jobs)
    isolation()   # probe once, before the threads start

    def call(job):
        if callable(job):
            return job()
        kw = dict(job)
        return run_function(**kw) if "fn_name" in kw else run_program(**kw)

    workers = workers or os.cpu_count() or 1
    if workers <= 1 or len(jobs) <= 1:
        return [call(j) for j in jobs]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(call, jobs))


# ----------------------------------------------------------------------------------------------- internals

def _classify(m: dict, cpu_limit: int) -> tuple[str, str]:
    sig, code = m["signal"], m["exit"]
    if m["timed_out"]:
        return "time_limit", "wall-clock limit"
    if sig is not None:
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and m["cpu_s"] >= cpu_limit - 0.05):
            return "time_limit", "CPU limit"
        if sig == signal.SIGXFSZ:
            return "output_limit", "output over the limit"
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return "runtime_error", f"killed by {name}"
    if m["stdout_truncated"] or m.get("result_truncated"):
        return "output_limit", "output over the limit"
    if code == 0:
        return "ok", ""
    if code == MEMORY_EXIT:
        return "memory_limit", "MemoryError"
    return "runtime_error", f"exit status {code}"


def _new_cgroup(root: str | None, nproc: int) -> str | None:
    global _CALLS
    if root is None:
        return None
    with _CALLS_LOCK:
        _CALLS += 1
        n = _CALLS
    path = os.path.join(root, f"run-{os.getpid()}-{n}")
    try:
        os.mkdir(path)
        with open(os.path.join(path, "pids.max"), "w") as f:
            f.write(str(nproc + 2))   # + the runner and the case process
    except OSError as e:
        raise SandboxError(f"cannot create the pids cgroup {path}: {e}") from e
    return path


def _drop_cgroup(path: str | None) -> None:
    if path is None:
        return
    procs = os.path.join(path, "cgroup.procs")
    for attempt in range(200):
        try:
            with open(procs) as f:
                pids = [int(x) for x in f.read().split()]
        except OSError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.005 if attempt < 20 else 0.05)
    warnings.warn(f"could not remove sandbox cgroup {path}", RuntimeWarning)


def _syscall_filter() -> bytes:
    """The seccomp filter for this machine (fail closed: a machine without a table runs no program)."""
    global _FILTER
    if _FILTER is None:
        try:
            _FILTER = syscall_filter.program(os.uname().machine, pointer_bytes=struct.calcsize("P"))
        except ValueError as e:
            raise SandboxError(str(e)) from None
    return _FILTER


def _uid_range() -> range:
    """The uids calls claim: ``UIDS_ENV`` (FIRST-LAST) or ``DEFAULT_UIDS``; as many calls as it holds run at once
    on the machine, more wait."""
    text = os.environ.get(UIDS_ENV, "").strip()
    if not text:
        return DEFAULT_UIDS
    m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", text)
    if m is None or not 0 < int(m[1]) <= int(m[2]) < 2 ** 32 - 1:
        raise SandboxError(f"{UIDS_ENV}={text!r}: give FIRST-LAST (e.g. 200000-201023), uids above 0 that no user or "
                           f"service of this machine has")
    return range(int(m[1]), int(m[2]) + 1)


def _uid_lock_dir() -> str:
    """The folder of the uids' lock files, which every grader process on the machine shares: /run's, else the
    temp folder's; owned by this user and writable by no one else (another user's lock would hold a uid)."""
    global _UID_LOCK_DIR
    if _UID_LOCK_DIR is None:
        for d in _UID_LOCK_DIRS:
            try:
                if not os.path.isdir(os.path.dirname(d)):
                    continue
                os.makedirs(d, mode=0o700, exist_ok=True)
                st = os.lstat(d)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022:
                _UID_LOCK_DIR = d
                break
        else:
            raise SandboxError(f"no folder for the sandbox's uid locks: make {' or '.join(_UID_LOCK_DIRS)} a folder "
                               f"of uid {os.geteuid()} that no one else may write")
    return _UID_LOCK_DIR


def _claim_uid(uids: range) -> int:
    """A uid no other call on the machine runs as: the first of ``uids`` that no thread of this process holds and
    whose lock file (``_uid_lock_dir``) this process can lock, held until ``_release_uid``. Waits while all are
    taken. POSIX record locks, not flock: a child forked meanwhile (a grading worker) inherits none, so a claim
    never outlives its call."""
    folder = _uid_lock_dir()
    deadline = time.monotonic() + SETUP_GRACE_S
    while True:
        # one claim at a time in this process: a POSIX lock is the process's, and closing any descriptor of the file
        # would drop the lock another thread holds, so a held uid's file is never opened again here
        with _UIDS_LOCK:
            for uid in uids:
                if uid in _UIDS_HELD:
                    continue
                fd = os.open(os.path.join(folder, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600)
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:   # another grader process's call holds it
                    os.close(fd)
                    continue
                _UIDS_HELD[uid] = fd
                return uid
        if time.monotonic() > deadline:
            raise SandboxError(f"all {len(uids)} sandbox uids ({uids[0]}-{uids[-1]}) stayed in use for "
                               f"{SETUP_GRACE_S:g} s; give more with {UIDS_ENV}=FIRST-LAST")
        time.sleep(0.01)


def _release_uid(uid: int) -> None:
    with _UIDS_LOCK:
        os.close(_UIDS_HELD.pop(uid))   # drops the lock


def _forget_uids() -> None:
    """In a forked child: it holds none of its parent's uids (POSIX locks are not inherited)."""
    global _UIDS_LOCK, _UIDS_HELD
    for fd in _UIDS_HELD.values():
        try:
            os.close(fd)   # the parent's locks stay: only the owner's own close drops them
        except OSError:
            pass
    _UIDS_LOCK, _UIDS_HELD = threading.Lock(), {}


os.register_at_fork(after_in_child=_forget_uids)


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("ts-sandbox-spec")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def _execute(iso: Isolation, *, source, cases, mode, fn_name, prelude, timeout_s, memory_mb, max_output_bytes,
             nproc, disk_mb, python_path, on_case, harness=None, packages=(), preimport=(),
             load_files=(), watch=()) -> list[RunResult]:
    if not cases:
        return []
    if timeout_s <= 0 or memory_mb <= 0 or max_output_bytes <= 0:
        raise ValueError("timeout_s, memory_mb and max_output_bytes must be positive")
    cpu_limit = int(-(-timeout_s // 1)) + 1
    enc_cases = []
    for c in cases:
        if mode == "stdin":
            enc_cases.append(c.encode() if isinstance(c, str) else bytes(c))
        else:
            if not isinstance(c, str):
                raise TypeError("function-mode cases are str: one JSON value per line")
            enc_cases.append(c)
    extra_dirs, sys_path = list(python_path), list(python_path)
    for name in packages:
        dirs, entries = _package_dirs(name)
        extra_dirs += dirs
        sys_path += [e for e in entries if e not in sys_path]
    extra_files = [path for _, path in load_files]
    jail = None
    if iso.namespaces:
        key = (tuple(extra_dirs), tuple(extra_files))
        if not key[0] and not key[1]:
            jail = _JAIL
        else:
            if key not in _LAYOUTS:
                _LAYOUTS[key] = _jail_layout(extra_dirs, extra_files)
            jail = _LAYOUTS[key]
    preimport = (["json"] if mode != "stdin" else []) + [m for m in preimport if m != "json"]
    spec = {
        "source": source, "prelude": prelude, "mode": mode, "fn_name": fn_name, "cases": enc_cases,
        "timeout_s": float(timeout_s), "cpu_s": cpu_limit, "mem_bytes": int(memory_mb) << 20,
        "fsize_bytes": int(max_output_bytes) + 1, "nofile": 64, "nproc": int(nproc),
        "max_stdout": int(max_output_bytes), "max_stderr": int(max_output_bytes), "max_result": int(max_output_bytes),
        "uid": None, "gid": SANDBOX_GID if iso.uids is not None else None,   # the uid: claimed below
        "cwd": "/sandbox", "disk_bytes": int(disk_mb) << 20,
        "jail": jail, "cgroup": None, "preimport": preimport,
        "pythonpath": [jail_path(x) for x in sys_path] if jail else sys_path,
        "harness": harness, "load_files": [[n, jail_path(x) if jail else x] for n, x in load_files],
        "int_max_str_digits": 50000,   # LiveCodeBench's evaluator sets the same
        "watch": list(watch), "seccomp": _syscall_filter(),
    }
    spec_fd = status_r = status_w = ctl_r = ctl_w = None
    proc = workdir = cgroup = None
    results: list[RunResult] = []
    stopped = finished = False
    case_pid = uid = None
    sel = None
    try:
        if iso.uids is not None:   # a uid of its own: RLIMIT_NPROC and the kernel's per-uid state are the call's
            uid = spec["uid"] = _claim_uid(iso.uids)
        if not iso.namespaces:
            workdir = tempfile.mkdtemp(prefix="ts-sandbox-")
            if uid is not None:
                os.chown(workdir, uid, SANDBOX_GID)
            spec["cwd"] = workdir
            # The PID namespace kills everything a case started; without it a per-call cgroup is how leftovers
            # are found and killed (with it, a cgroup would only add ~12 ms of attach time per call).
            cgroup = spec["cgroup"] = _new_cgroup(iso.cgroup, nproc)
        spec_fd = _memfd(marshal.dumps(spec))
        status_r, status_w = os.pipe()
        ctl_r, ctl_w = os.pipe()   # closing ctl_w (stop early, or this process dies) makes the runner clean up
        cmd = [sys.executable, "-I", "-S", "-B", CHILD, str(spec_fd), str(status_w), str(ctl_r)]
        if iso.namespaces:
            cmd = [shutil.which("unshare") or "unshare", *_UNSHARE_FLAGS, *cmd]
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    pass_fds=(spec_fd, status_w, ctl_r), env=dict(_ENV), start_new_session=True,
                                    close_fds=True)
        except OSError as e:
            raise SandboxError(f"cannot start the sandbox ({cmd[0]}): {e}") from e
        for fd in (spec_fd, status_w, ctl_r):
            os.close(fd)
        spec_fd = status_w = ctl_r = None
        budget = SETUP_GRACE_S + len(enc_cases) * (timeout_s + CASE_GRACE_S)
        deadline = time.monotonic() + budget
        sel = selectors.DefaultSelector()
        sel.register(status_r, selectors.EVENT_READ, "status")
        sel.register(proc.stdout, selectors.EVENT_READ, "log")
        buf = bytearray()
        log = bytearray()
        done = status_eof = False
        while not done and not stopped and not status_eof:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError(f"the sandbox runner did not finish within its budget of {budget:.0f}s "
                                   f"({len(results)} of {len(enc_cases)} cases done); runner output: "
                                   f"{bytes(log[-2000:]).decode(errors='replace')}")
            for key, _ in sel.select(timeout=min(left, 1.0)):
                if key.data == "log":
                    chunk = os.read(proc.stdout.fileno(), 65536)
                    if not chunk:
                        sel.unregister(proc.stdout)
                    elif len(log) < 65536:
                        log += chunk
                    continue
                chunk = os.read(status_r, 1 << 20)
                if not chunk:
                    status_eof = True
                    break
                buf += chunk
                while len(buf) >= 4:
                    n = int.from_bytes(buf[:4], "little")
                    if len(buf) < 4 + n:
                        break
                    msg = marshal.loads(bytes(buf[4:4 + n]))
                    del buf[:4 + n]
                    t = msg["t"]
                    if t == "fail":
                        tail = bytes(log[-2000:]).decode(errors="replace")
                        raise SandboxError(f"{msg['msg']}; runner output: {tail}")
                    if t == "start":
                        case_pid = msg["pid"]
                    elif t == "case":
                        r = _result(msg, mode, cpu_limit, iso)
                        results.append(r)
                        if on_case is not None and on_case(msg["i"], r) is False:
                            stopped = True
                            break
                    elif t == "done":
                        done = True
                if stopped:
                    break
        if not done and not stopped:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            tail = bytes(log[-2000:]).decode(errors="replace")
            raise SandboxError(f"the sandbox runner exited ({proc.returncode}) after {len(results)} of "
                               f"{len(enc_cases)} cases without reporting; runner output: {tail}")
        finished = True
        return results
    finally:
        # Stop: closing the control pipe makes the runner kill everything it started and exit, and unshare exits
        # only once the namespace is empty, so nothing of the call outlives this function. A runner that does
        # not exit within a few seconds (or a failure) gets SIGKILL: the namespace dies with it.
        if sel is not None:
            sel.close()
        for fd in (ctl_w, status_r, spec_fd, status_w, ctl_r):
            if fd is not None:
                os.close(fd)
        if proc is not None:
            try:
                proc.wait(timeout=10 if finished else 0.5)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                if not iso.namespaces and case_pid is not None:
                    _kill_group(case_pid)
                proc.wait()
            proc.stdout.close()
        _drop_cgroup(cgroup)
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        if uid is not None:   # last: nothing of the call runs as it any more
            _release_uid(uid)


def _result(m: dict, mode: str, cpu_limit: int, iso: Isolation) -> RunResult:
    status, detail = _classify(m, cpu_limit)
    r = RunResult(
        status=status, exit_code=m["exit"], signal=m["signal"],
        stdout=m["stdout"].decode("utf-8", errors="replace"), stderr=m["stderr"].decode("utf-8", errors="replace"),
        stdout_truncated=m["stdout_truncated"], stderr_truncated=m["stderr_truncated"], wall_s=m["wall_s"],
        cpu_s=m["cpu_s"], maxrss_kb=m["maxrss_kb"], isolated=iso.full, detail=detail,
        completed=m.get("completed"))
    if mode in TEST_MODES:
        return _tests_result(r, m)
    if mode in HARNESS_MODES:
        raw = (m["result"] or b"").decode("utf-8", errors="replace")
        try:
            r.value = [parse_json(line) for line in raw.splitlines() if line.strip()]
            r.value_ok = all(isinstance(x, dict) for x in r.value)
        except ValueError as e:
            r.value, r.detail = None, (r.detail + "; " if r.detail else "") + f"malformed harness records: {e}"
        if m.get("result_truncated") and status == "output_limit":
            r.detail = "output over the limit"
        return r
    if mode != "stdin" and status == "ok":
        raw = m["result"] or b""
        if not raw:
            r.detail = "the function returned no value"
        else:
            try:
                r.value, r.value_ok = parse_json(raw.decode("utf-8")), True
            except (ValueError, UnicodeDecodeError) as e:
                r.detail = f"the returned value is not valid JSON data: {e}"
    return r


def _tests_result(r: RunResult, m: dict) -> RunResult:
    """A test mode's result: an exit before the epilogue's token is a failure whatever its status; ``checks``
    values are decoded (a malformed list is the program's failure: it could have written it)."""
    if r.status == "ok" and not r.completed:
        r.status, r.detail = "runtime_error", "the program ended the process before its tests finished"
        return r
    if r.completed and m["result"]:
        try:
            values = decode_tagged(parse_json(m["result"].decode("utf-8")))
            if not isinstance(values, list):
                raise ValueError("not a list")
            r.value, r.value_ok = values, True
        except (ValueError, UnicodeDecodeError, RecursionError, TypeError) as e:
            r.status, r.detail = "runtime_error", f"malformed test values: {str(e)[:200]}"
    return r


# What a record may make the grader do: nest (json.loads and everything after it recurse once per level; a record
# 1,000 deep raised RecursionError, a grader_error) and hold integers (str -> int is quadratic in Python 3.11).
# EvalPlus's deepest gold is 21 levels as a tagged record (MBPP+, all canonical outputs), LiveCodeBench's golds 3.
MAX_JSON_DEPTH = 100
MAX_INT_DIGITS = 50000    # LiveCodeBench's sys.set_int_max_str_digits, the runner's ``int_max_str_digits``
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_SQUARE = str.maketrans("{}", "[]")


def _nested_deeper(text: str, limit: int) -> bool:
    """Does ``text`` nest deeper than ``limit``? Its brackets outside strings (in valid JSON the strings the pattern
    takes out are json.loads's own), innermost pairs removed a level per pass: at most ``limit + 1`` passes of
    ``str.replace``, no recursion. Unbalanced brackets (not JSON) count as too deep."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)).translate(_SQUARE)
    for _ in range(limit):
        if not brackets:
            return False
        brackets = brackets.replace("[]", "")
    return bool(brackets)


def _digits_to_int(s: str) -> int:
    # halves under Python's 4,300-digit str -> int limit: O(n^1.6) (Karatsuba) where int(Decimal(s)) was quadratic
    # (4,000,000 digits: minutes), and thread-safe, unlike raising the process-wide sys.set_int_max_str_digits
    if len(s) <= 4000:
        return int(s)
    half = len(s) // 2
    return _digits_to_int(s[:half]) * 10 ** (len(s) - half) + _digits_to_int(s[half:])


def _big_int(s: str) -> int:
    """json.loads's integer literals (``-?digits``): up to ``MAX_INT_DIGITS`` digits, refused past that before any
    arithmetic."""
    digits = len(s) - s.startswith("-")
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits (LiveCodeBench's limit is {MAX_INT_DIGITS})")
    if digits <= 4000:
        return int(s)
    return -_digits_to_int(s[1:]) if s.startswith("-") else _digits_to_int(s)


def parse_json(text: str) -> Any:
    """``json.loads`` for gold and returned values: integers up to ``MAX_INT_DIGITS`` digits, NaN/Infinity allowed.

    Bounded for what a program wrote: text nested deeper than ``MAX_JSON_DEPTH`` (told by ``_nested_deeper`` before
    json.loads recurses into it) and an integer of more digits are ValueErrors, which every caller makes the
    program's failure (never a grader_error), in time linear in the text (integers: O(n^1.6) in their digits)."""
    if _nested_deeper(text, MAX_JSON_DEPTH):
        raise ValueError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    return json.loads(text, parse_int=_big_int)
