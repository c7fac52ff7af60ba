"""The Landlock network guard: a child restricted with a ruleset built on the host cannot connect to a denied
TCP port (other ports, and bind on the denied one, still work), cannot reach the test's abstract Unix socket or
signal it (ABI >= 6); the same inside bubblewrap on the host network; with the seccomp filter MPTCP and TCP
Fast Open do not get around it. The child runs `RESTRICT_SOURCE` under `python -I -S`, as a sandbox
bootstrap does."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
from bwrap_probe import bwrap_reason

from prorl_server.sandbox import landlock, seccomp

REASON = landlock.unavailable_reason()
needs_landlock = pytest.mark.skipif(REASON is not None, reason=str(REASON))
SCOPED = landlock.abi_version() >= landlock.SCOPE_ABI  # abstract Unix sockets and signals
BWRAP = ["--unshare-user", "--unshare-pid", "--cap-drop", "ALL", "--die-with-parent"]
BWRAP += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"]

# argv[1]: [denied port, allowed port, abstract socket name, ruleset fd or None, pid to signal, seccomp hex]
CHILD = (
    landlock.RESTRICT_SOURCE
    + seccomp.INSTALL_SOURCE
    + r"""
import json, os, socket, sys
a, b, abstract, fd, pid, program = json.loads(sys.argv[1])
if fd is not None:
    _landlock(fd)
if program is not None:
    _seccomp(bytes.fromhex(program))
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = 0
    except OSError as e:
        out[name] = e.errno
def connect(family, address, proto=0):
    s = socket.socket(family, socket.SOCK_STREAM, proto)
    s.settimeout(5)
    s.connect(address)
    s.close()
def bind_denied():
    s = socket.socket()
    s.bind(("127.0.0.2", a))
    s.listen()
    s.close()
def fastopen():
    s = socket.socket()  # blocking: with a timeout the implicit connect is left in progress (EINPROGRESS)
    s.sendto(b"x", 0x20000000, ("127.0.0.1", a))
    s.close()
attempt("connect_denied", lambda: connect(socket.AF_INET, ("127.0.0.1", a)))
attempt("connect_denied_v6_mapped", lambda: connect(socket.AF_INET6, ("::ffff:127.0.0.1", a)))
attempt("connect_allowed", lambda: connect(socket.AF_INET, ("127.0.0.1", b)))
attempt("bind_denied", bind_denied)
attempt("abstract", lambda: connect(socket.AF_UNIX, "\0" + abstract))
attempt("signal", lambda: os.kill(pid, 0))
attempt("mptcp", lambda: connect(socket.AF_INET, ("127.0.0.1", a), 262))
attempt("fastopen", fastopen)
if fd is not None:
    attempt("fd_open", lambda: os.fstat(fd))
