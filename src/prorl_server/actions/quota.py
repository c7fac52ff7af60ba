"""Quotas for external services (ARL-Tangram's basic resource manager): a concurrency limit and a rate limit.

`ServiceQuota` guards one service (the judge pool, a search API, any HTTP service a handler names).
`async with quota.slot() as slot:` waits, first come first served, for a concurrency slot and a rate
token; the block then reports how the call went. The concurrency limit adapts by AIMD between
`min_concurrency` and `max_concurrency`:

- additive increase: +1 after as many successes as the limit (one window, TCP's congestion avoidance);
- multiplicative decrease: x `backoff` (floored at the minimum) on an overload signal, a 429, a 503 or a
  timeout (`slot.overloaded()`, or the block exiting with TimeoutError). Once per wave: a signal from a
  slot granted before the last decrease has already been answered by it, so a burst of 429s from the
  requests of one wave halves the limit once. A `Retry-After` hint pauses the service (new grants) for
  that long, at most `max_pause_s`.

The rate limit is a token bucket (`rate_per_s`, `burst`). Waiters may sit on different event loops (each
pipeline stage runs its own, on its own thread): as in pipeline/cross_loop_semaphore.py, the books are
kept under a threading lock and a slot is handed to a waiter with `try_call_in_loop`. While the head of the line waits for a
token (or for a pause to end), it alone sleeps, with the quota's `sleep`, then takes the token; tests
inject `clock` and `sleep`. A waiter cancelled in line leaves it holding nothing; a slot handed to a
waiter that was cancelled before it resumed is passed on; a holder cancelled inside the block returns
its slot. `in_use == granted_total - released_total` always.
"""

from __future__ import annotations

import asyncio
import collections
import enum
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import TracebackType

from prorl_server.errors import ResourceError
from prorl_server.threadsafe import try_call_in_loop

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

_ROUNDING = 1e-9  # a token short by less is there: float sums of refills fall a hair short of whole tokens
WAIT_SAMPLES = 1024
"""Queue waits (of the last grants) the snapshot's mean and 95th percentile are taken over."""


class ServiceDisabled(ResourceError, RuntimeError):
    """The service is configured with `max_concurrency=0`: it takes no calls."""


@dataclass(frozen=True)
class QuotaConfig:
    """The limits of one service. `max_concurrency=0` turns the service off (a slot raises ServiceDisabled).

    `rate_per_s`: grants per second at most (None: unlimited), with bursts of up to `burst` (default: one
    second's worth, at least 1). `backoff`: the factor a limit is cut by on an overload. `max_pause_s`: the
    longest pause a `Retry-After` hint can impose.
    """

    max_concurrency: int = 32
    min_concurrency: int = 1
    backoff: float = 0.5
    rate_per_s: float | None = None
    burst: int | None = None
    max_pause_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_concurrency < 0:
            raise ValueError(f"max_concurrency must be >= 0 (0 turns the service off), got {self.max_concurrency}")
        if self.max_concurrency and not 1 <= self.min_concurrency <= self.max_concurrency:
            raise ValueError(
                f"min_concurrency must be between 1 and max_concurrency ({self.max_concurrency}), "
                f"got {self.min_concurrency}"
            )
        if not 0 < self.backoff < 1:
            raise ValueError(f"backoff must be between 0 and 1 (exclusive), got {self.backoff}")
        if self.rate_per_s is not None and not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)):
            raise ValueError(f"rate_per_s must be a positive number or None (unlimited), got {self.rate_per_s}")
        if self.burst is not None and (self.rate_per_s is None or self.burst < 1):
            raise ValueError(f"burst must be >= 1, and given only with rate_per_s; got burst={self.burst}")
        if not self.max_pause_s >= 0:
            raise ValueError(f"max_pause_s must be >= 0, got {self.max_pause_s}")

    @property
    def bucket_size(self) -> float:
        """Tokens the rate bucket holds when full."""
        if self.burst is not None:
            return float(self.burst)
        return float(max(1, math.ceil(self.rate_per_s or 1)))


@dataclass(frozen=True)
class QuotaSnapshot:
    """One service's figures: its limit now and bounds, slots in use and waiters, counters since it was
    created, the pause left, and the queue wait (mean and 95th percentile) of its last grants."""

    name: str
    limit: int
    min_concurrency: int
    max_concurrency: int
    rate_per_s: float | None
    in_use: int
    waiting: int
    granted_total: int
    released_total: int
    overloads_total: int
    backoffs_total: int
    paused_s: float
    queue_wait_mean_s: float
    queue_wait_p95_s: float


