"""PausableTimer: a job's timeout budget that counts stage time only, never queue time."""

from __future__ import annotations

import threading
import time


class PausableTimer:
    """Accumulates time only while a stage is running.

    `start(stage)` resumes the clock, `pause()` stops it and books the interval to that stage.
    Thread-safe: stages run on different threads.
    """

    def __init__(self, budget_s: float | None, clock=time.monotonic) -> None:
        self.budget_s = budget_s
        self._clock = clock
        self._lock = threading.Lock()
        self._created = clock()
        self._stage: str | None = None
        self._started_at = 0.0
        self._booked: dict[str, float] = {}

    def start(self, stage: str) -> None:
        """Resume counting, booking time to `stage`."""
        with self._lock:
            if self._stage is not None:
                self._book_locked()
            self._stage = stage
            self._started_at = self._clock()

    def pause(self) -> None:
        """Stop counting; a no-op when already paused."""
        with self._lock:
            if self._stage is not None:
                self._book_locked()
                self._stage = None

    def _book_locked(self) -> None:
        assert self._stage is not None
        now = self._clock()
        self._booked[self._stage] = self._booked.get(self._stage, 0.0) + now - self._started_at
        self._started_at = now

    @property
    def active_s(self) -> float:
        """Seconds spent inside stages so far, including the running one."""
        with self._lock:
            running = self._clock() - self._started_at if self._stage is not None else 0.0
            return sum(self._booked.values()) + running

    def remaining(self) -> float | None:
        """Seconds left in the budget (never negative), or None without a budget."""
        if self.budget_s is None:
            return None
        return max(0.0, self.budget_s - self.active_s)

    def stage_seconds(self, stage: str) -> float:
        """Seconds booked to one stage (the running interval included)."""
        with self._lock:
            booked = self._booked.get(stage, 0.0)
            if self._stage == stage:
                booked += self._clock() - self._started_at
            return booked

    def wall_s(self) -> float:
        """Seconds since the timer was created (queues included)."""
        return self._clock() - self._created
