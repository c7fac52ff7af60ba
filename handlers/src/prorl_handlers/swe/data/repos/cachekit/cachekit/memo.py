"""Memoization with an LRU cache."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from cachekit.lru import LRUCache

F = TypeVar("F", bound=Callable[..., Any])
_MISSING = object()


def memoize(maxsize: int = 128) -> Callable[[F], F]:
    """Cache a function's results by its (hashable) arguments; `func.cache` is the LRUCache."""

    def decorator(func: F) -> F:
        cache = LRUCache(maxsize)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key = args + tuple(kwargs.items())
            value = cache.get(key, _MISSING)
            if value is _MISSING:
                value = func(*args, **kwargs)
                cache.put(key, value)
            return value

        wrapper.cache = cache  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorator
