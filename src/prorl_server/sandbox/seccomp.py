"""A seccomp-BPF deny-list for sandboxes, hand-assembled (no libseccomp).

`deny_program()` is a classic BPF program (struct sock_filter[], 8 bytes an instruction) that:

- returns EPERM for a foreign architecture (on x86_64: i386 `int 0x80`) and for x32 system calls;
- returns EPERM for each system call of `DENIED`;
- returns EPERM for `clone` with a namespace flag (a new user namespace, above all: a root server's sandboxes
  run without one, see bwrap.py) and ENOSYS for `clone3`, whose flags sit in memory a filter cannot read, so
  that the C library falls back to `clone`;
- closes the ways around Landlock's TCP port rules (see landlock.py): MPTCP and SMC sockets (TCP with extra
  features, not restricted by Landlock, and they talk to plain TCP servers) fail as if the kernel had no
  such protocol, and `sendto`/`sendmsg`/`sendmmsg` with MSG_FASTOPEN (an implicit connect that Landlock
  does not see) fail as if TCP Fast Open were disabled, so clients fall back to `connect`;
- allows everything else.

Two ways to install it: bubblewrap's `--seccomp FD` (`program_fd`), or the sandbox's first process runs
`INSTALL_SOURCE` (the same code as `install`). Either way the filter is inherited by everything the sandbox
starts and cannot be removed.
"""

from __future__ import annotations

import errno
import os
import platform
import struct
from typing import Any

# System calls a task never needs: Docker's default profile denies them to unprivileged containers (kernel
# modules, kexec, reboot, swap, clocks, accounting, kernel log, quotas, raw I/O ports, mounts and the new mount
# API, namespaces, BPF, perf, userfaultfd, the kernel keyring, file handles, obsolete calls), plus io_uring
# (its operations bypass seccomp and it is a frequent source of kernel bugs). ptrace and personality are
# allowed: debuggers inside a sandbox are legitimate and the pid namespace bounds them.
DENIED = (
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "iopl",
    "ioperm",
    "vhangup",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "open_tree_attr",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "setns",
    "unshare",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "lookup_dcookie",
    "fanotify_init",
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "vm86",
    "vm86old",
    "pciconfig_read",
    "pciconfig_write",
    "pciconfig_iobase",
)
# System calls allowed after a check of their arguments (see the module docstring).
ARG_CHECKED = ("socket", "sendto", "sendmsg", "sendmmsg", "clone")
NOT_IMPLEMENTED = ("clone3",)  # answered ENOSYS (see the module docstring)

# Per architecture: AUDIT_ARCH, and the numbers of the system calls above that exist there (vm86 and the
# pciconfig calls exist on neither; the obsolete calls not in the aarch64 generic table are skipped).
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Calls added since Linux 5.1 have one number on every architecture (include/uapi/asm-generic/unistd.h)
_SHARED = {
    "quotactl_fd": 443,
    "move_mount": 429,
    "open_tree": 428,
    "open_tree_attr": 467,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "clone3": 435,
}
_NUMBERS = {
    # arch/x86/entry/syscalls/syscall_64.tbl
    "x86_64": {
        "kexec_load": 246,
        "kexec_file_load": 320,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "reboot": 169,
        "swapon": 167,
        "swapoff": 168,
        "acct": 163,
        "syslog": 103,
        "quotactl": 179,
        "settimeofday": 164,
        "clock_settime": 227,
        "clock_adjtime": 305,
        "adjtimex": 159,
        "iopl": 172,
        "ioperm": 173,
        "vhangup": 153,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "setns": 308,
        "unshare": 272,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "open_by_handle_at": 304,
        "name_to_handle_at": 303,
        "lookup_dcookie": 212,
        "fanotify_init": 300,
        "nfsservctl": 180,
        "uselib": 134,
        "ustat": 136,
        "sysfs": 139,
        "_sysctl": 156,
        "create_module": 174,
        "get_kernel_syms": 177,
        "query_module": 178,
        "socket": 41,
        "sendto": 44,
        "sendmsg": 46,
        "sendmmsg": 307,
        "clone": 56,
        **_SHARED,
    },
    # include/uapi/asm-generic/unistd.h
    "aarch64": {
        "kexec_load": 104,
        "kexec_file_load": 294,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "reboot": 142,
        "swapon": 224,
        "swapoff": 225,
        "acct": 89,
        "syslog": 116,
        "quotactl": 60,
        "settimeofday": 170,
        "clock_settime": 112,
        "clock_adjtime": 266,
        "adjtimex": 171,
        "vhangup": 58,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "setns": 268,
        "unshare": 97,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "open_by_handle_at": 265,
        "name_to_handle_at": 264,
        "lookup_dcookie": 18,
        "fanotify_init": 262,
        "nfsservctl": 42,
        "socket": 198,
        "sendto": 206,
        "sendmsg": 211,
        "sendmmsg": 269,
        "clone": 220,
        **_SHARED,
    },
}

