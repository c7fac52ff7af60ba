"""AdmissionGate: at most `limit` LLM completions in flight on one backend; the rest wait in priority order.

A call asks for a slot with its priority (lower = sooner, from the dispatch policy); it is admitted at once
while a slot is free and nobody waits, else it waits and slots go to waiters in (priority, arrival) order.
A slot moves through explicit states: WAITING -> ADMITTED -> RELEASED, or WAITING -> LEFT when its call was
cancelled while waiting (a job cancel or timeout, a stop, a weight-update abort). A slot granted to a call
that was being cancelled at that moment is handed on to the next waiter, so no cancellation keeps a slot.

Thread-safe and usable from any event loop: waiters are woken with `try_call_in_loop`, as in
`weight_pause_gate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
from dataclasses import dataclass, field
from enum import StrEnum

from prorl_server.threadsafe import try_call_in_loop


class SlotState(StrEnum):
    """Where a call is at the gate."""

    WAITING = "waiting"
    ADMITTED = "admitted"
    RELEASED = "released"
    LEFT = "left"


@dataclass(eq=False)
class Slot:
    """One call's place at the gate; `waited_s` is how long it waited for admission."""

    priority: int
    seq: int
    state: SlotState
    waited_s: float = 0.0
    loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    future: asyncio.Future[None] | None = field(default=None, repr=False)

    def __lt__(self, other: Slot) -> bool:
        return (self.priority, self.seq) < (other.priority, other.seq)


class AdmissionGate:
    """Per-backend admission: `limit` slots, waiters ordered by priority then arrival."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"an admission gate needs at least one slot, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._admitted = 0
        self._waiting: list[Slot] = []  # a heap

    @property
    def admitted(self) -> int:
        """Calls holding a slot."""
        with self._lock:
            return self._admitted

    @property
    def waiting(self) -> int:
        """Calls waiting for a slot."""
        with self._lock:
            return len(self._waiting)

    async def admit(self, priority: int) -> Slot:
        """Wait for a slot; pair with `release(slot)`. A cancelled wait leaves the gate (CancelledError)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        with self._lock:
            slot = Slot(priority, next(self._seq), SlotState.WAITING)
            if self._admitted < self.limit and not self._waiting:
                slot.state = SlotState.ADMITTED
                self._admitted += 1
                return slot
            slot.loop, slot.future = loop, loop.create_future()
            heapq.heappush(self._waiting, slot)
        try:
            await slot.future
        except asyncio.CancelledError:
            with self._lock:
                if slot.state is SlotState.WAITING:
                    slot.state = SlotState.LEFT
                    self._waiting.remove(slot)
                    heapq.heapify(self._waiting)
                    raise
            self.release(slot)  # granted as it was being cancelled: hand the slot on
            raise
        slot.waited_s = loop.time() - started
        return slot

    def release(self, slot: Slot) -> None:
        """The call of an admitted slot is over (any outcome; idempotent): its slot goes to the next waiter."""
        with self._lock:
            if slot.state is not SlotState.ADMITTED:
                return
            slot.state = SlotState.RELEASED
            self._admitted -= 1
            granted = self._grant_locked()
        if granted is not None:
            self._wake(granted)

    def _grant_locked(self) -> Slot | None:
        if self._admitted >= self.limit or not self._waiting:
            return None
        slot = heapq.heappop(self._waiting)
        slot.state = SlotState.ADMITTED
        self._admitted += 1
        return slot

    def _wake(self, slot: Slot) -> None:
        assert slot.loop is not None and slot.future is not None
        if not try_call_in_loop(slot.loop, _set_done, slot.future):  # its loop is closed: the call is gone
            self.release(slot)  # its slot goes on


def _set_done(future: asyncio.Future[None]) -> None:
    with contextlib.suppress(asyncio.InvalidStateError):
        if not future.done():
            future.set_result(None)
