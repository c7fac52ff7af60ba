"""A transparent HTTP proxy in front of an LLM engine that keeps the engine's own answers to completions.

Tests and benchmarks put it between prorl-server and a real vLLM, which keeps no record of what it sampled,
to check that a trajectory carries exactly the ids and logprobs the engine returned::

    proxy = RecordingProxy("http://127.0.0.1:8101")
    with UvicornThread(proxy.app()) as server:          # give prorl-server f"{server.url}/v1"
        ...
        proxy.generations()                              # what the engine answered, oldest first

Every request is forwarded unchanged (method, path, query, body, content type) and the answer returned
unchanged. A client that goes away before the answer closes the upstream request too, so the engine aborts
it as it would without the proxy.
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from prorl_server.disconnect import CLIENT_CLOSED, until_disconnected
from prorl_server.llm import JOB_ID_HEADER

FORWARDED_HEADERS = ("content-type", "authorization", "accept", JOB_ID_HEADER)


@dataclass(frozen=True)
class RecordedGeneration:
    """One completion as the engine answered it (token-id prompts with `return_token_ids` only)."""

    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str | None
    seed: int | None
    request: dict[str, Any]
    response: dict[str, Any]


def recorded_generation(request: dict[str, Any], response: dict[str, Any]) -> RecordedGeneration | None:
    """The generation in one `/v1/completions` exchange, or None when it did not carry token ids."""
    prompt = request.get("prompt")
    choices = response.get("choices") or []
    if not isinstance(prompt, list) or len(choices) != 1 or choices[0].get("token_ids") is None:
        return None
    choice = choices[0]
    logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
    return RecordedGeneration(
        prompt_ids=list(prompt),
        output_ids=list(choice["token_ids"]),
        logprobs=list(logprobs) if logprobs is not None else None,
        finish_reason=choice.get("finish_reason"),
        seed=request.get("seed"),
        request=request,
        response=response,
    )


class RecordingProxy:
    """Forwards everything to `upstream` (a base URL without `/v1`) and keeps the last `keep` successful
    `POST /v1/completions` exchanges."""

    def __init__(self, upstream: str, keep: int = 10_000) -> None:
        self.upstream = upstream.rstrip("/")
        self._generations: deque[RecordedGeneration] = deque(maxlen=keep)
        self.forwarded = 0
        self.unrecorded = 0  # completions answered with an error, or without token ids

    def generations(self) -> list[RecordedGeneration]:
        """The recorded completions, oldest first."""
        return list(self._generations)

    def app(self) -> Starlette:
        """The ASGI app; its HTTP client lives as long as the app runs."""
        client: httpx.AsyncClient | None = None

        @contextlib.asynccontextmanager
        async def lifespan(_: Starlette):
            nonlocal client
            async with httpx.AsyncClient(timeout=None, trust_env=False) as http:
                client = http
                yield

        async def forward(request: Request) -> Response:
            assert client is not None
            body = await request.body()
            headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
            upstream = client.build_request(
                request.method,
                f"{self.upstream}{request.url.path}",
                params=request.query_params,
                content=body,
                headers=headers,
            )
            answer = await until_disconnected(request, _fetch(client, upstream))
            if answer is None:
                return Response(status_code=CLIENT_CLOSED)
            status, content_type, content = answer
            self.forwarded += 1
            if request.method == "POST" and request.url.path == "/v1/completions":
                self._record(body, content if status == 200 else None)
            return Response(
                content, status_code=status, headers={"content-type": content_type} if content_type else None
            )

        methods = ["GET", "POST", "PUT", "DELETE", "PATCH"]
        return Starlette(routes=[Route("/{path:path}", forward, methods=methods)], lifespan=lifespan)

    def _record(self, request_body: bytes, response_body: bytes | None) -> None:
        """Keep a successful completion's generation; count one without a usable answer."""
        generation = None
        if response_body is not None:
            try:
                generation = recorded_generation(json.loads(request_body), json.loads(response_body))
            except (ValueError, TypeError, KeyError):
                generation = None
        if generation is None:
            self.unrecorded += 1
        else:
            self._generations.append(generation)


async def _fetch(client: httpx.AsyncClient, request: httpx.Request) -> tuple[int, str | None, bytes]:
    response = await client.send(request, stream=True)
    try:
        return response.status_code, response.headers.get("content-type"), await response.aread()
    finally:
        await response.aclose()
