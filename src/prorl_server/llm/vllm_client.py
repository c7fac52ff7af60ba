"""Token-in/token-out client for vLLM's OpenAI-compatible HTTP server.

Every answer is read as a stream and bounded by what the request asked for (`response_limits`), then
checked against vLLM's response shapes (`protocol.vllm`, read by `vllm_parsing`). A backend that answers
with too many bytes, malformed data, a server error, or nothing within the stall timeout fails like an unreachable one
(BackendUnavailable and its subclasses), so the caller can fail over.
"""

from __future__ import annotations

import asyncio
import json
import math
import urllib.request
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import httpx
from pydantic_core import to_json

from prorl_server.llm import response_limits as limits
from prorl_server.llm.errors import (
    BackendProtocolError,
    BackendRequestError,
    BackendStalled,
    BackendUnavailable,
    LLMError,
)
from prorl_server.llm.vllm_parsing import (
    Completion,
    ServedModel,
    parse_completion,
    parse_detokenized,
    parse_served_model,
    parse_tokens,
)
from prorl_server.llm.weight_pause_gate import frozen_with_the_call

_MAX_CONNECTIONS = 4096
_KEEPALIVE_S = 5.0  # an idle connection is closed after this (httpx's default)
# identity: the byte bounds apply to what is held in memory, not to a compressed size
_HEADERS = {"accept-encoding": "identity", "content-type": "application/json"}
# names the job a completion is for (percent-encoded): test doubles pick that job's scripted replies by it
JOB_ID_HEADER = "x-prorl-job-id"


def server_root(address: str) -> str:
    """`http://h:p/v1` -> `http://h:p` (vLLM serves /tokenize, /detokenize and /health at the root)."""
    address = address.rstrip("/")
    return address[: -len("/v1")] if address.endswith("/v1") else address


