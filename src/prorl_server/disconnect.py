"""Stop work for an HTTP client that has gone away (used by the dev engine and the recording proxy)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.requests import Request

T = TypeVar("T")
CLIENT_CLOSED = 499  # the status of an answer nobody reads: the client is gone


async def until_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """Await `work`, cancelling it if the client disconnects first (then None). The request's body must
    have been read already: this reads the connection's next message, which is the disconnect."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return None
    finally:
        watcher.cancel()
        task.cancel()
