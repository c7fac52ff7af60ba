"""A circuit breaker per backend: how many requests may fail before it leaves placement, and how it returns.

    CLOSED    --`threshold` consecutive failed requests-->                 OPEN (cooldown = base)
    OPEN      --cooldown elapsed and a health check passes-->              HALF_OPEN
    HALF_OPEN --its one trial request succeeds-->                          CLOSED (cooldown back to base)
    HALF_OPEN --its trial fails-->                                         OPEN (cooldown doubled, capped)

A successful request in CLOSED resets the count. A passing health check never closes the circuit by itself:
a backend whose `/health` answers while its completions fail gets one trial request at a time, and each
failed trial keeps it out longer, so it does not flap back into full rotation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum


class CircuitState(StrEnum):
    """Whether a backend takes requests: all (closed), none (open), or one trial at a time (half open)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Failure counting and state of one backend. Not thread-safe: the pool calls it under its lock."""

    def __init__(
        self,
        threshold: int = 3,
        cooldown_s: float = 5.0,
        max_cooldown_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = threshold
        self.base_cooldown_s = cooldown_s
        self.max_cooldown_s = max(max_cooldown_s, cooldown_s)
        self.clock = clock
        self.state = CircuitState.CLOSED
        self.consecutive_failures = 0
        self.cooldown_s = cooldown_s
        self.opened_at = 0.0
        self.trial_in_flight = False

    def admits_request(self) -> bool:
        """True when a request may be sent now: CLOSED, or HALF_OPEN with no trial under way."""
        return self.state is CircuitState.CLOSED or (self.state is CircuitState.HALF_OPEN and not self.trial_in_flight)

    def start_request(self) -> bool:
        """Note a request that `admits_request` allowed; returns True when it is the HALF_OPEN trial."""
        if self.state is CircuitState.HALF_OPEN:
            self.trial_in_flight = True
            return True
        return False

    def record_success(self, trial: bool) -> CircuitState:
        """A request was answered (a 4xx counts: the backend works). Returns the state before."""
        before = self.state
        if before is CircuitState.CLOSED or trial:
            self.state = CircuitState.CLOSED
            self.consecutive_failures = 0
            self.cooldown_s = self.base_cooldown_s
            self.trial_in_flight = False
        return before

    def record_failure(self, trial: bool) -> bool:
        """A request failed; returns True when this failure opened the circuit."""
        self.consecutive_failures += 1
        if trial:
            self.trial_in_flight = False
            self._open(min(self.cooldown_s * 2, self.max_cooldown_s))
            return True
        if self.state is CircuitState.CLOSED and self.consecutive_failures >= self.threshold:
            self._open(self.base_cooldown_s)
            return True
        return False

    def abandon_trial(self) -> None:
        """The trial request ended without a verdict (cancelled): the next request may try again."""
        self.trial_in_flight = False

    def health_passed(self) -> bool:
        """A health check passed; an OPEN circuit whose cooldown is over goes HALF_OPEN (returns True then)."""
        if self.state is CircuitState.OPEN and self.seconds_until_trial() <= 0:
            self.state = CircuitState.HALF_OPEN
            self.trial_in_flight = False
            return True
        return False

    def seconds_until_trial(self) -> float:
        """Seconds left of an OPEN circuit's cooldown (0 when over or not OPEN)."""
        if self.state is not CircuitState.OPEN:
            return 0.0
        return max(0.0, self.opened_at + self.cooldown_s - self.clock())

    def _open(self, cooldown_s: float) -> None:
        self.state = CircuitState.OPEN
        self.cooldown_s = cooldown_s
        self.opened_at = self.clock()
