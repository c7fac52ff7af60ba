"""One prorl-server as the client sees it: an aiohttp connection pool, the API key, retries, error mapping.

Requests go through aiohttp rather than httpx: httpx's pool costs about 1.5 ms of CPU per request with
dozens in flight (its pool re-checks every connection at each request), aiohttp about 0.2 ms, and a
trainer submits and collects tens of thousands of jobs a step (benchmarks/bench_multinode.py, part 2).
Failures keep httpx's exception types (`httpx.ConnectError`, `httpx.ReadTimeout`, ...), which
RolloutServerError carries as its cause.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import httpx

from prorl_server.client.errors import RolloutServerError
from prorl_server.client.retry import RetryPolicy

CONNECT_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 100
"""Connections per server at most (httpx's default)."""
KEEPALIVE_S = 5.0
"""An idle connection is closed after this (httpx's default; uvicorn closes its side after 5 s too)."""

_TRANSPORT_ERRORS: list[tuple[type[BaseException], type[httpx.TransportError]]] = [
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.SocketTimeoutError, httpx.ReadTimeout),
    (TimeoutError, httpx.TimeoutException),
    (aiohttp.ClientProxyConnectionError, httpx.ProxyError),
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),
    (aiohttp.InvalidURL, httpx.UnsupportedProtocol),
    (aiohttp.ClientPayloadError, httpx.ReadError),
    (aiohttp.ClientOSError, httpx.NetworkError),
    (aiohttp.ClientError, httpx.TransportError),
]
"""aiohttp's failures as the httpx exception of the same meaning (the first that matches)."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A server's answer to one request: the request's method and URL, the status and the body."""

    method: str
    url: str
    status_code: int
    content: bytes

    @property
    def is_success(self) -> bool:
        """A 2xx status."""
        return 200 <= self.status_code < 300

    @property
    def path(self) -> str:
        """The request's path (no query)."""
        return urlsplit(self.url).path

    @property
    def text(self) -> str:
        """The body as text."""
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body, parsed as JSON (ValueError if it is not)."""
        return json.loads(self.content)


class ServerConnection:
    """Requests to one server; every failure becomes a RolloutServerError, retried ones after RetryPolicy.

    The connection pool is opened on the running event loop at the first request (and used on that loop
    only, as the client is)."""

    def __init__(
        self, url: str, *, api_key: str | None, timeout_s: float, retry: RetryPolicy, trust_env: bool = True
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retry = retry
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp_timeout(httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)))
        self._trust_env = trust_env
        self._session: aiohttp.ClientSession | None = None

    def _pool(self) -> aiohttp.ClientSession:
        """The connection pool (opened at the first request): no cookies kept; the environment's proxies
        used if `trust_env` and any is set (aiohttp then looks them up at every request: only then)."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_S),
                headers=self._headers,
                timeout=self._timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=self._trust_env and bool(urllib.request.getproxies()),
            )
        return self._session

    async def aclose(self) -> None:
        """Close the connection pool."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        timeout: float | httpx.Timeout | None = None,
    ) -> Answer:
        """One attempt, whatever the answer's status; httpx.TransportError when none came. The body is `json`
        encoded, or `content`, JSON already encoded. `timeout` overrides the read timeout (a float) or every
        timeout (an httpx.Timeout)."""
        url = f"{self.url}{path}"
        kwargs: dict[str, Any] = {"params": params, "allow_redirects": False}
        if json is not None:
            content = _json_bytes(json)
        if content is not None:
            kwargs["data"] = content
            kwargs["headers"] = _JSON_HEADERS
        if timeout is not None:
            if not isinstance(timeout, httpx.Timeout):
                timeout = httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S)
            kwargs["timeout"] = aiohttp_timeout(timeout)
        try:
            async with self._pool().request(method, url, **kwargs) as response:
                return Answer(method, str(response.url), response.status, await response.read())
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _transport_error(exc) from exc

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        timeout: float | httpx.Timeout | None = None,
        accept_on_retry: frozenset[int] = frozenset(),
        accept: frozenset[int] = frozenset(),
    ) -> Answer:
        """Send a request (body and `timeout` as for `send`), retrying per the policy; return a 2xx answer (or
        one whose status is in `accept`, or, on a retry, in `accept_on_retry`), else raise RolloutServerError."""
        started = time.monotonic()
        if json is not None:
            content, json = _json_bytes(json), None  # encoded once for every attempt
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self.send(method, path, content=content, params=params, timeout=timeout)
            except httpx.TransportError as exc:
                failure: Answer | httpx.TransportError = exc
            else:
                if (
                    response.status_code < 400
                    or response.status_code in accept
                    or (attempt > 1 and response.status_code in accept_on_retry)
                ):
                    return response
                if not self.retry.retryable_status(response.status_code):
                    raise RolloutServerError.from_response(response, _attempts_note(attempt, started))
                failure = response
            delay = self.retry.delay(attempt - 1)
            if attempt >= self.retry.attempts or time.monotonic() - started + delay > self.retry.budget_s:
                note = _attempts_note(attempt, started)
                if isinstance(failure, Answer):
                    raise RolloutServerError.from_response(failure, note)
                raise RolloutServerError.unreachable(method, f"{self.url}{path}", failure, note) from failure
            await asyncio.sleep(delay)


def aiohttp_timeout(timeout: httpx.Timeout) -> aiohttp.ClientTimeout:
    """httpx's timeouts as aiohttp's: connect, read, and the wait for a pooled connection (no total)."""
    pool = None if timeout.pool is None or timeout.connect is None else timeout.pool + timeout.connect
    return aiohttp.ClientTimeout(total=None, connect=pool, sock_connect=timeout.connect, sock_read=timeout.read)


_JSON_HEADERS = {"Content-Type": "application/json"}


def _json_bytes(body: Any) -> bytes:
    """A JSON body as httpx encodes one (compact, UTF-8, no NaN)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _transport_error(exc: BaseException) -> httpx.TransportError:
    """`exc` (aiohttp's, or a timeout) as the httpx exception of the same meaning."""
    message = str(exc) or type(exc).__name__
    for source, target in _TRANSPORT_ERRORS:
        if isinstance(exc, source):
            return target(message)
    return httpx.TransportError(message)


def _attempts_note(attempts: int, started: float) -> str:
    return f" [after {attempts} attempts in {time.monotonic() - started:.1f} s]" if attempts > 1 else ""
