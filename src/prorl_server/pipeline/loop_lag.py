"""How late an event loop runs what is due on it: its lag, sampled every PROBE_S and kept as a histogram.

A loop that runs a callback 30 ms after it was due made every coroutine on it wait about as long (a reply
to a backend read late, a tool result handed on late). The stage loops sample it from their heartbeat
(`LoopThread`), the API loop from a task of the app's lifespan (`probe`); `GET /metrics` shows both as
`prorl_event_loop_lag_seconds{loop}`.
"""

from __future__ import annotations

import asyncio
import bisect
import threading
import time

PROBE_S = 0.05
"""Seconds between two samples of a loop's lag."""

BOUNDS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Upper bounds of the histogram's buckets, in seconds (one more bucket holds what lies above)."""


class LoopLag:
    """Counts of lag samples by bucket, and their sum; written by the loop's thread, read by any."""

    def __init__(self) -> None:
        self.bounds = BOUNDS_S
        self._counts = [0] * (len(BOUNDS_S) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def record(self, lag_s: float) -> None:
        """One sample: the loop ran a callback `lag_s` seconds after it was due."""
        lag_s = max(0.0, lag_s)
        with self._lock:
            self._counts[bisect.bisect_left(self.bounds, lag_s)] += 1
            self._sum += lag_s

    @property
    def counts(self) -> tuple[int, ...]:
        """Samples per bucket (`counts[i]`: above `bounds[i - 1]` and at most `bounds[i]`; the last: above all)."""
        with self._lock:
            return tuple(self._counts)

    @property
    def sum(self) -> float:
        """The sum of every sample, in seconds."""
        return self._sum


async def probe(lag: LoopLag) -> None:
    """Sample the running loop's lag into `lag` every PROBE_S until cancelled."""
    while True:
        due = time.monotonic() + PROBE_S
        await asyncio.sleep(PROBE_S)
        lag.record(time.monotonic() - due)