_X32_SYSCALL_BIT = 0x40000000
_AF_SMC = 43
_IPPROTO_SMC = 256
_IPPROTO_MPTCP = 262
_MSG_FASTOPEN = 0x20000000
# CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET
# (clone's low byte is the exit signal, so CLONE_NEWTIME, 0x80, cannot be told apart there)
_CLONE_NEW_NAMESPACES = 0x7E020000

# BPF opcodes (linux/bpf_common.h) and seccomp return values (linux/seccomp.h)
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6]
_NR, _ARCH = 0, 4


def _arg(i: int) -> int:
    """Offset of the low 32 bits of argument `i` (little-endian; int arguments are truncated to them)."""
    return 16 + 8 * i


def _assemble(lines: list[str | tuple[int, str | None, str | None, int]]) -> bytes:
    """Instructions (code, jump-if-true label, jump-if-false label, k) and label names -> sock_filter[].

    A label of None falls through; jumps go forward only, at most 255 instructions. Both supported
    architectures are little-endian.
    """
    labels: dict[str, int] = {}
    insns: list[tuple[int, str | None, str | None, int]] = []
    for line in lines:
        if isinstance(line, str):
            labels[line] = len(insns)
        else:
            insns.append(line)
    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(insns):
        offsets = [0 if label is None else labels[label] - i - 1 for label in (jt, jf)]
        if not all(0 <= offset <= 255 for offset in offsets):
            raise ValueError(f"BPF jump out of range at instruction {i}: {offsets}")
        out += struct.pack("<HBBI", code, *offsets, k)
    return bytes(out)


