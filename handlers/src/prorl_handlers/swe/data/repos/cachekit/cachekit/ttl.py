"""A cache whose entries expire."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any


class TTLCache:
    """Entries live for `ttl` seconds after they were set: from the moment `clock()` reaches
    set time + ttl, the entry is gone. `clock` is injectable for tests."""

    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        if ttl < 0:
            raise ValueError("ttl must not be negative")
        self.ttl = ttl
        self._clock = clock
        self._data: dict[Hashable, tuple[Any, float]] = {}

    def set(self, key: Hashable, value: Any) -> None:
        """Cache `value` under `key` for `ttl` seconds from now."""
        self._data[key] = (value, self._clock() + self.ttl)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value of `key` if it has not expired, else `default`."""
        item = self._data.get(key)
        if item is None:
            return default
        value, expires = item
        if self._clock() > expires:
            del self._data[key]
            return default
        return value

    def __len__(self) -> int:
        return len(self._data)
