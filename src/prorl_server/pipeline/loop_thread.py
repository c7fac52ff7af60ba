"""A thread that owns one asyncio event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class LoopThread:
    """Runs an event loop on a dedicated daemon thread until `stop()`.

    Other threads hand work over with `submit` (a coroutine) or `call_soon` (a callback).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self) -> None:
        """Start the thread and wait until its loop runs."""
        if self._thread is not None:
            raise RuntimeError(f"loop thread {self.name} already started")
        self._ready.clear()
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        self.loop = loop
        loop.call_soon(self._ready.set)
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    @property
    def alive(self) -> bool:
        """True while the thread runs its loop."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule a coroutine on this loop from any thread."""
        assert self.loop is not None, "loop thread not started"
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule a callback on this loop from any thread."""
        assert self.loop is not None, "loop thread not started"
        self.loop.call_soon_threadsafe(fn, *args)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every task on the loop, let them unwind, stop the loop and join the thread."""
        if self._thread is None or self.loop is None:
            return
        loop = self.loop
        if loop.is_running():
            try:
                self.submit(_cancel_all_tasks()).result(timeout)
            except (concurrent.futures.TimeoutError, RuntimeError):
                log.warning("tasks on %s did not finish within %.1fs of cancellation", self.name, timeout)
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("loop thread %s did not exit within %.1fs", self.name, timeout)
        self._thread = None
        self.loop = None


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed (it ships with uvicorn[standard]), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


async def _cancel_all_tasks() -> None:
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
