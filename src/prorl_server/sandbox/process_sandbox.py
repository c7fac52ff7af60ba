"""ProcessRuntime and ProcessSandbox: sandboxes whose processes descend from one host process leading its own session.

Shared by the bubblewrap, Apptainer, Podman and local runtimes: private directories and cgroups (a `Slot`,
slot.py), spawning (own session, scrubbed and tagged environment, cgroups joined before exec), readiness (the execution server
answers a ping), the wall-clock watchdog, and close (SIGTERM, SIGKILL after a grace period, then whatever is
left in the sandbox's cgroups or, with `sweep_tags`, carries its sandbox id). Close works from any thread
and any event loop: a sandbox started on one stage's loop may be closed on another's.

Nothing of the host is writable from inside a sandbox (but for the handler's own read-write binds):
- the execution server's listening socket is made here, in the sandbox's private host directory, and its
  file descriptor is passed into the sandbox (`--listen-fd`); the sandbox sees no socket file and no host
  directory, so it can neither replace the socket nor write past its disk limit through a socket directory;
- the top process's output goes to a pipe (`StartLog`), not a file: the host reads it while the sandbox
  starts (to quote it if the start fails) and not afterwards, so a process inside that writes to it (through
  /proc/1/fd/2, say) only fills a 64 KiB pipe and then blocks itself.
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
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prorl_server.actions import ActionDemand
from prorl_server.sandbox import cgroups
from prorl_server.sandbox.base import Runtime, Sandbox
from prorl_server.sandbox.cpu_grants import START_KIND, CpuPool, Dop, SandboxCpu
from prorl_server.sandbox.errors import SandboxError
from prorl_server.sandbox.limits import Watchdog, join_cgroups_argv
from prorl_server.sandbox.loopback import LoopbackAllocator
from prorl_server.sandbox.network_guard import NetworkGuard
from prorl_server.sandbox.process import signal_group
from prorl_server.sandbox.reaper import DEFAULT_BASE_DIR, MEMORY_SNAPSHOT_DIR, kill_tagged
from prorl_server.sandbox.slot import Command, Slot, check_socket_room, group_members, new_slot, spawn
from prorl_server.sandbox.snapshot import Snapshot, new_snapshot_dir
from prorl_server.sandbox.spec import SandboxSpec
from prorl_server.tool_server.protocol import ENV_SANDBOX_ID

if TYPE_CHECKING:
    from prorl_server.actions import Grant
    from prorl_server.tool_server.client import ToolClient

log = logging.getLogger(__name__)

POLL_S = 0.001  # readiness poll interval per sandbox being started (so polling stays ~1000/s per runtime)


async def wait_ready(
    sandbox: ProcessSandbox, popen: subprocess.Popen[bytes], timeout_s: float, interval: Callable[[], float]
) -> None:
    """Return once the execution server answers a ping; raise SandboxError if the process ends or time runs out.

    The listening socket exists before the server does, so a ping waits in its backlog until the server
    accepts; the process and the deadline are checked meanwhile.
    """
    from prorl_server.tool_server.client import ToolError

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    ping: asyncio.Future[int] | None = None
    try:
        while True:
            if ping is None:
                ping = asyncio.ensure_future(sandbox.tools.ping())
            await asyncio.wait({ping}, timeout=interval())
            if ping.done():
                failure = None if ping.cancelled() else ping.exception()
                if not ping.cancelled() and failure is None:
                    return
                if failure is not None and not isinstance(failure, ToolError):
                    raise failure  # not the sandbox's doing
                ping = None
            sandbox.slot.log.drain()
            if popen.poll() is not None:
                raise SandboxError(
                    f"the sandbox exited with status {popen.returncode} before its execution server was ready; "
                    f"its output:\n{sandbox.slot.log.text() or '(none)'}"
                )
            if loop.time() > deadline:
                raise SandboxError(
                    f"the execution server did not answer within {timeout_s:.0f} s; its output:\n"
                    f"{sandbox.slot.log.text() or '(none)'}"
                )
    finally:
        if ping is not None and not ping.done():
            ping.cancel()
            with contextlib.suppress(BaseException):
                await ping


class ProcessSandbox(Sandbox):
    """One running sandbox rooted in a host process group (see the module docstring).

    `monitor`: the top process only watches the others (bwrap), so SIGTERM goes to everything but it, and it
    exits once they are gone; signalling it first would orphan its child. `sweep_tags`: also kill, on close,
    processes outside the group and cgroups that carry the sandbox id (the local runtime, no pid namespace).
    `cpu`: its share of the server's CPU pool, which every tool action is granted cores from (None: the
    static quota of its limits only).
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
        cpu: SandboxCpu | None = None,
    ) -> None:
        self.id = slot.sandbox_id
        self.cpu = cpu
        self.spec = spec
        self.pid = popen.pid
        self.address = address
        self.slot = slot
        self.socket_path = slot.socket_path
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
            from prorl_server.tool_server.client import ToolClient

            self._tools = ToolClient(str(self.socket_path))
            if self.cpu is not None:
                self._tools.admission = self.cpu.admit
        return self._tools

    def grant(self, kind: str, dop: Dop | None) -> contextlib.AbstractAsyncContextManager[Grant | None]:
        """Cores from the server's pool for one action (see Sandbox.grant)."""
        return contextlib.nullcontext() if self.cpu is None else self.cpu.action(kind, dop)

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

    def processes(self) -> set[int]:
        """The sandbox's live processes on the host: its cgroups' members, else its process group's."""
        return self.slot.cgroup.pids() if self.slot.cgroup.directories else group_members(self.pid)

    async def stop(self) -> None:
        """End every process of the sandbox (SIGTERM, SIGKILL after the grace period) and keep its files; close()
        removes them."""
        await self._terminate()
        await asyncio.to_thread(self._kill_and_reap)

    def kill(self) -> None:
        """SIGKILL every process of the sandbox now and reap its top process (blocking; files kept until
        close())."""
        self._kill_and_reap()

    def _kill_and_reap(self) -> None:
        self._kill_all()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(timeout=5)

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
            self.slot.log.close()  # a writer blocked on the full pipe must not delay its exit
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
            for pid in self.processes() - {self.pid}:
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
        self._kill_and_reap()
        self.slot.discard()


