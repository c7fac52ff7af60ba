"""DispatchGate: holds LLM calls back while the trainer updates the policy's weights.

Every backend request of an LLMSession passes the gate (`enter`, then `Ticket.run`, then `exit`). While
the gate is paused no call is dispatched: `enter` waits (on whatever event loop the caller runs: each
stage pool has its own) until `resume`. A pause in "wait" mode lets calls already in flight finish; in
"abort" mode it cancels them at once (closing the HTTP request, so the engine aborts it) and their
`Ticket.run` raises DispatchAborted, which tells the session to send the call again after the resume.
`wait_idle` returns once no call is in flight, which is when the engines may be updated.

Thread-safe: state is kept under a threading lock, and waiters on other loops are woken with
`call_soon_threadsafe`, as in `pipeline.cross_loop_semaphore`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

T = TypeVar("T")

PauseMode = Literal["wait", "abort"]


class PauseClock(Protocol):
    """A clock a call stops while it waits at the gate (a job's budget timer)."""

    def hold(self) -> None: ...

    def release(self) -> None: ...


class DispatchAborted(Exception):
    """The call was aborted by a weight-update pause; send it again once the gate is open."""


@dataclass(eq=False)
class Ticket:
    """One call admitted through the gate; `waited_s` is how long it was held back by a pause."""

    gate: DispatchGate
    waited_s: float
    aborted: bool = False
    loop: asyncio.AbstractEventLoop | None = None
    task: asyncio.Future | None = field(default=None, repr=False)

    async def run(self, awaitable: Awaitable[T]) -> T:
        """Await `awaitable` as a child task the gate can abort; raises DispatchAborted when it did."""
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(awaitable)
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


class DispatchGate:
    """Pause/resume switch and in-flight counter for backend calls, usable from any thread or loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._paused = False
        self._mode: PauseMode | None = None
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
    def in_flight(self) -> int:
        """Calls admitted and not finished yet."""
        with self._lock:
            return len(self._in_flight)

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
                        ticket = Ticket(self, waited_s=time.monotonic() - started)
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
            self._in_flight.discard(ticket)
            if self._in_flight:
                return
            idle, self._idle_waiters = self._idle_waiters, []
        _wake(idle)

    # the trainer's side --------------------------------------------------------------------------------

    def pause(self, mode: PauseMode = "wait") -> tuple[int, int]:
        """Stop dispatching; with "abort", cancel the calls in flight. Idempotent: pausing a paused gate
        again keeps it paused (an "abort" pause then aborts what is still in flight).

        Returns (calls in flight that were left to finish, calls aborted)."""
        with self._lock:
            self._paused = True
            if mode == "abort" or self._mode is None:
                self._mode = mode
            if mode == "wait":
                return len(self._in_flight), 0
            return 0, sum(self._abort_locked(ticket) for ticket in list(self._in_flight))

    def abort(self, ticket: Ticket) -> bool:
        """Abort one call in flight, as an "abort" pause does: its `Ticket.run` raises DispatchAborted and
        the session sends it again. False when it was aborted already."""
        with self._lock:
            return self._abort_locked(ticket)

    def _abort_locked(self, ticket: Ticket) -> bool:
        if ticket.aborted:
            return False
        ticket.aborted = True
        if ticket.task is not None and ticket.loop is not None:
            with contextlib.suppress(RuntimeError):  # its loop is closed: the call is gone anyway
                ticket.loop.call_soon_threadsafe(ticket.task.cancel)
        return True

    def resume(self) -> bool:
        """Dispatch again; False when the gate was not paused."""
        with self._lock:
            if not self._paused:
                return False
            self._paused, self._mode = False, None
            waiters, self._waiters = self._waiters, []
        _wake(waiters)
        return True

    async def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Return True once no call is in flight, False when `timeout_s` passed first."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._in_flight:
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
        with contextlib.suppress(RuntimeError):  # that loop is closed
            loop.call_soon_threadsafe(_set_done, future)


def _set_done(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
