"""Sandbox runner (trusted): started by ``scoring.sandbox.host`` as ``python -I -S -B runner.py SPEC STATUS CTL``.

Nothing here decides pass or fail. The runner reads a run spec (``marshal``, written by the grader), builds the
jail, and for every test case forks a fresh copy of itself that drops privileges and runs the untrusted program.
It reports raw facts (exit status, signal, time, captured bytes) back to the grader over the STATUS pipe; the
grader classifies and compares. When the grader closes the CTL pipe (it stopped the call early, or it died), the
runner kills the case and everything else in the namespace and exits.

Process layout with namespaces (the grader runs ``unshare --net --pid --mount --ipc --uts --fork --kill-child``)::

    grader ── unshare (host) ── runner R: PID 1 of a new PID namespace, root, holds STATUS
                                   └── case process P (one per test case): the call's uid, rlimits, chroot,
                                       the seccomp filter the grader built (``syscall_filter``), runs the
                                       program

R stays root so that the kernel's parent-death signal (``--kill-child``) survives: when the grader kills unshare,
R dies, and when PID 1 of a namespace dies the kernel kills every process in it (detached grandchildren too).
R itself kills everything else in the namespace (``kill(-1)``) after each case.

Imports: ``-I -S`` puts neither this folder nor site-packages on ``sys.path``, and the jail shows only the
standard library, so the runner puts its own folder on ``sys.path`` for a moment and imports its siblings as
top-level modules (``protocol``; the call's harness, ``harness_lcb`` or ``harness_evalplus``, with ``records``),
all before it builds the jail; never the ``scoring`` package (whose ``scoring.sandbox`` is the grader's side).
Every module imported here is standard library only.

This file imports only what the interpreter already loads plus small C modules: it runs once per sandbox call
and its start-up time is the sandbox's overhead. Linux only.
"""

import fcntl
import marshal
import os
import resource
import select
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
from protocol import (HARNESS_MODES, MEMORY_EXIT, TEST_MODES, decode_tagged, encode_tagged, jail_path,  # noqa: E402
                      jsonable, trust_collections)
sys.path.remove(_HERE)

SIGKILL = 9
TOKEN_TAG = b"\x00token:"  # on the set-up pipe: the case's completion token (a set-up failure is any other text)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
ROOT = "/tmp/r"            # the jail's root, on a tmpfs mounted over /tmp inside the private mount namespace
# harness mode -> (module in this folder, function): imported by ``_load_harness`` for the calls that use one
HARNESSES = {"lcb_stdin": ("harness_lcb", "lcb_stdin"), "lcb_call": ("harness_lcb", "lcb_call"),
             "evalplus": ("harness_evalplus", "evalplus")}
assert tuple(HARNESSES) == HARNESS_MODES, "the runner's harnesses and protocol.HARNESS_MODES disagree"

_libc = None
_FILTER = None              # the case's seccomp filter as a ``struct sock_fprog`` (``_prepare_filter``)
_PRELUDE = None
_HARNESS = None             # the call's harness function (``_load_harness``), None for a plain program
_RECORDS = None             # the ``records`` module, with the harness
_PRELUDE_NS = None          # the namespace the prelude ran in (its helpers' globals): watched in ``assert`` mode
epilogue = None             # the ``epilogue`` module, imported for a test mode's call only (``_load_epilogue``)
# stdlib classes whose comparison a test may use (``epilogue.prepare``), when their module is loaded
_TRUSTED_CLASSES = (("collections", ("Counter", "OrderedDict", "defaultdict", "deque", "UserDict", "UserList",
                                     "UserString", "ChainMap")), ("fractions", ("Fraction",)))


def _send(fd, msg):
    data = marshal.dumps(msg)
    data = len(data).to_bytes(4, "little") + data
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_all(fd):
    chunks = []
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            return b"".join(chunks)
        chunks.append(b)


def _mount(src, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    if _libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)) != 0:
        import ctypes
        err = ctypes.get_errno()
        raise OSError(err, f"mount({src!r}, {target!r}, {fstype!r}): {os.strerror(err)}")


