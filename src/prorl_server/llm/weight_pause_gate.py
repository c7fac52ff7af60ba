"""WeightPauseGate: holds LLM calls back while the trainer updates the policy's weights.

Every backend request of an LLMSession passes the gate (`enter`, then `Ticket.run`, then `exit`). While
the gate is paused no call is dispatched: `enter` waits (on whatever event loop the caller runs: each
stage pool has its own) until `resume`. A pause in "wait" mode lets calls already in flight finish; in
"abort" mode it cancels them at once (closing the HTTP request, so the engine aborts it) and their
`Ticket.run` raises DispatchAborted, which tells the session to send the call again after the resume. In
"keep" mode the calls in flight are marked kept: their engines have frozen them (`llm/engine_freeze.py`),
they stay open and go on after the resume, and each records the versions set meanwhile (`note_version`).
While frozen, a call's clock (the job's budget timer) is held, and so is every timeout registered with
`frozen_with_the_call` inside it (the client's stall timeout): a freeze counts as a pause, not as LLM time.
`wait_idle` returns once no call is in flight (kept ones aside), which is when the engines may be updated.

Thread-safe: state is kept under a threading lock, and waiters on other loops are woken with
`prorl_server.threadsafe`, as in `pipeline.cross_loop_semaphore`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol, TypeVar

from prorl_server.errors import ProrlError
from prorl_server.threadsafe import try_call_in_loop

T = TypeVar("T")

PauseMode = Literal["wait", "abort", "keep"]
_PRECEDENCE: dict[PauseMode, int] = {"wait": 0, "keep": 1, "abort": 2}  # a paused gate takes the strongest mode


class Paused(NamedTuple):
    """What one `WeightPauseGate.pause` did to the calls in flight."""

    waited_for: int
    aborted: int
    kept: int


class PauseClock(Protocol):
    """A clock a call stops while it waits at the gate (a job's budget timer)."""

    def hold(self) -> None: ...

    def release(self) -> None: ...


class DispatchAborted(ProrlError):
    """The call was aborted by a weight-update pause; send it again once the gate is open."""


_RUNNING: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("prorl_dispatch_ticket", default=None)


@contextlib.contextmanager
def frozen_with_the_call(timeout: asyncio.Timeout) -> Iterator[None]:
    """Within a call run by `Ticket.run`, stop `timeout` while a keep pause freezes the call, and push its
    deadline back by the time frozen after the resume; outside one, nothing."""
    ticket = _RUNNING.get()
    if ticket is None:
        yield
        return
    ticket._watch(timeout)
    try:
        yield
    finally:
        ticket._unwatch(timeout)


@dataclass(eq=False)
class Ticket:
    """One call admitted through the gate; `waited_s` is how long it was held back by a pause, `resumed_under`
    the versions set while a keep pause held it frozen."""

    gate: WeightPauseGate
    waited_s: float
    clock: PauseClock | None = None
    aborted: bool = False
    kept: bool = False
    resumed_under: list[str | int] = field(default_factory=list)
    frozen_s: float = 0.0  # seconds a keep pause held it frozen (ended freezes)
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Future | None = field(default=None, repr=False)
    _frozen_at: float | None = field(default=None, repr=False)
    _timeouts: dict[asyncio.Timeout, float | None] = field(default_factory=dict, repr=False)  # -> deadline

    def resumed(self) -> list[str | int]:
        """The versions set while a keep pause held this call frozen, in order (a copy)."""
        with self.gate._lock:
            return list(self.resumed_under)

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Await `awaitable` as a child task the gate can abort; raises DispatchAborted when it did."""
        loop = asyncio.get_running_loop()
        token = _RUNNING.set(self)
        try:
            task = asyncio.ensure_future(awaitable)  # the task runs with `self` as its ticket
        finally:
            _RUNNING.reset(token)
        with self.gate._lock:
            self.loop, self.task = loop, task
            aborted_already = self.aborted
        if aborted_already:
            task.cancel()
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.aborted and task.cancelled() and (current is None or current.cancelling() == 0):
                raise DispatchAborted("the call was aborted for a weight update") from None
            raise
        finally:
            with self.gate._lock:
                self.task = None

    # a keep pause's freeze (under the gate's lock; timeouts on the ticket's loop) ----------------------

    def _freeze_locked(self) -> None:
        self.kept, self._frozen_at = True, time.monotonic()
        if self.clock is not None:
            self.clock.hold()
        self._on_loop(self._stop_timeouts)

    def _thaw_locked(self) -> None:
        if not self.kept:
            return
        assert self._frozen_at is not None
        frozen = time.monotonic() - self._frozen_at
        self.kept, self._frozen_at = False, None
        self.frozen_s += frozen
        if self.clock is not None:
            self.clock.release()
        self._on_loop(self._restart_timeouts, frozen)

    def _on_loop(self, fn: Callable[..., object], *args: object) -> None:
        if self.loop is not None:
            try_call_in_loop(self.loop, fn, *args)  # False: its loop is closed, the call is gone anyway

    def _watch(self, timeout: asyncio.Timeout) -> None:
        with self.gate._lock:
            self._timeouts[timeout] = timeout.when()
            if self.kept:
                timeout.reschedule(None)

    def _unwatch(self, timeout: asyncio.Timeout) -> None:
        with self.gate._lock:
            self._timeouts.pop(timeout, None)

    def _stop_timeouts(self) -> None:
        with self.gate._lock:
            if not self.kept:
                return
            for timeout in self._timeouts:
                if not timeout.expired():
                    self._timeouts[timeout] = timeout.when()
                    timeout.reschedule(None)

    def _restart_timeouts(self, frozen_s: float) -> None:
        with self.gate._lock:
            if self.kept:
                return
            for timeout, deadline in self._timeouts.items():
                if deadline is not None and timeout.when() is None and not timeout.expired():
                    timeout.reschedule(deadline + frozen_s)


class WeightPauseGate:
    """Pause/resume switch and in-flight counter for backend calls, usable from any thread or loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paused = False
        self._mode: PauseMode | None = None
        self._pauses = 0
        self._in_flight: set[Ticket] = set()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._idle_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    # state ----------------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        with self._lock:
            return self._paused

    @property
    def mode(self) -> PauseMode | None:
        """The mode of the current pause, None while open."""
        with self._lock:
            return self._mode

    @property
    def pauses(self) -> int:
        """How many pauses have begun (pausing a paused gate goes on with the same one): names the current one."""
        with self._lock:
            return self._pauses

    @property
    def in_flight(self) -> int:
        """Calls admitted and not finished yet, those a keep pause froze left out."""
        with self._lock:
            return self._running_locked()

    @property
    def kept(self) -> int:
        """Calls a keep pause froze on their engines, not finished yet."""
        with self._lock:
            return len(self._in_flight) - self._running_locked()

    def _running_locked(self) -> int:
        return sum(not t.kept for t in self._in_flight)

    @property
    def waiting(self) -> int:
        """Calls held back by the pause."""
        with self._lock:
            return len(self._waiters)

    # callers ---------------------------------------------------------------------------------------

    async def enter(self, clock: PauseClock | None = None) -> Ticket:
        """Wait while paused, then count the call as in flight; pair with `exit(ticket)`. `clock` is held
        while the call waits."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        holding = False
        try:
            while True:
                with self._lock:
                    if not self._paused:
                        ticket = Ticket(self, waited_s=time.monotonic() - started, clock=clock)
                        self._in_flight.add(ticket)
                        return ticket
                    future: asyncio.Future[None] = loop.create_future()
                    self._waiters.append((loop, future))
                if clock is not None and not holding:
                    clock.hold()
                    holding = True
                try:
                    await future
                finally:
                    with self._lock, contextlib.suppress(ValueError):
                        self._waiters.remove((loop, future))
        finally:
            if holding:
                clock.release()  # type: ignore[union-attr]

    def exit(self, ticket: Ticket) -> None:
        """The call is over (any outcome)."""
        with self._lock:
            ticket._thaw_locked()
            self._in_flight.discard(ticket)
            if self._running_locked():
                return
            idle, self._idle_waiters = self._idle_waiters, []
        _wake(idle)

    # the trainer's side --------------------------------------------------------------------------------

    def pause(self, mode: PauseMode = "wait") -> Paused:
        """Stop dispatching; with "abort", cancel the calls in flight; with "keep", mark them kept (the caller
        has frozen their engines). Idempotent: pausing a paused gate again keeps it paused, in the stronger of
        the two modes (abort, then keep, then wait); an "abort" pause then aborts what is still in flight,
        kept calls included."""
        with self._lock:
            if not self._paused:
                self._paused = True
                self._pauses += 1
            if self._mode is None or _PRECEDENCE[mode] > _PRECEDENCE[self._mode]:
                self._mode = mode
            if mode == "wait":
                return Paused(self._running_locked(), 0, 0)
            if mode == "keep":
                fresh = [t for t in self._in_flight if not t.kept and not t.aborted]
                for ticket in fresh:
                    ticket._freeze_locked()
                return Paused(0, 0, len(fresh))
            return Paused(0, sum(self._abort_locked(ticket) for ticket in list(self._in_flight)), 0)

    def note_version(self, version: str | int) -> int:
        """A weight version was set while paused: every kept call will go on under it. Returns their count."""
        with self._lock:
            kept = [t for t in self._in_flight if t.kept]
            for ticket in kept:
                ticket.resumed_under.append(version)
            return len(kept)

    def abort(self, ticket: Ticket) -> bool:
        """Abort one call in flight, as an "abort" pause does: its `Ticket.run` raises DispatchAborted and
        the session sends it again. False when it was aborted already."""
        with self._lock:
            return self._abort_locked(ticket)

    def _abort_locked(self, ticket: Ticket) -> bool:
        if ticket.aborted:
            return False
        ticket._thaw_locked()
        ticket.aborted = True
        if ticket.task is not None and ticket.loop is not None:
            try_call_in_loop(ticket.loop, ticket.task.cancel)  # False: its loop is closed, the call is gone anyway
        return True

    def resume(self) -> bool:
        """Dispatch again (kept calls run on); False when the gate was not paused."""
        with self._lock:
            if not self._paused:
                return False
            self._paused, self._mode = False, None
            for ticket in self._in_flight:
                ticket._thaw_locked()
            waiters, self._waiters = self._waiters, []
        _wake(waiters)
        return True

    async def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Return True once no call is in flight (kept ones aside), False when `timeout_s` passed first."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._running_locked():
                return True
            future: asyncio.Future[None] = loop.create_future()
            self._idle_waiters.append((loop, future))
        try:
            await asyncio.wait_for(asyncio.shield(future), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._idle_waiters.remove((loop, future))


def _wake(waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]]) -> None:
    for loop, future in waiters:
        try_call_in_loop(loop, _set_done, future)  # False: that loop is closed


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
