"""BuildQueue: image builds on at most `limit` threads, one build per key at a time (single-flight).

A batch of 500 instances submits 500 builds; at most `limit` run at once, the rest wait in the queue, in
order. A request for a key whose build is queued or running gets that build's future, so it shares the result
or the exception; once the build is done the key is free again, so a failed build is retried by the next
request. The worker threads are started on demand and end when the queue is empty. Synchronous code waits on
the future (`submit`); async code (a handler's INIT) awaits it without blocking its event loop (`build`), and
being cancelled does not cancel the build the others wait for.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

T = TypeVar("T")


class BuildQueue(Generic[T]):
    """Runs builds on at most `limit` threads; concurrent requests for one key share one build."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the build concurrency limit must be at least 1, not {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._pending: dict[str, Future[T]] = {}  # queued or running, by key
        self._waiting: deque[tuple[str, Callable[[], T], Future[T]]] = deque()
        self._workers = 0

    def submit(self, key: str, build: Callable[[], T]) -> Future[T]:
        """The future of `key`'s build: the one queued or running, else `build` queued now."""
        with self._lock:
            future = self._pending.get(key)
            if future is not None:
                return future
            future = Future()
            self._pending[key] = future
            self._waiting.append((key, build, future))
            if self._workers < self.limit:
                self._workers += 1
                threading.Thread(target=self._work, name="prorl-image-build", daemon=True).start()
            return future

    async def build(self, key: str, build: Callable[[], T]) -> T:
        """`submit`, awaited: the result, or the build's exception."""
        return await asyncio.shield(asyncio.wrap_future(self.submit(key, build)))

    def pending(self) -> int:
        """Builds queued or running."""
        with self._lock:
            return len(self._pending)

    def _work(self) -> None:
        """Run queued builds until none is left."""
        while True:
            with self._lock:
                if not self._waiting:
                    self._workers -= 1
                    return
                key, build, future = self._waiting.popleft()
            if not future.set_running_or_notify_cancel():  # cancelled while queued
                self._forget(key, future)
                continue
            try:
                result = build()
            except BaseException as exc:  # every waiter gets it, whatever it is
                self._forget(key, future)
                future.set_exception(exc)
            else:
                self._forget(key, future)
                future.set_result(result)

    def _forget(self, key: str, future: Future[T]) -> None:
        """Free `key` for the next request."""
        with self._lock:
            if self._pending.get(key) is future:
                del self._pending[key]
