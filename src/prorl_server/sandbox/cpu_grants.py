"""CPU granted per action (ARL-Tangram): a sandbox's cgroup CPU quota and cpuset follow its actions' grants.

`CpuPool` is the server's: the node's `ActionScheduler`, the CPU ids its grants are pinned to and the idle
share. `SandboxCpu` is one sandbox's: while actions of the sandbox hold grants, its cgroup quota is the sum of
their cores (`cpu.max`, or `cpu.cfs_quota_us` with cgroup v1) and its `cpuset.cpus` their pinned CPU ids, so
`nproc` inside sees them; with none it is lowered to the idle share (`idle_cpus` cores) on every pool CPU, so
what the task left running in the background goes on, slowly. Memory and state stay.

A sandbox whose cgroup has no writable cpu controller keeps its static quota (`SandboxLimits.cpus`) and the
server says so once; its actions still queue for grants. Without a writable cpuset only the quota follows.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager

from prorl_server.actions import ActionDemand, ActionScheduler, Grant
from prorl_server.sandbox.cgroups import SandboxCgroup, cpu_quota

log = logging.getLogger(__name__)

Dop = int | tuple[int, int]
"""Cores an action can use: `n` (fixed), or a (minimum, maximum) range; 0: none, it mostly waits."""
DEFAULT_DOP = (1, 1)
"""Cores an action asks unless its caller says more (`sandbox.bash(..., dop=(1, 8))`)."""
DEFAULT_IDLE_CPUS = 0.1
"""Cores a sandbox gets between its actions, by default."""
ENV_DOP = "PRORL_DOP"
"""The variable a bash action sees its granted cores in."""
START_KIND = "start"
"""The action kind of a sandbox's start (one core, from launch until its execution server answers)."""
KINDS = {
    "bash": "bash",
    "ipython": "ipython",
    "edit": "edit",
    "read_file": "files",
    "write_file": "files",
    "upload": "files",
    "download": "files",
}
"""Execution-server action -> action kind (its duration model); the other actions (ping, shutdown, the
gateway relay's setup) need no grant."""

_holding: contextvars.ContextVar[SandboxCpu | None] = contextvars.ContextVar("prorl_cpu_holding", default=None)


def reserve_for(cores: int) -> int:
    """Cores kept out of the pool by default: one per 16 usable cores (none below 16)."""
    return cores // 16


def parse_cpus(text: str) -> tuple[int, ...]:
    """A CPU list (`0-3,8`) as sorted ids; ValueError when it is not one."""
    ids: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        low, high = (int(match[1]), int(match[2] or match[1])) if match else (0, -1)
        if high < low:
            raise ValueError(f"not a CPU list (such as 0-3,8): {text!r}")
        ids.update(range(low, high + 1))
    return tuple(sorted(ids))


def cpu_slice(ids: tuple[int, ...], index: int, count: int) -> tuple[int, ...]:
    """The `index`-th of `count` near-equal disjoint slices of `ids` (each at least one id when it can be)."""
    if not 0 <= index < count:
        raise ValueError(f"slice {index} of {count} does not exist")
    if count > len(ids):
        return (ids[index % len(ids)],)  # more servers than CPUs: they share, one each
    start, stop = index * len(ids) // count, (index + 1) * len(ids) // count
    return ids[start:stop]


def format_cpus(ids: tuple[int, ...] | list[int]) -> str:
    """CPU ids as a cpuset list (`0,2,3`)."""
    return ",".join(map(str, sorted(ids)))


def cpu_range(dop: Dop | None) -> tuple[int, int]:
    """`dop` as a (minimum, maximum) range (the scheduler refuses a range that makes no sense)."""
    if dop is None:
        return DEFAULT_DOP
    if isinstance(dop, int):
        return (dop, dop)
    low, high = dop
    return (int(low), int(high))


def dop_prefix(cores: int) -> str:
    """What a bash action's command is prefixed with so it sees its grant (same line: line numbers stay)."""
    return f"export {ENV_DOP}={int(cores)}; "


class CpuPool:
    """The server's CPU pool: the action scheduler, the CPU ids grants are pinned to, the idle share."""

    def __init__(self, scheduler: ActionScheduler, cpu_ids: tuple[int, ...], idle_cpus: float) -> None:
        if len(cpu_ids) != scheduler.cpus:
            raise ValueError(f"the pool has {scheduler.cpus} cores but {len(cpu_ids)} CPU ids: {cpu_ids}")
        if idle_cpus <= 0:
            raise ValueError(f"idle_cpus must be > 0, got {idle_cpus}")
        self.scheduler = scheduler
        self.cpu_ids = cpu_ids
        self.idle_cpus = idle_cpus
        self._uses = dict.fromkeys(cpu_ids, 0)
        self._lock = threading.Lock()
        self._said: set[str] = set()

    @classmethod
    def for_node(
        cls, reserve: int | None = None, idle_cpus: float = DEFAULT_IDLE_CPUS, cpus: str | None = None
    ) -> CpuPool:
        """The CPUs this process may use (`sched_getaffinity`), but for the first `reserve` (default
        `reserve_for`), left to the server itself; or exactly the list `cpus` (`0-3,8`), which this process
        must be allowed to use. ValueError if no core would be left or the list is wrong."""
        usable = tuple(sorted(os.sched_getaffinity(0)))
        if cpus is not None:
            ids = parse_cpus(cpus)
            outside = sorted(set(ids) - set(usable))
            if outside:
                raise ValueError(
                    f"--action-cpus {cpus}: CPUs {format_cpus(outside)} are not among those this process may use "
                    f"({format_cpus(usable)})"
                )
            return cls(ActionScheduler(cpus=len(ids), memory_mb=0), ids, idle_cpus)
        reserve = reserve_for(len(usable)) if reserve is None else reserve
        if not 0 <= reserve < len(usable):
            raise ValueError(
                f"a CPU reserve of {reserve} leaves no core for actions: this process may use {len(usable)} "
                f"(serve: --action-cpu-reserve)"
            )
        ids = usable[reserve:]
        return cls(ActionScheduler(cpus=len(ids), memory_mb=0), ids, idle_cpus)

    def pin(self, cores: int) -> tuple[int, ...]:
        """`cores` CPU ids for one grant, the least used first (disjoint while the scheduler's books hold)."""
        with self._lock:
            chosen = tuple(sorted(self._uses, key=lambda i: (self._uses[i], i))[:cores])
            for cpu in chosen:
                self._uses[cpu] += 1
            return chosen

    def unpin(self, ids: tuple[int, ...]) -> None:
        """Give back the ids of `pin`."""
        with self._lock:
            for cpu in ids:
                self._uses[cpu] -= 1

    def say_once(self, key: str, message: str, *args: object) -> None:
        """Log a warning the first time `key` comes up on this server."""
        with self._lock:
            if key in self._said:
                return
            self._said.add(key)
        log.warning(message, *args)


