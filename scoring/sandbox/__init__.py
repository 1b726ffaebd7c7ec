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
                  └── one fresh fork per test case (emptied /sandbox, /tmp, /dev/shm): setgroups([]), the call's
                        own uid (gid 65534), no_new_privs, rlimits CPU/AS/FSIZE/NOFILE/NPROC/CORE, an environment
                        of PATH, LANG, LC_ALL, HOME, TMPDIR only, then the seccomp filter; runs the program
                        in-process as ``__main__``

- A fresh interpreter per call, never ``exec`` in the grader; every case of the call is a fork of the runner
  taken before any program code ran (so no state leaks between cases), which costs ~1 ms instead of a new
  interpreter's ~10-20 ms. An optional ``prelude`` (trusted code from the grader, e.g. LiveCodeBench's import
  block) runs once in the runner and each case starts from a copy of the names it defined.
- Wall-clock time limit per case: the runner kills every process of the namespace (``kill(-1)`` from PID 1)
  at the deadline and after every case, so detached grandchildren (double fork + setsid) never outlive a case.
  If the grader kills the whole call (a watchdog, or it stops at the first failing case), unshare dies, the
  runner gets SIGKILL from ``--kill-child`` (it stays root, so that parent-death signal is never cleared), and
  the kernel kills the rest of the namespace.
- A uid per call: the kernel keeps some limits and state per uid, machine-wide (``RLIMIT_NPROC``'s count, signal
  queues, inotify instances, POSIX message queue bytes), so each call runs its programs as a uid no other call on
  the machine has while it runs: the first free one of ``DEFAULT_UIDS`` (200000-201023;
  ``THINKING_SEEDS_SANDBOX_UIDS=FIRST-LAST`` for others), claimed with a lock file under
  ``/run/thinking-seeds-sandbox/`` (the temp folder's without /run) that every grader process shares (containers
  on one machine share its uids but not their /run: give each container a range of its own). With one
  shared uid, a sample holding its process slots made two concurrently graded correct programs fail ("can't start
  new thread"): in GRPO a rollout could lower its siblings' rewards.
- Fork bombs: ``RLIMIT_NPROC`` stops them; it is enforced because programs are not root. It counts the call's own
  processes and threads (its uid's), the case process included, so it is ``nproc`` (default 32) however many calls
  run at once. The time limit ends them. Memory is limited per process (``RLIMIT_AS``), so a
  fork bomb that also allocates is bounded by ``nproc * memory_mb``, not by ``memory_mb``: a per-call memory
  cgroup would bound the total, but attaching a process to a cgroup waits for an RCU grace period (measured
  ~10-12 ms per call here, doubling the overhead), so cgroups are only the fallback below.
  Without a PID namespace, a per-call pids cgroup (v1 ``pids`` or v2, ``pids.max = nproc + 2``) caps the call
  and is how the grader finds and kills what the program left behind.
- System calls (``syscall_filter``): a seccomp filter the grader builds, installed in the case process after the
  privilege drop and right before the program runs, denies with EPERM what a test program has no use for: the keyrings (a uid's
  keyring outlives the call: a correct sample stored its answers there and a later sample that computed nothing
  read them), io_uring, userfaultfd, bpf, perf_event_open, memfd_create (memory outside ``RLIMIT_AS``), ptrace and
  process_vm_readv/writev, unshare, setns and clone with ``CLONE_NEW*``, the mount calls, modules and kexec;
  ``clone3`` answers ENOSYS (glibc falls back to clone). A system call of another ABI kills the process; on a
  machine the filter has no table for every call raises ``SandboxError``.
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

What is available is probed once per process (``isolation()``). Fail closed: without root or without ``unshare``
(no namespaces, no jail: programs could read the grader's files, its tokens, a gold file, and signal the trainer)
every call raises ``SandboxError``, one line saying what is missing and naming ``--allow-unisolated``, unless the
user allows it: ``--allow-unisolated`` on ``eval.run`` and ``tsanalysis relay``, ``allow_unisolated=true`` in a
trainer config. Those commands and the trainer's launch checks call ``check_isolation(allow_unisolated=...)``
before any model loads (a refusal is exit 2); allowing sets ``THINKING_SEEDS_SANDBOX_ALLOW_UNISOLATED=1``, which grading workers inherit
(``require_isolation=False`` allows one call). An allowed call warns (``RuntimeWarning``), sets
``RunResult.isolated = False`` and still applies everything else it can (rlimits, the seccomp filter, a temporary
working directory, a minimal environment, the call's own uid when root and the standard library is readable by
others, the pids cgroup when writable). ``THINKING_SEEDS_SANDBOX_REQUIRE_ISOLATION=1`` (or
``require_isolation=True``) refuses even then.

Status of a case (``RunResult.status``): ``ok`` (exit 0), ``runtime_error`` (non-zero exit, uncaught exception,
any signal other than the ones below), ``time_limit`` (wall deadline, SIGXCPU or the hard CPU limit's SIGKILL),
``memory_limit`` (an uncaught MemoryError from RLIMIT_AS), ``output_limit`` (output over ``max_output_bytes``).

Modules (one role each):

- ``host``: the grader's side (this process): probing (``isolation``, ``check_isolation``), ``run_program`` /
  ``run_function`` / ``run_cases`` / ``run_harness`` / ``run_many``, claiming each call's uid, launching the runner
  and reading its reports.
- ``runner``: the trusted runner inside the jail (``python -I -S -B runner.py``): the jail, the case processes,
  the program run as ``__main__`` or called (function, calls modes).
- ``harness_lcb``, ``harness_evalplus`` (with ``records``, what they share): the reference graders' harnesses,
  all of a problem's tests in one case process.
- ``epilogue``: the trusted code a test mode runs after the program (token, strict comparison, tamper check).
- ``syscall_filter``: the case processes' seccomp filter (classic BPF, no libseccomp): the tables and the program,
  built here and installed by the runner.
- ``protocol``: what both sides agree on (exit codes, jail paths, the harness names, the tagged values
  ``encode_tagged`` / ``decode_tagged``), standard library only.

The runner and its harnesses are standard library only and never import this package (the runner imports its
siblings as top-level modules from this folder; ``runner.py`` says how); this ``__init__`` is the grader's
public API.
"""

from scoring.sandbox.host import (ALLOW_UNISOLATED_ENV, CASE_GRACE_S, DEFAULT_MAX_OUTPUT, DEFAULT_NPROC,
                                  SETUP_GRACE_S, Isolation, RunResult, SandboxError, check_isolation, isolation,
                                  parse_json, run_cases, run_function, run_harness, run_many, run_program)
from scoring.sandbox.protocol import HARNESS_MODES, CallException, Opaque, decode_tagged, encode_tagged

__all__ = ["ALLOW_UNISOLATED_ENV", "CASE_GRACE_S", "DEFAULT_MAX_OUTPUT", "DEFAULT_NPROC", "SETUP_GRACE_S",
           "SandboxError", "Isolation", "RunResult", "isolation", "check_isolation", "run_program", "run_function",
           "run_cases", "run_many", "run_harness", "HARNESS_MODES", "parse_json", "decode_tagged", "encode_tagged",
           "Opaque", "CallException"]
