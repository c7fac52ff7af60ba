"""Per-token time as a function of batch size: the interference factor of Heddle section 5.2.

Heddle profiles per-token time across batch sizes and derives the interference of a group from it. A
`Profile` is built from measured (batch_size, seconds_per_token) points and interpolates linearly between
them; below the smallest batch size it keeps the first point's time, past the largest it extends the last
segment's slope (a single point gives a constant). `seconds_per_token(n)` is then the time a trajectory
sharing a backend with n - 1 others spends per generated token.

A backend runs at most so many requests at once (vLLM's `max_num_seqs`, or the server's per-backend
admission limit); past that limit C the extra requests wait their turn, so n > C trajectories share C
slots: each then gets C / n of a slot, and its per-token time is I(C) * n / C (`with_batch_limit`).

How long a group of trajectories takes on one backend (`group_seconds`, the placement's group time): Heddle's
formula 2 charges I(n) for the whole length of the group's longest, as if all n ran to its end. They do not:
all start together and each leaves when it is done, so the longest runs at I(n) while all n run, then at
I(n - 1) once the shortest left, and so on; with the lengths sorted longest first l_1 >= ... >= l_n,

    T(G) = sum over k of I(k) * (l_k - l_(k+1)) = sum over k of l_k * (I(k) - I(k - 1))      (I(0) = 0)

(the group "drains"). It is never more than I(n) * l_1 and only falls when a member gets shorter or is left
out (with a non-decreasing profile), which is what the placement DP needs (`partition.py`).
`interference_steps` gives the increments I(k) - I(k - 1) as runs of equal value (a piecewise-linear profile
has a handful), so a group time is a few slice sums.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise


@dataclass(frozen=True, slots=True)
class Profile:
    """Piecewise-linear per-token time over batch size, from measured points."""

    batch_sizes: tuple[float, ...]
    seconds: tuple[float, ...]
    batch_limit: int | None = None  # most requests running at once; more wait (module docstring)

    @classmethod
    def from_points(cls, points: Iterable[tuple[float, float]]) -> Profile:
        """A profile through (batch_size, seconds_per_token) points, in any order, batch sizes distinct."""
        ordered = sorted(points)
        if not ordered:
            raise ValueError("a profile needs at least one (batch_size, seconds_per_token) point")
        sizes = tuple(float(size) for size, _ in ordered)
        seconds = tuple(float(s) for _, s in ordered)
        if sizes[0] <= 0 or any(s <= 0 for s in seconds):
            raise ValueError(f"batch sizes and seconds per token must be positive, got {ordered}")
        if len(set(sizes)) != len(sizes):
            raise ValueError(f"a profile's batch sizes must be distinct, got {list(sizes)}")
        return cls(sizes, seconds)

    def with_batch_limit(self, limit: int | None) -> Profile:
        """This profile on a backend that runs at most `limit` requests at once (None: no limit)."""
        if limit is not None and limit < 1:
            raise ValueError(f"a batch limit must be at least 1, got {limit}")
        return Profile(self.batch_sizes, self.seconds, limit)

    @property
    def nondecreasing(self) -> bool:
        """True when per-token time never falls as the batch grows (Heddle's premise; lets the DP bisect)."""
        return all(a <= b for a, b in pairwise(self.seconds))

    def interference_steps(self, n: int) -> list[tuple[int, int, float]]:
        """The increments I(k) - I(k - 1) for k = 1..n (I(0) = 0) as runs (first k - 1, last k, increment)
        of equal increments, in order of k."""
        runs: list[tuple[int, int, float]] = []
        previous = 0.0
        for k in range(1, n + 1):
            current = self.seconds_per_token(k)
            step = current - previous
            previous = current
            if runs and math.isclose(runs[-1][2], step, rel_tol=1e-9, abs_tol=1e-15):
                runs[-1] = (runs[-1][0], k, step)
            else:
                runs.append((k - 1, k, step))
        return runs

    def group_seconds(self, lengths: Iterable[float]) -> float:
        """How long a group of trajectories with these lengths takes on this backend, draining (module
        docstring): sum over k of l_k * (I(k) - I(k - 1)), the lengths sorted longest first; 0 if empty."""
        ordered = sorted(lengths, reverse=True)
        return sum(step * sum(ordered[start:end]) for start, end, step in self.interference_steps(len(ordered)))

    def seconds_per_token(self, batch_size: float) -> float:
        """Interpolated per-token time at `batch_size` concurrent trajectories (never below 0); past the
        batch limit, the limit's time stretched by the share of a slot each trajectory gets."""
        limit = self.batch_limit
        if limit is not None and batch_size > limit:
            return self.seconds_per_token(limit) * batch_size / limit
        sizes, seconds = self.batch_sizes, self.seconds
        if len(sizes) == 1 or batch_size <= sizes[0]:
            return seconds[0]
        i = min(bisect.bisect_right(sizes, batch_size), len(sizes) - 1)
        x0, x1, y0, y1 = sizes[i - 1], sizes[i], seconds[i - 1], seconds[i]
        return max(0.0, y0 + (y1 - y0) * (batch_size - x0) / (x1 - x0))
