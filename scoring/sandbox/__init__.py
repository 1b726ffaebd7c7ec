"""Run model-written programs, which are hostile by assumption, and hand back what they did as data.

The sandbox never decides whether a program is right: it returns the program's output (stdin mode) or the JSON
value a named function returned (function mode), and ``scoring.code`` compares them with the gold.

Isolation, per sandbox call (one call runs one program on one or more test cases)::

    grader (this process)
      └── unshare --net --pid --mount --ipc --uts --fork --kill-child      new namespaces, no network
            └── runner (scoring/sandbox/runner.py): ``python -I -S -B``, PID 1 of the new PID namespace, root
                  builds a jail: a tmpfs over /tmp holding read-only binds of /usr and the standard library,
                  /dev/null|zero|urandom|random and /etc/ld.so.cache, nothing else of the host (no /work, /home,
                  /root, no data files, no /proc); tmpfs mounts as working directory (/sandbox), /tmp and
                  /dev/shm; chroot into it
                  └── one fresh fork per test case (emptied /sandbox, /tmp, /dev/shm): setgroups([]), uid 65534,
                        no_new_privs, rlimits CPU/AS/FSIZE/NOFILE/NPROC/CORE, an environment of PATH, LANG,
                        LC_ALL, HOME, TMPDIR only; runs the program in-process as ``__main__``

- A fresh interpreter per call, never ``exec`` in the grader; every case of the call is a fork of the runner
  taken before any program code ran (so no state leaks between cases), which costs ~1 ms instead of a new
  interpreter's ~10-20 ms. An optional ``prelude`` (trusted code from the grader, e.g. LiveCodeBench's import
  block) runs once in the runner and each case starts from a copy of the names it defined.
- Wall-clock time limit per case: the runner kills every process of the namespace (``kill(-1)`` from PID 1)
  at the deadline and after every case, so detached grandchildren (double fork + setsid) never outlive a case.
  If the grader kills the whole call (a watchdog, or it stops at the first failing case), unshare dies, the
  runner gets SIGKILL from ``--kill-child`` (it stays root, so that parent-death signal is never cleared), and
  the kernel kills the rest of the namespace.
- Fork bombs: ``RLIMIT_NPROC`` stops them; it is enforced because programs are not root. It counts every
  uid-65534 process and thread on the machine, so it is set to ``nproc`` (default 32) plus the number of calls
  this grader process has in flight (each holds one uid-65534 case process): a program may start ~``nproc``
  threads or processes however many calls run at once (another grader process on the same machine still shares
  the count). The time limit ends them. Memory is limited per process (``RLIMIT_AS``), so a
  fork bomb that also allocates is bounded by ``nproc * memory_mb``, not by ``memory_mb``: a per-call memory
  cgroup would bound the total, but attaching a process to a cgroup waits for an RCU grace period (measured
  ~10-12 ms per call here, doubling the overhead), so cgroups are only the fallback below.
  Without a PID namespace, a per-call pids cgroup (v1 ``pids`` or v2, ``pids.max = nproc + 2``) caps the call
  and is how the grader finds and kills what the program left behind.
- Output: stdout and the function result go to memory files capped by ``RLIMIT_FSIZE`` at
  ``max_output_bytes + 1``: a program printing forever is stopped at once (Python gets EFBIG, other programs
  SIGXFSZ) and the status is ``output_limit``. stderr is a pipe the runner drains while the case runs: the first
  ``max_output_bytes`` are kept, the rest discarded (``stderr_truncated``), and the program goes on.
- The runner is trusted and reports over a pipe the program never holds; the program's own result channel (fd 3
  in function mode) carries only data, which the grader parses as JSON and compares itself.
- Infrastructure failures (cannot spawn, the runner reports a setup failure or dies without reporting) raise
  ``SandboxError``; they are never scored (``eval.run`` records them as ``grader_error``). Only the runner, which
  the program never reaches, can produce one: whatever a program does inside its case is a verdict about it.
- Harnesses (``run_harness``): a case process may instead run a reference grader's harness around the program,
  all of a problem's tests in that one process (lcb_runner's ``lcb_stdin``/``lcb_call``, EvalPlus's
  ``evalplus``; ``harness_lcb.py``, ``harness_evalplus.py``), writing one JSON record per test to fd 3. The
  records are the program's data (it shares the process and could write them itself), checked by the grader,
  never a verdict.
- Test modes (``mode="checks"`` / ``"assert"``, ``epilogue.py``): the program, then its tests (calls whose values
  go back as data, or hardened test code), then a completion token the case process draws after the fork and a
  trusted epilogue writes after the last test. A run without the token failed, whatever its exit status
  (``RunResult.completed``); ``SystemExit`` is a failure and the program's hooks are never called. The assertion
  graders (``scoring.code.grade_assert_script``, ``scoring.asserts``) use them.
- Packages: ``packages=("numpy",)`` shows an installed package to programs, read-only in the jail (only its own
  folder and a wheel's ``<name>.libs``); ``preimport`` imports it once in the runner before the cases fork.

What is available is probed once per process (``isolation()``). Without root or without ``unshare`` the sandbox
warns once (``RuntimeWarning``), sets ``RunResult.isolated = False`` and still applies everything else it can
(rlimits, a temporary working directory, a minimal environment, uid 65534 when root and the standard library is
readable by it, the pids cgroup when writable). ``THINKING_SEEDS_SANDBOX_REQUIRE_ISOLATION=1`` (or
``require_isolation=True``) turns that into an error.

Status of a case (``RunResult.status``): ``ok`` (exit 0), ``runtime_error`` (non-zero exit, uncaught exception,
any signal other than the ones below), ``time_limit`` (wall deadline, SIGXCPU or the hard CPU limit's SIGKILL),
``memory_limit`` (an uncaught MemoryError from RLIMIT_AS), ``output_limit`` (output over ``max_output_bytes``).

Modules (one role each):

- ``host``: the grader's side (this process): probing (``isolation``), ``run_program`` / ``run_function`` /
  ``run_cases`` / ``run_harness`` / ``run_many``, launching the runner and reading its reports.
- ``runner``: the trusted runner inside the jail (``python -I -S -B runner.py``): the jail, the case processes,
  the program run as ``__main__`` or called (function, calls modes).
- ``harness_lcb``, ``harness_evalplus`` (with ``records``, what they share): the reference graders' harnesses,
  all of a problem's tests in one case process.
- ``epilogue``: the trusted code a test mode runs after the program (token, strict comparison, tamper check).
- ``protocol``: what both sides agree on (exit codes, jail paths, the harness names, the tagged values
  ``encode_tagged`` / ``decode_tagged``), standard library only.

The runner and its harnesses are standard library only and never import this package (the runner imports its
siblings as top-level modules from this folder; ``runner.py`` says how); this ``__init__`` is the grader's
public API.
"""

from scoring.sandbox.host import (CASE_GRACE_S, DEFAULT_MAX_OUTPUT, DEFAULT_NPROC, SETUP_GRACE_S, Isolation,
                                  RunResult, SandboxError, isolation, parse_json, run_cases, run_function,
                                  run_harness, run_many, run_program)
from scoring.sandbox.protocol import HARNESS_MODES, CallException, Opaque, decode_tagged, encode_tagged

__all__ = ["CASE_GRACE_S", "DEFAULT_MAX_OUTPUT", "DEFAULT_NPROC", "SETUP_GRACE_S", "SandboxError", "Isolation",
           "RunResult", "isolation", "run_program", "run_function", "run_cases", "run_many", "run_harness",
           "HARNESS_MODES", "parse_json", "decode_tagged", "encode_tagged", "Opaque", "CallException"]
