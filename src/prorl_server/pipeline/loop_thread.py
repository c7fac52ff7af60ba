"""A thread that owns one asyncio event loop, and says when that loop died, stalls or runs late."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from prorl_server.pipeline.loop_lag import PROBE_S, LoopLag
from prorl_server.threadsafe import call_in_loop, run_in_loop, try_call_in_loop

log = logging.getLogger(__name__)
T = TypeVar("T")

HEARTBEAT_S = 1.0
"""A loop that has not turned for this long is late (see `LoopThread.stalled_s`); its heartbeat, which also
samples its lag (`LoopThread.lag`), beats every `loop_lag.PROBE_S`."""


class LoopThread:
    """Runs an event loop on a dedicated daemon thread until `stop()`.

    Other threads hand work over with `submit` (a coroutine) or `call_soon` (a callback). If the loop ends
    without `stop()` (code on it called `loop.stop()`, or a SystemExit or KeyboardInterrupt escaped one of
    its tasks or callbacks), `on_death(error)` is called on the dying thread once the loop is closed.
    """

    def __init__(self, name: str, on_death: Callable[[BaseException | None], None] | None = None) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._on_death = on_death
        self._stopping = False
        self._last_beat = time.monotonic()
        self.lag = LoopLag()

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
        loop.set_default_executor(ContainedExecutor())  # asyncio.to_thread in handler code runs on it
        asyncio.set_event_loop(loop)
        self.loop = loop
        loop.call_soon(self._ready.set)
        self._last_beat = time.monotonic()
        loop.call_soon(self._beat, loop, self._last_beat)
        error: BaseException | None = None
        try:
            loop.run_forever()
        except BaseException as exc:  # a SystemExit or KeyboardInterrupt that escaped a task or callback
            error = exc
        try:
            if not self._stopping:
                if self._on_death is not None:
                    self._on_death(error)
                _unwind(loop, self.name)
            loop.run_until_complete(loop.shutdown_asyncgens())
        except BaseException:
            log.exception("cleaning up the loop of %s failed", self.name)
        finally:
            loop.close()

    def _beat(self, loop: asyncio.AbstractEventLoop, due: float) -> None:
        now = self._last_beat = time.monotonic()
        self.lag.record(now - due)
        loop.call_later(PROBE_S, self._beat, loop, now + PROBE_S)

    @property
    def stalled_s(self) -> float:
        """Seconds the loop is late to turn (0 while it turns at least every HEARTBEAT_S): something blocks it."""
        if not self.alive:
            return 0.0
        return max(0.0, time.monotonic() - self._last_beat - HEARTBEAT_S)

    @property
    def alive(self) -> bool:
        """True while the thread runs its loop."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule a coroutine on this loop from any thread."""
        assert self.loop is not None, "loop thread not started"
        return run_in_loop(self.loop, coro)

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Schedule a callback on this loop from any thread."""
        assert self.loop is not None, "loop thread not started"
        call_in_loop(self.loop, fn, *args)

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every task on the loop, let them unwind, stop the loop and join the thread."""
        if self._thread is None or self.loop is None:
            return
        self._stopping = True
        loop = self.loop
        if loop.is_running():
            try:
                left = self.submit(_cancel_all_tasks(timeout)).result(timeout + 1)
            except (concurrent.futures.TimeoutError, RuntimeError):
                left = -1
            if left:
                log.warning("tasks on %s did not finish within %.1fs of cancellation", self.name, timeout)
            try_call_in_loop(loop, loop.stop)  # False: it closed meanwhile
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("loop thread %s did not exit within %.1fs", self.name, timeout)
        self._thread = None
        self.loop = None


class ContainedExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loops' default executor (`asyncio.to_thread`, `run_in_executor(None, ...)`): a StopIteration
    the function raises becomes a RuntimeError. As is, it cannot be set into the awaited asyncio future
    (PEP 479), which then never resolves: the awaiting handler would hang until its job's budget ran out."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        return super().submit(_no_stop_iteration, fn, *args, **kwargs)


def _no_stop_iteration(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    try:
        return fn(*args, **kwargs)
    except StopIteration as exc:
        raise RuntimeError(
            "a function run in a thread (asyncio.to_thread, run_in_executor) raised StopIteration, which cannot "
            f"be raised into a Future: {exc!r}"
        ) from exc


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed (it ships with uvicorn[standard]), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


DEAD_LOOP_UNWIND_S = 1.0
"""Seconds the tasks of a loop that died get to unwind after their cancellation, before it is closed."""


def _unwind(loop: asyncio.AbstractEventLoop, name: str) -> None:
    """Cancel the tasks left on a dead loop and run it until they end (at most DEAD_LOOP_UNWIND_S), so that
    their `finally` blocks run now rather than at garbage collection on a closed loop."""
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        try:
            loop.run_until_complete(asyncio.wait(tasks, timeout=DEAD_LOOP_UNWIND_S))
        except BaseException:  # the code that killed the loop may do it again while it unwinds
            log.warning("the tasks of the dead loop %s did not unwind", name, exc_info=True)


async def _cancel_all_tasks(timeout: float) -> int:
    """Cancel every other task of the running loop and wait up to `timeout` for them to end; returns how
    many did not."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current and not t.done()]
    for task in tasks:
        task.cancel()
    if not tasks:
        return 0
    _, pending = await asyncio.wait(tasks, timeout=timeout)
    return len(pending)