class _Outcome(enum.Enum):
    SUCCESS = "success"
    OVERLOAD = "overload"
    NEUTRAL = "neutral"  # a failure that says nothing about the service's load, or a cancellation


class _State(enum.Enum):
    NEW = "new"
    QUEUED = "queued"
    HELD = "held"  # granted (maybe still on its way to the waiter's loop)
    DONE = "done"


class Slot:
    """One use of a service: `async with quota.slot() as slot:` holds it for the block.

    A normal exit counts as a success, an exit by TimeoutError as an overload, any other exception as
    neither; `overloaded()` reports an overload explicitly (then the exit counts as nothing more).
    """

    __slots__ = ("_epoch", "_future", "_loop", "_outcome", "_queued_at", "_quota", "_state")

    def __init__(self, quota: ServiceQuota) -> None:
        self._quota = quota
        self._state = _State.NEW
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future: asyncio.Future[bool] | None = None
        self._queued_at = 0.0
        self._epoch = 0
        self._outcome: _Outcome | None = None

    async def __aenter__(self) -> Slot:
        await self._quota._acquire(self)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._outcome is None:
            if exc_type is None:
                self._outcome = _Outcome.SUCCESS
            elif issubclass(exc_type, TimeoutError):
                self._quota._overload(self, None)
            else:
                self._outcome = _Outcome.NEUTRAL
        self._quota._release(self)

    def overloaded(self, retry_after_s: float | None = None) -> None:
        """Report an overload (429, 503, a timeout): the limit is cut (once per wave), and a `retry_after_s`
        hint pauses new grants for that long (at most the quota's `max_pause_s`)."""
        if self._state is not _State.HELD:
            raise RuntimeError("overloaded() is reported from inside `async with quota.slot()`")
        if self._outcome is None:
            self._quota._overload(self, retry_after_s)