class VLLMClient:
    """Async client for the endpoints the server needs: completions, tokenize, detokenize, models, health.

    A client session is bound to the event loop that created it, and every stage pool has its own loop,
    so connections are kept per loop. Requests are sent with aiohttp itself: httpx's own pool loses most
    of its throughput with dozens of concurrent requests, which is the normal load of a RUN pool, and
    httpx on aiohttp's pool (httpx-aiohttp) spent about twice aiohttp's CPU per request (two requests a
    turn). Pass `transport` (an httpx transport) to run without sockets (tests, benchmarks): requests
    then go through an httpx client on it.
    """

    def __init__(
        self,
        *,
        request_timeout_s: float = 3600.0,
        connect_timeout_s: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._timeout = httpx.Timeout(request_timeout_s, connect=connect_timeout_s)
        self._transport = transport
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )
        self._sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = (
            weakref.WeakKeyDictionary()
        )
        self._aiohttp_timeout = aiohttp.ClientTimeout(
            sock_connect=connect_timeout_s, sock_read=request_timeout_s, connect=request_timeout_s
        )

    def _client(self) -> httpx.AsyncClient:
        """This loop's httpx client on `transport` (only with one)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = httpx.AsyncClient(timeout=self._timeout, transport=self._transport, headers=_HEADERS)
            self._clients[loop] = client
        return client

    def _session(self) -> aiohttp.ClientSession:
        """This loop's aiohttp session: no cookies kept; the environment's proxies used as httpx would, if
        any is set (aiohttp then looks them up, and reads ~/.netrc, at every request: only then)."""
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None:
            connector = aiohttp.TCPConnector(limit=_MAX_CONNECTIONS, keepalive_timeout=_KEEPALIVE_S)
            session = aiohttp.ClientSession(
                connector=connector,
                headers=_HEADERS,
                timeout=self._aiohttp_timeout,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=bool(urllib.request.getproxies()),
            )
            self._sessions[loop] = session
        return session

    async def aclose_current_loop(self) -> None:
        """Close this loop's connections (call from each loop before it stops)."""
        loop = asyncio.get_running_loop()
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()

    async def call(
        self,
        method: str,
        url: str,
        content: bytes | None,
        limit: int,
        timeout_s: float | None,
        headers: dict[str, str] | None = None,
    ) -> bytes | bytearray:
        """The body of a successful answer of at most `limit` bytes, within `timeout_s` (None: no stall limit)."""
        exchange = self._exchange_httpx if self._transport is not None else self._exchange_aiohttp
        stall = asyncio.timeout(timeout_s)
        try:
            async with stall:
                with frozen_with_the_call(stall):  # a keep pause stops the stall clock of a frozen call
                    return await exchange(method, url, content, limit, headers)
        except TimeoutError as exc:
            if stall.expired():
                raise BackendStalled(
                    f"{method} {url}: no answer within the {timeout_s:g}s stall timeout; request closed"
                ) from None
            raise BackendUnavailable(f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc
        except (aiohttp.ClientError, httpx.HTTPError) as exc:
            raise BackendUnavailable(f"{method} {url} failed: {type(exc).__name__}: {exc}") from exc

    async def _exchange_aiohttp(
        self, method: str, url: str, content: bytes | None, limit: int, headers: dict[str, str] | None
    ) -> bytes | bytearray:
        """One request and its answer through this loop's aiohttp session."""
        request = self._session().request(method, url, data=content, headers=headers, allow_redirects=False)
        async with request as response:
            if response.status >= 400:
                error = await _read_aiohttp(response, url, limits.ERROR_BYTES, truncate=True)
                raise _status_error(method, url, response.status, response.headers.get("retry-after"), error)
            return await _read_aiohttp(response, url, limit)

    async def _exchange_httpx(
        self, method: str, url: str, content: bytes | None, limit: int, headers: dict[str, str] | None
    ) -> bytes | bytearray:
        """One request and its answer through the httpx client on `transport`."""
        async with self._client().stream(method, url, content=content, headers=headers) as response:
            if response.status_code >= 400:
                error = await _read(response, limits.ERROR_BYTES, truncate=True)
                raise _status_error(method, url, response.status_code, response.headers.get("retry-after"), error)
            return await _read(response, limit)

    async def complete(
        self,
        address: str,
        model: str | None,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        *,
        max_new_tokens: int | None = None,
        vocab_size: int | None = None,
        timeout_s: float | None = None,
        job_id: str | None = None,
    ) -> Completion:
        """Generate from token ids; returns the sampled ids and their logprobs exactly as the engine sent them.

        `job_id` is sent in the `X-Prorl-Job-Id` header (percent-encoded); engines ignore it.

        `max_new_tokens`: the most the request may return (default: `max_tokens` of the sampling params, see
        response_limits.requested_tokens). The answer is refused (BackendProtocolError) when it is larger than that can need or
        carries more ids, ids outside `vocab_size`, or logprobs that are not finite and <= 0.
        """
        payload: dict[str, Any] = dict(sampling_params)
        payload.update(prompt=prompt_ids, return_token_ids=True, logprobs=0, stream=False, n=1)
        if model is not None:
            payload["model"] = model
        if max_new_tokens is None:
            max_new_tokens = limits.requested_tokens(sampling_params, len(prompt_ids), None)
        limit = limits.completion_bytes(max_new_tokens, len(prompt_ids))
        headers = {JOB_ID_HEADER: quote(job_id, safe="")} if job_id is not None else None
        url = f"{address.rstrip('/')}/completions"
        body = await self.call("POST", url, _json(payload), limit, timeout_s, headers)
        return parse_completion(body, max_tokens=max_new_tokens, vocab_size=vocab_size)

    async def tokenize_messages(
        self,
        address: str,
        model: str | None,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        vocab_size: int | None = None,
        timeout_s: float | None = None,
    ) -> list[int]:
        """Apply the backend's chat template to `messages` and return the token ids."""
        payload: dict[str, Any] = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "add_special_tokens": False,
        }
        if tools:
            payload["tools"] = tools
        return await self._tokenize(address, model, payload, vocab_size, timeout_s)

    async def tokenize_text(
        self,
        address: str,
        model: str | None,
        text: str,
        *,
        vocab_size: int | None = None,
        timeout_s: float | None = None,
    ) -> list[int]:
        """Tokenize plain text (no special tokens added)."""
        payload = {"prompt": text, "add_special_tokens": False}
        return await self._tokenize(address, model, payload, vocab_size, timeout_s)

    async def _tokenize(
        self,
        address: str,
        model: str | None,
        payload: dict[str, Any],
        vocab_size: int | None,
        timeout_s: float | None,
    ) -> list[int]:
        if model is not None:
            payload["model"] = model
        content = _json(payload)
        url = f"{server_root(address)}/tokenize"
        body = await self.call("POST", url, content, limits.tokenize_bytes(len(content)), timeout_s)
        return parse_tokens(body, vocab_size=vocab_size)

    async def detokenize(
        self, address: str, model: str | None, ids: list[int], *, timeout_s: float | None = None
    ) -> str:
        """Turn token ids into text with the backend's tokenizer."""
        payload: dict[str, Any] = {"tokens": ids}
        if model is not None:
            payload["model"] = model
        url = f"{server_root(address)}/detokenize"
        body = await self.call("POST", url, _json(payload), limits.detokenize_bytes(len(ids)), timeout_s)
        return parse_detokenized(body)

    async def served_model(self, address: str, *, timeout_s: float | None = None) -> ServedModel:
        """The first model the backend serves, with its context length and vocabulary size (`GET /v1/models`)."""
        url = f"{address.rstrip('/')}/models"
        return parse_served_model(await self.call("GET", url, None, limits.MODELS_BYTES, timeout_s))

    async def healthy(self, address: str, timeout_s: float = 5.0) -> tuple[bool, str | None]:
        """Probe `GET /health`; returns (ok, error message)."""
        try:
            await self.call("GET", f"{server_root(address)}/health", None, limits.HEALTH_BYTES, timeout_s)
        except LLMError as exc:
            return False, str(exc)
        return True, None


