"""Sandbox runner (trusted): started by ``scoring.sandbox`` as ``python -I -S -B _sandbox_child.py SPEC STATUS CTL``.

Nothing here decides pass or fail. The runner reads a run spec (``marshal``, written by the grader), builds the
jail, and for every test case forks a fresh copy of itself that drops privileges and runs the untrusted program.
It reports raw facts (exit status, signal, time, captured bytes) back to the grader over the STATUS pipe; the
grader classifies and compares. When the grader closes the CTL pipe (it stopped the call early, or it died), the
runner kills the case and everything else in the namespace and exits.

Process layout with namespaces (the grader runs ``unshare --net --pid --mount --ipc --uts --fork --kill-child``)::

    grader ── unshare (host) ── runner R: PID 1 of a new PID namespace, root, holds STATUS
                                   └── case process P (one per test case): uid 65534, rlimits, chroot,
                                       runs the program

R stays root so that the kernel's parent-death signal (``--kill-child``) survives: when the grader kills unshare,
R dies, and when PID 1 of a namespace dies the kernel kills every process in it (detached grandchildren too).
R itself kills everything else in the namespace (``kill(-1)``) after each case.

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

MEMORY_EXIT = 213          # exit status the case process uses for an uncaught MemoryError
SIGKILL = 9
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
PR_SET_NO_NEW_PRIVS = 38
ROOT = "/tmp/r"            # the jail's root, on a tmpfs mounted over /tmp inside the private mount namespace
HOST_TMP = "/.host-tmp"    # where host paths under /tmp (a checkout or venv there) appear in the jail: its own /tmp
                           # is a fresh tmpfs. Must match scoring/sandbox.py's jail_path


def jail_path(path):
    return HOST_TMP + path[4:] if path == "/tmp" or path.startswith("/tmp/") else path

_libc = None
_PRELUDE = None


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
        if _libc is not None:
            _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        os.chdir(spec["cwd"])
        os.environ["HOME"] = spec["cwd"]
        os.environ["TMPDIR"] = "/tmp"
    except BaseException as e:  # an infrastructure failure, reported on a pipe the program never holds
        try:
            os.write(setup_fd, f"{e!r}".encode()[:4000] or b"?")
        finally:
            os._exit(126)
    os.close(setup_fd)
    harness = _HARNESSES.get(spec["mode"])
    os._exit(_run_program(spec, case) if harness is None else _run_harness(harness, spec, case))



def _run_program(spec, case):
    """Run prelude + program as ``__main__`` (stdin mode) or call ``fn_name`` on one JSON-lines input (function
    mode, result written as JSON to fd 3). Returns the exit status, like the interpreter would."""
    sys.set_int_max_str_digits(spec["int_max_str_digits"])
    sys.argv = ["main.py"]
    sys.path[:0] = spec["pythonpath"]
    main = type(sys)("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    g = main.__dict__
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
    (``_tagged``); the first exception ends the list with an ``__exception__`` entry."""
    import json
    calls = json.loads(case)
    target = _target(spec, g)
    out = []
    try:
        for args in calls:
            out.append(_tagged(target(*args)))
    except Exception as e:
        out.append({"__exception__": f"{type(e).__name__}: {e}"[:300]})
    _write_result(json.dumps(out, allow_nan=True))


def _tagged(x):
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [_tagged(v) for v in x]
    if t is tuple:
        return {"__tuple__": [_tagged(v) for v in x]}
    if t is set or t is frozenset:
        return {"__" + t.__name__ + "__": [_tagged(v) for v in x]}
    if t is dict:
        return {"__dict__": [[_tagged(k), _tagged(v)] for k, v in x.items()]}
    if t is complex:
        return {"__complex__": [x.real, x.imag]}
    if t is bytes:
        return {"__bytes__": x.hex()}
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str(x)
    if _is_numpy(t):   # numpy scalars and arrays keep their dtype: EvalPlus compares them as numpy values
        try:
            return {"__numpy__": [x.dtype.str, list(x.shape), _tagged(x.tolist())]}
        except Exception:
            pass
    try:
        r = repr(x)[:200]
    except Exception:
        r = "?"
    return {"__repr__": [t.__name__, r]}


def _is_numpy(t):
    return getattr(t, "__module__", "") == "numpy" and hasattr(t, "dtype") and hasattr(t, "tolist")


