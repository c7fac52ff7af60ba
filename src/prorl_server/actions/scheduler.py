"""ActionScheduler: one node's CPU pool, granted per action (ARL-Tangram's action-level scheduler).

An action (a tool call, a test run, a sandbox start) asks for cores, a range when it can use more (its DoP),
and memory (`ActionDemand`). `acquire` queues it, first come first served; each time the queue or the pool
changes, `allocation.plan` decides which waiting actions start and with how many cores. `release` returns
them and teaches the action kind's duration model (`elasticity`) how long it took with that many cores.

Waiters may sit on different event loops (the server runs one per stage, each on its own thread): a grant is
handed to its waiter's loop with `try_call_in_loop`; a waiter cancelled before it sees its grant passes
it back. An action that could never fit the pool is refused at once (`ActionRefused`).

The scheduler also keeps, per action kind, what `/metrics`, `/status` and the dashboard show (`kind_stats`):
actions granted and refused, each grant's queueing seconds and cores, each completed action's completion time
(ACT: queued + run), as bucket counts and sums (a few dict and list updates per action); and the pool's busy
core-seconds (`Books.busy_core_s`), integrated each time its busy cores change.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

from prorl_server.actions.allocation import HORIZON, Duration, Pending, Running, plan
from prorl_server.actions.elasticity import ElasticityModels
from prorl_server.errors import ResourceError
from prorl_server.threadsafe import try_call_in_loop

UNKNOWN_DURATION_S = 1.0
"""Seconds assumed for an action whose kind has no duration model yet (for the estimate only)."""
MAX_KINDS = 32
"""Action kinds (named by handlers) the statistics keep apart; any later kind is counted as `OTHER_KIND`."""
OTHER_KIND = "other"
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Upper bounds (seconds) of the queueing-time buckets."""
COMPLETION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
"""Upper bounds (seconds) of the completion-time (ACT) buckets."""
CORE_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)
"""Upper bounds of the granted-cores buckets."""


class ActionRefused(ResourceError, ValueError):
    """The action asks more than the pool can ever give (or asks nonsense); the message says what."""


@dataclass(frozen=True)
class ActionDemand:
    """What an action asks: `kind` (its duration model's name), cores as a (minimum, maximum) DoP range (equal:
    fixed), and memory in MiB."""

    kind: str
    cpu: tuple[int, int] = (1, 1)
    memory_mb: int = 0


@dataclass(frozen=True)
class Grant:
    """Cores and memory granted to one action, from `started`, after `queued_s` in the queue."""

    id: int
    kind: str
    cpu: int
    memory_mb: int
    queued_s: float
    started: float


@dataclass(eq=False)
class _Waiter:
    demand: ActionDemand
    pending: Pending
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Grant]


@dataclass
class Books:
    """The pool's counts at one moment; `busy_core_s` is the integral of its busy cores over time (core-seconds
    granted, the running actions' included up to now)."""

    cpus: int
    free_cpu: int
    memory_mb: int
    free_memory_mb: int
    waiting: int
    running: int
    granted_total: int
    released_total: int
    refused_total: int
    busy_core_s: float


