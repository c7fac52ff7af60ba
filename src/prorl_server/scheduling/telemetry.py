"""Per-trajectory telemetry: where a live trajectory's time goes (Heddle's runtime telemetry, section 3).

One `TrajectoryTelemetry` per job, owned by its LLM session: LLM time and admission-queue time of each
completion call, and tool time, the time from one call's answer to the next call (the handler's and its tools'
work between turns). Weight-update pauses are left out of all three (they are the result's `weight_pause_s`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TelemetrySnapshot:
    """Totals so far: answered completion calls, seconds generating, waiting for admission, between calls."""

    turns: int = 0
    llm_s: float = 0.0
    llm_queue_s: float = 0.0
    tool_s: float = 0.0


class TrajectoryTelemetry:
    """Accumulates one trajectory's call and tool times (thread-safe; `clock` is monotonic seconds)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._totals = TelemetrySnapshot()
        self._answered_at: float | None = None  # when the last call answered, until the next call starts

    def call_started(self) -> None:
        """A completion call starts: the time since the previous answer was tool time."""
        now = self._clock()
        with self._lock:
            if self._answered_at is not None:
                t = self._totals
                self._totals = TelemetrySnapshot(t.turns, t.llm_s, t.llm_queue_s, t.tool_s + now - self._answered_at)
                self._answered_at = None

    def call_ended(self, llm_s: float, queue_s: float, answered: bool) -> None:
        """A completion call ended after `llm_s` seconds at backends and `queue_s` waiting for admission;
        `answered` when it produced a turn (tool time runs from then)."""
        with self._lock:
            t = self._totals
            self._totals = TelemetrySnapshot(t.turns + answered, t.llm_s + llm_s, t.llm_queue_s + queue_s, t.tool_s)
            if answered:
                self._answered_at = self._clock()

    def snapshot(self) -> TelemetrySnapshot:
        """The totals so far."""
        with self._lock:
            return self._totals
