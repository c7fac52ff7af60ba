"""Per-token decode latency as a function of the running batch size: piecewise linear over measured points.

Written `batch:seconds,batch:seconds,...` (e.g. `1:0.020,8:0.024,32:0.035`), or read from a profile file. Between two points the time
is interpolated linearly; below the first point it is the first point's time; past the last point the last
segment is extended (a single point is a constant).

The LLM simulator's timing model (simllm/) and the server's default interference profile (config.py,
llm/placement.py) both read it from here, so the server never imports the simulator.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from prorl_server.scheduling.profile_file import read_profile_file

MAX_POINTS = 256

# Shaped like a 7B model in 16-bit on one A100/H100-class GPU under vLLM: decode is memory-bound at small
# batches (the time barely grows from 1 to 8), then grows with the batch as compute and KV reads add up.
# An assumption, not a measurement: pass a profile measured on your own engine (e.g. vLLM's latency
# benchmark at several batch sizes), as Heddle's simulator is fed by its profiler.
DEFAULT_PROFILE = "1:0.020,8:0.024,32:0.035,64:0.055,128:0.095"


@dataclass(frozen=True)
class LatencyProfile:
    """Seconds per decode step by batch size."""

    points: tuple[tuple[int, float], ...]

    @classmethod
    def parse(cls, text: str) -> LatencyProfile:
        """`1:0.02,8:0.024,...`; batch sizes strictly increasing integers >= 1, seconds finite and > 0."""
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise ValueError("a latency profile needs at least one batch:seconds point")
        if len(items) > MAX_POINTS:
            raise ValueError(f"a latency profile has at most {MAX_POINTS} points, got {len(items)}")
        points: list[tuple[int, float]] = []
        for item in items:
            batch_text, sep, seconds_text = item.partition(":")
            try:
                batch, seconds = int(batch_text), float(seconds_text)
            except ValueError:
                raise ValueError(f"latency profile point {item!r} is not batch:seconds (e.g. 8:0.024)") from None
            if not sep or batch < 1 or not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"latency profile point {item!r}: batch >= 1 and seconds > 0 expected")
            if points and batch <= points[-1][0]:
                raise ValueError(f"latency profile batch sizes must increase: {batch} after {points[-1][0]}")
            points.append((batch, seconds))
        return cls(tuple(points))

    @classmethod
    def from_file(cls, path: str) -> LatencyProfile:
        """The points of a profile file (`scheduling/profile_file.py`, as `prorl-server profile-backend` writes)."""
        return cls(read_profile_file(path).points)

    def __str__(self) -> str:
        return ",".join(f"{batch}:{seconds:g}" for batch, seconds in self.points)

    def seconds_per_token(self, batch_size: int) -> float:
        """The time of one decode step with `batch_size` running requests."""
        points = self.points
        if len(points) == 1 or batch_size <= points[0][0]:
            return points[0][1]
        i = min(bisect.bisect_left([b for b, _ in points], batch_size), len(points) - 1)
        (b0, s0), (b1, s1) = points[i - 1], points[i]
        return max(0.0, s0 + (s1 - s0) * (batch_size - b0) / (b1 - b0))
