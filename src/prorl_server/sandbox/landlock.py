"""Landlock network guard for sandboxes that share the host network (network modes `host` and `loopback`).

Such a sandbox could connect to the rollout server's own HTTP API and to the LLM backends. Landlock (ABI 4,
Linux 6.7) forbids it unprivileged, from inside: a ruleset handling TCP connect allows every port except the
denied ones (bind is not handled: a sandbox may serve on any port). With ABI 6 (Linux 6.12) it also scopes
abstract Unix sockets and signals to the sandbox: no connecting to host processes' abstract sockets, no
signalling processes outside.

TCP rules are per port, so the ruleset has about 65,536 rules (about 0.1 s to build from Python): it is built
once on the host (`RulesetCache`) and its fd passed into each sandbox, whose first process runs
`RESTRICT_SOURCE` (`restrict_self`). Enforcing copies the rules into the sandbox's own domain: about 25 ms and
4.6 MB of kernel memory (charged to the sandbox's memory cgroup) per sandbox. Whoever holds a ruleset fd can add rules to it, for every later sandbox:
the fd must be closed (as `restrict_self` does) before anything untrusted runs, and never given to a sandbox
that does not restrict itself with it.

Landlock does not see everything: MPTCP and SMC sockets (which fall back to plain TCP) and the implicit
connect of `sendto(MSG_FASTOPEN)` get through; the seccomp filter (seccomp.py) refuses those.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import threading
from typing import Any

# System call numbers: since Linux 5.1 a new system call has the same number on every architecture (alpha and
# mips add an offset), so the same on x86_64 and aarch64.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_UNIFIED_ARCHES = ("x86_64", "aarch64", "riscv64", "ppc64le", "s390x")

_CREATE_RULESET_VERSION = 1 << 0
_RULE_NET_PORT = 2
_ACCESS_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
_SCOPE_SIGNAL = 1 << 1

NET_ABI = 4  # TCP bind/connect rules (Linux 6.7)
SCOPE_ABI = 6  # abstract Unix socket and signal scoping (Linux 6.12)
PORTS = 65536


def _probe() -> tuple[int, str | None]:
    """(Landlock ABI version, why it is 0)."""
    if platform.system() != "Linux" or platform.machine() not in _UNIFIED_ARCHES:
        return 0, f"Landlock system call numbers unknown on {platform.system()} {platform.machine()}"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as e:
        return 0, f"cannot load the C library: {e}"
    abi = libc.syscall(_SYS_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    if abi > 0:
        return abi, None
    err = ctypes.get_errno()
    why = {
        errno.ENOSYS: "not built into the kernel (CONFIG_SECURITY_LANDLOCK) or kernel older than 5.13",
        errno.EOPNOTSUPP: "built but not enabled at boot (add landlock to the lsm= kernel parameter)",
    }.get(err, f"landlock_create_ruleset failed: {os.strerror(err)}")
    return 0, f"Landlock is unavailable on kernel {platform.release()}: {why}"


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 when unavailable. Never raises."""
    return _probe()[0]


def unavailable_reason() -> str | None:
    """None if Landlock TCP rules work here (ABI >= 4), else why not (with the kernel version).

    Abstract Unix socket and signal scoping need `abi_version() >= SCOPE_ABI` besides.
    """
    return _net_unavailable(*_probe())


def _net_unavailable(abi: int, why: str | None) -> str | None:
    if why is None and abi < NET_ABI:
        why = f"Landlock ABI {abi} on kernel {platform.release()} has no TCP rules (ABI {NET_ABI}, Linux 6.7)"
    return why


def build_ruleset(denied_ports: frozenset[int]) -> int:
    """A Landlock ruleset fd (close-on-exec, owned by the caller) that allows TCP connect to every port but
    `denied_ports`, and with ABI >= 6 scopes abstract Unix sockets and signals. OSError when unavailable."""
    if bad := sorted(p for p in denied_ports if not 0 <= p < PORTS):
        raise ValueError(f"not TCP ports: {bad}")
    abi, why = _probe()
    if (why := _net_unavailable(abi, why)) is not None:
        raise OSError(errno.EOPNOTSUPP, why)
    libc = ctypes.CDLL(None, use_errno=True)
    # struct landlock_ruleset_attr {u64 handled_access_fs, handled_access_net, scoped}: ABI 6 added `scoped`;
    # an older kernel refuses a larger size with non-zero fields, so pass only the fields it knows.
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL
    attr = (ctypes.c_uint64 * 3)(0, _ACCESS_NET_CONNECT_TCP, scoped)
    size = 24 if abi >= SCOPE_ABI else 16
    fd = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"landlock_create_ruleset: {os.strerror(e)}")
    try:
        # struct landlock_net_port_attr {u64 allowed_access, port} (packed): one buffer, rewritten per port
        rule = (ctypes.c_uint64 * 2)(_ACCESS_NET_CONNECT_TCP, 0)
        ref, add_rule = ctypes.byref(rule), libc.syscall
        for port in range(PORTS):
            if port in denied_ports:
                continue
            rule[1] = port
            if add_rule(_SYS_ADD_RULE, fd, _RULE_NET_PORT, ref, 0):
                e = ctypes.get_errno()
                raise OSError(e, f"landlock_add_rule (port {port}): {os.strerror(e)}")
    except BaseException:
        os.close(fd)
        raise
    return fd


class RulesetCache:
    """Ruleset fds built once per distinct set of denied ports (there are few); thread-safe.

    The fds stay open until `close()`: call it only when no sandbox is starting.
    """

    def __init__(self) -> None:
        self._fds: dict[frozenset[int], int] = {}
        self._lock = threading.Lock()

    def fd_for(self, denied_ports: frozenset[int]) -> int:
        """The ruleset fd for `denied_ports` (built on first use; owned by the cache). OSError as build_ruleset."""
        with self._lock:
            fd = self._fds.get(denied_ports)
            if fd is None:
                fd = self._fds[denied_ports] = build_ruleset(denied_ports)
            return fd

    def close(self) -> None:
        """Close every fd."""
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)


# Runs in a sandbox's first process (standard library only, any Python 3): defines `_landlock(fd)`, which
# sets no_new_privs, enforces the ruleset on the calling thread (and what it starts afterwards: call it before
# starting threads) and closes the fd whatever happens.
RESTRICT_SOURCE = f"""\
def _landlock(fd):
    import ctypes, os
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(38, 1, 0, 0, 0) or libc.syscall({_SYS_RESTRICT_SELF}, fd, 0):
            e = ctypes.get_errno()
            raise OSError(e, "landlock: " + os.strerror(e))
    finally:
        os.close(fd)
"""
_namespace: dict[str, Any] = {}
exec(RESTRICT_SOURCE, _namespace)


def restrict_self(fd: int) -> None:
    """Enforce ruleset `fd` on the calling thread and close `fd` (exactly `RESTRICT_SOURCE`'s `_landlock`);
    OSError with the errno on failure. Irreversible: for a sandbox's first process, or a test's child."""
    _namespace["_landlock"](fd)
