"""BuildQueue: image builds on a bounded pool of threads, one build per key at a time (single-flight).

A batch of 500 instances submits 500 builds; at most `limit` run at once, the rest wait in the pool's queue.
A request for a key whose build is queued or running gets that build's future, so it shares the result or
the exception; once the build is done the key is free again, so a failed build is retried by the next
request. Synchronous code waits on the future (`submit`); async code (a handler's INIT) awaits it without
blocking its event loop (`build`), and being cancelled does not cancel the build the others wait for.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")


class BuildQueue(Generic[T]):
    """Runs builds on at most `limit` threads; concurrent requests for one key share one build."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the build concurrency limit must be at least 1, not {limit}")
        self.limit = limit
        self._pool = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="prorl-image-build")
        self._pending: dict[str, Future[T]] = {}
        self._lock = threading.RLock()  # RLock: a build already done runs its callback in submit()

    def submit(self, key: str, build: Callable[[], T]) -> Future[T]:
        """The future of `key`'s build: the one queued or running, else `build` queued now."""
        with self._lock:
            future = self._pending.get(key)
            if future is None:
                future = self._pool.submit(build)
                self._pending[key] = future
                future.add_done_callback(functools.partial(self._done, key))
            return future

    async def build(self, key: str, build: Callable[[], T]) -> T:
        """`submit`, awaited: the result, or the build's exception."""
        return await asyncio.shield(asyncio.wrap_future(self.submit(key, build)))

    def pending(self) -> int:
        """Builds queued or running."""
        with self._lock:
            return len(self._pending)

    def _done(self, key: str, future: Future[T]) -> None:
        with self._lock:
            if self._pending.get(key) is future:
                del self._pending[key]