def _call_function(spec, case, g):
    import json
    args = [json.loads(line) for line in case.split("\n")]
    target = _target(spec, g)
    value = target(*args)
    if isinstance(value, tuple):   # LiveCodeBench: a returned tuple counts as the list it holds
        value = list(value)
    _write_result(json.dumps(_jsonable(value), allow_nan=True))


def _jsonable(x):
    """Turn the program's return value into JSON data without changing what ``==`` would say against a JSON value.

    Values JSON cannot hold faithfully (a nested tuple, a set, a custom object, a dict with non-str keys) become
    a marker object that no gold JSON value equals, as they would compare unequal in LiveCodeBench's in-process
    ``==`` too.
    """
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [_jsonable(v) for v in x]
    if t is dict and all(type(k) is str for k in x):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, bool):
        return bool(x)
    if isinstance(x, int) and not isinstance(x, bool):
        return int(x)
    if isinstance(x, float):
        return float(x)
    if isinstance(x, str):
        return str(x)
    if _is_numpy(t) and getattr(x, "shape", None) == ():   # numpy scalars compare as the Python value they hold
        try:
            return _jsonable(x.item())
        except Exception:
            pass
    if hasattr(t, "__index__") and not hasattr(t, "__len__"):   # other integer scalars
        return int(x.__index__())
    try:
        r = repr(x)[:200]
    except BaseException:
        r = "?"
    return {"__sandbox_unrepresentable__": t.__name__, "repr": r}


# ----------------------------------------------------------------------------------------------- harnesses
#
# A harness runs every test of one program inside ONE case process, the way a reference grader does (state shared
# between tests, its stdin/stdout conventions, its timeouts), and writes one JSON record per test to fd 3, straight
# away, so that what was recorded survives the process being killed. Everything in this process is the program's:
# a record is data the grader checks (never a verdict), and anything missing or malformed is the program's failure.
#
#   lcb_stdin / lcb_call: LiveCodeBench's lcb_runner (evaluation/testing_util.py): stdin programs wrapped in a
#       function, a mocked sys.stdin and a captured sys.stdout per test; call-based programs loaded once, one
#       Solution() shared by all tests; a 6 s alarm per test; lcb's reliability guard.
#   evalplus: EvalPlus's unsafe_execute (candidate: its reliability guard, swallow_io, per-input time_limit; the
#       functions come from the installed evalplus package's evalplus/eval/utils.py, loaded by the runner) or its
#       trusted_exec (canonical solution: deepcopy, timing, no guard).
#
# Record: {"i": test index, "s": "ok" | "error" | "timeout" | "fatal" | "output_limit", ...}; "out" (captured
# stdout), "v" (returned value), "e" (exception text), "t" (seconds), "stage": "load" for failures before test 0.

_LOADED = {}                # name -> module loaded by the runner from a file (evalplus's eval/utils.py)


class TimeoutException(Exception):
    """Raised by the per-test alarm (the name matters: lcb_runner recognises a timeout by it)."""


class _Records:
    """JSON lines on fd 3, unbuffered; refuses to write past ``cap`` bytes (an ``output_limit`` record instead)."""

    def __init__(self, cap):
        import json
        self._dumps, self._write, self.left, self.full = json.dumps, os.write, cap, False

    def put(self, rec):
        if self.full:
            return False
        data = (self._dumps(rec, allow_nan=True) + "\n").encode("ascii")
        if len(data) > self.left:
            data = (self._dumps({"i": rec.get("i", 0), "s": "output_limit"}) + "\n").encode("ascii")
            self.full = True
        view = memoryview(data)
        while view:
            view = view[self._write(3, view):]
        self.left -= len(data)
        return not self.full


def _run_harness(harness, spec, case):
    import json
    out = _Records(spec["max_result"])
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
            out.put({"i": -1, "s": "memory" if isinstance(e, MemoryError) else "fatal", "e": _exc_text(e)})
        except BaseException:
            pass
        return 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return 0


def _exc_text(e):
    try:
        return f"{type(e).__name__}: {e}"[:300]
    except BaseException:
        return type(e).__name__