def deny_program(arch: str | None = None) -> bytes | None:
    """The filter for `arch` (default: this machine's, as `platform.machine()` names it); None where there is
    no table (other architectures, or a 32-bit Python whose system calls the table would not match)."""
    if arch is None:
        arch = platform.machine() if struct.calcsize("P") == 8 else ""
    numbers = _NUMBERS.get(arch)
    if numbers is None:
        return None
    lines: list[str | tuple[int, str | None, str | None, int]] = [
        (_LD_W_ABS, None, None, _ARCH),
        (_JEQ, None, "eperm", _AUDIT_ARCH[arch]),
        (_LD_W_ABS, None, None, _NR),
    ]
    if arch == "x86_64":
        lines.append((_JGE, "eperm", None, _X32_SYSCALL_BIT))
    lines += [
        (_JEQ, "socket", None, numbers["socket"]),
        (_JEQ, "flags3", None, numbers["sendto"]),
        (_JEQ, "flags3", None, numbers["sendmmsg"]),
        (_JEQ, "flags2", None, numbers["sendmsg"]),
        (_JEQ, "clone", None, numbers["clone"]),
        (_JEQ, "enosys", None, numbers["clone3"]),
    ]
    denied = [numbers[name] for name in DENIED if name in numbers]
    lines += [(_JEQ, "eperm", None, nr) for nr in denied[:-1]]
    lines += [
        (_JEQ, "eperm", "allow", denied[-1]),
        "socket",  # socket(family, type, protocol)
        (_LD_W_ABS, None, None, _arg(0)),
        (_JEQ, "eafnosupport", None, _AF_SMC),
        (_LD_W_ABS, None, None, _arg(2)),
        (_JEQ, "eprotonosupport", None, _IPPROTO_MPTCP),
        (_JEQ, "eprotonosupport", "allow", _IPPROTO_SMC),
        "flags3",  # sendto(fd, buf, len, flags, ...), sendmmsg(fd, msgvec, vlen, flags)
        (_LD_W_ABS, None, None, _arg(3)),
        (_JSET, "eopnotsupp", "allow", _MSG_FASTOPEN),
        "flags2",  # sendmsg(fd, msg, flags)
        (_LD_W_ABS, None, None, _arg(2)),
        (_JSET, "eopnotsupp", "allow", _MSG_FASTOPEN),
        "clone",  # clone(flags, ...) on both architectures
        (_LD_W_ABS, None, None, _arg(0)),
        (_JSET, "eperm", None, _CLONE_NEW_NAMESPACES),
        "allow",
        (_RET, None, None, _RET_ALLOW),
        "eperm",
        (_RET, None, None, _RET_ERRNO | errno.EPERM),
        "eafnosupport",
        (_RET, None, None, _RET_ERRNO | errno.EAFNOSUPPORT),
        "eprotonosupport",
        (_RET, None, None, _RET_ERRNO | errno.EPROTONOSUPPORT),
        "eopnotsupp",
        (_RET, None, None, _RET_ERRNO | errno.EOPNOTSUPP),
        "enosys",
        (_RET, None, None, _RET_ERRNO | errno.ENOSYS),
    ]
    return _assemble(lines)


def unavailable_reason() -> str | None:
    """None if this kernel and machine can install `deny_program()`, else why not."""
    if deny_program() is None:
        return f"no seccomp table for {platform.machine()} ({struct.calcsize('P') * 8}-bit Python)"
    try:
        with open("/proc/sys/kernel/seccomp/actions_avail") as f:
            actions = f.read().split()
    except OSError:
        return f"kernel {platform.release()} has no seccomp filters (CONFIG_SECCOMP_FILTER)"
    if "errno" not in actions or "allow" not in actions:
        return f"kernel {platform.release()} lacks the seccomp actions errno/allow (has: {' '.join(actions)})"
    return None


# Runs in a sandbox's first process (standard library only, any Python 3): defines `_seccomp(program)`.
# prctl(PR_SET_NO_NEW_PRIVS=38, 1), then prctl(PR_SET_SECCOMP=22, SECCOMP_MODE_FILTER=2, &sock_fprog).
# Only the calling thread is filtered (and what it starts afterwards): call it before starting threads.
INSTALL_SOURCE = """\
def _seccomp(program):
    import ctypes, os
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    libc = ctypes.CDLL(None, use_errno=True)
    insns = ctypes.create_string_buffer(program, len(program))
    fprog = Fprog(len(program) // 8, ctypes.addressof(insns))
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(fprog), 0, 0):
        e = ctypes.get_errno()
        raise OSError(e, "seccomp: " + os.strerror(e))
"""
_namespace: dict[str, Any] = {}
exec(INSTALL_SOURCE, _namespace)


def install(program: bytes) -> None:
    """Set no_new_privs and install `program` on the calling thread (exactly `INSTALL_SOURCE`'s `_seccomp`);
    OSError with the errno on failure. Irreversible: for a sandbox's first process, or a test's child."""
    _namespace["_seccomp"](program)


def program_fd(program: bytes) -> int:
    """A memfd holding `program`, offset 0, for bubblewrap's `--seccomp FD` (pass it with `pass_fds`).

    bubblewrap reads it to the end, and the offset is shared by every copy of the fd: use a new one for each
    bwrap. Close-on-exec in this process (`pass_fds` makes it inheritable in the child only).
    """
    fd = os.memfd_create("prorl-seccomp", os.MFD_CLOEXEC)
    try:
        view = memoryview(program)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