@dataclass(frozen=True)
class Distribution:
    """Values observed: `counts[i]` of them above `bounds[i - 1]` and at most `bounds[i]` (the last count: above
    every bound), and their sum."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        """Values observed."""
        return sum(self.counts)

    @property
    def mean(self) -> float | None:
        """Their mean (None before the first)."""
        count = self.count
        return self.sum / count if count else None


@dataclass(frozen=True)
class KindStats:
    """One action kind's figures since the scheduler was built: actions granted and refused, each grant's
    queueing seconds and cores, and the completion time (queued + run) of each action that completed (its
    block did not raise and was not cancelled)."""

    granted: int
    refused: int
    queue_s: Distribution
    cores: Distribution
    completion_s: Distribution


class _Tally:
    """A Distribution being counted (under the scheduler's lock)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def frozen(self) -> Distribution:
        return Distribution(self.bounds, tuple(self.counts), self.sum)


class _KindTally:
    __slots__ = ("completion", "cores", "granted", "queue", "refused")

    def __init__(self) -> None:
        self.granted = self.refused = 0
        self.queue = _Tally(QUEUE_BUCKETS)
        self.cores = _Tally(CORE_BUCKETS)
        self.completion = _Tally(COMPLETION_BUCKETS)


class ActionScheduler:
    """The CPU pool of one node and its waiting actions (see the module). Thread-safe."""

    def __init__(
        self,
        cpus: int,
        memory_mb: int,
        *,
        models: ElasticityModels | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cpus < 1:
            raise ValueError(f"the action pool needs at least one core, got {cpus}")
        if memory_mb < 0:
            raise ValueError(f"memory_mb must be >= 0, got {memory_mb}")
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.models = models or ElasticityModels()
        self._clock = clock
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: list[_Waiter] = []
        self._granting: dict[_Waiter, Grant] = {}  # handed to a waiter's loop, not yet delivered
        self._running: dict[int, tuple[Grant, float]] = {}  # id -> (grant, expected finish)
        self._free_cpu = cpus
        self._free_memory = memory_mb
        self._granted = self._released = self._refused = 0
        self._kinds: dict[str, _KindTally] = {}
        self._busy_core_s = 0.0  # busy cores integrated over time, up to `_ticked`
        self._ticked = clock()

    async def acquire(self, demand: ActionDemand) -> Grant:
        """Wait for cores and memory for `demand` (first come, first served); ActionRefused if it can never fit."""
        low, high = self._check(demand)
        loop = asyncio.get_running_loop()
        with self._lock:
            kind = self._kind_name_locked(demand.kind)  # past MAX_KINDS: "other", for its duration model too
            self._kind_locked(kind)  # known from now on: the kinds waiting at once stay within the bound too
            if kind != demand.kind:
                demand = replace(demand, kind=kind)
            waiter = _Waiter(
                demand, Pending(low, high, demand.memory_mb, self._clock(), None), loop, loop.create_future()
            )
            self._waiting.append(waiter)
            self._dispatch_locked()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            with self._lock:
                if waiter in self._waiting:  # not granted yet: leave the queue
                    self._waiting.remove(waiter)
                    self._dispatch_locked()  # the actions behind it may fit now
            if waiter.future.done() and not waiter.future.cancelled():  # delivered, then cancelled: give it back
                self.release(waiter.future.result(), completed=False)
            raise  # a grant still on its way is passed back by _deliver

    def release(self, grant: Grant, *, completed: bool = True) -> None:
        """Return `grant`'s cores and memory (idempotent); a `completed` action teaches its kind's duration model."""
        with self._lock:
            if self._running.pop(grant.id, None) is None:
                return
            now = self._clock()
            self._tick_locked(now)
            self._free_cpu += grant.cpu
            self._free_memory += grant.memory_mb
            self._released += 1
            if completed:
                self._kind_locked(grant.kind).completion.observe(grant.queued_s + now - grant.started)
            self._dispatch_locked()
        if completed:
            self.models[grant.kind].observe(grant.cpu, now - grant.started)

    @contextlib.asynccontextmanager
    async def action(self, demand: ActionDemand) -> AsyncIterator[Grant]:
        """`async with scheduler.action(demand) as grant:` holds the grant for the block; a block that raises
        (a cancelled action included) does not teach the duration model."""
        grant = await self.acquire(demand)
        completed = False
        try:
            yield grant
            completed = True
        finally:
            self.release(grant, completed=completed)

    def abandon_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """`loop` died: forget its waiters and take back the grants it never delivered."""
        with self._lock:
            self._tick_locked(self._clock())
            self._waiting = [w for w in self._waiting if w.loop is not loop]
            for waiter in [w for w in self._granting if w.loop is loop]:
                grant = self._granting.pop(waiter)
                self._running.pop(grant.id, None)
                self._free_cpu += grant.cpu
                self._free_memory += grant.memory_mb
                self._released += 1
            self._dispatch_locked()

    def books(self) -> Books:
        """The pool's counts now."""
        with self._lock:
            busy = self.cpus - self._free_cpu
            return Books(
                cpus=self.cpus,
                free_cpu=self._free_cpu,
                memory_mb=self.memory_mb,
                free_memory_mb=self._free_memory,
                waiting=len(self._waiting),
                running=len(self._running),
                granted_total=self._granted,
                released_total=self._released,
                refused_total=self._refused,
                busy_core_s=self._busy_core_s + busy * (self._clock() - self._ticked),
            )

    def kind_stats(self) -> dict[str, KindStats]:
        """Each action kind's figures so far (at most `MAX_KINDS` kinds, and `OTHER_KIND`)."""
        with self._lock:
            return {
                kind: KindStats(t.granted, t.refused, t.queue.frozen(), t.cores.frozen(), t.completion.frozen())
                for kind, t in self._kinds.items()
            }

    def _check(self, demand: ActionDemand) -> tuple[int, int]:
        low, high = demand.cpu
        problem = None
        if low < 1 or high < low:
            problem = f"cores must be a range (minimum >= 1, maximum >= minimum), got {demand.cpu}"
        elif low > self.cpus:
            problem = f"it needs at least {low} cores and the pool has {self.cpus}"
        elif demand.memory_mb < 0:
            problem = f"memory must be >= 0 MiB, got {demand.memory_mb}"
        elif demand.memory_mb > self.memory_mb:
            problem = f"it needs {demand.memory_mb} MiB and the pool has {self.memory_mb} MiB"
        if problem is not None:
            with self._lock:
                self._refused += 1
                self._kind_locked(demand.kind).refused += 1
            raise ActionRefused(f"action {demand.kind!r} refused: {problem}")
        return low, min(high, self.cpus)

    def _dispatch_locked(self) -> None:
        if not self._waiting:
            return
        now = self._clock()
        durations: dict[str, Duration | None] = {}
        waiting = []
        head = self._waiting[: self._free_cpu + HORIZON]  # candidates need a core each: no more can matter
        for waiter in head:
            kind = waiter.demand.kind
            if kind not in durations:
                durations[kind] = self._duration(kind)
            waiter.pending = Pending(
                waiter.pending.cpu_min,
                waiter.pending.cpu_max,
                waiter.pending.memory_mb,
                waiter.pending.arrival,
                durations[kind],
            )
            waiting.append(waiter.pending)
        running = [Running(finish, grant.cpu) for grant, finish in self._running.values()]
        decided = plan(waiting, self._free_cpu, self._free_memory, running, now, UNKNOWN_DURATION_S)
        if not decided:
            return
        self._tick_locked(now)
        by_pending = {w.pending: w for w in head}
        for pending, cores in decided:
            waiter = by_pending[pending]
            self._waiting.remove(waiter)
            grant = Grant(next(self._ids), waiter.demand.kind, cores, pending.memory_mb, now - pending.arrival, now)
            duration = durations[grant.kind]
            finish = now + (duration(cores) if duration is not None else UNKNOWN_DURATION_S)
            self._running[grant.id] = (grant, finish)
            self._free_cpu -= cores
            self._free_memory -= pending.memory_mb
            self._granted += 1
            if not try_call_in_loop(waiter.loop, self._deliver, waiter, grant):  # its loop is closed: nobody takes it
                self._running.pop(grant.id)
                self._free_cpu += cores
                self._free_memory += pending.memory_mb
                self._released += 1
                continue
            self._granting[waiter] = grant
            tally = self._kind_locked(grant.kind)
            tally.granted += 1
            tally.queue.observe(grant.queued_s)
            tally.cores.observe(cores)

    def _tick_locked(self, now: float) -> None:
        """Add the busy core-seconds since the last tick (before the busy cores change)."""
        self._busy_core_s += (self.cpus - self._free_cpu) * (now - self._ticked)
        self._ticked = now

    def _kind_name_locked(self, kind: str) -> str:
        """`kind`, or OTHER_KIND once MAX_KINDS others are known (handlers name kinds: the books stay bounded)."""
        return kind if kind in self._kinds or len(self._kinds) < MAX_KINDS else OTHER_KIND

    def _kind_locked(self, kind: str) -> _KindTally:
        kind = self._kind_name_locked(kind)
        tally = self._kinds.get(kind)
        if tally is None:
            tally = self._kinds[kind] = _KindTally()
        return tally

    def _duration(self, kind: str) -> Duration | None:
        fitted = self.models[kind].fit()
        if fitted is None:
            return None
        t1, serial = fitted
        return lambda cores: t1 * (serial + (1.0 - serial) / cores)

    def _deliver(self, waiter: _Waiter, grant: Grant) -> None:
        with self._lock:
            if self._granting.pop(waiter, None) is None:  # taken back (abandon_loop)
                return
        if waiter.future.cancelled():
            self.release(grant, completed=False)
        else:
            waiter.future.set_result(grant)
