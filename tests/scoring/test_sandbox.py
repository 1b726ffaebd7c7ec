"""The code sandbox against hostile programs: each is contained, gets the right status, leaves the host untouched,
and the grader survives. Plus the plumbing: modes, limits, concurrency, infrastructure errors.

Hostile tests need the full isolation (root + unshare: namespaces, chroot jail, a uid per call); they are skipped
with the probe's reason where the machine cannot give it.
"""

import dataclasses
import errno
import os
import re
import socket
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from scoring import sandbox as sb
from scoring.sandbox import host   # the grader's side: its launch and probing internals
from scoring.code import grade_code

ISO = sb.isolation()
full = pytest.mark.skipif(not ISO.full, reason=f"needs full sandbox isolation: {ISO.reason}")


def _tagged(code: str) -> tuple[str, str]:
    """(tag, code that first names its process ``tag``): prctl(PR_SET_NAME) sets the command name, which every
    process it forks inherits, so a test finds the processes of its own programs and no one else's (other
    sandboxes running on the machine, or other processes of the sandbox's uids, are not counted)."""
    tag = "tsb" + uuid.uuid4().hex[:12]   # at most 15 characters: the kernel's limit for a command name
    return tag, f"import ctypes\nctypes.CDLL(None).prctl(15, {tag.encode()!r}, 0, 0, 0)\n" + code


def _procs_named(tag: str) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/comm") as f:
                    if f.read().strip() == tag:
                        pids.append(int(d))
            except OSError:
                pass
    return pids


# ------------------------------------------------------------------------------------------- basics

def test_probe_agrees_with_what_a_program_sees():
    """The probe's verdict is what a program run in the sandbox observes: with full isolation it is PID 2 of a new
    PID namespace (its runner is PID 1), runs as one of the sandbox's uids and cannot see the host's root; without,
    it runs in the host's namespace and the probe names why."""
    here = str(Path(__file__).resolve())   # a file of the host's
    r = sb.run_program(f"import os\nprint(os.getpid(), os.getppid(), os.getuid(), os.path.exists({here!r}))\n")
    pid, ppid, uid, sees_host = r.stdout.split()
    assert r.status == "ok" and r.isolated == ISO.full
    if ISO.full:
        assert (ppid, sees_host) == ("1", "False") and int(uid) in ISO.uids and int(pid) <= 3 and ISO.reason == ""
    else:
        assert ISO.reason and ppid != "1" and sees_host == "True"


def test_probe_is_cached():
    assert sb.isolation() is ISO   # probed once, cached


@full
def test_runs_as_its_own_uid_in_a_jail_with_a_minimal_environment(monkeypatch):
    monkeypatch.setenv("TS_GRADER_CANARY_SECRET", "do-not-leak")
    r = sb.run_program(
        "import os, sys\n"
        "print(sys.stdin.read().upper())\n"
        "print(os.getuid(), os.getgid(), os.getgroups(), os.getcwd())\n"
        "print(sorted(os.environ))\n"
        "print(os.environ.get('TS_GRADER_CANARY_SECRET'))\n"
        "print(sorted(os.listdir('/')))\n", stdin="hello")
    lines = r.stdout.splitlines()
    assert r.status == "ok" and r.isolated
    assert lines[0] == "HELLO"
    uid, rest = lines[1].split(" ", 1)
    assert int(uid) in ISO.uids and rest == "65534 [] /sandbox"
    assert lines[2] == "['HOME', 'LANG', 'LC_ALL', 'PATH', 'TMPDIR']"
    assert lines[3] == "None"
    top = eval(lines[4])
    assert "work" not in top and "home" not in top and "proc" not in top
    assert {"usr", "tmp", "sandbox", "dev"} <= set(top)


def test_function_mode_returns_data_the_grader_compares():
    src = ("class Solution:\n"
           "    def f(self, a, b):\n"
           "        print('chatter on stdout is ignored')\n"
           "        return (a + b, [a, b])\n")
    r = sb.run_function(src, "f", [2, 3])
    assert r.status == "ok" and r.value_ok and r.value == [5, [2, 3]]   # the returned tuple became a list
    r = sb.run_function("def g(x):\n    return [(1, 2)], {3}\n", "g", [0])
    # a nested tuple or a set cannot be JSON: a marker no gold equals (LiveCodeBench compares them unequal too)
    assert r.value[0] == [{"__sandbox_unrepresentable__": "tuple", "repr": "(1, 2)"}]
    assert r.value[1]["__sandbox_unrepresentable__"] == "set"