def _json(payload: dict[str, Any]) -> bytes:
    """Compact JSON of a request body; a non-finite float is refused (ValueError), as JSON has none.

    A `prompt` of token ids (the whole context of a completion: thousands of ints every turn) is encoded by
    pydantic-core, several times faster than `json.dumps`, and spliced in as the last field."""
    ids = payload.get("prompt")
    if not isinstance(ids, list) or not all(type(i) is int for i in ids[:1]):
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    rest = {k: v for k, v in payload.items() if k != "prompt"}
    head = json.dumps(rest, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    return head[:-1] + (b',"prompt":' if rest else b'"prompt":') + to_json(ids, inf_nan_mode="null") + b"}"


async def _read(response: httpx.Response, limit: int, *, truncate: bool = False) -> bytes | bytearray:
    """Read an httpx body of at most `limit` bytes; past it, refuse (BackendProtocolError) or, with `truncate`,
    cut."""
    return await _read_bounded(
        str(response.request.url), response.headers, limit, truncate, response.aread, response.aiter_bytes()
    )


async def _read_aiohttp(
    response: aiohttp.ClientResponse, url: str, limit: int, *, truncate: bool = False
) -> bytes | bytearray:
    """`_read` for an aiohttp response."""
    return await _read_bounded(url, response.headers, limit, truncate, response.read, response.content.iter_any())


async def _read_bounded(
    url: str,
    headers: Mapping[str, str],
    limit: int,
    truncate: bool,
    read_all: Callable[[], Awaitable[bytes]],
    chunks: AsyncIterator[bytes],
) -> bytes | bytearray:
    """A body of at most `limit` bytes: refused unread when its Content-Length says more (read whole with
    `read_all` else), or read by `chunks` and refused, or with `truncate` cut, once it passes `limit`."""
    announced = headers.get("content-length")
    plain = headers.get("content-encoding", "identity") == "identity"
    if announced is not None and plain and not truncate:
        if not (announced.isascii() and announced.isdigit()):
            raise BackendProtocolError(f"{url}: malformed Content-Length {announced[:40]!r}")
        if int(announced) > limit:
            raise BackendProtocolError(
                f"{url}: answer of {announced} bytes refused unread; this request needs at most {limit}"
            )
        return await read_all()
    body = bytearray()
    async for chunk in chunks:
        body += chunk
        if len(body) > limit:
            if truncate:
                return body[:limit]
            raise BackendProtocolError(
                f"{url}: answer passed {limit} bytes, more than this request can need; stopped reading"
            )
    return body


def _status_error(method: str, url: object, status: int, retry_after: str | None, body: bytes | bytearray) -> LLMError:
    message = _error_message(body)
    retry_after_s = _retry_after_s(retry_after)
    if status >= 500:
        return BackendUnavailable(
            f"{method} {url}: HTTP {status}: {message}", status_code=status, retry_after_s=retry_after_s
        )
    return BackendRequestError(
        f"{url} rejected the request: HTTP {status}: {message}",
        status,
        retry_after_s=retry_after_s,
        detail=f"HTTP {status}: {message}",
    )


def _retry_after_s(value: str | None) -> float | None:
    """A `Retry-After` header's seconds (its HTTP-date form is not read: None)."""
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _error_message(body: bytes | bytearray) -> str:
    text = body.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])[:500]
        for key in ("message", "detail"):
            if key in parsed:
                return str(parsed[key])[:500]
    return str(parsed)[:500]
