"""Failover: how one LLM call gets through failing backends, as a small state machine.

One pass (`Failover._pass`) takes a call through the weight-pause gate to a backend and back:

    GATE  wait while a weight update pauses dispatching (the wait is added to the retry budget)
    PLACE lease the job's backend  -> no backend placeable: WAIT (or give up when the budget is spent)
    SEND  back off (again on a backend it failed on), wait for an admission slot, send
          -> answered, or refused (the backend works, the request is wrong): DONE
          -> aborted by a pause: RETRY at once (no verdict on the backend)
          -> backend failure: RETRY (or give up past `max_failovers` failures or the budget)

and says what comes next (`Next`): the call is done, is sent again, or waits outside the gate for a backend.
The time it may spend retrying is a `retry.RetryBudget`, as for the judge's retry (`judge.py`).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from prorl_server.llm.backend import Backend
from prorl_server.llm.backend_pool import BackendPool, Lease
from prorl_server.llm.errors import BackendRequestError, BackendUnavailable, NoBackendAvailable
from prorl_server.llm.retry import RetryBudget
from prorl_server.llm.weight_pause_gate import DispatchAborted, PauseClock, Ticket

T = TypeVar("T")


@dataclass(slots=True)
class CallClock:
    """Seconds one call spent waiting for an admission slot and at weight-update pauses, and the versions a
    keep pause resumed its answered request under."""

    queue_s: float = 0.0
    pause_s: float = 0.0
    resumed_under: list[str | int] = field(default_factory=list)


class Next(enum.Enum):
    """What a pass through the gate leads to."""

    DONE = "done"  # answered (the result is in the outcome)
    RETRY = "retry"  # send again now: a backend failed, or a pause aborted the call
    WAIT = "wait"  # no backend placeable: sleep outside the gate, then try again


@dataclass(slots=True)
class Outcome(Generic[T]):
    next: Next
    result: T | None = None
    backend: Backend | None = None
    delay_s: float = 0.0


@dataclass(slots=True)
class _Tries:
    """What a call met so far: its failed requests (and where), and its waits for a placeable backend."""

    failures: list[str] = field(default_factory=list)
    failed_on: set[str] = field(default_factory=set)
    waits: int = 0


class Failover:
    """Runs one job's calls on the pool's backends: a call whose backend fails (unreachable, server error,
    stalled, malformed answer) is retried with backoff, on another backend when there is one, for at most
    `max_failovers` failed requests and the pool's retry budget; while no backend can take it, it waits
    within the same budget. `acquire(avoid, ticket)` leases the job's backend (LLMSession's, which refuses
    once the session ended); `pause_clock` (the job's budget timer) is held while a call waits at a pause.
    """

    def __init__(
        self,
        pool: BackendPool,
        acquire: Callable[[Collection[str], Ticket], Lease],
        *,
        max_failovers: int,
        pause_clock: PauseClock | None = None,
    ) -> None:
        self.pool = pool
        self.acquire = acquire
        self.max_failovers = max_failovers
        self.pause_clock = pause_clock

    async def run(
        self, call: Callable[[Backend], Awaitable[T]], priority: int | None = None, clock: CallClock | None = None
    ) -> tuple[T, Backend]:
        """Run `call` on the job's backend, failing over as the class docstring says; the result and the
        backend that answered.

        Each attempt passes the pool's weight-pause gate: while the trainer has paused dispatching for a
        weight update the attempt waits there, and that wait neither spends the retry budget nor counts as a
        failure; an attempt the pause aborted is sent again after the resume (nothing of it is kept). With a
        `priority` (completions), the attempt then waits for its backend's admission slot, if the pool limits
        calls in flight; `clock` adds up both waits."""
        budget = RetryBudget(self.pool.retry, asyncio.get_running_loop().time)
        tries = _Tries()
        while True:
            outcome = await self._pass(call, budget, tries, priority, clock)
            if outcome.next is Next.DONE:
                assert outcome.backend is not None
                return outcome.result, outcome.backend  # type: ignore[return-value]
            if outcome.next is Next.WAIT:
                await asyncio.sleep(outcome.delay_s)  # no backend placeable: wait outside the gate

    async def _pass(
        self,
        call: Callable[[Backend], Awaitable[T]],
        budget: RetryBudget,
        tries: _Tries,
        priority: int | None,
        clock: CallClock | None,
    ) -> Outcome[T]:
        """GATE -> PLACE -> SEND once; raises when the call gives up."""
        gate = self.pool.gate
        ticket = await gate.enter(self.pause_clock)
        budget.extend(ticket.waited_s)
        if clock is not None:
            clock.pause_s += ticket.waited_s
        try:
            try:
                lease = self.acquire(tries.failed_on, ticket)
            except NoBackendAvailable as exc:
                delay = min(budget.delay_s(tries.waits), budget.left())
                if delay <= 0:
                    raise NoBackendAvailable(
                        f"no LLM backend could take the call within the {budget.policy.budget_s:g}s retry budget: "
                        f"{exc}" + (f"; earlier failures: {'; '.join(tries.failures)}" if tries.failures else "")
                    ) from None
                tries.waits += 1
                return Outcome(Next.WAIT, delay_s=delay)
            return await self._send(lease, ticket, call, budget, tries, priority, clock)
        finally:
            self.pool.done(ticket)
            gate.exit(ticket)

    async def _send(
        self,
        lease: Lease,
        ticket: Ticket,
        call: Callable[[Backend], Awaitable[T]],
        budget: RetryBudget,
        tries: _Tries,
        priority: int | None,
        clock: CallClock | None,
    ) -> Outcome[T]:
        """SEND on the leased backend, and the verdict on it."""
        backend = lease.backend
        backoff = 0.0
        if backend.address in tries.failed_on:  # back again where this call failed: back off first
            backoff = min(budget.delay_s(len(tries.failures) - 1), max(0.0, budget.left()))
        try:
            result = await ticket.run(self._attempt(backend, call, backoff, priority, clock))
            if clock is not None:
                clock.resumed_under = ticket.resumed()
                clock.pause_s += ticket.frozen_s
        except DispatchAborted:
            self.pool.abandoned(lease)  # no verdict on the backend: the trainer stopped the call
            return Outcome(Next.RETRY)
        except BackendUnavailable as exc:
            self.pool.failed(lease, str(exc))
            tries.failures.append(f"{backend.address}: {exc}")
            tries.failed_on.add(backend.address)
            if len(tries.failures) > self.max_failovers or budget.spent():
                raise type(exc)(
                    f"LLM call failed after {len(tries.failures)} failed request(s) in "
                    f"{budget.elapsed():.1f}s: " + "; ".join(tries.failures)
                ) from exc
            return Outcome(Next.RETRY)
        except BackendRequestError:
            self.pool.succeeded(lease)  # the backend works; the request was wrong
            raise
        except BaseException:
            self.pool.abandoned(lease)
            raise
        self.pool.succeeded(lease)
        return Outcome(Next.DONE, result, backend)

    async def _attempt(
        self,
        backend: Backend,
        call: Callable[[Backend], Awaitable[T]],
        backoff_s: float,
        priority: int | None,
        clock: CallClock | None,
    ) -> T:
        """One request: back off, wait for an admission slot (a cancelled wait leaves the gate), send it; its
        slot is released however it ends."""
        if backoff_s > 0:
            await asyncio.sleep(backoff_s)
        admission = self.pool.admission(backend) if priority is not None else None
        if admission is None or priority is None:
            await self.pool.resolve_model(backend)
            return await call(backend)
        slot = await admission.admit(priority)
        if clock is not None:
            clock.queue_s += slot.waited_s
        try:
            await self.pool.resolve_model(backend)
            return await call(backend)
        finally:
            admission.release(slot)