def test_calls_mode_keeps_python_types():
    r = sb.run_cases("def f(x):\n    return (x, {x}, {x: [x]}, complex(x, 1))\n", ["[[1], [2]]"], mode="calls",
                     fn_name="f")[0]
    assert sb.decode_tagged(r.value) == [(1, {1}, {1: [1]}, 1 + 1j), (2, {2}, {2: [2]}, 2 + 1j)]


def test_cases_are_fresh_processes_and_stop_early():
    src = ("import os\n"
           "print(sorted(os.listdir('.')))\n"
           "open('state.txt', 'w').write('x')\n"
           "print(input())\n")
    seen = []
    rs = sb.run_cases(src, ["a\n", "b\n", "c\n"], on_case=lambda i, r: seen.append(i) or i < 1)
    assert [r.stdout for r in rs] == ["[]\na\n", "[]\nb\n"]   # the file of case 1 is gone in case 2
    assert seen == [0, 1]                                      # stopped after the second case


def test_large_stdin_and_output_within_the_cap():
    data = "7\n" * 1_000_000
    r = sb.run_program("import sys\nprint(sum(map(int, sys.stdin.read().split())))\nprint('y' * 500000)\n",
                       stdin=data)
    assert r.status == "ok" and r.stdout.splitlines()[0] == "7000000" and not r.stdout_truncated


def test_common_program_idioms_work():
    deep = ("import sys, threading\n"
            "sys.setrecursionlimit(1 << 20)\n"
            "threading.stack_size(1 << 27)\n"
            "def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\n"
            "t = threading.Thread(target=lambda: print(f(100000)))\nt.start()\nt.join()\n")
    assert sb.run_program(deep).stdout == "100000\n"   # the competitive-programming deep-recursion trick
    assert sb.run_program("print(open(0).read().split())", stdin="a b").stdout == "['a', 'b']\n"
    assert sb.run_program("import sys\nprint(sys.stdin.buffer.read())", stdin="a b").stdout == "b'a b'\n"
    pool = ("import multiprocessing as mp\n"
            "def sq(x):\n    return x * x\n"
            "if __name__ == '__main__':\n    with mp.Pool(2) as p:\n        print(p.map(sq, range(4)))\n")
    assert sb.run_program(pool).stdout == "[0, 1, 4, 9]\n"
    assert sb.run_program("import subprocess\nprint(subprocess.run(['echo', 'hi'], capture_output=True).stdout)"
                          ).stdout == "b'hi\\n'\n"


def test_run_many_keeps_order_and_overlaps():
    t0 = time.monotonic()
    out = sb.run_many([{"source": f"import time\ntime.sleep(0.5)\nprint({i})"} for i in range(6)], workers=6)
    assert [r.stdout for r in out] == [f"{i}\n" for i in range(6)]
    assert time.monotonic() - t0 < 6 * 0.5   # not serial


def test_status_classification():
    assert sb.run_program("raise SystemExit(3)").status == "runtime_error"
    assert sb.run_program("raise SystemExit(0)").status == "ok"
    r = sb.run_program("1/0")
    assert r.status == "runtime_error" and r.exit_code == 1 and "ZeroDivisionError" in r.stderr
    assert "runner.py" not in r.stderr and "scoring" not in r.stderr   # the traceback shows the program's frames only
    assert sb.run_program("x = (").status == "runtime_error"


# ------------------------------------------------------------------------------------------- hostile corpus