print(json.dumps(out))
"""
)


class Host:
    """Listeners of the test process: TCP ports `denied` and `allowed` on 127.0.0.1, an abstract Unix socket."""

    def __init__(self) -> None:
        self.sockets = [socket.create_server(("127.0.0.1", 0), backlog=64) for _ in range(2)]
        self.denied, self.allowed = (s.getsockname()[1] for s in self.sockets)
        self.abstract = f"prorl-landlock-test-{uuid.uuid4().hex}"
        unix = socket.socket(socket.AF_UNIX)
        unix.bind("\0" + self.abstract)
        unix.listen(64)
        self.sockets.append(unix)

    def run(
        self, argv: list[str], fd: int | None, pid: int, program: bytes | None = None, fds: tuple[int, ...] = ()
    ) -> dict[str, int]:
        """CHILD under `argv` (a wrapper, or nothing), restricted with ruleset `fd` (None: not), signalling `pid`,
        installing seccomp `program` itself; `fds` are passed too."""
        settings = [self.denied, self.allowed, self.abstract, fd, pid, program and program.hex()]
        fds += () if fd is None else (fd,)
        argv = [*argv, sys.executable, "-I", "-S", "-c", CHILD, json.dumps(settings)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, pass_fds=fds)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def close(self) -> None:
        for s in self.sockets:
            s.close()


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    h = Host()
    yield h
    h.close()


@pytest.fixture(scope="module")
def ruleset(host: Host) -> Iterator[int]:
    if REASON is not None:
        pytest.skip(REASON)
    cache = landlock.RulesetCache()
    yield cache.fd_for(frozenset({host.denied}))
    cache.close()


def assert_guarded(result: dict[str, int], scoped: bool) -> None:
    assert result["connect_denied"] == errno.EACCES
    assert result["connect_denied_v6_mapped"] in (errno.EACCES, errno.EAFNOSUPPORT)  # no IPv6 here
    assert result["connect_allowed"] == 0
    assert result["bind_denied"] == 0  # bind is not handled: a sandbox may serve on any port
    assert result["fd_open"] == errno.EBADF  # nothing after the bootstrap can add rules to the shared ruleset
    if scoped:
        assert result["abstract"] == errno.EPERM
        assert result["signal"] == errno.EPERM


def test_probe_never_raises_and_explains():
    abi = landlock.abi_version()
    assert isinstance(abi, int) and abi >= 0
    assert (landlock.unavailable_reason() is None) == (abi >= landlock.NET_ABI)


def test_old_abi_is_refused_with_the_kernel_version(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(landlock, "_probe", lambda: (3, None))
    reason = landlock.unavailable_reason()
    assert reason is not None and "ABI 3" in reason and os.uname().release in reason
    with pytest.raises(OSError, match="no TCP rules") as info:
        landlock.build_ruleset(frozenset({80}))
    assert info.value.errno == errno.EOPNOTSUPP
    with pytest.raises(ValueError, match="65536"):
        landlock.build_ruleset(frozenset({65536}))


def test_cache_builds_once_per_set_across_threads(monkeypatch: pytest.MonkeyPatch):
    built: list[frozenset[int]] = []

    def fake_build(denied: frozenset[int]) -> int:
        built.append(denied)
        time.sleep(0.05)
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    monkeypatch.setattr(landlock, "build_ruleset", fake_build)
    cache = landlock.RulesetCache()
    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.append(cache.fd_for(frozenset({1, 2})))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    other = cache.fd_for(frozenset({3}))
    assert len(set(got)) == 1 and len(got) == 8 and other not in got
    assert built == [frozenset({1, 2}), frozenset({3})]
    cache.close()
    for fd in (got[0], other):
        with pytest.raises(OSError):
            os.fstat(fd)


@needs_landlock
def test_unrestricted_child_reaches_everything(host: Host):
    """The control: without the ruleset the child reaches the denied port, the abstract socket, the parent."""
    result = host.run([], None, os.getpid())
    assert result["connect_denied"] == result["connect_allowed"] == 0
    assert result["abstract"] == result["signal"] == 0


@needs_landlock
def test_restricted_child(host: Host, ruleset: int):
    result = host.run([], ruleset, os.getpid())
    assert_guarded(result, scoped=SCOPED)


@needs_landlock
def test_without_scoping_only_ports_are_guarded(host: Host, monkeypatch: pytest.MonkeyPatch):
    """An ABI 4/5 ruleset (the 16-byte attribute, no `scoped`): ports guarded, abstract socket and signal not."""
    monkeypatch.setattr(landlock, "_probe", lambda: (5, None))
    fd = landlock.build_ruleset(frozenset({host.denied}))
    try:
        result = host.run([], fd, os.getpid())
    finally:
        os.close(fd)
    assert_guarded(result, scoped=False)
    assert result["abstract"] == result["signal"] == 0


@needs_landlock
def test_seccomp_closes_the_ways_around(host: Host, ruleset: int):
    """MPTCP and TCP Fast Open's implicit connect are not seen by Landlock; the seccomp filter refuses them."""
    if (reason := seccomp.unavailable_reason()) is not None:
        pytest.skip(reason)
    result = host.run([], ruleset, os.getpid(), seccomp.deny_program())
    assert_guarded(result, scoped=SCOPED)
    assert result["mptcp"] == errno.EPROTONOSUPPORT
    assert result["fastopen"] == errno.EOPNOTSUPP


@needs_landlock
def test_through_bwrap_on_the_host_network(host: Host, ruleset: int):
    """bwrap without --unshare-net; pid 1 inside is bwrap itself, outside the child's Landlock domain."""
    if (reason := bwrap_reason(*BWRAP)) is not None:
        pytest.skip(reason)
    bwrap = ["bwrap", *BWRAP, "--"]
    control = host.run(bwrap, None, 1)
    assert control["connect_denied"] == control["abstract"] == control["signal"] == 0
    assert_guarded(host.run(bwrap, ruleset, 1), scoped=SCOPED)
    if seccomp.unavailable_reason() is None:  # and with bwrap's --seccomp, as a sandbox runs
        program = seccomp.program_fd(seccomp.deny_program())
        try:
            result = host.run(["bwrap", *BWRAP, "--seccomp", str(program), "--"], ruleset, 1, fds=(program,))
        finally:
            os.close(program)
        assert_guarded(result, scoped=SCOPED)
        assert (result["mptcp"], result["fastopen"]) == (errno.EPROTONOSUPPORT, errno.EOPNOTSUPP)