def _build_root(spec):
    """Mount a tmpfs over /tmp (hiding the host's), lay out a minimal read-only root in it, chroot there."""
    import ctypes
    global _libc
    _libc = ctypes.CDLL(None, use_errno=True)
    jail = spec["jail"]
    # host paths under /tmp vanish under the tmpfs below: hold each by an O_PATH descriptor first and bind it
    # through /proc/self/fd, which still names the original
    held = {}
    for path in [*jail["ro_dirs"], *(f for f, _ in jail["files"])]:
        if jail_path(path) != path:
            held[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)

    def source(path):
        return f"/proc/self/fd/{held[path]}" if path in held else path

    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    os.mkdir(ROOT, 0o755)
    for link, target in jail["links"]:
        os.makedirs(os.path.dirname(ROOT + link), 0o755, exist_ok=True)
        os.symlink(target, ROOT + link)
    for path in jail["ro_dirs"]:
        target = ROOT + jail_path(path)
        os.makedirs(target, 0o755, exist_ok=True)
        _mount(source(path), target, None, MS_BIND | MS_REC)
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for path, writable in jail["files"]:
        target = ROOT + jail_path(path)
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(source(path), target, None, MS_BIND)
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_NOSUID | MS_NOEXEC | (0 if writable else MS_RDONLY))
    os.mkdir(ROOT + "/tmp", 0o755)
    os.mkdir(ROOT + "/sandbox", 0o755)
    os.makedirs(ROOT + "/dev/shm", 0o755, exist_ok=True)
    size = spec["disk_bytes"]
    for d, mode in (("/sandbox", "0755"), ("/tmp", "1777"), ("/dev/shm", "1777")):   # shm: multiprocessing locks
        _mount("tmpfs", ROOT + d, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode}")
    for fd in held.values():
        os.close(fd)
    os.chroot(ROOT)
    os.chdir("/")


