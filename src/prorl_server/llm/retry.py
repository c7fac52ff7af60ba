"""How long and how often an LLM call retries while its backends fail or none can take it."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """A call retries for at most `budget_s`; waits grow exponentially from `base_delay_s` to `max_delay_s`."""

    budget_s: float = 120.0
    base_delay_s: float = 0.1
    max_delay_s: float = 2.0

    def delay_s(self, attempt: int) -> float:
        """The wait before retry number `attempt` (from 0): half fixed, half random, so the retries of
        many jobs that failed together spread out."""
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** min(attempt, 30))
        return ceiling / 2 + random.uniform(0, ceiling / 2)


class RetryBudget:
    """The time a call may retry: `policy.budget_s` from its start, plus the time that does not count (waits
    at a weight-update pause, queueing for a slot: `extend`). `clock` gives seconds (monotonic)."""

    def __init__(self, policy: RetryPolicy, clock: Callable[[], float] | None = None) -> None:
        self.policy = policy
        self.clock = clock or time.monotonic
        self.started = self.clock()
        self.deadline = self.started + policy.budget_s

    def extend(self, seconds: float) -> None:
        """`seconds` the call waited without spending its budget."""
        self.deadline += seconds

    def left(self) -> float:
        """Seconds left (negative once spent)."""
        return self.deadline - self.clock()

    def spent(self) -> bool:
        return self.clock() >= self.deadline

    def elapsed(self) -> float:
        """Seconds since the call started (waits included)."""
        return self.clock() - self.started

    def delay_s(self, attempt: int) -> float:
        """The policy's backoff before retry number `attempt` (from 0)."""
        return self.policy.delay_s(attempt)
