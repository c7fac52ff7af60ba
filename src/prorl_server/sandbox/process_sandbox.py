"""ProcessRuntime and ProcessSandbox: sandboxes whose processes descend from one host process leading its own session.

Shared by the bubblewrap and local runtimes: private directories and cgroups (a `Slot`), spawning (own
session, scrubbed and tagged environment, cgroups joined before exec), readiness (the execution server
answers a ping), the wall-clock watchdog, and close (SIGTERM, SIGKILL after a grace period, then whatever is
left in the sandbox's cgroups or, with `sweep_tags`, carries its sandbox id). Close works from any thread
and any event loop: a sandbox started on one stage's loop may be closed on another's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import threading
import uuid
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prorl_server.sandbox import cgroups
from prorl_server.sandbox.base import Runtime, Sandbox, SandboxError
from prorl_server.sandbox.cgroups import SandboxCgroup
from prorl_server.sandbox.limits import Watchdog, join_cgroups_argv
from prorl_server.sandbox.loopback import LoopbackAllocator
from prorl_server.sandbox.process import signal_group
from prorl_server.sandbox.reaper import DEFAULT_BASE_DIR, kill_tagged
from prorl_server.sandbox.spec import SandboxSpec
from prorl_server.tools.protocol import ENV_SANDBOX_ID, SOCKET_NAME

if TYPE_CHECKING:
    from prorl_server.tools.client import ToolClient

log = logging.getLogger(__name__)

LOG_NAME = "sandbox.log"  # the top process's stdout and stderr, in the sandbox's private directory
LOG_TAIL = 2000  # characters of it quoted when a start fails
POLL_S = 0.001  # readiness poll interval per sandbox being started (so polling stays ~1000/s per runtime)
TOOL_PACKAGES = ("prorl_server", "ptyprocess")  # what `python -m prorl_server.tools` imports


def package_dir(name: str) -> Path:
    """The directory of an importable package."""
    module = __import__(name)
    return Path(module.__file__).resolve().parent


def host_python_path() -> list[str]:
    """sys.path entries the execution server needs when this Python runs it with -I -S (no site)."""
    return list(dict.fromkeys(str(package_dir(p).parent) for p in TOOL_PACKAGES))


@dataclass
class Slot:
    """A sandbox's host-side resources: its id, private directory (with `sock/`) and cgroups."""

    sandbox_id: str
    directory: Path
    cgroup: SandboxCgroup

    def discard(self) -> None:
        """Remove the cgroups (emptied) and the private directory."""
        self.cgroup.kill()
        self.cgroup.remove()
        shutil.rmtree(self.directory, ignore_errors=True)


def new_slot(base_dir: Path, owner: str, hierarchies: list[cgroups.Hierarchy], subdirs: tuple[str, ...]) -> Slot:
    """A fresh id, `<base>/<owner>/<id>/` (mode 0700) with `sock/` and `subdirs`, and unlimited cgroups."""
    sandbox_id = f"sbx-{uuid.uuid4().hex[:12]}"
    if not base_dir.exists():
        base_dir.mkdir(parents=True, exist_ok=True)
        base_dir.chmod(0o1777)  # shared by the servers of all users on the node, like /tmp
    (base_dir / owner).mkdir(mode=0o700, exist_ok=True)
    directory = base_dir / owner / sandbox_id
    directory.mkdir(mode=0o700)
    for name in ("sock", *subdirs):
        (directory / name).mkdir()
    return Slot(sandbox_id, directory, cgroups.create(hierarchies, owner, sandbox_id))


