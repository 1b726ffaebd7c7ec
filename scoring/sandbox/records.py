"""What the harnesses share, inside the jail: the record writer, the failure classification, the modules the runner
loaded for them. Standard library only; imported by the runner as a top-level module (see ``runner.py``).

A harness runs every test of one program inside ONE case process, the way a reference grader does (state shared
between tests, its stdin/stdout conventions, its timeouts), and writes one JSON record per test to fd 3, straight
away, so that what was recorded survives the process being killed. Everything in this process is the program's:
a record is data the grader checks (never a verdict), and anything missing or malformed is the program's failure.

  lcb_stdin / lcb_call (``harness_lcb.py``): LiveCodeBench's lcb_runner (evaluation/testing_util.py): stdin
      programs wrapped in a function, a mocked sys.stdin and a captured sys.stdout per test; call-based programs
      loaded once, one Solution() shared by all tests; a 6 s alarm per test; lcb's reliability guard.
  evalplus (``harness_evalplus.py``): EvalPlus's unsafe_execute (candidate: its reliability guard, swallow_io,
      per-input time_limit; the functions come from the installed evalplus package's evalplus/eval/utils.py, loaded
      by the runner) or its trusted_exec (canonical solution: deepcopy, timing, no guard).

Record: {"i": test index, "s": "ok" | "error" | "timeout" | "fatal" | "output_limit", ...}; "out" (captured
stdout), "v" (returned value), "e" (exception text), "t" (seconds), "stage": "load" for failures before test 0.
"""

import json
import os

LOADED = {}                 # name -> module loaded by the runner from a file (evalplus's eval/utils.py)


class Records:
    """JSON lines on fd 3, unbuffered; refuses to write past ``cap`` bytes (an ``output_limit`` record instead)."""

    def __init__(self, cap):
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


def exc_text(e):
    try:
        return f"{type(e).__name__}: {e}"[:300]
    except BaseException:
        return type(e).__name__


def failure(i, e, stage=None):
    """lcb_runner's classification of an exception: Exception -> timeout (its repr names TimeoutException) or
    error; anything else (SystemExit, KeyboardInterrupt...) escapes its handlers and kills the process: fatal."""
    if isinstance(e, Exception):
        kind = "timeout" if "timeoutexception" in repr(e).lower() else "error"
        if isinstance(e, MemoryError):
            kind = "memory"
    else:
        kind = "fatal"
    rec = {"i": i, "s": kind, "e": exc_text(e)}
    if stage:
        rec["stage"] = stage
    return rec