@pytest.mark.slow
@full
def test_fork_bomb_is_stopped_and_host_process_count_recovers():
    tag, bomb = _tagged("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    t0 = time.monotonic()
    # case 1 is the bomb; case 2, in the same namespace right after it, can still fork normally
    r, after = sb.run_cases("import sys\nexec(sys.stdin.read())\n",
                            [bomb, "import subprocess\nprint(subprocess.run(['true']).returncode)\n"], timeout_s=2.0)
    assert r.status == "time_limit"
    assert after.status == "ok" and after.stdout == "0\n"
    assert time.monotonic() - t0 < 2.0 + 3.0
    assert _procs_named(tag) == []   # no process of the bomb is left on the host


def test_memory_bomb_is_memory_limit():
    r = sb.run_program("a = []\nwhile True:\n    a.append(bytearray(10 ** 7))\n", memory_mb=256)
    assert r.status == "memory_limit" and "MemoryError" in r.stderr
    assert sb.run_program("x = bytearray(2 ** 40)", memory_mb=256).status == "memory_limit"


@pytest.mark.slow
def test_infinite_loop_is_time_limit_within_slack():
    t0 = time.monotonic()
    r = sb.run_program("while True:\n    pass\n", timeout_s=1.0)
    elapsed = time.monotonic() - t0
    assert r.status == "time_limit" and 1.0 <= r.wall_s < 1.0 + 0.75   # killed at the deadline
    assert elapsed < 1.0 + 3.0                                          # + sandbox start-up on a loaded machine
    r = sb.run_program("import time\ntime.sleep(60)\n", timeout_s=1.0)   # wall clock, not CPU
    assert r.status == "time_limit" and r.wall_s < 1.0 + 0.75


def test_huge_output_is_capped_and_the_run_ends():
    t0 = time.monotonic()
    r = sb.run_program("while True:\n    print('x' * 1000)\n", max_output_bytes=1 << 20, timeout_s=10.0)
    assert r.status == "output_limit" and r.stdout_truncated and len(r.stdout) == 1 << 20
    assert time.monotonic() - t0 < 5.0   # stopped by the size limit, not the clock
    # stderr beyond the cap is discarded without stopping the program (debug output is not the answer)
    r = sb.run_program("import sys\nfor _ in range(30):\n    sys.stderr.write('e' * 100000)\nprint('fine')\n",
                       max_output_bytes=1 << 20)
    assert r.stderr_truncated and len(r.stderr) == 1 << 20 and r.status == "ok" and r.stdout == "fine\n"


@full
def test_files_outside_the_sandbox_are_untouched(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    canary = outside / "canary.txt"
    canary.write_text("precious")
    src = (f"import os, shutil\n"
           f"for f in (lambda: os.remove({str(canary)!r}), lambda: shutil.rmtree({str(outside)!r}),\n"
           f"          lambda: open({str(outside / 'pwned.txt')!r}, 'w').write('x'),\n"
           f"          lambda: open('/usr/pwned.txt', 'w').write('x')):\n"
           f"    try:\n"
           f"        f(); print('did it')\n"
           f"    except OSError as e:\n"
           f"        print(type(e).__name__)\n")
    r = sb.run_program(src)
    assert r.status == "ok" and "did it" not in r.stdout
    assert canary.read_text() == "precious"
    assert sorted(p.name for p in outside.iterdir()) == ["canary.txt"]
    assert not Path("/usr/pwned.txt").exists()


@full
def test_writes_to_tmp_stay_in_the_sandbox():
    name = f"/tmp/ts-sandbox-{uuid.uuid4().hex}"
    r = sb.run_program(f"open({name!r}, 'w').write('hi')\nprint(open({name!r}).read())\n")
    assert r.status == "ok" and r.stdout == "hi\n"
    assert not os.path.exists(name)


@full
def test_no_network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    try:
        r = sb.run_program(f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
                           f"print('connected')\n")
        assert r.status == "runtime_error" and "connected" not in r.stdout
        assert "Network is unreachable" in r.stderr or "Connection refused" in r.stderr
        server.settimeout(0.2)
        with pytest.raises(socket.timeout):
            server.accept()   # nothing reached the listener
    finally:
        server.close()


@full
def test_killing_the_parent_or_everything_leaves_the_grader_alive():
    r = sb.run_program("import os\nos.kill(os.getppid(), 9)\n")
    assert r.status == "runtime_error" and "PermissionError" in r.stderr
    r = sb.run_program("import os, time\n"
                       "if os.fork() == 0:\n    time.sleep(30)\n"
                       "os.kill(-1, 9)\nprint('still here')\n")
    assert r.status == "ok" and r.stdout == "still here\n"   # kill(-1) reached only its own child
    assert sb.run_program("print(1)").stdout == "1\n"        # the grader (this process) is fine


@full
@pytest.mark.slow   # over 1.5 s of sandboxed processes or a subprocess
def test_detached_grandchild_is_killed(tmp_path):
    tag, daemon = _tagged("import os, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    if os.fork() == 0:\n"
              "        time.sleep(0.7)\n"
              "        open('/tmp/late.txt', 'w').write('alive')\n"
              "        os._exit(0)\n"
              "    os._exit(0)\n"
              "print('parent done')\n")
    check = "import os, time\ntime.sleep(1.5)\nprint(os.path.exists('/tmp/late.txt'))\n"
    # case 1 leaves a daemon behind; case 2 (same namespace) waits past the daemon's write and looks for it
    r1, r2 = sb.run_cases("import sys\nexec(sys.stdin.read())\n", [daemon, check])
    assert r1.stdout == "parent done\n" and r2.stdout == "False\n"
    assert _procs_named(tag) == []
    # the grader stopping a call early (first failing test) kills the namespace: runner, case, daemons
    t0 = time.monotonic()
    rs = sb.run_cases("import sys\nexec(sys.stdin.read())\n", [daemon, "import time\ntime.sleep(30)\n"],
                      on_case=lambda i, r: False)
    assert len(rs) == 1 and time.monotonic() - t0 < 5
    assert _procs_named(tag) == []


@full
def test_grader_death_takes_its_sandboxes_along():
    import signal
    import subprocess
    import sys
    tag, sleeper = _tagged("import time\ntime.sleep(60)\n")
    grader = subprocess.Popen([sys.executable, "-c",
                               "from scoring import sandbox as sb\n"
                               "print('started', flush=True)\n"
                               f"sb.run_program({sleeper!r}, timeout_s=60)\n"],
                              cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, text=True)
    assert grader.stdout.readline() == "started\n"
    deadline = time.monotonic() + 20
    while not _procs_named(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_named(tag), "the sandboxed program never started"
    grader.send_signal(signal.SIGKILL)
    grader.wait()
    deadline = time.monotonic() + 5
    while _procs_named(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _procs_named(tag) == []


def test_segfault_is_runtime_error():
    r = sb.run_program("import ctypes\nctypes.string_at(0)\n")
    assert r.status == "runtime_error" and r.signal == 11


def test_faking_a_pass_does_not_pass():
    tests = [{"input": "2 3\n", "output": "5\n"}]
    forged_exit = "import os\n_real = os._exit\nos._exit = lambda code: _real(0)\nraise ValueError('boom')\n"
    for src in ("print('PASS')\nimport sys\nsys.exit(0)\n", forged_exit, "import os\nos._exit(0)\n",
                "import builtins\nbuiltins.print = lambda *a, **k: None\nprint(5)\n"):
        assert not grade_code(src, tests, kind="stdin", prelude="").correct, src
    ftests = [{"input": "2\n3", "output": "5"}]
    for src in ("import sys\nsys.exit(0)\n",                                   # exits while loading
                "def add(a, b):\n    raise SystemExit(0)\n",                  # exits inside the call
                "import json\njson.dumps = lambda *a, **k: '\"PASS\"'\ndef add(a, b):\n    return 0\n",
                "import builtins\nbuiltins.__import__ = None\ndef add(a, b):\n    return 0\n",
                "import os\nos.write(3, b'\"PASS\"')\nos._exit(0)\n"):      # writes a "result" itself, then quits
        v = grade_code(src, ftests, kind="functional", fn_name="add")
        assert not v.correct and v.verdict != "pass", (src, v)
    assert grade_code("def add(a, b):\n    return a + b\n", ftests, kind="functional", fn_name="add").correct


# ------------------------------------------------------------------------------------------- channels between samples
# Kernel state a sample could leave for a later one, or take from a concurrent one (in GRPO: its siblings' rewards).

_MACHINE = os.uname().machine
# system call numbers: x86_64 (arch/x86/entry/syscalls/syscall_64.tbl) and aarch64 (asm-generic/unistd.h)
_NR = {"add_key": (248, 217), "keyctl": (250, 219), "memfd_create": (319, 279), "io_uring_setup": (425, 425),
       "unshare": (272, 97), "userfaultfd": (323, 282), "bpf": (321, 280), "perf_event_open": (298, 241),
       "setns": (308, 268), "ptrace": (101, 117), "process_vm_readv": (310, 270), "clone3": (435, 435)}
known_arch = pytest.mark.skipif(_MACHINE not in ("x86_64", "aarch64"), reason=f"syscall numbers of {_MACHINE}")


def _nr(name: str) -> int:
    return _NR[name][_MACHINE == "aarch64"]


# ``sys_call(nr, *args) -> (return value, errno)``: the raw system call, as a program would make it with ctypes
_SYSCALL = ("import ctypes, os\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "libc.syscall.restype = ctypes.c_long\n"
            "def sys_call(nr, *args):\n"
            "    ctypes.set_errno(0)\n"
            "    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])\n"
            "    return r, ctypes.get_errno()\n")


@full
@known_arch
def test_a_sample_cannot_leave_answers_in_the_kernel_keyring_for_a_later_one():
    """The attack: a correct sample stores its answer in the user keyring (``add_key``), a later sample that
    computes nothing finds it there (``keyctl`` SEARCH, READ) and passes. The keyring of a uid outlives the call."""
    secret = "ts-answer-" + uuid.uuid4().hex
    store = _SYSCALL + (f"s = {secret.encode()!r}\n"   # KEY_SPEC_USER_KEYRING = -4
                        f"print(*sys_call({_nr('add_key')}, b'user', b'ts-answer', s, len(s), -4))\n")
    read = _SYSCALL + (f"key, err = sys_call({_nr('keyctl')}, 10, -4, b'user', b'ts-answer', 0)\n"   # KEYCTL_SEARCH
                       "buf = ctypes.create_string_buffer(4096)\n"
                       f"n, _ = sys_call({_nr('keyctl')}, 11, key, buf, 4096)\n"   # KEYCTL_READ
                       "print(buf.raw[:max(n, 0)].decode(errors='replace'))\n")
    first = sb.run_program(store)
    assert first.status == "ok" and first.stdout.split() == ["-1", str(errno.EPERM)]   # nothing stored
    second = sb.run_program(read)
    assert second.status == "ok" and secret not in second.stdout


@full
@pytest.mark.slow   # over 1.5 s of sandboxed processes or a subprocess
def test_a_sample_holding_its_process_slots_does_not_starve_concurrent_ones():
    """RLIMIT_NPROC counts a uid's processes and threads machine-wide: with one uid for every call, a sample holding
    as many threads as it may made two concurrently graded correct programs fail ("can't start new thread")."""
    hog = ("import os, time\n"   # processes: threads would run into RLIMIT_AS first (a malloc arena each)
           "n = 0\n"
           "try:\n"
           "    while n < 10000:\n"
           "        if os.fork() == 0:\n"
           "            time.sleep(3.0)\n"
           "            os._exit(0)\n"
           "        n += 1\n"
           "except OSError:\n"
           "    pass\n"
           "print(n, flush=True)\n"
           "time.sleep(3.0)\n")
    fair = ("import threading, time\n"
            "time.sleep(1.0)\n"   # the hog has taken its threads by then
            "ts = [threading.Thread(target=time.sleep, args=(0.2,)) for _ in range(8)]\n"
            "for t in ts:\n    t.start()\n"
            "for t in ts:\n    t.join()\n"
            "print(len(ts))\n")
    hogged, *others = sb.run_many([{"source": hog, "timeout_s": 8.0}] + [{"source": fair, "timeout_s": 8.0}] * 2,
                                  workers=3)
    assert hogged.status == "ok" and 0 < int(hogged.stdout) < 10000   # it took every slot it was given
    assert [(r.status, r.stdout) for r in others] == [("ok", "8\n")] * 2, [r.stderr[-300:] for r in others]


# (name, arguments that succeed, or fail with another errno, where the call is allowed; the errno in the sandbox)
_DENIED = [("memfd_create", (b"x", 0), errno.EPERM),
           ("io_uring_setup", (1, "ctypes.create_string_buffer(120)"), errno.EPERM),
           ("unshare", (0,), errno.EPERM),                       # 0: a no-op where allowed
           ("userfaultfd", (1,), errno.EPERM),                   # UFFD_USER_MODE_ONLY: allowed unprivileged
           ("bpf", (9999, None, 0), errno.EPERM),                # an unknown command: EINVAL where allowed
           ("perf_event_open", (None, 0, -1, -1, 0), errno.EPERM),   # EFAULT where allowed
           ("keyctl", (0, -4, 0), errno.EPERM),                  # KEYCTL_GET_KEYRING_ID of the user keyring
           ("setns", (-1, 0), errno.EPERM),                      # EBADF where allowed
           ("ptrace", (0, 0, 0, 0), errno.EPERM),                # PTRACE_TRACEME
           ("process_vm_readv", ("os.getpid()", None, 0, None, 0, 0), errno.EPERM),
           ("clone3", (None, 0), errno.ENOSYS)]                  # glibc then falls back to clone (flags checked)


@full
@known_arch
@pytest.mark.parametrize("name, args, err", _DENIED, ids=[d[0] for d in _DENIED])
def test_system_calls_a_test_program_has_no_use_for_are_denied(name, args, err):
    """Kernel interfaces that hold state beyond the call (keyrings, io_uring, userfaultfd), reach other processes
    (ptrace, process_vm_readv) or reshape the jail (unshare, setns), and memfd files, which sit outside RLIMIT_AS."""
    text = ", ".join(a if isinstance(a, str) else repr(a) for a in args)
    r = sb.run_program(_SYSCALL + f"print(*sys_call({_nr(name)}, {text}))\n")
    assert r.status == "ok" and r.stdout.split() == ["-1", str(err)], (r.stdout, r.stderr[-500:])


@full
def test_x32_system_calls_and_new_namespaces_by_clone_are_denied():
    if _MACHINE != "x86_64":
        pytest.skip("x32 is an x86_64 ABI")
    x32_getpid = 0x40000000 | 39
    clone = (_SYSCALL + f"print(*sys_call({x32_getpid}))\n"
             "r, e = sys_call(56, 0x10000000 | 17, 0, 0, 0, 0)\n"   # clone(CLONE_NEWUSER | SIGCHLD)
             "if r == 0:\n    os._exit(0)\n"
             "print(r, e)\n")
    r = sb.run_program(clone)
    assert r.status == "ok" and r.stdout.split() == ["-1", str(errno.EPERM)] * 2, (r.stdout, r.stderr[-500:])


def test_the_filter_tables_match_the_kernel_headers_and_fail_closed_elsewhere(monkeypatch):
    """Every denied call has a number on both machines, the numbers are the kernel's (its uapi headers, where this
    machine has them), and a machine or a 32-bit interpreter without a table gets no filter, so no program runs."""
    from scoring.sandbox import syscall_filter as sf
    headers = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
               "aarch64": Path("/usr/include/asm-generic/unistd.h")}
    for machine, (_, table) in sf.TABLES.items():
        assert set(sf.DENIED) | {"clone", "clone3"} == set(table)
        assert len(set(table.values())) == len(table)
        if headers[machine].is_file():
            text = headers[machine].read_text()
            assert {name: int(re.search(rf"#define __NR_{name}\s+(\d+)", text)[1]) for name in table} == table
        assert len(sf.program(machine)) % 8 == 0
    with pytest.raises(ValueError, match="no system call table for riscv64"):
        sf.program("riscv64")
    with pytest.raises(ValueError, match="32-bit pointers"):
        sf.program("x86_64", pointer_bytes=4)
    monkeypatch.setattr(sf, "TABLES", {})   # this machine unknown: no call runs
    monkeypatch.setattr(host, "_FILTER", None)
    with pytest.raises(sb.SandboxError, match=f"no system call table for {_MACHINE}"):
        sb.run_program("print(1)")


def test_what_a_test_program_uses_still_works_under_the_filter():
    """Threads, a fork-context multiprocessing pool and queue, subprocesses, numpy."""
    src = ("import multiprocessing as mp, subprocess, threading, numpy\n"
           "def sq(x):\n    return x * x\n"
           "if __name__ == '__main__':\n"
           "    out = []\n"
           "    ts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]\n"
           "    [t.start() for t in ts]\n    [t.join() for t in ts]\n"
           "    ctx = mp.get_context('fork')\n"
           "    with ctx.Pool(2) as p:\n        squares = p.map(sq, range(5))\n"
           "    q = ctx.Queue()\n    w = ctx.Process(target=q.put, args=(7,))\n    w.start()\n    got = q.get()\n"
           "    w.join()\n"
           "    print(sorted(out) == list(range(8)), squares, got, subprocess.run(['true']).returncode,\n"
           "          int(numpy.arange(4).sum()))\n")
    [r] = sb.run_cases(src, [""], packages=("numpy",), timeout_s=20.0)
    assert r.status == "ok" and r.stdout == "True [0, 1, 4, 9, 16] 7 0 6\n", r.stderr[-1000:]


# ------------------------------------------------------------------------------------------- infrastructure

def test_infrastructure_failures_raise(monkeypatch):
    monkeypatch.setattr(host, "CHILD", "/nonexistent/runner.py")
    with pytest.raises(sb.SandboxError, match="without reporting"):
        sb.run_program("print(1)")


@full
def test_a_broken_jail_raises_instead_of_scoring(monkeypatch):
    bad = dict(host._JAIL, ro_dirs=host._JAIL["ro_dirs"] + ["/nonexistent-dir-for-the-jail"])
    monkeypatch.setattr(host, "_JAIL", bad)
    with pytest.raises(sb.SandboxError, match="sandbox setup failed"):
        sb.run_program("print(1)")


def test_without_full_isolation_it_refuses_unless_the_user_allows_it(monkeypatch):
    """Fail closed: a machine without namespaces (here: the probe's verdict replaced) runs no program unless the user
    said --allow-unisolated (the environment switch the commands set); then it runs, with a warning."""
    monkeypatch.setattr(host, "_ISOLATION", dataclasses.replace(ISO, namespaces=False, reason="test: no unshare"))
    monkeypatch.delenv(sb.ALLOW_UNISOLATED_ENV, raising=False)
    with pytest.raises(sb.SandboxError, match="test: no unshare.*--allow-unisolated") as e:
        sb.run_program("print(1)")
    assert "\n" not in str(e.value)   # the one line a command prints
    with pytest.raises(sb.SandboxError, match="--allow-unisolated"):
        sb.check_isolation()   # what the commands call before any model loads
    monkeypatch.setenv(sb.ALLOW_UNISOLATED_ENV, "1")
    with pytest.warns(RuntimeWarning, match="NOT fully isolated"):
        r = sb.run_program("print(1)")
    assert r.status == "ok" and r.stdout == "1\n" and not r.isolated
    with pytest.raises(sb.SandboxError, match="--allow-unisolated"):   # the old switch still refuses
        sb.run_program("print(1)", require_isolation=True)
    monkeypatch.setenv("THINKING_SEEDS_SANDBOX_REQUIRE_ISOLATION", "1")
    with pytest.raises(sb.SandboxError, match="--allow-unisolated"):
        sb.run_program("print(1)")


@pytest.mark.slow
def test_degraded_mode_still_limits_and_kills_detached_children(tmp_path):
    """No namespaces (as on a machine without unshare): rlimits, a temp working directory, a minimal
    environment, and the pids cgroup / process group to kill what the program left behind."""
    if os.geteuid() != 0:
        pytest.skip("the degraded mode is the normal mode here")
    iso = sb.Isolation(False, None, host._pids_cgroup_root(), "test: namespaces off")
    late = tmp_path / "late.txt"
    kw = dict(cases=[b""], mode="stdin", fn_name=None, prelude="", memory_mb=256, max_output_bytes=1 << 16,
              nproc=16, disk_mb=4, python_path=(), on_case=None)
    [r] = host._execute(iso, source="while True: pass", timeout_s=1.0, **kw)
    assert r.status == "time_limit" and not r.isolated
    daemon = (f"import os, time\n"
              f"if os.fork() == 0:\n    os.setsid()\n"
              f"    if os.fork() == 0:\n        time.sleep(1.0)\n        open({str(late)!r}, 'w').write('x')\n"
              f"    os._exit(0)\n"
              f"print(os.getcwd())\n")
    [r] = host._execute(iso, source=daemon, timeout_s=5.0, **kw)
    assert r.status == "ok" and r.stdout.startswith(os.path.join(tempfile.gettempdir(), "ts-sandbox-"))
    time.sleep(1.5)
    if iso.cgroup is None:
        pytest.skip("no pids cgroup here: a setsid'd grandchild escapes the process-group kill")
    assert not late.exists()   # the per-call cgroup sweep killed the setsid'd grandchild
