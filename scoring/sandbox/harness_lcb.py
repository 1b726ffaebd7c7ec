"""LiveCodeBench's harnesses inside the jail (``lcb_stdin``, ``lcb_call``): lcb_runner's evaluation/testing_util.py,
reproduced (docs/graders.md lists what matches and every known difference). Standard library only; the runner
imports it as a top-level module before it builds the jail, only for a call that uses it (see ``runner.py``);
``records.py`` describes what a harness writes.
"""

import ast
import builtins
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from types import ModuleType

from protocol import jsonable
from records import failure


class TimeoutException(Exception):
    """Raised by the per-test alarm (the name matters: lcb_runner recognises a timeout by it)."""


def _lcb_alarm_handler(signum, frame):
    print("timeout occured: alarm went off")   # sic: lcb_runner prints this, into the captured output if any
    raise TimeoutException


def _alarm(seconds):
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _lcb_guard():
    """What lcb_runner's reliability_guard() disables before a program is loaded (programs that call these fail
    there, so they fail here); the sandbox is what actually contains the program."""
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
    mod = ModuleType("tmp_sol", "")
    try:
        _alarm(_LCB_TIMEOUT[0])
        try:
            exec(code, mod.__dict__)
            return mod.Solution() if "class Solution" in code else mod   # lcb's own test for LeetCode style
        finally:
            _alarm(0)
    except BaseException as e:
        out.put(failure(0, e, "load"))
        return None


_LCB_TIMEOUT = [6.0]


class _LcbStdin:
    """``sys.stdin`` during a stdin test, as lcb_runner mocks it: ``read()`` is the whole input every time,
    ``readlines()`` is ``input.split("\\n")`` (no line ends, a last empty string), ``readline()`` consumes lines,
    ``buffer.read()`` is the bytes, ``buffer.readline()`` is always the first line; other attributes come from a
    StringIO of the input. The class has no ``__iter__``: ``for line in sys.stdin`` raises TypeError there."""

    def __init__(self, text):
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
        rec = failure(i, e)
    finally:
        sys.stdout = real_stdout
    if rec["s"] != "ok":
        return rec, ""
    try:
        return rec, captured.getvalue()
    except MemoryError as e:
        return failure(i, e), ""


def lcb_stdin(spec, payload, out):
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


def lcb_call(spec, payload, out):
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
        out.put(failure(0, e, "load"))
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
            rec = {"i": i, "s": "ok", "v": jsonable(value)}
        except BaseException as e:
            _alarm(0)
            rec = failure(i, e)
        if not out.put(rec) or rec["s"] != "ok":
            return

