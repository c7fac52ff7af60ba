"""Crossing from a thread (or another event loop) to an event loop: the one place that does it.

The server runs several event loops (the API's, one per stage pool, the health checks', a client's loop
thread) and plain threads (handler threads, the journal's sender thread). Whatever wakes a waiter, hands it
a grant or cancels its task from elsewhere goes through these helpers, so a loop that closed meanwhile is
handled alike everywhere: `try_call_in_loop` says False (nothing is scheduled: its waiters are gone), and
`call_in_loop` / `run_in_loop` raise RuntimeError as asyncio does, for callers that handle it themselves.

A leaf module: the standard library only, so every package may use it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def call_in_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: Any) -> None:
    """Run `fn(*args)` on `loop` soon, from any thread; RuntimeError when `loop` is closed."""
    loop.call_soon_threadsafe(fn, *args)


def try_call_in_loop(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: Any) -> bool:
    """Run `fn(*args)` on `loop` soon, from any thread; False (and nothing scheduled) when `loop` is closed."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        return False
    return True


def run_in_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """Schedule `coro` on `loop` from any thread; its outcome comes in the returned future. RuntimeError when
    `loop` is closed."""
    return asyncio.run_coroutine_threadsafe(coro, loop)
