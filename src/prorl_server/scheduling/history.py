"""Bounded histories of final lengths and the conditional expectation the online predictor needs.

`LengthHistory` keeps the last `capacity` totals (tokens or turns) in arrival order, and the same values
sorted with suffix sums, so that E[L - t | L >= t] and the number of samples with L >= t cost a binary
search. `BoundedMap` is a least-recently-used dictionary: the predictor keeps one history per prompt and
per data source, and both are capped.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Generic, TypeVar

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
        self._suffix: list[int] | None = None  # _suffix[i] = sum(_sorted[i:]); rebuilt lazily

    def __len__(self) -> int:
        return len(self._sorted)

    def add(self, value: int) -> None:
        """Record a final length, forgetting the oldest past the capacity."""
        if len(self._arrivals) == self._capacity:
            oldest = self._arrivals.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._arrivals.append(value)
        bisect.insort(self._sorted, value)
        self._suffix = None

    def remaining_past(self, so_far: float) -> tuple[float, int]:
        """(E[L - so_far | L >= so_far], how many samples have L >= so_far); (0.0, 0) when none has."""
        start = bisect.bisect_left(self._sorted, so_far)
        count = len(self._sorted) - start
        if count == 0:
            return 0.0, 0
        if self._suffix is None:
            suffix = [0] * (len(self._sorted) + 1)
            for i in range(len(self._sorted) - 1, -1, -1):
                suffix[i] = suffix[i + 1] + self._sorted[i]
            self._suffix = suffix
        return self._suffix[start] / count - so_far, count


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
