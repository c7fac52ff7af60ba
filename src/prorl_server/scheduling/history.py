"""Bounded histories of final lengths and the conditional expectation the online predictor needs.

`LengthHistory` keeps the last `capacity` totals (tokens or turns) in arrival order, and the same values
sorted with suffix sums, so that E[L - t | L >= t] and the number of samples with L >= t cost a binary
search. The sorted values and their suffix sums are a snapshot, rebuilt (in C, by `itertools.accumulate`)
when more than 1/`STALENESS` of the samples arrived since the last build: every arrival while fewer than
`STALENESS` samples are kept, every 129th at 8,192, so the rebuild costs O(1) amortised per arrival instead of
O(capacity) and an answer may leave out at most that share of the latest samples. `BoundedMap` is a least-recently-used dictionary: the predictor keeps one history per prompt and
per data source, and both are capped.
"""

from __future__ import annotations

import bisect
import itertools
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Generic, TypeVar

STALENESS = 64
"""A history's snapshot is rebuilt once more than 1/STALENESS of its samples arrived since (module docstring)."""

K = TypeVar("K")
V = TypeVar("V")


class LengthHistory:
    """The last `capacity` final lengths, answering conditional means of what remains past a length."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"a history needs a capacity of at least 1, got {capacity}")
        self._arrivals: deque[int] = deque()
        self._capacity = capacity
        self._sorted: list[int] = []
        self._snapshot: tuple[list[int], list[int]] | None = None  # sorted values, suffix[i] = sum(values[i:])
        self._stale = 0  # arrivals since the snapshot

    def __len__(self) -> int:
        return len(self._sorted)

    def add(self, value: int) -> None:
        """Record a final length, forgetting the oldest past the capacity."""
        if len(self._arrivals) == self._capacity:
            oldest = self._arrivals.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._arrivals.append(value)
        bisect.insort(self._sorted, value)
        self._stale += 1

    def remaining_past(self, so_far: float) -> tuple[float, int]:
        """(E[L - so_far | L >= so_far], how many samples have L >= so_far); (0.0, 0) when none has. From the
        snapshot (module docstring)."""
        if self._snapshot is None or self._stale > len(self._sorted) // STALENESS:
            values = list(self._sorted)
            suffix = list(itertools.accumulate(reversed(values), initial=0))
            suffix.reverse()
            self._snapshot, self._stale = (values, suffix), 0
        values, suffix = self._snapshot
        start = bisect.bisect_left(values, so_far)
        count = len(values) - start
        if count == 0:
            return 0.0, 0
        return suffix[start] / count - so_far, count


class BoundedMap(Generic[K, V]):
    """A dictionary of at most `capacity` entries that forgets the least recently used one."""

    def __init__(self, capacity: int, factory: Callable[[], V]) -> None:
        if capacity < 1:
            raise ValueError(f"a bounded map needs a capacity of at least 1, got {capacity}")
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._capacity = capacity
        self._factory = factory

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        """The entry of `key` (now the most recently used), or None."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def setdefault(self, key: K) -> V:
        """The entry of `key`, created by the factory when absent (evicting the least recently used)."""
        entry = self.get(key)
        if entry is None:
            entry = self._entries[key] = self._factory()
            if len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
        return entry
