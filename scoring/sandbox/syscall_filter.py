"""The system calls a test program has no use for, denied by a seccomp filter: classic BPF built here (no
libseccomp) by the grader (``host``, once per process), handed to the runner in the call's spec and installed in
each case process after the privilege drop and ``no_new_privs``, right before the program runs; every process and
thread the program starts inherits it, across ``execve`` too.

Denied with EPERM (an ordinary failure the program may handle, not a kill):

- kernel state that outlives the call or that every sample of a uid shares: the keyrings (``add_key``,
  ``request_key``, ``keyctl``: a correct sample stored its answers in the user keyring and a later sample that
  computed nothing read them), io_uring, ``userfaultfd``, ``bpf``, ``perf_event_open``;
- memory outside ``RLIMIT_AS``: ``memfd_create`` and ``memfd_secret`` (the runner makes the case's memory files
  before the fork, unfiltered);
- reaching other processes: ``ptrace``, ``process_vm_readv``/``writev``, ``pidfd_getfd``, ``kcmp``;
- reshaping the jail: ``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag, the mount calls old and new,
  ``chroot``, ``open_by_handle_at``;
- the machine's: ``kexec_*``, ``init_module``/``finit_module``/``delete_module``, ``reboot``, ``swapon``/``swapoff``,
  ``acct``, ``quotactl``, ``fanotify_init``.

``clone3`` answers ENOSYS: its flags sit in a structure a filter cannot read, and glibc then falls back to
``clone``, whose flags it can (threads, ``fork``, ``posix_spawn`` and ``vfork`` work as before). A system call
made under another ABI than the interpreter's (i386's ``int 0x80`` on x86_64) kills the process; x32 numbers
(from ``0x40000000`` on x86_64) are denied. Fail closed: a machine without a table here runs no program
(``program`` raises, and so does every sandbox call).

Pure: the tables and ``program``, standard library only.
"""

import struct

__all__ = ["DENIED", "TABLES", "program"]

DENIED = ("add_key", "request_key", "keyctl", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "userfaultfd", "bpf", "perf_event_open", "memfd_create", "memfd_secret", "ptrace", "process_vm_readv",
          "process_vm_writev", "pidfd_getfd", "kcmp", "unshare", "setns", "mount", "umount2", "pivot_root",
          "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "chroot",
          "open_by_handle_at", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
          "reboot", "swapon", "swapoff", "acct", "quotactl", "fanotify_init")
# machine (os.uname) -> (AUDIT_ARCH_*, system call numbers): x86_64 from arch/x86/entry/syscalls/syscall_64.tbl,
# aarch64 from include/uapi/asm-generic/unistd.h (io_uring and everything from 424 on are shared)
_SHARED = {"io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
           "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "clone3": 435,
           "pidfd_getfd": 438, "mount_setattr": 442, "memfd_secret": 447}
TABLES = {
    "x86_64": (0xC000003E, {**_SHARED, "clone": 56, "add_key": 248, "request_key": 249, "keyctl": 250,
                            "userfaultfd": 323, "bpf": 321, "perf_event_open": 298, "memfd_create": 319,
                            "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
                            "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
                            "chroot": 161, "open_by_handle_at": 304, "kexec_load": 246, "kexec_file_load": 320,
                            "init_module": 175, "finit_module": 313, "delete_module": 176, "reboot": 169,
                            "swapon": 167, "swapoff": 168, "acct": 163, "quotactl": 179, "fanotify_init": 300}),
    "aarch64": (0xC00000B7, {**_SHARED, "clone": 220, "add_key": 217, "request_key": 218, "keyctl": 219,
                             "userfaultfd": 282, "bpf": 280, "perf_event_open": 241, "memfd_create": 279,
                             "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
                             "unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "pivot_root": 41,
                             "chroot": 51, "open_by_handle_at": 265, "kexec_load": 104, "kexec_file_load": 294,
                             "init_module": 105, "finit_module": 273, "delete_module": 106, "reboot": 142,
                             "swapon": 224, "swapoff": 225, "acct": 89, "quotactl": 60, "fanotify_init": 262}),
}
X32_SYSCALL_BIT = 0x40000000
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
CLONE_NEW_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
EPERM, ENOSYS = 1, 38

# linux/filter.h, linux/seccomp.h; struct seccomp_data: int nr at 0, __u32 arch at 4, __u64 args[6] from 16
LD_ABS_W, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000


def program(machine: str, *, pointer_bytes: int = 8) -> bytes:
    """The filter for ``machine`` (``os.uname().machine``) as ``struct sock_filter[]`` bytes (what the runner hands
    to ``prctl(PR_SET_SECCOMP)``); a ValueError for a machine (or a 32-bit interpreter) without a table here."""
    if machine not in TABLES or pointer_bytes != 8:
        raise ValueError(f"no system call table for {machine} with {8 * pointer_bytes}-bit pointers: the sandbox "
                         f"does not run programs without its seccomp filter (scoring/sandbox/syscall_filter.py)")
    arch, nr = TABLES[machine]
    # (code, jump-if-true label, jump-if-false label, k); a label is an instruction index or a name below
    code = [(LD_ABS_W, 0, 0, 4),
            (JEQ, 1, 0, arch), (RET, 0, 0, RET_KILL_PROCESS),   # another ABI: its numbers mean other calls
            (LD_ABS_W, 0, 0, 0)]
    if machine == "x86_64":
        code.append((JGE, "deny", 0, X32_SYSCALL_BIT))
    code += [(JEQ, "deny", 0, nr[name]) for name in DENIED]
    code += [(JEQ, "enosys", 0, nr["clone3"]),
             (JEQ, 0, "allow", nr["clone"]),
             (LD_ABS_W, 0, 0, 16),   # clone's flags: args[0], its low half (little-endian), where CLONE_NEW* are
             (JSET, "deny", 0, CLONE_NEW_FLAGS)]
    labels = {"allow": len(code), "deny": len(code) + 1, "enosys": len(code) + 2}
    code += [(RET, 0, 0, RET_ALLOW), (RET, 0, 0, RET_ERRNO | EPERM), (RET, 0, 0, RET_ERRNO | ENOSYS)]
    out = []
    for i, (op, jt, jf, k) in enumerate(code):
        jt, jf = (labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        assert 0 <= jt < 256 and 0 <= jf < 256, "a BPF jump reaches at most 255 instructions ahead"
        out.append(struct.pack("=HBBI", op, jt, jf, k))
    return b"".join(out)
