"""A sandbox's place on the host and the start of its top process, for the process runtimes.

A `Slot` is what the host holds for one sandbox: its id, private directory (`<base>/<owner>/<id>/`, mode
0700), cgroups, the execution server's listening socket and the top process's output pipe (`StartLog`).
`spawn` starts a `Command` as the leader of a new session holding the slot's socket; `group_members` finds
a process group's live members.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prorl_server.sandbox import cgroups
from prorl_server.sandbox.cgroups import SandboxCgroup
from prorl_server.sandbox.errors import SandboxError
from prorl_server.sandbox.private_dir import ensure_private_dir
from prorl_server.sandbox.spec import SandboxSpec
from prorl_server.tool_server.protocol import SOCKET_NAME

if TYPE_CHECKING:
    from prorl_server.sandbox.snapshot import Snapshot

LOG_TAIL = 2000  # characters of the top process's output quoted when a start fails
LOG_READ_MAX = 1 << 20  # bytes read from that output per look, at most (a flood cannot hold the host)
TOOL_PACKAGES = ("prorl_server", "ptyprocess")  # what `python -m prorl_server.tool_server` imports


def package_dir(name: str) -> Path:
    """The directory of an importable package."""
    module = __import__(name)
    return Path(module.__file__).resolve().parent


def host_python_path() -> list[str]:
    """sys.path entries the execution server needs when this Python runs it with -I -S (no site)."""
    return list(dict.fromkeys(str(package_dir(p).parent) for p in TOOL_PACKAGES))


class StartLog:
    """A pipe for a sandbox's top process's stdout and stderr, of which the host keeps the last LOG_TAIL bytes.

    `drain()` reads what is there without blocking (at most LOG_READ_MAX bytes a call). The host drains
    only while the sandbox starts; afterwards writers inside fill the pipe and block, costing the host nothing.
    """

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self._tail = bytearray()
        self._lock = threading.Lock()

    def writer_spawned(self) -> None:
        """The child has its copy of the write end: close ours, so the pipe ends when the sandbox does."""
        with self._lock:
            if self.write_fd >= 0:
                os.close(self.write_fd)
                self.write_fd = -1

    def drain(self) -> None:
        """Read what the sandbox wrote so far (bounded), keeping the tail."""
        with self._lock:
            read = 0
            while self.read_fd >= 0 and read < LOG_READ_MAX:
                try:
                    chunk = os.read(self.read_fd, 1 << 16)
                except (BlockingIOError, InterruptedError):
                    return
                if not chunk:
                    return
                read += len(chunk)
                self._tail += chunk
                del self._tail[: max(0, len(self._tail) - 4 * LOG_TAIL)]

    def text(self) -> str:
        """The end of what was read, as text (empty if nothing)."""
        self.drain()
        return self._tail.decode(errors="replace")[-LOG_TAIL:].strip()

    def close(self) -> None:
        """Close both ends (idempotent): a writer blocked on a full pipe gets EPIPE."""
        with self._lock:
            for fd in (self.read_fd, self.write_fd):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self.read_fd = self.write_fd = -1


@dataclass
class Slot:
    """A sandbox's host-side resources: id, private directory, cgroups, listening socket and output pipe.

    `listener` is the host's copy of the execution server's listening socket (bound at `socket_path`): it is
    passed into the sandbox's top process and closed here once that process has it (`spawned()`), so that
    connections are refused as soon as the sandbox is gone.
    """

    sandbox_id: str
    directory: Path
    cgroup: SandboxCgroup
    listener: socket.socket
    log: StartLog
    listen_fd: int = -1  # the listening socket's descriptor number, the same in the sandbox's top process
    fork: Snapshot | None = None  # the snapshot this sandbox is a copy-on-write fork of (None: a fresh one)

    def __post_init__(self) -> None:
        self.listen_fd = self.listener.fileno()

    @property
    def socket_path(self) -> Path:
        """Where the host connects to the execution server."""
        return self.directory / SOCKET_NAME

    def spawned(self) -> None:
        """The top process holds the listening socket and the pipe's write end: drop the host's copies."""
        self.listener.close()
        self.log.writer_spawned()

    def discard(self) -> None:
        """Remove the cgroups (emptied), close the socket and pipe, remove the private directory."""
        self.cgroup.kill()
        self.cgroup.remove()
        self.listener.close()
        self.log.close()
        shutil.rmtree(self.directory, ignore_errors=True)


MAX_SOCKET_PATH = 107
"""Bytes of a Unix socket's path, at most (`sun_path` holds 108 with the final NUL)."""


def new_sandbox_id() -> str:
    """A fresh sandbox id: `sbx-` and 12 hex digits."""
    return f"sbx-{uuid.uuid4().hex[:12]}"


def check_socket_room(base_dir: Path, owner: str) -> None:
    """SandboxError, saying how long `base_dir` may be, if its sandboxes' socket paths would not fit."""
    longest = len(os.fsencode(base_dir / owner / new_sandbox_id() / SOCKET_NAME))
    if longest > MAX_SOCKET_PATH:
        raise SandboxError(
            f"the sandboxes' directory {base_dir} is too long: their Unix socket paths would have {longest} bytes, "
            f"at most {MAX_SOCKET_PATH} fit; choose one {longest - MAX_SOCKET_PATH} bytes shorter (serve: --sandbox-dir)"
        )


def new_slot(base_dir: Path, owner: str, hierarchies: list[cgroups.Hierarchy], subdirs: tuple[str, ...]) -> Slot:
    """A fresh id, `<base>/<owner>/<id>/` (mode 0700) with `subdirs`, a listening socket, unlimited cgroups."""
    sandbox_id = new_sandbox_id()
    ensure_private_dir(base_dir)
    (base_dir / owner).mkdir(mode=0o700, exist_ok=True)
    directory = base_dir / owner / sandbox_id
    directory.mkdir(mode=0o700)
    for name in subdirs:
        (directory / name).mkdir()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(directory / SOCKET_NAME))
        listener.listen(128)
        cgroup = cgroups.create(hierarchies, owner, sandbox_id)
    except BaseException:
        listener.close()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return Slot(sandbox_id, directory, cgroup, listener, StartLog())


@dataclass
class Command:
    """How to start a sandbox's top process.

    `pass_fds`: descriptors it inherits besides the listening socket; `owned_fds`: those opened for this
    start alone, closed once the process has them (or the start failed).
    """

    argv: list[str]
    env: dict[str, str]
    cwd: Path | str = "/"
    pass_fds: tuple[int, ...] = ()
    owned_fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        """Close the descriptors opened for this start (idempotent)."""
        while self.owned_fds:
            with contextlib.suppress(OSError):
                os.close(self.owned_fds.pop())


def server_args(spec: SandboxSpec, slot: Slot, workdir: str) -> list[str] | None:
    """The execution server's arguments inside a sandbox (None: the spec wants no server)."""
    return ["--listen-fd", str(slot.listen_fd), "--workdir", workdir] if spec.tools else None


def spawn(
    argv: list[str], env: dict[str, str], slot: Slot, cwd: Path | str = "/", pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen[bytes]:
    """Start `argv` as the leader of a new session with the slot's listening socket; output to its pipe."""
    try:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=slot.log.write_fd,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            pass_fds=(slot.listen_fd, *pass_fds),
        )
    except OSError as exc:
        raise SandboxError(f"cannot start {argv[0]}: {exc}") from exc


def group_members(pgid: int) -> set[int]:
    """Live (non-zombie) processes of a process group, found in /proc."""
    found = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != b"Z":
                found.add(int(name))
    return found
