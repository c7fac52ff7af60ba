"""PausableTimer: a job's timeout budget that counts stage time only, never queue time."""

from __future__ import annotations

import threading
import time


class PausableTimer:
    """Accumulates time only while a stage is running, and not while the stage is held.

    `start(stage)` resumes the clock, `pause()` stops it and books the interval to that stage. `hold()` and
    `release()` (nesting) stop and restart the clock inside a stage: a stage's LLM calls hold it while they
    wait at a weight-update pause, so a trainer's update never uses up a job's budget. Held time is kept
    apart (`held_s`). Thread-safe: stages run on different threads.
    """

    def __init__(self, budget_s: float | None, clock=time.monotonic) -> None:
        self.budget_s = budget_s
        self._clock = clock
        self._lock = threading.Lock()
        self._created = clock()
        self._stage: str | None = None
        self._started_at = 0.0
        self._booked: dict[str, float] = {}
        self._holds = 0
        self._held_since = 0.0
        self._held_s = 0.0

    def start(self, stage: str) -> None:
        """Resume counting, booking time to `stage`."""
        with self._lock:
            self._book_locked()
            self._stage = stage
            self._started_at = self._clock()

    def pause(self) -> None:
        """Stop counting; a no-op when already paused."""
        with self._lock:
            self._book_locked()
            self._stage = None

    def hold(self) -> None:
        """Stop counting until the matching `release()` (the stage goes on)."""
        with self._lock:
            if self._holds == 0:
                self._book_locked()
                self._held_since = self._clock()
            self._holds += 1

    def release(self) -> None:
        """End one `hold()`; the clock runs again when none is left."""
        with self._lock:
            if self._holds == 0:
                return
            self._holds -= 1
            if self._holds == 0:
                now = self._clock()
                self._held_s += now - self._held_since
                self._started_at = now

    @property
    def held(self) -> bool:
        """Whether a hold stops the clock now."""
        with self._lock:
            return self._holds > 0

    @property
    def held_s(self) -> float:
        """Seconds spent held so far (the current hold included)."""
        with self._lock:
            return self._held_s + (self._clock() - self._held_since if self._holds else 0.0)

    def _book_locked(self) -> None:
        if self._stage is None or self._holds:
            return
        now = self._clock()
        self._booked[self._stage] = self._booked.get(self._stage, 0.0) + now - self._started_at
        self._started_at = now

    def _running_locked(self) -> float:
        return self._clock() - self._started_at if self._stage is not None and not self._holds else 0.0

    @property
    def active_s(self) -> float:
        """Seconds spent inside stages so far, including the running one, held time excluded."""
        with self._lock:
            return sum(self._booked.values()) + self._running_locked()

    def remaining(self) -> float | None:
        """Seconds left in the budget (never negative), or None without a budget."""
        if self.budget_s is None:
            return None
        return max(0.0, self.budget_s - self.active_s)

    def overdue_s(self) -> float:
        """Seconds of stage time past the budget (0 within it or without one)."""
        if self.budget_s is None:
            return 0.0
        return max(0.0, self.active_s - self.budget_s)

    def stage_seconds(self, stage: str) -> float:
        """Seconds booked to one stage (the running interval included, held time excluded)."""
        with self._lock:
            booked = self._booked.get(stage, 0.0)
            if self._stage == stage:
                booked += self._running_locked()
            return booked

    def wall_s(self) -> float:
        """Seconds since the timer was created (queues included)."""
        return self._clock() - self._created