def spawn(
    argv: list[str], env: dict[str, str], directory: Path, cwd: Path | None = None, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen[bytes]:
    """Start `argv` as the leader of a new session; stdout and stderr go to the private log file."""
    with open(directory / LOG_NAME, "wb") as out:
        try:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=cwd or directory,
                start_new_session=True,
                pass_fds=pass_fds,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start {argv[0]}: {exc}") from exc


def log_tail(directory: Path) -> str:
    """The end of the sandbox's log file (empty if none)."""
    try:
        return (directory / LOG_NAME).read_text(errors="replace")[-LOG_TAIL:].strip()
    except OSError:
        return ""


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


async def wait_ready(
    sandbox: ProcessSandbox, popen: subprocess.Popen[bytes], timeout_s: float, interval: Callable[[], float]
) -> None:
    """Return once the execution server answers a ping; raise SandboxError if the process ends or time runs out."""
    from prorl_server.tools.client import ToolError

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        if popen.poll() is not None:
            raise SandboxError(
                f"the sandbox exited with status {popen.returncode} before its execution server was ready; "
                f"its output:\n{log_tail(sandbox.slot.directory) or '(none)'}"
            )
        if sandbox.socket_path.exists():
            with contextlib.suppress(ToolError):
                await sandbox.tools.ping()
                return
        if loop.time() > deadline:
            raise SandboxError(
                f"the execution server did not answer within {timeout_s:.0f} s; its output:\n"
                f"{log_tail(sandbox.slot.directory) or '(none)'}"
            )
        await asyncio.sleep(interval())


class ProcessSandbox(Sandbox):
    """One running sandbox rooted in a host process group (see the module docstring).

    `monitor`: the top process only watches the others (bwrap), so SIGTERM goes to everything but it, and it
    exits once they are gone; signalling it first would orphan its child. `sweep_tags`: also kill, on close,
    processes outside the group and cgroups that carry the sandbox id (the local runtime, no pid namespace).
    """

    def __init__(
        self,
        *,
        slot: Slot,
        spec: SandboxSpec,
        popen: subprocess.Popen[bytes],
        address: str | None,
        monitor: bool,
        sweep_tags: bool,
        watchdog: Watchdog,
        on_close: Callable[[ProcessSandbox], None],
        grace_s: float = 2.0,
    ) -> None:
        self.id = slot.sandbox_id
        self.spec = spec
        self.pid = popen.pid
        self.address = address
        self.slot = slot
        self.socket_path = slot.directory / "sock" / SOCKET_NAME
        self.expired = False  # True once the wall-clock limit killed it
        self._popen = popen
        self._monitor = monitor
        self._sweep_tags = sweep_tags
        self._on_close = on_close
        self._grace_s = grace_s
        self._tools: ToolClient | None = None
        self._lock = threading.Lock()
        self._closing = False
        self._done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._watchdog = watchdog
        self._deadline = None
        if spec.limits.wall_clock_s is not None:
            self._deadline = watchdog.add(spec.limits.wall_clock_s, self._expire)

    @property
    def tools(self) -> ToolClient:
        """Client of the execution server inside (created on first use)."""
        if self._tools is None:
            from prorl_server.tools.client import ToolClient

            self._tools = ToolClient(str(self.socket_path))
        return self._tools

    @property
    def closed(self) -> bool:
        """True once close() finished."""
        return self._done.done()

    def alive(self) -> bool:
        """True while the sandbox's top process runs."""
        return self._popen.poll() is None

    def _expire(self) -> None:
        """Watchdog thread: the lifetime is over; kill everything now, files go on close()."""
        self.expired = True
        log.warning("sandbox %s reached its wall-clock limit of %s s; killed", self.id, self.spec.limits.wall_clock_s)
        self._kill_all()

    def _kill_all(self) -> None:
        """SIGKILL the group, the cgroup members and (local runtime) every process with this sandbox id."""
        signal_group(self.pid, signal.SIGKILL)
        self.slot.cgroup.kill()
        if self._sweep_tags:
            kill_tagged(ENV_SANDBOX_ID, self.id)

    async def close(self) -> None:
        """SIGTERM, SIGKILL after the grace period, remove cgroups and private files (idempotent)."""
        with self._lock:
            first, self._closing = not self._closing, True
        if not first:
            await asyncio.wrap_future(self._done)
            return
        try:
            if self._deadline is not None:
                self._watchdog.cancel(self._deadline)
            if self._tools is not None:
                await self._tools.aclose()
            await self._terminate()
            await asyncio.to_thread(self._cleanup)
        finally:
            self._on_close(self)
            self._done.set_result(None)

    async def _terminate(self) -> None:
        """SIGTERM, then wait up to the grace period for the top process to exit."""
        if self._popen.poll() is not None:
            return
        if self._monitor:
            members = self.slot.cgroup.pids() if self.slot.cgroup.directories else group_members(self.pid)
            for pid in members - {self.pid}:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
        else:
            signal_group(self.pid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._grace_s
        while loop.time() < deadline and self._popen.poll() is None:
            await asyncio.sleep(0.005)

    def _cleanup(self) -> None:
        """Blocking part of close(): kill leftovers, reap, remove cgroups and files."""
        self._kill_all()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)
        self.slot.discard()


class ProcessRuntime(Runtime):
    """A runtime whose sandboxes are ProcessSandboxes; subclasses say how the top process starts."""

    monitor = False  # see ProcessSandbox
    sweep_tags = False
    subdirs: tuple[str, ...] = ()  # made in the private directory next to sock/

    def __init__(
        self,
        owner: str,
        *,
        base_dir: Path = DEFAULT_BASE_DIR,
        loopback: LoopbackAllocator | None = None,
        ready_timeout_s: float = 30.0,
        grace_s: float = 2.0,
    ) -> None:
        self.owner = owner
        self.base_dir = base_dir
        self.loopback = loopback or LoopbackAllocator()
        self.ready_timeout_s = ready_timeout_s
        self.grace_s = grace_s
        self.watchdog = Watchdog()
        self.cgroups = cgroups.detect()
        self._starting = 0
        self._lock = threading.Lock()

    def new_slot(self) -> Slot:
        """Host-side resources for one more sandbox of this runtime."""
        return new_slot(self.base_dir, self.owner, self.cgroups, self.subdirs)

    @abstractmethod
    def command(
        self, spec: SandboxSpec, sandbox_id: str, directory: Path, address: str | None
    ) -> tuple[list[str], dict[str, str], Path | None]:
        """argv, environment and working directory of a sandbox's top process (`directory`: its private one)."""

    def launch(self, spec: SandboxSpec, address: str | None) -> tuple[Slot, subprocess.Popen[bytes]]:
        """Start a sandbox's top process in fresh cgroups with the spec's limits (cleaned up if that fails)."""
        slot = self.new_slot()
        try:
            slot.cgroup.apply(spec.limits)
            argv, env, cwd = self.command(spec, slot.sandbox_id, slot.directory, address)
            return slot, spawn(join_cgroups_argv(slot.cgroup.procs_files, argv), env, slot.directory, cwd)
        except BaseException:
            slot.discard()
            raise

    def close(self) -> None:
        """Remove this owner's cgroup and private directories if no sandbox uses them; the runtime stays usable."""
        for directory in [*(h.base / self.owner for h in self.cgroups), self.base_dir / self.owner]:
            with contextlib.suppress(OSError):
                directory.rmdir()

    def _poll_interval(self) -> float:
        with self._lock:
            return POLL_S * max(1, self._starting)

    async def start(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox and return once its execution server answers (at once with `tools=False`)."""
        address = self.loopback.allocate() if spec.network == "loopback" else None
        try:
            slot, popen = self.launch(spec, address)
        except BaseException:
            if address is not None:
                self.loopback.release(address)
            raise
        sandbox = ProcessSandbox(
            slot=slot,
            spec=spec,
            popen=popen,
            address=address,
            monitor=self.monitor,
            sweep_tags=self.sweep_tags,
            watchdog=self.watchdog,
            on_close=self._closed,
            grace_s=self.grace_s,
        )
        if spec.tools:
            with self._lock:
                self._starting += 1
            try:
                await wait_ready(sandbox, popen, self.ready_timeout_s, self._poll_interval)
            except BaseException:
                await sandbox.close()
                raise
            finally:
                with self._lock:
                    self._starting -= 1
        return sandbox

    def _closed(self, sandbox: ProcessSandbox) -> None:
        """A sandbox finished closing: give its address back."""
        if sandbox.address is not None:
            self.loopback.release(sandbox.address)