def _failure(i, e, stage=None):
    """lcb_runner's classification of an exception: Exception -> timeout (its repr names TimeoutException) or
    error; anything else (SystemExit, KeyboardInterrupt...) escapes its handlers and kills the process: fatal."""
    if isinstance(e, Exception):
        kind = "timeout" if "timeoutexception" in repr(e).lower() else "error"
        if isinstance(e, MemoryError):
            kind = "memory"
    else:
        kind = "fatal"
    rec = {"i": i, "s": kind, "e": _exc_text(e)}
    if stage:
        rec["stage"] = stage
    return rec


# ---- LiveCodeBench (lcb_runner) ----------------------------------------------------------------------------------

def _lcb_alarm_handler(signum, frame):
    print("timeout occured: alarm went off")   # sic: lcb_runner prints this, into the captured output if any
    raise TimeoutException


def _alarm(seconds):
    import signal
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _lcb_guard():
    """What lcb_runner's reliability_guard() disables before a program is loaded (programs that call these fail
    there, so they fail here); the sandbox is what actually contains the program."""
    import builtins
    import shutil
    import subprocess
    builtins.quit = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork", "forkpty",
                 "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown", "chmod",
                 "chown", "chroot", "lchflags", "lchmod", "lchown", "getcwd", "chdir"):
        setattr(os, name, None)
    shutil.rmtree = shutil.move = shutil.chown = None
    subprocess.Popen = None
    builtins.help = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


def _lcb_wrap(source, prelude):
    """lcb_runner's stdin transformation: a final ``if __name__ == '__main__':`` block is unwrapped, top-level
    imports are kept at module level (after the import prelude), every other statement becomes the body of
    ``wrapped_function()``. Code that does not parse is returned as is (it fails to load, as there)."""
    import ast
    try:
        tree = ast.parse(source)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            source = ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except BaseException:
        pass
    try:
        tree = ast.parse(source)
        imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
        body = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
        fn = ast.FunctionDef(name="wrapped_function", args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                             kw_defaults=[], defaults=[]), body=body, decorator_list=[], lineno=-1)
        return prelude + "\n" + ast.unparse(imports) + "\n" + ast.unparse(fn)
    except BaseException:
        return source


def _lcb_load(code, out):
    """Load the program the way lcb_runner's compile_code does (an alarm around it); the object to call into, or
    None after recording the failure."""
    from types import ModuleType
    mod = ModuleType("tmp_sol", "")
    try:
        _alarm(_LCB_TIMEOUT[0])
        try:
            exec(code, mod.__dict__)
            return mod.Solution() if "class Solution" in code else mod   # lcb's own test for LeetCode style
        finally:
            _alarm(0)
    except BaseException as e:
        out.put(_failure(0, e, "load"))
        return None


_LCB_TIMEOUT = [6.0]


class _LcbStdin:
    """``sys.stdin`` during a stdin test, as lcb_runner mocks it: ``read()`` is the whole input every time,
    ``readlines()`` is ``input.split("\\n")`` (no line ends, a last empty string), ``readline()`` consumes lines,
    ``buffer.read()`` is the bytes, ``buffer.readline()`` is always the first line; other attributes come from a
    StringIO of the input. The class has no ``__iter__``: ``for line in sys.stdin`` raises TypeError there."""

    def __init__(self, text):
        import io
        self._text, self._io, self.buffer = text, io.StringIO(text), _LcbStdinBuffer(text)

    def read(self, *args):
        return self._text

    def readline(self, *args):
        return self._io.readline(*args)

    def readlines(self, *args):
        return self._text.split("\n")

    def __getattr__(self, name):
        return getattr(self._io, name)


class _LcbStdinBuffer:
    def __init__(self, text):
        self._data = text.encode("utf-8")

    def read(self, *args):
        return self._data

    def readline(self, *args):
        return self._data.split(b"\n")[0] + b"\n"


class _LazyMockOpen:
    """``builtins.open`` during a stdin test: lcb_runner patches it with ``unittest.mock.mock_open(read_data=input)``.
    The mock is built on the first call (importing unittest.mock costs ~50 ms; few programs call open)."""

    def __init__(self, text):
        self._text, self._mock = text, None

    def __call__(self, *args, **kwargs):
        if self._mock is None:
            from unittest.mock import mock_open
            self._mock = mock_open(read_data=self._text)
        return self._mock(*args, **kwargs)