class ServiceQuota:
    """The quota of one external service: an AIMD concurrency limit and a token-bucket rate limit (see the
    module docstring). Thread-safe; its waiters may be on any event loops."""

    def __init__(
        self,
        name: str,
        config: QuotaConfig | None = None,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if not name:
            raise ValueError("a service quota needs a name")
        self.name = name
        self.config = config or QuotaConfig()
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._limit = self.config.max_concurrency
        self._in_use = 0
        self._credit = 0  # successes since the limit last changed
        self._epoch = 0  # decreases so far: a slot granted in an older epoch belongs to an answered wave
        self._waiters: collections.deque[Slot] = collections.deque()
        self._holders: set[Slot] = set()
        self._timer: Slot | None = None  # the head of the line while it sleeps until a token
        self._tokens = self.config.bucket_size
        self._refilled = clock()
        self._paused_until = -math.inf
        self._granted = self._released = self._overloads = 0
        self._waits: collections.deque[float] = collections.deque(maxlen=WAIT_SAMPLES)

    def __repr__(self) -> str:
        return f"ServiceQuota({self.name!r}, limit={self.limit}, in_use={self.in_use}, waiting={self.waiting})"

    def slot(self) -> Slot:
        """A slot to hold with `async with` (it waits for the concurrency limit and the rate limit)."""
        return Slot(self)

    @property
    def limit(self) -> int:
        """The concurrency limit now (AIMD moves it between min_concurrency and max_concurrency)."""
        with self._lock:
            return self._limit

    @property
    def in_use(self) -> int:
        """Slots held (granted and not released)."""
        with self._lock:
            return self._in_use

    @property
    def waiting(self) -> int:
        """Callers in line."""
        with self._lock:
            return len(self._waiters)

    def snapshot(self) -> QuotaSnapshot:
        """This service's figures now."""
        with self._lock:
            waits = sorted(self._waits)
            now = self._clock()
            return QuotaSnapshot(
                name=self.name,
                limit=self._limit,
                min_concurrency=min(self.config.min_concurrency, self.config.max_concurrency),
                max_concurrency=self.config.max_concurrency,
                rate_per_s=self.config.rate_per_s,
                in_use=self._in_use,
                waiting=len(self._waiters),
                granted_total=self._granted,
                released_total=self._released,
                overloads_total=self._overloads,
                backoffs_total=self._epoch,
                paused_s=max(0.0, self._paused_until - now),
                queue_wait_mean_s=sum(waits) / len(waits) if waits else 0.0,
                queue_wait_p95_s=waits[min(len(waits) - 1, int(0.95 * len(waits)))] if waits else 0.0,
            )

    def abandon_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """`loop` died: drop its waiters and take back the slots held by (or on their way to) its tasks."""
        with self._lock:
            for slot in self._waiters:
                if slot._loop is loop:
                    slot._state = _State.DONE
            self._waiters = collections.deque(s for s in self._waiters if s._loop is not loop)
            if self._timer is not None and self._timer._loop is loop:
                self._timer = None
            for slot in [s for s in self._holders if s._loop is loop]:
                slot._outcome = _Outcome.NEUTRAL
                self._release_locked(slot)
            self._dispatch_locked()

    # the books (all under self._lock) -----------------------------------------------------------------

    async def _acquire(self, slot: Slot) -> None:
        if slot._state is not _State.NEW:
            raise RuntimeError("a slot is used once: take a new one with quota.slot()")
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.config.max_concurrency == 0:
                raise ServiceDisabled(
                    f"service {self.name!r} has a concurrency limit of 0: it takes no calls "
                    "(configure max_concurrency >= 1 to use it)"
                )
            slot._loop = loop
            slot._queued_at = now = self._clock()
            if not self._waiters and self._in_use < self._limit and self._token_wait(now) == 0:
                self._grant_locked(slot, now)
                return
            slot._future = loop.create_future()
            slot._state = _State.QUEUED
            self._waiters.append(slot)
            self._dispatch_locked()  # the head may need waking to time a token
        try:
            granted = await slot._future
            while not granted:  # head of the line, a slot free, no token yet: time it
                granted = await self._time_token(slot, loop)
        except BaseException:
            self._leave(slot)
            raise

    async def _time_token(self, slot: Slot, loop: asyncio.AbstractEventLoop) -> bool:
        """Sleep until the next token (or a grant), let the line move, and wait for the next word."""
        with self._lock:
            if slot._state is _State.HELD:  # granted since the wake-up, to the spent future
                return True
            slot._future = future = loop.create_future()
            delay = self._token_wait(self._clock())
        if delay > 0:
            sleeper = asyncio.ensure_future(self._sleep(delay))
            try:
                await asyncio.wait((future, sleeper), return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
        with self._lock:
            if self._timer is slot:
                self._timer = None
            self._dispatch_locked()
        return await future

    def _leave(self, slot: Slot) -> None:
        """The waiter was cancelled (or failed): out of the line, or the slot granted to it (maybe still on its
        way, then delivered to no one) passed on."""
        with self._lock:
            if slot._state is _State.QUEUED:
                self._waiters.remove(slot)
                slot._state = _State.DONE
                if self._timer is slot:
                    self._timer = None
                self._dispatch_locked()
            elif slot._state is _State.HELD:
                slot._outcome = _Outcome.NEUTRAL
                self._release_locked(slot)

    def _release(self, slot: Slot) -> None:
        with self._lock:
            self._release_locked(slot)

    def _release_locked(self, slot: Slot) -> None:
        if slot._state is _State.HELD:
            self._settle_locked(slot)
            self._dispatch_locked()

    def _settle_locked(self, slot: Slot) -> None:
        """Take back a held slot and learn from its outcome."""
        slot._state = _State.DONE
        self._holders.discard(slot)
        self._in_use -= 1
        self._released += 1
        if slot._outcome is _Outcome.SUCCESS:
            self._credit += 1
            if self._credit >= self._limit:  # a window of successes: one more slot
                self._credit = 0
                self._limit = min(self._limit + 1, self.config.max_concurrency)

    def _overload(self, slot: Slot, retry_after_s: float | None) -> None:
        with self._lock:
            slot._outcome = _Outcome.OVERLOAD
            self._overloads += 1
            if slot._epoch == self._epoch:  # the first signal of this wave: cut
                self._epoch += 1
                self._credit = 0
                self._limit = max(self.config.min_concurrency, math.floor(self._limit * self.config.backoff))
            if retry_after_s is not None and retry_after_s > 0:
                pause = min(retry_after_s, self.config.max_pause_s)
                self._paused_until = max(self._paused_until, self._clock() + pause)

    def _token_wait(self, now: float) -> float:
        """Seconds until a grant may take a token (0: now); refills the bucket."""
        wait = self._paused_until - now
        rate = self.config.rate_per_s
        if rate is not None:
            self._tokens = min(self.config.bucket_size, self._tokens + max(0.0, now - self._refilled) * rate)
            self._refilled = now
            if self._tokens < 1 - _ROUNDING:
                wait = max(wait, (1 - self._tokens) / rate)
        return max(wait, 0.0)

    def _grant_locked(self, slot: Slot, now: float) -> None:
        if self.config.rate_per_s is not None:
            self._tokens -= 1
        slot._state = _State.HELD
        slot._epoch = self._epoch
        self._holders.add(slot)
        self._in_use += 1
        self._granted += 1
        self._waits.append(now - slot._queued_at)

    def _dispatch_locked(self) -> None:
        """Grant the head of the line while slots and tokens allow; when only a token is missing, wake the
        head to time it (one timer at a time)."""
        if not self._waiters:
            return
        now = self._clock()
        while self._waiters and self._in_use < self._limit:
            head = self._waiters[0]
            granted = self._token_wait(now) == 0
            if not granted and self._timer is not None:
                return
            if not granted:
                if self._post(head, False):
                    self._timer = head
                    return
                self._waiters.popleft()  # its loop is closed
                head._state = _State.DONE
                continue
            self._waiters.popleft()
            if self._timer is head:
                self._timer = None
            self._grant_locked(head, now)  # before the hand-over: the waiter may use its slot at once
            if not self._post(head, True):  # its loop is closed: the slot comes straight back
                head._outcome = _Outcome.NEUTRAL
                self._settle_locked(head)

    def _post(self, slot: Slot, granted: bool) -> bool:
        """Hand `granted` to the waiter on its own loop; False when that loop is closed."""
        assert slot._loop is not None and slot._future is not None
        return try_call_in_loop(slot._loop, _deliver, slot._future, granted)


def _deliver(future: asyncio.Future[bool], granted: bool) -> None:
    if not future.done():  # done: cancelled with its waiter (whose `_leave` settled the books), or spent
        future.set_result(granted)


SERVICE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""What a service's name may be (it labels metrics)."""
MAX_SERVICES = 64
"""Services one registry holds at most (each is a metrics label value)."""


class QuotaRegistry:
    """Service quotas by name: created on first use with the `default` config, or configured beforehand.

    Names match SERVICE_NAME and a registry holds at most `max_services`, so a handler naming services in a
    loop (one per URL, say) gets a ValueError instead of growing the metrics without bound."""

    def __init__(
        self,
        default: QuotaConfig | None = None,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        max_services: int = MAX_SERVICES,
    ) -> None:
        self.default = default or QuotaConfig()
        self.max_services = max_services
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._quotas: dict[str, ServiceQuota] = {}

    def configure(self, name: str, config: QuotaConfig) -> ServiceQuota:
        """Create service `name` with `config`; ValueError when it exists already (configure before use)."""
        return self.add(ServiceQuota(name, config, clock=self._clock, sleep=self._sleep))

    def add(self, quota: ServiceQuota) -> ServiceQuota:
        """Hold a quota made elsewhere (the judge's) under its name; ValueError when the name is taken."""
        with self._lock:
            self._check_new(quota.name)
            self._quotas[quota.name] = quota
            return quota

    def get(self, name: str) -> ServiceQuota:
        """Service `name`'s quota (created with the default config on first use)."""
        with self._lock:
            quota = self._quotas.get(name)
            if quota is None:
                self._check_new(name)
                quota = self._quotas[name] = ServiceQuota(name, self.default, clock=self._clock, sleep=self._sleep)
            return quota

    def snapshot(self) -> dict[str, QuotaSnapshot]:
        """Every service's figures, by name."""
        with self._lock:
            quotas = list(self._quotas.values())
        return {quota.name: quota.snapshot() for quota in quotas}

    def abandon_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """`loop` died: every service forgets its waiters there and takes back what it never delivered."""
        with self._lock:
            quotas = list(self._quotas.values())
        for quota in quotas:
            quota.abandon_loop(loop)

    def _check_new(self, name: str) -> None:
        if name in self._quotas:
            raise ValueError(f"service {name!r} already has a quota; configure a service before its first use")
        if not isinstance(name, str) or not SERVICE_NAME.fullmatch(name):
            raise ValueError(f"a service name is 1 to 64 of A-Z a-z 0-9 _ . -, got {name!r}")
        if len(self._quotas) >= self.max_services:
            raise ValueError(
                f"service {name!r}: this server already has {self.max_services} services, the most it keeps; "
                "name a service by what it is (one name per API), not per request"
            )


def parse_service_quota(text: str) -> tuple[str, QuotaConfig]:
    """`NAME=MAX_CONCURRENCY[/RATE_PER_S]` (`search=8/20`: 8 in flight, 20 started per second) as its name and
    config; ValueError with the reason when it is not that."""
    name, sep, limits = text.partition("=")
    concurrency, _, rate = limits.partition("/")
    if not sep or not SERVICE_NAME.fullmatch(name.strip()):
        raise ValueError(f"a service quota is NAME=MAX_CONCURRENCY[/RATE_PER_S] (such as search=8/20), got {text!r}")
    try:
        config = QuotaConfig(max_concurrency=int(concurrency), rate_per_s=float(rate) if rate else None)
    except ValueError as exc:
        raise ValueError(f"service quota {text!r}: {exc}") from None
    return name.strip(), config
