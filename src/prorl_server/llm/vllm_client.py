"""Token-in/token-out client for vLLM's OpenAI-compatible HTTP server."""

from __future__ import annotations

import asyncio
import weakref
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_aiohttp import AiohttpTransport

from prorl_server.llm.errors import BackendRequestError, BackendUnavailable

_TOKEN_ID_PREFIX = "token_id:"
_POOL_LIMITS = httpx.Limits(max_connections=4096, max_keepalive_connections=512)


@dataclass(frozen=True)
class Completion:
    """What one `/v1/completions` call produced."""

    output_ids: list[int]
    logprobs: list[float]
    finish_reason: str | None
    text: str


@dataclass(frozen=True)
class ServedModel:
    """A model a backend serves: its id and context length (None when the backend does not say)."""

    id: str
    max_model_len: int | None


def server_root(address: str) -> str:
    """`http://h:p/v1` -> `http://h:p` (vLLM serves /tokenize, /detokenize and /health at the root)."""
    address = address.rstrip("/")
    return address[: -len("/v1")] if address.endswith("/v1") else address


def parse_completion(body: dict[str, Any]) -> Completion:
    """Read token ids and sampled logprobs from a vLLM completion response.

    Prefers `choices[0].token_ids` (`return_token_ids: true`); falls back to the `"token_id:N"`
    strings that `return_tokens_as_token_ids` puts in `logprobs.tokens`.
    """
    try:
        choice = body["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise BackendUnavailable(f"malformed completion response: no choices ({exc!r})") from exc
    logprobs_block = choice.get("logprobs") or {}
    ids = choice.get("token_ids")
    if ids is None:
        tokens = logprobs_block.get("tokens") or []
        if not all(isinstance(t, str) and t.startswith(_TOKEN_ID_PREFIX) for t in tokens):
            raise BackendUnavailable(
                "completion response has neither choices[0].token_ids nor token_id:N tokens; "
                "serve with a vLLM that supports return_token_ids (>= 0.10.2) or "
                "--return-tokens-as-token-ids"
            )
        ids = [int(t[len(_TOKEN_ID_PREFIX) :]) for t in tokens]
    token_logprobs = logprobs_block.get("token_logprobs")
    if token_logprobs is None:
        raise BackendUnavailable("completion response carries no logprobs.token_logprobs (send logprobs: 0)")
    if len(token_logprobs) != len(ids):
        raise BackendUnavailable(f"completion response has {len(ids)} token ids but {len(token_logprobs)} logprobs")
    return Completion(
        output_ids=[int(i) for i in ids],
        logprobs=[float(lp) if lp is not None else 0.0 for lp in token_logprobs],
        finish_reason=choice.get("finish_reason"),
        text=choice.get("text") or "",
    )


class VLLMClient:
    """Async client for the endpoints the server needs: completions, tokenize, detokenize, models, health.

    An httpx client is bound to the event loop that created it, and every stage pool has its own loop,
    so connections are kept per loop. Requests go through aiohttp's connection pool (httpx-aiohttp):
    httpx's own pool loses most of its throughput with dozens of concurrent requests, which is the
    normal load of a RUN pool. Pass `transport` to run without sockets (tests, benchmarks).
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

    def _client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            transport = self._transport or AiohttpTransport(limits=_POOL_LIMITS)
            client = httpx.AsyncClient(timeout=self._timeout, transport=transport)
            self._clients[loop] = client
        return client

    async def aclose_current_loop(self) -> None:
        """Close this loop's connections (call from each loop before it stops)."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def _post(self, url: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await self._client().post(url, json=payload)
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"POST {url} failed: {type(exc).__name__}: {exc}") from exc
        return _json_or_raise(response)

    async def complete(
        self, address: str, model: str | None, prompt_ids: list[int], sampling_params: dict[str, Any]
    ) -> Completion:
        """Generate from token ids; returns the sampled ids and their logprobs exactly as the engine sent them."""
        payload: dict[str, Any] = dict(sampling_params)
        payload.update(prompt=prompt_ids, return_token_ids=True, logprobs=0, stream=False, n=1)
        if model is not None:
            payload["model"] = model
        return parse_completion(await self._post(f"{address.rstrip('/')}/completions", payload))

    async def tokenize_messages(
        self,
        address: str,
        model: str | None,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Apply the backend's chat template to `messages` and return the token ids."""
        payload: dict[str, Any] = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "add_special_tokens": False,
        }
        if tools:
            payload["tools"] = tools
        return await self._tokenize(address, model, payload)

    async def tokenize_text(self, address: str, model: str | None, text: str) -> list[int]:
        """Tokenize plain text (no special tokens added)."""
        return await self._tokenize(address, model, {"prompt": text, "add_special_tokens": False})

    async def _tokenize(self, address: str, model: str | None, payload: dict[str, Any]) -> list[int]:
        if model is not None:
            payload["model"] = model
        body = await self._post(f"{server_root(address)}/tokenize", payload)
        try:
            return [int(t) for t in body["tokens"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise BackendUnavailable(f"malformed /tokenize response: {exc!r}") from exc

    async def detokenize(self, address: str, model: str | None, ids: list[int]) -> str:
        """Turn token ids into text with the backend's tokenizer."""
        payload: dict[str, Any] = {"tokens": ids}
        if model is not None:
            payload["model"] = model
        body = await self._post(f"{server_root(address)}/detokenize", payload)
        return str(body.get("prompt", ""))

    async def served_model(self, address: str) -> ServedModel:
        """The first model the backend serves, with its context length (`GET /v1/models`)."""
        url = f"{address.rstrip('/')}/models"
        try:
            response = await self._client().get(url)
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"GET {url} failed: {type(exc).__name__}: {exc}") from exc
        data = _json_or_raise(response).get("data") or []
        if not data:
            raise BackendUnavailable(f"GET {url} lists no model")
        length = data[0].get("max_model_len")
        return ServedModel(id=str(data[0]["id"]), max_model_len=length if isinstance(length, int) else None)

    async def healthy(self, address: str, timeout_s: float = 5.0) -> tuple[bool, str | None]:
        """Probe `GET /health`; returns (ok, error message)."""
        url = f"{server_root(address)}/health"
        try:
            response = await self._client().get(url, timeout=timeout_s)
        except httpx.HTTPError as exc:
            return False, f"GET {url}: {type(exc).__name__}: {exc}"
        if response.status_code != 200:
            return False, f"GET {url}: HTTP {response.status_code}"
        return True, None


def _json_or_raise(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 500:
        raise BackendUnavailable(f"{response.request.url}: HTTP {response.status_code}: {response.text[:500]}")
    if response.status_code >= 400:
        raise BackendRequestError(
            f"{response.request.url} rejected the request: HTTP {response.status_code}: {_error_message(response)}",
            response.status_code,
        )
    try:
        return response.json()
    except ValueError as exc:
        raise BackendUnavailable(f"{response.request.url}: response is not JSON") from exc


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "message" in body:
            return str(body["message"])
        if "detail" in body:
            return str(body["detail"])
    return str(body)[:500]
