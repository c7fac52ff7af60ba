"""Finished results of one or more servers as one async iterator, with a cursor per server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from types import TracebackType

from prorl_server.client.errors import RolloutServerError
from prorl_server.protocol import JobList, JobResult

Cursor = dict[str, int]
"""Where a stream is, per server URL: results up to this position were listed (`after=` of `GET /jobs`)."""

FetchPage = Callable[[str, int, int, float], Awaitable[JobList]]
"""(server, after, limit, wait) -> the next page of that server's results."""
AckThrough = Callable[[str, int], Awaitable[int]]
"""(server, cursor) -> acknowledge every result of that server up to the cursor."""
OnError = Callable[[str, RolloutServerError], float | None]
"""(server, error of its long poll) -> seconds before polling that server again, or None to end the stream."""
WatchServers = Callable[[], Iterable[str]]
"""The servers to stream from now (servers added later join from their first result)."""


class ResultStream:
    """`async for result in stream`: every server's finished results as they arrive, in each server's
    completion order. `stream.cursor` advances past a page once all its results were taken; pass it as
    `after=` to resume (delivery is at least once: a page left half-way is listed again).

    With `ack=True`, a server's page is acknowledged (`through` its cursor) once all its results were taken
    (when the caller asks for the next one, or stops), which drops every stored result up to there, other
    clients' included. The stream ends when `timeout`
    seconds have passed (long polls are shortened to fit), else never; `aclose()` (or `async with`) stops it.

    A failed long poll ends the stream, unless `on_error` says when to poll that server again (the client's
    failover does, so that a lost server's results are picked up if it comes back); `watch` adds servers
    while the stream runs; `last_server` is the server of the result just handed out.
    """

    def __init__(
        self,
        cursor: Cursor,
        fetch_page: FetchPage,
        ack_through: AckThrough,
        *,
        wait: float = 10.0,
        limit: int = 100,
        ack: bool = False,
        timeout: float | None = None,
        on_error: OnError | None = None,
        watch: WatchServers | None = None,
        watch_interval_s: float = 1.0,
    ) -> None:
        self.cursor: Cursor = dict(cursor)
        self.last_server: str | None = None
        self._on_error = on_error
        self._watch = watch
        self._watch_interval_s = watch_interval_s
        self._fetch_page = fetch_page
        self._ack_through = ack_through
        self._wait = wait
        self._limit = limit
        self._ack = ack
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._results = self._run()

    def __aiter__(self) -> ResultStream:
        return self

    async def __anext__(self) -> JobResult:
        return await self._results.__anext__()

    async def aclose(self) -> None:
        """Stop: cancel the long polls under way."""
        await self._results.aclose()

    async def __aenter__(self) -> ResultStream:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _page(self, server: str) -> JobList | None:
        wait = self._wait
        if self._deadline is not None:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                return None
            wait = min(wait, remaining)
        return await self._fetch_page(server, self.cursor[server], self._limit, wait)

    async def _poll(self, server: str, delay: float) -> JobList | None:
        if delay > 0:
            await asyncio.sleep(delay)
        return await self._page(server)

    async def _run(self) -> AsyncIterator[JobResult]:
        polls: dict[asyncio.Task[JobList | None], str] = {}
        unacked: tuple[str, int] | None = None  # a page all handed out, to acknowledge when the caller is back
        try:
            for server in self.cursor:
                polls[asyncio.create_task(self._page(server))] = server
            while polls:
                if self._watch is not None:
                    polled = set(polls.values())
                    for server in self._watch():
                        if server not in polled:
                            self.cursor.setdefault(server, 0)
                            polls[asyncio.create_task(self._page(server))] = server
                    timeout = self._watch_interval_s
                else:
                    timeout = None
                done, _ = await asyncio.wait(polls, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    server = polls.pop(task)
                    try:
                        page = task.result()
                    except RolloutServerError as exc:
                        delay = None if self._on_error is None else self._on_error(server, exc)
                        if delay is None:
                            raise  # after the retries: ends the stream
                        polls[asyncio.create_task(self._poll(server, delay))] = server
                        continue
                    if page is None:
                        continue  # this server's part of the stream is over (timeout)
                    last = len(page.results) - 1
                    for i, result in enumerate(page.results):
                        if i == last:  # the whole page is handed out with this one
                            self.cursor[server] = page.next_cursor
                            unacked = (server, page.next_cursor) if self._ack else None
                        self.last_server = server
                        yield result
                    self.cursor[server] = page.next_cursor
                    if unacked is not None:
                        await self._ack_through(*unacked)
                        unacked = None
                    polls[asyncio.create_task(self._page(server))] = server
        finally:
            for task in polls:
                task.cancel()
            await asyncio.gather(*polls, return_exceptions=True)
            if unacked is not None:  # the caller stopped after taking a whole page
                with contextlib.suppress(RolloutServerError):
                    await self._ack_through(*unacked)
