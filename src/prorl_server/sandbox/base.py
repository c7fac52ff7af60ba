"""The two small interfaces every runtime implements: Runtime (where sandboxes come from) and Sandbox."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from prorl_server.sandbox.cpu_grants import CpuPool, Dop, dop_prefix
from prorl_server.sandbox.errors import SandboxError
from prorl_server.sandbox.spec import SandboxSpec

if TYPE_CHECKING:
    from prorl_server.actions import Grant
    from prorl_server.sandbox.snapshot import Snapshot
    from prorl_server.tool_server.client import CommandObservation, ToolClient


class Sandbox(ABC):
    """One running sandbox: an isolated process session with the execution server inside.

    `tools` talks to the execution server over a Unix domain socket in a bind-mounted directory.
    `close()` is idempotent: SIGTERM to the process group, SIGKILL after a grace period, then the
    workspace and socket directory are removed.
    """

    id: str
    spec: SandboxSpec
    tools: ToolClient
    pid: int  # the sandbox's top process on the host (leader of its own session/process group)
    address: str | None  # its 127.x.y.z address with network="loopback", else None

    @abstractmethod
    async def close(self) -> None:
        """Stop every process of the sandbox and remove its private files."""

    def grant(self, kind: str, dop: Dop | None) -> AbstractAsyncContextManager[Grant | None]:
        """Cores for one action of `kind` asking `dop`, held for the block: yields the grant, or None where the
        server grants none (no action scheduler; see cpu_grants.py)."""
        return contextlib.nullcontext()

    # handler-facing shortcuts to the execution server ---------------------------------------------

    async def bash(
        self, command: str, timeout: float = 30.0, *, dop: Dop | None = None, kind: str = "bash", **kwargs: Any
    ) -> CommandObservation:
        """Run a command in the sandbox's persistent shell. `dop`: the cores it can use, `n` or (minimum,
        maximum); the grant is exported to the command as $PRORL_DOP (not set without the action scheduler).
        `kind`: the action kind whose durations the scheduler learns from this one (name a scalable command's
        own, e.g. "tests")."""
        async with self.grant(kind, dop) as granted:
            if granted is not None:
                command = dop_prefix(granted.cpu) + command
            return await self.tools.bash(command, timeout=timeout, **kwargs)

    async def ipython(
        self, code: str, timeout: float = 30.0, *, dop: Dop | None = None, kind: str = "ipython", **kwargs: Any
    ) -> CommandObservation:
        """Run code in the sandbox's persistent IPython kernel; `dop` and `kind` as for `bash` (the grant
        shows in `os.sched_getaffinity(0)` where the cpuset follows it, not in an environment variable)."""
        async with self.grant(kind, dop):
            return await self.tools.ipython(code, timeout=timeout, **kwargs)

    async def edit(self, command: str, path: str, **kwargs: Any) -> Any:
        """File editor: view, create, str_replace, insert, undo_edit."""
        return await self.tools.edit(command, path, **kwargs)

    async def read_file(self, path: str) -> str:
        """Text of a file inside the sandbox."""
        return await self.tools.read_file(path)

    async def write_file(self, path: str, content: str) -> None:
        """Write a text file inside the sandbox (parents created)."""
        await self.tools.write_file(path, content)

    @property
    @abstractmethod
    def closed(self) -> bool:
        """True once close() finished."""


class Runtime(ABC):
    """Starts sandboxes of one kind (apptainer, bubblewrap, local, podman)."""

    name: str
    cpu_pool: CpuPool | None = None
    """The pool its sandboxes' actions are granted cores from (cpu_grants.py); None: static quotas only."""

    @abstractmethod
    async def start(self, spec: SandboxSpec) -> Sandbox:
        """Start a sandbox and return once its execution server answers (or raise SandboxError)."""

    def fork_unavailable(self) -> str | None:
        """None when this runtime can snapshot a sandbox and fork it (`snapshot`, `fork`), else why not."""
        return f"the {self.name} runtime cannot snapshot and fork sandboxes"

    async def snapshot(self, sandbox: Sandbox) -> Snapshot:
        """Stop `sandbox` (closing it) and keep its writable state as a snapshot to `fork` from (snapshot.py);
        SandboxError where this runtime cannot, or the state cannot be kept."""
        raise SandboxError(self.fork_unavailable() or f"the {self.name} runtime cannot snapshot sandboxes")

    async def fork(self, snapshot: Snapshot) -> Sandbox:
        """Start a sandbox of the snapshot's spec whose writable state is a private copy-on-write layer over the
        snapshot; SandboxError where this runtime cannot, or the snapshot is gone or corrupt."""
        raise SandboxError(self.fork_unavailable() or f"the {self.name} runtime cannot fork sandboxes")

    def close(self) -> None:  # noqa: B027 - optional hook, deliberately empty by default
        """Release runtime-wide resources (prewarmed launchers, empty cgroups); the runtime stays usable."""

    @classmethod
    @abstractmethod
    def available(cls) -> str | None:
        """None when this runtime can work on this machine, else why not (shown to users, used for skips)."""