def _prepare_filter(program):
    """The case processes' seccomp filter, once per call: the grader's ``struct sock_filter[]`` bytes
    (``syscall_filter.program``) in a ``struct sock_fprog`` for ``prctl``."""
    global _libc, _FILTER
    import ctypes
    if _libc is None:   # without the jail: the handle no_new_privs and the filter need
        _libc = ctypes.CDLL(None, use_errno=True)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]

    assert program and len(program) % 8 == 0, "a seccomp filter is whole 8-byte instructions"
    _FILTER = SockFprog(len(program) // 8, program)   # the structure keeps the bytes alive


def _install_filter():
    """Install the filter on the case process (every thread and child it starts inherits it); needs no_new_privs."""
    import ctypes
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(_FILTER), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot install the seccomp filter: prctl(PR_SET_SECCOMP): {os.strerror(err)}")


def _reset_dirs(spec):
    """Before every case: empty working directory, /tmp and /dev/shm with the owners and modes they started with.

    (A fresh tmpfs per case would cost two mount/umount pairs, ~1.5 ms; the directories are almost always empty.)
    """
    for path, mode, owned in ((spec["cwd"], 0o755, True), ("/tmp", 0o1777, False), ("/dev/shm", 0o1777, False)):
        if not owned and spec["jail"] is None:
            continue   # no private /tmp or /dev/shm without the jail: never touch the host's
        os.chmod(path, mode)
        if spec["uid"] is not None:
            os.chown(path, spec["uid"] if owned else 0, spec["gid"] if owned else 0)
        _clear_dir(path)


def _clear_dir(path):
    """Empty a directory as root (no symlink is followed)."""
    assert path and os.path.abspath(path) != "/", f"refusing to clear {path!r}"
    with os.scandir(path) as it:
        if next(it, None) is None:
            return
    stack = [path]
    dirs = []
    while stack:
        d = stack.pop()
        dirs.append(d)
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
            else:
                try:
                    os.unlink(e.path)
                except OSError:
                    pass
    for d in reversed(dirs[1:]):
        try:
            os.rmdir(d)
        except OSError:
            pass


def _case_process(spec, case, fds):
    """The forked case process: drop privileges, apply limits, run the untrusted program. Never returns."""
    setup_fd = fds[-1]
    try:
        # Copy every descriptor the case keeps above any number it will be placed at, then place them:
        # 0 stdin, 1 stdout, 2 stderr, 3 result (function mode), 4 setup-failure pipe (closed before the program).
        high = [None if fd is None else fcntl.fcntl(fd, fcntl.F_DUPFD, 64) for fd in fds]
        for target, fd in enumerate(high):
            if fd is not None:
                os.dup2(fd, target)
        if high[3] is None:
            try:
                os.close(3)
            except OSError:
                pass
        os.closerange(5, 1 << 16)   # the status pipe, the spec and every other runner descriptor: gone
        setup_fd = 4
        os.setsid()
        lim = resource.setrlimit
        lim(resource.RLIMIT_CORE, (0, 0))
        lim(resource.RLIMIT_CPU, (spec["cpu_s"], spec["cpu_s"] + 1))
        lim(resource.RLIMIT_AS, (spec["mem_bytes"], spec["mem_bytes"]))
        lim(resource.RLIMIT_FSIZE, (spec["fsize_bytes"], spec["fsize_bytes"]))
        lim(resource.RLIMIT_NOFILE, (spec["nofile"], spec["nofile"]))
        lim(resource.RLIMIT_NPROC, (spec["nproc"], spec["nproc"]))
        if spec["uid"] is not None:
            os.setgroups([])
            os.setgid(spec["gid"])
            os.setuid(spec["uid"])
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError("prctl(PR_SET_NO_NEW_PRIVS) failed")
        os.chdir(spec["cwd"])
        os.environ["HOME"] = spec["cwd"]
        os.environ["TMPDIR"] = "/tmp"
        token = None
        if spec["mode"] in TEST_MODES:   # drawn here, after the fork: the runner learns it, the program never does
            token = os.urandom(16).hex().encode()
            os.write(setup_fd, TOKEN_TAG + token)
        _install_filter()   # last: from here on the system calls a test program has no use for are denied
    except BaseException as e:  # an infrastructure failure, reported on a pipe the program never holds
        try:
            os.write(setup_fd, f"{e!r}".encode()[:4000] or b"?")
        finally:
            os._exit(126)
    os.close(setup_fd)
    if token is not None:
        os._exit(_run_tests(spec, case, token))
    os._exit(_run_program(spec, case) if _HARNESS is None else _run_harness(_HARNESS, spec, case))


def _main_namespace(spec):
    """The case process as the program will see it: its argv, path and int limit, and a fresh ``__main__`` module
    whose namespace is returned."""
    sys.set_int_max_str_digits(spec["int_max_str_digits"])
    sys.argv = ["main.py"]
    sys.path[:0] = spec["pythonpath"]
    main = type(sys)("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    return main.__dict__


def _run_program(spec, case):
    """Run prelude + program as ``__main__`` (stdin mode) or call ``fn_name`` on one JSON-lines input (function
    mode, result written as JSON to fd 3). Returns the exit status, like the interpreter would."""
    g = _main_namespace(spec)
    rc = 0
    try:
        if _PRELUDE is not None:
            g.update(_PRELUDE)   # the grader's prelude, run once in the runner before any case
        exec(compile(spec["source"], "main.py", "exec"), g)
        if spec["mode"] == "function":
            _call_function(spec, case, g)
        elif spec["mode"] == "calls":
            _call_many(spec, case, g)
    except SystemExit as e:
        code = e.code
        if code is None:
            rc = 0
        elif isinstance(code, int):
            rc = code & 0xFF
        else:
            try:
                sys.stderr.write(f"{code}\n")
            except BaseException:
                pass
            rc = 1
    except MemoryError:
        g.clear()
        try:
            sys.stderr.write("MemoryError\n")
        except BaseException:
            pass
        rc = MEMORY_EXIT
    except BaseException:
        try:
            etype, value, tb = sys.exc_info()
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next   # the program's frames only
            sys.excepthook(etype, value.with_traceback(tb), tb)
        except BaseException:
            pass
        rc = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return rc


def _run_tests(spec, case, token):
    """A test mode's case (``epilogue``): the program, then its tests (``checks``: calls whose values go back as
    data; ``assert``: test code), then the token. ``SystemExit`` is a failure; the program's hooks are never
    called. Returns the exit status."""
    import json
    g = _main_namespace(spec)
    try:
        if _PRELUDE is not None:
            g.update(_PRELUDE)
        exec(compile(spec["source"], "main.py", "exec"), g)
        if spec["mode"] == "checks":
            epilogue.run_checks(case, g, token, encode_tagged, decode_tagged, json.dumps, json.loads)
            return 0
        hidden = set(epilogue.pristine_builtins()) | set(_PRELUDE or ()) | set(spec["watch"])
        ns = epilogue.test_namespace({k: v for k, v in g.items() if k not in hidden}, _PRELUDE or {})
        exec(compile(case, "tests.py", "exec"), ns)
        where = epilogue.tampered()
        if where:
            raise epilogue.Untrusted(f"the program changed {where}")
        epilogue.write_result(b"", token)
        return 0
    except SystemExit:
        epilogue.fail("SystemExit: the program exited before its tests finished")
        return 1
    except MemoryError:
        g.clear()
        epilogue.fail("MemoryError")
        return MEMORY_EXIT
    except BaseException as e:
        epilogue.fail(epilogue.exception_text(e))
        return 1


def _target(spec, g):
    name = spec["fn_name"]
    if "class Solution" in spec["source"] and "Solution" in g:   # LiveCodeBench's own test for LeetCode style
        return getattr(g["Solution"](), name)
    if name not in g:
        raise NameError(f"function {name!r} is not defined by the program")
    return g[name]


def _write_result(data):
    fd3 = os.fdopen(3, "w", encoding="utf-8", closefd=False)
    fd3.write(data)
    fd3.flush()


def _call_many(spec, case, g):
    """EvalPlus style: one JSON array of argument lists; every value returned is encoded with Python types kept
    (``protocol.encode_tagged``); the first exception ends the list with an ``__exception__`` entry."""
    import json
    calls = json.loads(case)
    target = _target(spec, g)
    out = []
    try:
        for args in calls:
            out.append(encode_tagged(target(*args), True))
    except Exception as e:
        out.append({"__exception__": f"{type(e).__name__}: {e}"[:300]})
    _write_result(json.dumps(out, allow_nan=True))


def _call_function(spec, case, g):
    import json
    args = [json.loads(line) for line in case.split("\n")]
    target = _target(spec, g)
    value = target(*args)
    if isinstance(value, tuple):   # LiveCodeBench: a returned tuple counts as the list it holds
        value = list(value)
    _write_result(json.dumps(jsonable(value), allow_nan=True))


def _load_epilogue():
    """Import ``epilogue`` from this folder, before the jail hides it (a call of another mode never pays for it)."""
    global epilogue
    sys.path.insert(0, _HERE)
    try:
        epilogue = __import__("epilogue")
    finally:
        sys.path.remove(_HERE)


def _load_harness(mode):
    """Import the call's harness (and ``records``) from this folder, before the jail hides it."""
    global _HARNESS, _RECORDS
    module, fn = HARNESSES[mode]
    sys.path.insert(0, _HERE)
    try:
        _HARNESS = getattr(__import__(module), fn)
        _RECORDS = __import__("records")
    finally:
        sys.path.remove(_HERE)


def _run_harness(harness, spec, case):
    import json
    out = _RECORDS.Records(spec["max_result"])
    try:   # programs write to fd 1 only by mistake here: the harness captures or ignores print, like the reference
        null = os.open("/dev/null", os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass
    sys.set_int_max_str_digits(spec["int_max_str_digits"])
    sys.argv = ["main.py"]
    sys.path[:0] = spec["pythonpath"]
    try:
        harness(spec, json.loads(case), out)
    except BaseException as e:   # the program broke the harness itself (it runs in the program's process)
        try:
            out.put({"i": -1, "s": "memory" if isinstance(e, MemoryError) else "fatal", "e": _RECORDS.exc_text(e)})
        except BaseException:
            pass
        return 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return 0


def _read_capped(fd, cap):
    size = os.lseek(fd, 0, os.SEEK_END)
    os.lseek(fd, 0, os.SEEK_SET)
    want = min(size, cap)
    chunks = []
    while want > 0:
        b = os.read(fd, min(want, 1 << 20))
        if not b:
            break
        chunks.append(b)
        want -= len(b)
    return b"".join(chunks), size > cap


class _Sink:
    """The case's stderr pipe, drained while it runs: the first ``cap`` bytes are kept, the rest discarded (a
    program's debugging output must not stop it, unlike its stdout)."""

    def __init__(self, fd, cap):
        self.fd, self.cap, self.data, self.truncated = fd, cap, bytearray(), False

    def read(self):
        """Read what is there; False at end of file."""
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        room = self.cap - len(self.data)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[:max(room, 0)]
        self.data += chunk
        return True


def _wait_case(pid, timeout_s, in_pidns, ctl_fd, sink):
    """Wait for the case process with a wall-clock deadline, draining its stderr into ``sink``; if the grader
    closes the control pipe (it stopped the call, or died), kill everything and exit.
    Returns (status, rusage, wall_s, timed_out)."""
    t0 = time.monotonic()
    deadline = t0 + max(0.0, timeout_s)
    timed_out = False
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    poller = select.poll()
    poller.register(ctl_fd, select.POLLIN)
    poller.register(sink.fd, select.POLLIN)
    if pidfd is not None:
        poller.register(pidfd, select.POLLIN)
    exited = False
    while not exited:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        events = poller.poll((left if pidfd is not None else min(left, 0.005)) * 1000.0)
        for fd, _ in events:
            if fd == ctl_fd:
                _stop(pid, in_pidns)
            elif fd == sink.fd:
                if not sink.read():
                    poller.unregister(sink.fd)
            else:
                exited = True
        if pidfd is None:
            exited = _exited(pid)
    if pidfd is not None:
        os.close(pidfd)
    if timed_out:
        _signal_all(pid, in_pidns)
    _, status, ru = os.wait4(pid, 0)
    return status, ru, time.monotonic() - t0, timed_out


def _exited(pid):
    """Without pidfd (kernels before 5.3): has the process exited? (peeks without reaping)"""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _stop(pid, in_pidns):
    """The grader is gone or stopped this call: kill the case and everything else, exit."""
    try:
        _kill_rest(pid, in_pidns)
    finally:
        os._exit(0)


def _stop_requested(ctl_fd):
    p = select.poll()
    p.register(ctl_fd, select.POLLIN)
    return bool(p.poll(0))


def _signal_all(pid, in_pidns):
    """SIGKILL the case process and everything it started (without reaping)."""
    targets = [-1] if in_pidns else [-pid, pid]   # -1 from PID 1: every other process of the namespace only
    for target in targets:
        try:
            os.kill(target, SIGKILL)
        except OSError:
            pass


def _kill_rest(pid, in_pidns):
    """After a case: kill and reap whatever it left behind (detached grandchildren included).

    With a PID namespace every leftover is a child of this PID 1, so "no child left" means the namespace is
    empty; kill(-1) is repeated because a process forking while it runs can miss it."""
    deadline = time.monotonic() + 10.0
    while True:
        _signal_all(pid, in_pidns)
        while True:
            try:
                got, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if not got:
                break
        if not in_pidns:
            return   # no namespace: the grader's cgroup sweep is the fallback for setsid'd descendants
        if time.monotonic() > deadline:
            raise RuntimeError("processes left by the case survive SIGKILL for 10 s")
        time.sleep(0.0005)


def main():
    spec_fd, status_fd, ctl_fd = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    os.umask(0o022)
    try:
        spec = marshal.loads(_read_all(spec_fd))
        os.close(spec_fd)
        if spec["mode"] in HARNESSES:
            _load_harness(spec["mode"])
        if spec["mode"] in TEST_MODES:
            _load_epilogue()
        in_pidns = os.getpid() == 1
        t0 = time.monotonic()
        if spec["cgroup"]:
            with open(spec["cgroup"] + "/cgroup.procs", "w") as f:
                f.write("0")
        t1 = time.monotonic()
        if spec["jail"] is not None:
            _build_root(spec)
        _prepare_filter(spec["seccomp"])
        t2 = time.monotonic()
        if spec["preimport"]:
            sys.path[:0] = [d for d in spec["pythonpath"] if d not in sys.path]   # trusted: the grader's packages
        for name in spec["preimport"]:   # paid once here instead of once per case
            if name == "numpy":   # one BLAS thread: no thread pool is started in the runner (threads do not fork)
                os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            __import__(name)
            if name == "numpy":
                for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                    os.environ.pop(var, None)
        for name, path in spec.get("load_files", ()):   # a module of a package the jail shows only this file of
            import importlib.util
            mspec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(mspec)
            mspec.loader.exec_module(module)
            _RECORDS.LOADED[name] = module
        if spec["prelude"]:
            # Trusted code from the grader (imports, sys.setrecursionlimit): run once here, and each case process
            # (a fork of this one) starts from a copy of the names it defined.
            global _PRELUDE, _PRELUDE_NS
            ns = {"__name__": "__main__", "__builtins__": __builtins__}
            exec(compile(spec["prelude"], "<prelude>", "exec"), ns)
            _PRELUDE = {k: v for k, v in ns.items() if k not in ("__name__", "__builtins__")}
            _PRELUDE_NS = ns
        if spec["mode"] in TEST_MODES:   # what the epilogue trusts and watches, as it is before any program runs
            watched = []
            for name in spec["watch"]:
                try:
                    watched.append(__import__(name).__dict__)
                except BaseException:
                    pass   # a test that imports a missing module fails there
            trust_collections()   # a returned Counter / OrderedDict / defaultdict travels as itself (protocol)
            epilogue.prepare([getattr(sys.modules[m], c) for m, names in _TRUSTED_CLASSES if m in sys.modules
                              for c in names if hasattr(sys.modules[m], c)])
            epilogue.watch(watched + ([_PRELUDE_NS] if _PRELUDE_NS is not None else []))
        t3 = time.monotonic()
        _send(status_fd, {"t": "ready", "setup_s": t3 - t0, "pidns": in_pidns,
                          "cgroup_s": t1 - t0, "jail_s": t2 - t1, "preimport_s": t3 - t2})
    except BaseException as e:
        _send(status_fd, {"t": "fail", "msg": f"sandbox setup failed: {e!r}"})
        os._exit(125)

    mode = spec["mode"]
    for i, case in enumerate(spec["cases"]):
        if _stop_requested(ctl_fd):
            os._exit(0)
        try:
            _reset_dirs(spec)
            in_fd = os.memfd_create("in")
            data = case if mode == "stdin" else b""
            view = memoryview(data)
            while view:
                view = view[os.write(in_fd, view):]
            os.lseek(in_fd, 0, os.SEEK_SET)
            out_fd = os.memfd_create("out")
            err_r, err_fd = os.pipe()
            os.set_blocking(err_r, False)
            res_fd = os.memfd_create("res") if mode != "stdin" else None
            setup_r, setup_w = os.pipe()
            pid = os.fork()
        except BaseException as e:
            _send(status_fd, {"t": "fail", "msg": f"sandbox could not start case {i}: {e!r}"})
            os._exit(125)
        if pid == 0:
            _case_process(spec, case, (in_fd, out_fd, err_fd, res_fd, setup_w))
        try:
            os.close(setup_w)
            os.close(err_fd)
            _send(status_fd, {"t": "start", "i": i, "pid": pid})
            sink = _Sink(err_r, spec["max_stderr"])
            status, ru, wall, timed_out = _wait_case(pid, spec["timeout_s"], in_pidns, ctl_fd, sink)
            _kill_rest(pid, in_pidns)   # detached grandchildren of this case do not outlive it
            while sink.read() and in_pidns:   # every writer is dead now: read to the end
                pass
            out, out_trunc = _read_capped(out_fd, spec["max_stdout"])
            err, err_trunc = bytes(sink.data), sink.truncated
            res, res_trunc = (None, False) if res_fd is None else _read_capped(res_fd, spec["max_result"])
            completed = None
            setup_error = _read_all(setup_r)
            token = None
            if setup_error.startswith(TOKEN_TAG):
                token, setup_error = setup_error[len(TOKEN_TAG):], b""
            if setup_error:
                why = setup_error.decode(errors="replace")
                _send(status_fd, {"t": "fail", "msg": f"sandbox case setup failed: {why}"})
                os._exit(125)
            for fd in (in_fd, out_fd, err_r, res_fd, setup_r):
                if fd is not None:
                    os.close(fd)
            if mode in TEST_MODES:   # finished only when the epilogue's token closes the result channel
                tail = epilogue.TOKEN_SEP + (token or b"?")
                completed = token is not None and not res_trunc and res.endswith(tail)
                res = res[:-len(tail)] if completed else res
            msg = {
                "t": "case", "i": i, "wall_s": wall, "timed_out": timed_out,
                "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss,
                "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                "stdout": out, "stdout_truncated": out_trunc,
                "stderr": err, "stderr_truncated": err_trunc,
                "result": res, "result_truncated": res_trunc, "completed": completed,
            }
            _send(status_fd, msg)
        except BaseException as e:
            _send(status_fd, {"t": "fail", "msg": f"sandbox failed while running case {i}: {e!r}"})
            os._exit(125)
    _send(status_fd, {"t": "done"})
    os._exit(0)


if __name__ == "__main__":
    main()