def _lcb_stdin_test(fn, text, i, timeout_s):
    """One stdin test as lcb_runner's grade_stdio/call_method run it; (record, captured stdout)."""
    import builtins
    import io
    captured = io.StringIO()
    captured.close = lambda x: 1          # sic: lcb's capture object "ignores" close() (calling it raises)
    real_stdout, sys.stdout = sys.stdout, captured
    rec = {"i": i, "s": "ok"}
    try:
        real_stdin = sys.stdin
        lines = iter(text.split("\n"))
        patches = {"read": lambda *a: text, "readlines": lambda *a: text.split("\n"),
                   "readline": lambda *a: next(lines)}   # the real stdin object (what `from sys import stdin` holds)
        had = {k: real_stdin.__dict__[k] for k in patches if k in real_stdin.__dict__}
        real_open = builtins.open
        try:
            for k, v in patches.items():
                setattr(real_stdin, k, v)
            sys.stdin = _LcbStdin(text)
            builtins.open = _LazyMockOpen(text)
            _alarm(timeout_s)
            try:
                fn()
            except SystemExit:       # lcb_runner ignores exit() and sys.exit(code) in stdin programs
                pass
            finally:
                _alarm(0)
        finally:
            builtins.open = real_open
            sys.stdin = real_stdin
            for k in patches:
                if k in had:
                    setattr(real_stdin, k, had[k])
                else:
                    try:
                        delattr(real_stdin, k)
                    except AttributeError:
                        pass
    except BaseException as e:
        _alarm(0)
        rec = _failure(i, e)
    finally:
        sys.stdout = real_stdout
    if rec["s"] != "ok":
        return rec, ""
    try:
        return rec, captured.getvalue()
    except MemoryError as e:
        return _failure(i, e), ""


def _lcb_stdin(spec, payload, out):
    import signal
    h = spec["harness"]
    _LCB_TIMEOUT[0] = h["timeout_s"]
    code = _lcb_wrap(spec["source"], h["prelude"])
    _lcb_guard()
    signal.signal(signal.SIGALRM, _lcb_alarm_handler)
    sol = _lcb_load(code, out)
    if sol is None:
        return
    fn = getattr(sol, "wrapped_function", None)
    if fn is None:
        out.put({"i": 0, "s": "error", "e": "no wrapped_function", "stage": "load"})
        return
    for i, text in enumerate(payload["inputs"]):
        rec, got = _lcb_stdin_test(fn, text, i, h["timeout_s"])
        if rec["s"] == "ok":
            rec["out"] = got
        if not out.put(rec) or rec["s"] != "ok":
            return


def _lcb_call(spec, payload, out):
    import json
    import signal
    h = spec["harness"]
    _LCB_TIMEOUT[0] = h["timeout_s"]
    code = h["prelude"] + "\n\n" + spec["source"]
    _lcb_guard()
    signal.signal(signal.SIGALRM, _lcb_alarm_handler)
    sol = _lcb_load(code, out)
    if sol is None:
        return
    method = getattr(sol, spec["fn_name"], None) if hasattr(sol, spec["fn_name"]) else None
    if method is None:
        out.put({"i": 0, "s": "error", "e": f"{spec['fn_name']!r} is not defined by the program", "stage": "load"})
        return
    try:
        args = [[json.loads(line) for line in text.split("\n")] for text in payload["inputs"]]
    except BaseException as e:
        out.put(_failure(0, e, "load"))
        return
    for i, a in enumerate(args):
        try:
            _alarm(h["timeout_s"])
            try:
                value = method(*a)
            finally:
                _alarm(0)
            if isinstance(value, tuple):   # lcb_runner: a returned tuple counts as the list it holds
                value = list(value)
            rec = {"i": i, "s": "ok", "v": _jsonable(value)}
        except BaseException as e:
            _alarm(0)
            rec = _failure(i, e)
        if not out.put(rec) or rec["s"] != "ok":
            return


# ---- EvalPlus ----------------------------------------------------------------------------------------------------