def _drop_snapshot(work: asyncio.Future[Snapshot]) -> None:
    """A snapshot made for a caller that was cancelled meanwhile: remove it (in a thread)."""
    if not work.cancelled() and work.exception() is None:
        asyncio.get_running_loop().run_in_executor(None, work.result().remove)


class ProcessRuntime(Runtime):
    """A runtime whose sandboxes are ProcessSandboxes; subclasses say how the top process starts."""

    monitor = False  # see ProcessSandbox
    sweep_tags = False
    confines = True  # Landlock and seccomp (confinement.py); the local runtime does not
    subdirs: tuple[str, ...] = ()  # made in the private directory
    snapshots_in_memory = False  # keep snapshots under MEMORY_SNAPSHOT_DIR (where /dev/shm is), not base_dir

    def __init__(
        self,
        owner: str,
        *,
        base_dir: Path = DEFAULT_BASE_DIR,
        loopback: LoopbackAllocator | None = None,
        ready_timeout_s: float = 30.0,
        grace_s: float = 2.0,
        network_guard: NetworkGuard | None = None,
        cpu_pool: CpuPool | None = None,
    ) -> None:
        check_socket_room(base_dir, owner)
        self.owner = owner
        self.base_dir = base_dir
        self.loopback = loopback or LoopbackAllocator()
        self.ready_timeout_s = ready_timeout_s
        self.grace_s = grace_s
        self.watchdog = Watchdog()
        self.cpu_pool = cpu_pool  # grants each tool action its cores (cpu_grants.py); None: static quotas
        self.cgroups = cgroups.detect(cpuset=cpu_pool is not None)
        self.network_guard = network_guard  # the ports sandboxes sharing the host network may not connect to
        self._starting = 0
        self._lock = threading.Lock()

    def landlock_fd(self, spec: SandboxSpec) -> int | None:
        """The Landlock ruleset `spec`'s sandbox restricts itself to (the guard's; None: none). Blocking the
        first time for a set of ports (~0.1 s): `start` calls it off the event loop."""
        if not self.confines or self.network_guard is None or spec.network == "none":
            return None
        return self.network_guard.ruleset_fd(spec)

    def new_slot(self) -> Slot:
        """Host-side resources for one more sandbox of this runtime."""
        return new_slot(self.base_dir, self.owner, self.cgroups, self.subdirs)

    @abstractmethod
    def command(self, spec: SandboxSpec, slot: Slot, address: str | None, landlock_fd: int | None) -> Command:
        """How to start a sandbox's top process, given its slot (id, private directory, listening socket) and
        the Landlock ruleset it restricts itself to (None: none)."""

    def launch(
        self, spec: SandboxSpec, address: str | None, landlock_fd: int | None, fork: Snapshot | None = None
    ) -> tuple[Slot, subprocess.Popen[bytes]]:
        """Start a sandbox's top process in fresh cgroups with the spec's limits (cleaned up if that fails), as a
        fork of `fork` if given."""
        slot = self.new_slot()
        slot.fork = fork
        command: Command | None = None
        try:
            slot.cgroup.apply(spec.limits)
            command = self.command(spec, slot, address, landlock_fd)
            argv = join_cgroups_argv(slot.cgroup.procs_files, command.argv)
            popen = spawn(argv, command.env, slot, command.cwd, command.pass_fds)
        except BaseException:
            slot.discard()
            raise
        finally:
            if command is not None:
                command.close()
        slot.spawned()
        return slot, popen

    def close(self) -> None:
        """Remove this owner's cgroup and private directories if no sandbox uses them, and the network guard's
        rulesets; the runtime stays usable."""
        if self.network_guard is not None:
            self.network_guard.close()
        for directory in [*(h.base / self.owner for h in self.cgroups), self.base_dir / self.owner]:
            with contextlib.suppress(OSError):
                directory.rmdir()

    def _poll_interval(self) -> float:
        with self._lock:
            return POLL_S * max(1, self._starting)

    async def start(self, spec: SandboxSpec, *, fork: Snapshot | None = None) -> Sandbox:
        """Start a sandbox (a copy-on-write fork of `fork`, whose spec it then has) and return once its
        execution server answers (at once with `tools=False`).

        With a CPU pool, a `per_action` sandbox's start is an action (kind `start`, one core): it waits for
        its core, and the sandbox is at the idle share once started."""
        if self.cpu_pool is None or spec.cpu_grants == "static":
            return await self._start_or_fork(spec, None, fork)
        async with self.cpu_pool.scheduler.action(ActionDemand(START_KIND)) as grant:
            return await self._start_or_fork(spec, grant, fork)

    async def _start_or_fork(self, spec: SandboxSpec, grant: Grant | None, fork: Snapshot | None) -> ProcessSandbox:
        """`_start` a fresh sandbox, or a fork: a runtime that does not fork may override `_start` without
        the `fork` parameter."""
        return await (self._start(spec, grant) if fork is None else self._start(spec, grant, fork))

    async def fork(self, snapshot: Snapshot) -> Sandbox:
        """A copy-on-write fork of `snapshot` (see Runtime.fork); a failure to start one is a SandboxError
        naming the snapshot."""
        reason = self.fork_unavailable()
        if reason is not None:
            raise SandboxError(reason)
        if snapshot.runtime != self.name:
            raise SandboxError(f"snapshot {snapshot.id} was made by the {snapshot.runtime} runtime, not {self.name}")
        await asyncio.to_thread(snapshot.check)
        try:
            return await self.start(snapshot.spec, fork=snapshot)
        except SandboxError as exc:
            raise SandboxError(f"cannot fork snapshot {snapshot.id}: {exc}") from exc

    async def snapshot(self, sandbox: Sandbox) -> Snapshot:
        """Keep `sandbox`'s writable state as a snapshot (`capture`), then close it (also when that fails)."""
        reason = self.fork_unavailable()
        if reason is not None:
            await sandbox.close()
            raise SandboxError(reason)
        if not isinstance(sandbox, ProcessSandbox) or sandbox.slot.fork is not None:
            await sandbox.close()
            raise SandboxError("only a sandbox this runtime started afresh (not a fork) can be snapshotted")
        work = asyncio.ensure_future(self._snapshot_and_close(sandbox))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:  # the snapshot and the close go on to their end; then the snapshot goes
            work.add_done_callback(_drop_snapshot)
            raise

    async def _snapshot_and_close(self, sandbox: ProcessSandbox) -> Snapshot:
        try:
            root = MEMORY_SNAPSHOT_DIR if self.snapshots_in_memory and MEMORY_SNAPSHOT_DIR.parent.is_dir() else None
            snapshot_id, directory = await asyncio.to_thread(new_snapshot_dir, root or self.base_dir, self.owner)
            try:
                layers = await self.capture(sandbox, directory)
                snapshot = Snapshot(snapshot_id, self.name, sandbox.spec, directory, layers)
                await asyncio.to_thread(snapshot.write_manifest)
            except BaseException:
                await asyncio.to_thread(shutil.rmtree, directory, True)
                raise
            return snapshot
        finally:
            await sandbox.close()

    async def capture(self, sandbox: ProcessSandbox, directory: Path) -> tuple[str, ...]:
        """Put the writable state of `sandbox` into the empty `directory`, stopping its processes: the snapshot's
        layers (see snapshot.py). Runtimes that fork implement it."""
        raise SandboxError(f"the {self.name} runtime cannot snapshot sandboxes")

    async def _start(self, spec: SandboxSpec, grant: Grant | None, fork: Snapshot | None = None) -> ProcessSandbox:
        # a network namespace of its own needs no ruleset; one is built off the event loop, once per set of ports
        landlock_fd = None if spec.network == "none" else await asyncio.to_thread(self.landlock_fd, spec)
        address = self.loopback.allocate() if spec.network == "loopback" else None
        try:
            slot, popen = self.launch(spec, address, landlock_fd, fork)
        except BaseException:
            if address is not None:
                self.loopback.release(address)
            raise
        sandbox = self.sandbox(
            slot=slot,
            spec=spec,
            popen=popen,
            address=address,
            monitor=self.monitor,
            sweep_tags=self.sweep_tags,
            watchdog=self.watchdog,
            on_close=self._closed,
            grace_s=self.grace_s,
            cpu=None if grant is None else SandboxCpu(self.cpu_pool, slot.cgroup, slot.sandbox_id),
        )
        with contextlib.nullcontext() if sandbox.cpu is None else sandbox.cpu.hold(grant):  # then the idle share
            if not spec.tools:  # nothing serves the socket: let connects fail at once
                sandbox.socket_path.unlink(missing_ok=True)
                return sandbox
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

    def sandbox(self, **options: Any) -> ProcessSandbox:
        """The sandbox object for a started top process (a runtime whose processes leave the top process's
        group, such as podman's, returns a subclass that stops them)."""
        return ProcessSandbox(**options)

    def _closed(self, sandbox: ProcessSandbox) -> None:
        """A sandbox finished closing: give its address back."""
        if sandbox.address is not None:
            self.loopback.release(sandbox.address)