class SandboxCpu:
    """One sandbox's share of the pool: its actions' grants, written to its cgroup (see the module)."""

    def __init__(self, pool: CpuPool, cgroup: SandboxCgroup, sandbox_id: str) -> None:
        self.pool = pool
        self.cgroup = cgroup
        self.sandbox_id = sandbox_id
        self.quota = cgroup.read("cpu.max") is not None or cgroup.read("cpu.cfs_quota_us") is not None
        self.cpuset = cgroup.read("cpuset.cpus") is not None
        if not self.quota:
            pool.say_once(
                "no-cpu",
                "sandbox %s has no cgroup cpu controller: sandboxes keep their static CPU quota (limits.cpus) "
                "and actions only queue for their cores (docs/sandboxes.md, 'CPU per action')",
                sandbox_id,
            )
        if not self.cpuset:
            pool.say_once(
                "no-cpuset",
                "sandbox %s has no cgroup cpuset controller: actions' cores are not pinned and nproc inside "
                "sees every core (only $PRORL_DOP tells the grant)",
                sandbox_id,
            )
        self._lock = threading.Lock()
        self._held: dict[int, tuple[int, tuple[int, ...]]] = {}  # grant id -> (cores, pinned ids)
        self._written: dict[str, str] = {}  # control file -> the value last written (each write costs ~50 us)

    @contextlib.asynccontextmanager
    async def action(self, kind: str, dop: Dop | None = None) -> AsyncIterator[Grant | None]:
        """Hold a grant for one action of this sandbox (queued until the pool has the cores; ActionRefused
        when it never will): the cgroup is raised for the block and lowered after. `dop=0`: no grant (None),
        for a command that mostly waits; it runs on what the sandbox has (the idle share, or other grants)."""
        if dop == 0:
            token = _holding.set(self)
            try:
                yield None
            finally:
                _holding.reset(token)
            return
        async with self.pool.scheduler.action(ActionDemand(kind, cpu_range(dop))) as grant:
            with self.hold(grant):
                yield grant

    @contextlib.contextmanager
    def hold(self, grant: Grant) -> Iterator[None]:
        """Apply `grant` (taken from the pool's scheduler) to this sandbox's cgroup for the block."""
        ids = self.pool.pin(grant.cpu) if self.cpuset else ()
        token = _holding.set(self)
        try:
            self._change(grant.id, (grant.cpu, ids))
            yield
        finally:
            self._change(grant.id, None)
            self.pool.unpin(ids)
            _holding.reset(token)

    def admit(self, action: str) -> AbstractAsyncContextManager[object]:
        """For the tool client: a grant of the default size around an execution-server request, unless the
        action needs none or the caller already holds one for this sandbox."""
        kind = KINDS.get(action)
        if kind is None or _holding.get() is self:
            return contextlib.nullcontext()
        return self.action(kind)

    def _change(self, grant_id: int | None, held: tuple[int, tuple[int, ...]] | None) -> None:
        """Record a grant taken (`held`) or returned (None), then write the cgroup's quota and cpuset."""
        with self._lock:
            if grant_id is not None:
                if held is None:
                    self._held.pop(grant_id, None)
                else:
                    self._held[grant_id] = held
            cores = sum(c for c, _ in self._held.values())
            ids = {i for _, pinned in self._held.values() for i in pinned}
            if self.quota:
                self._write("cpu", cpu_quota(cores or self.pool.idle_cpus))
            if self.cpuset:
                self._write("cpuset", {"cpuset.cpus": format_cpus(sorted(ids) or list(self.pool.cpu_ids))})

    def _write(self, controller: str, values: dict[str, str]) -> None:
        changed = {name: value for name, value in values.items() if self._written.get(name) != value}
        try:
            self.cgroup.write(changed)
            self._written.update(changed)
        except OSError as exc:
            if controller == "cpu":
                self.quota = False
            else:
                self.cpuset = False
            self.pool.say_once(
                f"write-{controller}",
                "cannot change the %s cgroup of sandbox %s (%s): from now on it keeps what it has",
                controller,
                self.sandbox_id,
                exc,
            )
