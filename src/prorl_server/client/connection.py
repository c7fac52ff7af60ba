"""One prorl-server as the client sees it: an httpx connection pool, the API key, retries, error mapping."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from prorl_server.client.errors import RolloutServerError
from prorl_server.client.retry import RetryPolicy

CONNECT_TIMEOUT_S = 5.0


class ServerConnection:
    """Requests to one server; every failure becomes a RolloutServerError, retried ones after RetryPolicy."""

    def __init__(
        self, url: str, *, api_key: str | None, timeout_s: float, retry: RetryPolicy, trust_env: bool = True
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retry = retry
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)),
            trust_env=trust_env,
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | httpx.Timeout | None = None,
        accept_on_retry: frozenset[int] = frozenset(),
        accept: frozenset[int] = frozenset(),
    ) -> httpx.Response:
        """Send a request, retrying per the policy; return a 2xx answer (or one whose status is in `accept`,
        or, on a retry, in `accept_on_retry`), else raise RolloutServerError. `timeout` overrides the read
        timeout."""
        started = time.monotonic()
        kwargs: dict[str, Any] = {"json": json, "params": params}
        if timeout is not None:
            kwargs["timeout"] = (
                timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S)
            )
        attempt = 0
        while True:
            attempt += 1
            try:
                response = await self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                failure: httpx.Response | httpx.TransportError = exc
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
                if isinstance(failure, httpx.Response):
                    raise RolloutServerError.from_response(failure, note)
                raise RolloutServerError.unreachable(method, f"{self.url}{path}", failure, note) from failure
            await asyncio.sleep(delay)


def _attempts_note(attempts: int, started: float) -> str:
    return f" [after {attempts} attempts in {time.monotonic() - started:.1f} s]" if attempts > 1 else ""
