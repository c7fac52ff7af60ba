"""ModelServiceCache: model services that do not all fit at once (ARL-Tangram's evict-on-execution, §5.3).

Model services (reward models, judges) are registered with a memory footprint and a `ServiceLauncher` that
starts and stops the service's process. At most `budget_mb` of them are resident at once. `async with
cache.use(name) as endpoint:` makes the service resident and counts it as executing for the block:

- resident already: it is used at once (a hit); concurrent users of one resident service share it;
- not resident: idle services (none executing) are evicted, least recently used first, until it fits, then it
  is restored (a miss); users asking for it meanwhile join that restore;
- it fits only once executing services finish: the caller waits, first come, first served (a later caller waits
  behind, even for a service that is resident, so a busy service cannot starve the head of the line);
- unknown name: refused at once (`ModelServiceRefused`); a service larger than the budget is refused when it is
  registered.

Restores are done one at a time, on a thread of their own (`prorl-model-service-restore`): the evictions a
restore needs, then the start, so the memory of the processes alive never exceeds the budget. A start that fails
fails every use waiting for it (`ModelServiceUnavailable`).

"Restore from a host copy": on a GPU the paper keeps each service's state in host memory and copies it back
into GPU memory. Here services are CPU processes: eviction stops the process, and a restore starts it again
from its weights on disk (the host copy, read through the page cache). The snapshot reports how long restores
and evictions took, as measured.

Users may sit on different event loops (the server runs one per stage, each on its own thread): the books are
kept under a threading lock and the endpoint is handed to a waiter with `try_call_in_loop`. A waiter
cancelled in line leaves it holding nothing; one cancelled while its service is restored leaves the restore
going (the service stays cached); one cancelled after its grant gives it back. `abandon_loop(loop)` takes back
what the users of a loop that died held.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import enum
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from prorl_server.actions.quota import SERVICE_NAME
from prorl_server.errors import ResourceError
from prorl_server.threadsafe import try_call_in_loop

log = logging.getLogger(__name__)


class ServiceLauncher(abc.ABC):
    """Starts and stops the process of one model service. Both calls block; the cache calls them on its
    restore thread, one at a time."""

    @abc.abstractmethod
    def start(self) -> str:
        """Start the service from its host copy, wait until it answers, and return its endpoint (a base URL)."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the service and return once its memory is free. It must not fail: an exception is logged and
        the service counted as stopped."""


class ModelServiceRefused(ResourceError, ValueError):
    """The service is unknown, or larger than the whole budget; the message says what to do."""


class ModelServiceUnavailable(ResourceError, RuntimeError):
    """The service failed to start (the message has the launcher's error), or the cache was closed."""


class ServiceState(enum.Enum):
    """Where a service's process is."""

    ABSENT = "absent"  # no process; its host copy only
    RESTORING = "restoring"  # the services it evicts are being stopped, then it is started
    RESIDENT = "resident"
    STOPPING = "stopping"  # being evicted


@dataclass(frozen=True)
class ServiceSnapshot:
    """One service's figures."""

    name: str
    memory_mb: int
    state: ServiceState
    executing: int  # uses in their block, or waiting for its restore
    restores: int
    restore_s_total: float
    last_restore_s: float | None


@dataclass(frozen=True)
class ModelServiceSnapshot:
    """The cache's figures: memory held by live processes, users executing and waiting, and counters since it
    was created. `hits`: uses that found their service resident; `misses`: uses that waited for a restore (their
    own or one in progress); `services` are in LRU order, least recently used first."""

    budget_mb: int
    resident_mb: int
    executing: int
    waiting: int
    hits: int
    misses: int
    restores: int
    evictions: int
    start_failures: int
    refused: int
    restore_s_total: float
    evict_s_total: float
    services: tuple[ServiceSnapshot, ...]


class _UseState(enum.Enum):
    QUEUED = "queued"  # in line
    JOINED = "joined"  # counted as executing, waiting for its service's restore
    HELD = "held"  # granted (the endpoint maybe still on its way to the waiter's loop)
    DONE = "done"


class _Service:
    def __init__(self, name: str, memory_mb: int, launcher: ServiceLauncher) -> None:
        self.name = name
        self.memory_mb = memory_mb
        self.launcher = launcher
        self.state = ServiceState.ABSENT
        self.has_process = False  # its memory counts against the budget
        self.endpoint: str | None = None
        self.executing = 0
        self.joined: list[_Use] = []
        self.restores = 0
        self.restore_s_total = 0.0
        self.last_restore_s: float | None = None


class _Use:
    __slots__ = ("future", "loop", "service", "state")

    def __init__(self, service: _Service, loop: asyncio.AbstractEventLoop) -> None:
        self.service = service
        self.loop = loop
        self.future: asyncio.Future[str] = loop.create_future()
        self.state = _UseState.QUEUED


class ModelServiceCache:
    """Model services under a memory budget, evicted LRU when idle and restored on use (see the module).
    Thread-safe; its users may be on any event loops."""

    def __init__(self, budget_mb: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if budget_mb < 1:
            raise ValueError(f"the model-service budget must be >= 1 MiB, got {budget_mb}")
        self.budget_mb = budget_mb
        self._clock = clock
        self._lock = threading.Lock()
        self._services: dict[str, _Service] = {}
        self._lru: collections.OrderedDict[str, None] = collections.OrderedDict()  # least recently used first
        self._queue: collections.deque[_Use] = collections.deque()
        self._held: set[_Use] = set()
        self._restorer: threading.Thread | None = None  # the restore in progress
        self._closed = False
        self._hits = self._misses = self._restores = self._evictions = 0
        self._start_failures = self._refused = 0
        self._restore_s = self._evict_s = 0.0

    def register(self, name: str, memory_mb: int, launcher: ServiceLauncher) -> None:
        """Add service `name` (not started: its first use restores it). ModelServiceRefused if it can never fit
        the budget; ValueError for a name taken or a footprint < 1 MiB."""
        if not name:
            raise ValueError("a model service needs a name")
        if memory_mb < 1:
            raise ValueError(f"model service {name!r}: memory_mb must be >= 1, got {memory_mb}")
        if memory_mb > self.budget_mb:
            raise ModelServiceRefused(
                f"model service {name!r} needs {memory_mb} MiB and the budget is {self.budget_mb} MiB: "
                "raise the budget or give the service a smaller model"
            )
        with self._lock:
            if name in self._services:
                raise ValueError(f"model service {name!r} is registered already")
            self._services[name] = _Service(name, memory_mb, launcher)
            self._lru[name] = None

    @contextlib.asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[str]:
        """`async with cache.use(name) as endpoint:` the service is resident and counted as executing for the
        block (see the module for the waiting order)."""
        use = await self._acquire(name)
        try:
            yield use.future.result()
        finally:
            self._release(use)

    def snapshot(self) -> ModelServiceSnapshot:
        """The figures now."""
        with self._lock:
            services = tuple(
                ServiceSnapshot(
                    name=s.name,
                    memory_mb=s.memory_mb,
                    state=s.state,
                    executing=s.executing,
                    restores=s.restores,
                    restore_s_total=s.restore_s_total,
                    last_restore_s=s.last_restore_s,
                )
                for s in (self._services[name] for name in self._lru)
            )
            return ModelServiceSnapshot(
                budget_mb=self.budget_mb,
                resident_mb=self._resident_mb_locked(),
                executing=sum(s.executing for s in self._services.values()),
                waiting=len(self._queue),
                hits=self._hits,
                misses=self._misses,
                restores=self._restores,
                evictions=self._evictions,
                start_failures=self._start_failures,
                refused=self._refused,
                restore_s_total=self._restore_s,
                evict_s_total=self._evict_s,
                services=services,
            )

    def close(self) -> None:
        """Refuse new uses, fail the waiting ones, finish the restore in progress and stop every service (blocks;
        from async code, `await asyncio.to_thread(cache.close)`). Users still executing keep their endpoint,
        whose process is gone."""
        with self._lock:
            self._closed = True
            waiting = list(self._queue)
            self._queue.clear()
            for use in waiting:
                use.state = _UseState.DONE
                _post(use, ModelServiceUnavailable(f"model service {use.service.name!r}: the cache was closed"))
            restorer = self._restorer
        if restorer is not None:
            restorer.join()
        with self._lock:
            live = [s for s in self._services.values() if s.state is ServiceState.RESIDENT]
            for service in live:
                service.state = ServiceState.STOPPING
        for service in live:
            self._stop(service, evicted=False)

    def abandon_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """`loop` died: drop its users in line and in restores, and take back the services its users held."""
        with self._lock:
            for use in [u for u in self._queue if u.loop is loop]:
                self._queue.remove(use)
                use.state = _UseState.DONE
            for service in self._services.values():
                for use in [u for u in service.joined if u.loop is loop]:
                    self._unjoin_locked(use)
            for use in [u for u in self._held if u.loop is loop]:
                self._settle_locked(use)
            self._dispatch_locked()

    # the books (all under self._lock) -----------------------------------------------------------------

    async def _acquire(self, name: str) -> _Use:
        loop = asyncio.get_running_loop()
        with self._lock:
            service = self._services.get(name)
            if service is None:
                self._refused += 1
                known = ", ".join(sorted(self._services)) or "none"
                raise ModelServiceRefused(
                    f"model service {name!r} is not registered (registered: {known}); register it first"
                )
            if self._closed:
                raise ModelServiceUnavailable(f"model service {name!r}: the cache was closed")
            use = _Use(service, loop)
            self._queue.append(use)
            self._dispatch_locked()
        try:
            await use.future
        except BaseException:
            self._leave(use)
            raise
        return use

    def _leave(self, use: _Use) -> None:
        """The waiter was cancelled (or failed): out of the line, out of its restore's users, or its grant given
        back."""
        with self._lock:
            if use.state is _UseState.QUEUED:
                self._queue.remove(use)
                use.state = _UseState.DONE
            elif use.state is _UseState.JOINED:
                self._unjoin_locked(use)
            elif use.state is _UseState.HELD:
                self._settle_locked(use)
            else:
                return
            self._dispatch_locked()

    def _release(self, use: _Use) -> None:
        with self._lock:
            if use.state is _UseState.HELD:
                self._settle_locked(use)
                self._dispatch_locked()

    def _unjoin_locked(self, use: _Use) -> None:
        """A use waiting for its service's restore gives up (the restore goes on)."""
        use.service.joined.remove(use)
        use.service.executing -= 1
        use.state = _UseState.DONE

    def _settle_locked(self, use: _Use) -> None:
        """Take back a held service: one user fewer, and it is the most recently used."""
        self._held.discard(use)
        use.service.executing -= 1
        use.state = _UseState.DONE
        self._lru.move_to_end(use.service.name)

    def _resident_mb_locked(self) -> int:
        return sum(s.memory_mb for s in self._services.values() if s.has_process)

    def _dispatch_locked(self) -> None:
        """Serve the line from its head while the head can be served: a resident service at once, one being
        restored by joining it, an absent one by starting its restore when none is in progress and enough idle
        services can be evicted."""
        while self._queue:
            use = self._queue[0]
            service = use.service
            if service.state is ServiceState.RESIDENT:
                self._queue.popleft()
                self._hits += 1
                service.executing += 1
                self._grant_locked(use)
            elif service.state is ServiceState.RESTORING:
                self._queue.popleft()
                self._join_locked(use)
            elif service.state is ServiceState.ABSENT and self._restorer is None:
                victims = self._victims_locked(service.memory_mb)
                if victims is None:  # the memory is held by executing services: wait for them
                    return
                self._queue.popleft()
                service.state = ServiceState.RESTORING
                self._join_locked(use)
                for victim in victims:
                    victim.state = ServiceState.STOPPING
                self._restorer = threading.Thread(
                    target=self._restore, args=(service, victims), name="prorl-model-service-restore", daemon=True
                )
                self._restorer.start()
            else:  # being evicted, or another restore in progress: wait for it
                return

    def _join_locked(self, use: _Use) -> None:
        self._misses += 1
        use.service.executing += 1
        use.service.joined.append(use)
        use.state = _UseState.JOINED

    def _grant_locked(self, use: _Use) -> None:
        use.state = _UseState.HELD
        self._held.add(use)
        assert use.service.endpoint is not None
        if not _post(use, use.service.endpoint):  # its loop is closed: nobody will take it
            self._settle_locked(use)

    def _victims_locked(self, need_mb: int) -> list[_Service] | None:
        """The idle resident services to evict, least recently used first, for `need_mb` to fit; None when even
        evicting every idle one would not make room."""
        free = self.budget_mb - self._resident_mb_locked()
        victims: list[_Service] = []
        for name in self._lru:
            if free >= need_mb:
                return victims
            service = self._services[name]
            if service.state is ServiceState.RESIDENT and service.executing == 0:
                victims.append(service)
                free += service.memory_mb
        return victims if free >= need_mb else None

    # the restore thread -------------------------------------------------------------------------------------

    def _restore(self, service: _Service, victims: list[_Service]) -> None:
        """Evict `victims`, then start `service` and hand its endpoint to the uses that joined the restore."""
        for victim in victims:
            self._stop(victim)
        with self._lock:
            service.has_process = True
        started = self._clock()
        try:
            endpoint = service.launcher.start()
        except Exception as exc:
            log.warning("model service %r failed to start: %s", service.name, exc)
            failure = ModelServiceUnavailable(f"model service {service.name!r} failed to start: {exc}")
            with self._lock:
                service.state = ServiceState.ABSENT
                service.has_process = False
                self._start_failures += 1
                for use in service.joined:
                    use.state = _UseState.DONE
                    service.executing -= 1
                    _post(use, failure)
                service.joined = []
                self._restorer = None
                self._dispatch_locked()
            return
        took = self._clock() - started
        with self._lock:
            service.state = ServiceState.RESIDENT
            service.endpoint = endpoint
            service.restores += 1
            service.restore_s_total += took
            service.last_restore_s = took
            self._restores += 1
            self._restore_s += took
            self._lru.move_to_end(service.name)
            joined, service.joined = service.joined, []
            for use in joined:
                self._grant_locked(use)
            self._restorer = None
            self._dispatch_locked()

    def _stop(self, service: _Service, *, evicted: bool = True) -> None:
        started = self._clock()
        try:
            service.launcher.stop()
        except Exception:
            log.exception("model service %r did not stop cleanly; counting it as stopped", service.name)
        with self._lock:
            service.state = ServiceState.ABSENT
            service.has_process = False
            service.endpoint = None
            if evicted:
                self._evictions += 1
                self._evict_s += self._clock() - started


def _post(use: _Use, outcome: str | BaseException) -> bool:
    """Hand the endpoint (or the failure) to the waiter on its own loop; False when that loop is closed."""
    return try_call_in_loop(use.loop, _deliver, use.future, outcome)


def _deliver(future: asyncio.Future[str], outcome: str | BaseException) -> None:
    if future.done():  # cancelled with its waiter, whose `_leave` settled the books
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def parse_model_service(text: str) -> tuple[str, int]:
    """`NAME=MEMORY_MB` (`judge-a=450`) as its name and footprint; ValueError with the reason when it is not."""
    name, sep, memory = text.partition("=")
    name = name.strip()
    if not sep or not SERVICE_NAME.fullmatch(name) or not memory.strip().isdigit():
        raise ValueError(f"a model service is NAME=MEMORY_MB (such as judge-a=450), got {text!r}")
    if int(memory) < 1:
        raise ValueError(f"model service {name!r}: its memory must be at least 1 MiB")
    return name, int(memory)