def _evalplus(spec, payload, out):
    """EvalPlus: ``trusted`` = its trusted_exec (the canonical solution: deepcopy of each input, timed, no guard);
    else its unsafe_execute around the candidate (reliability_guard, swallow_io, time_limit per input), stopping at
    the first exception like its fast_check; the comparison is EvalPlus's own, run by the grader on the values."""
    import contextlib
    import time
    h = spec["harness"]
    inputs = _untag(payload["inputs"])
    entry = spec["fn_name"]
    trusted = bool(payload.get("trusted"))
    if not trusted:
        u = _LOADED["evalplus_utils"]
        u.reliability_guard(maximum_memory_bytes=h["max_memory_bytes"])
    g = {}
    try:
        with (contextlib.nullcontext() if trusted else u.swallow_io()):
            exec(spec["source"], g)
            fn = g[entry]
    except BaseException as e:
        out.put(_failure(0, e, "load"))
        return
    if trusted:
        from copy import deepcopy
        for i, inp in enumerate(inputs):
            inp = deepcopy(inp)
            try:
                t0 = time.time()
                value = fn(*inp)
                dt = time.time() - t0
            except BaseException as e:
                out.put(_failure(i, e))
                return
            if payload.get("output_not_none"):
                value = value is not None
            if not out.put({"i": i, "s": "ok", "v": _tagged(value), "t": dt}):
                return
        return
    limits = payload["limits"]
    for i, inp in enumerate(inputs):
        try:
            with u.time_limit(limits[i]):
                with u.swallow_io():
                    value = fn(*inp)
            rec = {"i": i, "s": "ok", "v": _tagged(value)}
        except BaseException as e:
            rec = _failure(i, e)
            if isinstance(e, u.TimeoutException):
                rec["s"] = "timeout"
        if not out.put(rec) or rec["s"] != "ok":
            return


def _untag(x):
    """Inverse of ``_tagged`` for the inputs the grader sends (tuples, sets, dicts with any keys, complex, bytes)."""
    if isinstance(x, list):
        return [_untag(v) for v in x]
    if not isinstance(x, dict):
        return x
    (tag, v), = x.items()
    if tag == "__tuple__":
        return tuple(_untag(e) for e in v)
    if tag == "__set__":
        return {_untag(e) for e in v}
    if tag == "__frozenset__":
        return frozenset(_untag(e) for e in v)
    if tag == "__dict__":
        return {_untag(k): _untag(e) for k, e in v}
    if tag == "__complex__":
        return complex(float(v[0]), float(v[1]))
    if tag == "__bytes__":
        return bytes.fromhex(v)
    raise ValueError(f"unknown input tag {tag!r}")


_HARNESSES = {"lcb_stdin": _lcb_stdin, "lcb_call": _lcb_call, "evalplus": _evalplus}


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
        in_pidns = os.getpid() == 1
        t0 = time.monotonic()
        if spec["cgroup"]:
            with open(spec["cgroup"] + "/cgroup.procs", "w") as f:
                f.write("0")
        t1 = time.monotonic()
        if spec["jail"] is not None:
            _build_root(spec)
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
            _LOADED[name] = module
        if spec["prelude"]:
            # Trusted code from the grader (imports, sys.setrecursionlimit): run once here, and each case process
            # (a fork of this one) starts from a copy of the names it defined.
            global _PRELUDE
            ns = {"__name__": "__main__", "__builtins__": __builtins__}
            exec(compile(spec["prelude"], "<prelude>", "exec"), ns)
            _PRELUDE = {k: v for k, v in ns.items() if k not in ("__name__", "__builtins__")}
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
            setup_error = _read_all(setup_r)
            if setup_error:
                why = setup_error.decode(errors="replace")
                _send(status_fd, {"t": "fail", "msg": f"sandbox case setup failed: {why}"})
                os._exit(125)
            for fd in (in_fd, out_fd, err_r, res_fd, setup_r):
                if fd is not None:
                    os.close(fd)
            msg = {
                "t": "case", "i": i, "wall_s": wall, "timed_out": timed_out,
                "cpu_s": ru.ru_utime + ru.ru_stime, "maxrss_kb": ru.ru_maxrss,
                "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                "stdout": out, "stdout_truncated": out_trunc,
                "stderr": err, "stderr_truncated": err_trunc,
                "result": res, "result_truncated": res_trunc,
            }
            _send(status_fd, msg)
        except BaseException as e:
            _send(status_fd, {"t": "fail", "msg": f"sandbox failed while running case {i}: {e!r}"})
            os._exit(125)
    _send(status_fd, {"t": "done"})
    os._exit(0)


if __name__ == "__main__":
    main()
