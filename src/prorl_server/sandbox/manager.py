"""SandboxManager: the sandboxes of one server instance, so that nothing outlives the server."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from prorl_server.sandbox import reaper
from prorl_server.sandbox.base import Runtime, Sandbox
from prorl_server.sandbox.snapshot import Snapshot
from prorl_server.sandbox.spec import SandboxSpec

if TYPE_CHECKING:
    from prorl_server.actions import ActionScheduler

log = logging.getLogger(__name__)


class SandboxManager:
    """Starts sandboxes with one runtime and remembers every live one until it is closed.

    Thread-safe: stages on different threads start and close sandboxes. `close_all()` is the backstop
    of `/stop` and shutdown, after each job has released its own.
    """

    def __init__(
        self,
        runtime: Runtime,
        owner: str,
        default_spec: SandboxSpec | None = None,
        base_dir: Path = reaper.DEFAULT_BASE_DIR,
        *,
        on_start: Callable[[float | None], None] | None = None,
        on_tool_request: Callable[[str, float, bool], None] | None = None,
    ) -> None:
        self.runtime = runtime
        self.owner = owner
        self.base_dir = base_dir  # the runtime's: where its sandboxes' private directories are
        self.default_spec = default_spec or SandboxSpec()
        self._lock = threading.Lock()
        self._live: set[Sandbox] = set()
        # metrics: each start (seconds it took, or None when it failed), and each tool request of the sandboxes
        # started afterwards (action, seconds, whether it succeeded)
        self.on_start = on_start
        self.on_tool_request = on_tool_request

    async def start(self, spec: SandboxSpec | None = None) -> Sandbox:
        """Start a sandbox (the default spec unless given) and track it."""
        return await self._track(self.runtime.start(spec or self.default_spec))

    async def fork(self, snapshot: Snapshot) -> Sandbox:
        """Start a copy-on-write fork of a snapshot (Runtime.fork) and track it."""
        return await self._track(self.runtime.fork(snapshot))

    async def snapshot(self, sandbox: Sandbox) -> Snapshot:
        """Snapshot a tracked sandbox (Runtime.snapshot), which closes it, and forget it."""
        try:
            return await self.runtime.snapshot(sandbox)
        finally:
            with self._lock:
                self._live.discard(sandbox)

    async def _track(self, starting: Awaitable[Sandbox]) -> Sandbox:
        started = time.monotonic()
        try:
            sandbox = await starting
        except Exception:  # a cancelled start is no failure
            if self.on_start is not None:
                self.on_start(None)
            raise
        if self.on_start is not None:
            self.on_start(time.monotonic() - started)
        if self.on_tool_request is not None:
            sandbox.tools.on_request = self.on_tool_request
        with self._lock:
            self._live.add(sandbox)
        return sandbox

    async def close(self, sandbox: Sandbox) -> None:
        """Close a sandbox and forget it (idempotent)."""
        try:
            await sandbox.close()
        finally:
            with self._lock:
                self._live.discard(sandbox)

    @property
    def live(self) -> int:
        """How many sandboxes are open."""
        with self._lock:
            return len(self._live)

    @property
    def actions(self) -> ActionScheduler | None:
        """The scheduler granting cores to the actions of this manager's sandboxes (None: static quotas)."""
        pool = self.runtime.cpu_pool
        return None if pool is None else pool.scheduler

    async def close_all(self) -> int:
        """Close every tracked sandbox; returns how many there were."""
        with self._lock:
            live = list(self._live)
        results = await asyncio.gather(*(self.close(s) for s in live), return_exceptions=True)
        for sandbox, outcome in zip(live, results, strict=True):
            if isinstance(outcome, BaseException):
                log.error("closing sandbox %s failed: %s", getattr(sandbox, "id", "?"), outcome)
        return len(live)

    def reap_orphans(self) -> int:
        """On server start: kill what sandboxes of dead server instances left behind; returns how many."""
        killed = reaper.reap_orphans(self.owner, self.base_dir)
        if killed:
            log.warning("reaped %d processes left by sandboxes of earlier server instances", len(killed))
        return len(killed)

    async def shutdown(self) -> int:
        """On stop: close every sandbox, release runtime resources, reap anything still carrying our tag."""
        closed = await self.close_all()
        self.runtime.close()
        leftover = reaper.reap(owner=self.owner)
        if leftover:
            log.warning("reaped %d processes that outlived their sandboxes", len(leftover))
        reaper.remove_owner_files(self.owner, self.base_dir)
        return closed
