"""The route skeleton of vLLM's OpenAI-compatible server, shared by this project's fake engines.

`add_vllm_routes(app, serving)` adds the routes every fake engine serves alike (`/health`, `/v1/models`,
`/tokenize`, `/detokenize`, `/v1/completions` and, when the engine chats, `/v1/chat/completions`), each a
thin call into a `VLLMServing` the engine fills in: the dev engine (`devllm.app`, a real small LLM), the
simulator (`simllm.app`) and the test double (`testing.scripted_serving`). Bodies are the wire models of
`protocol.vllm` unless the serving names other types (the test double reads raw JSON objects, so that it
can be sent anything and answer as told).

No `from __future__ import annotations` here: FastAPI reads each route's body type from its signature,
and the types are the serving's, known only when the routes are added.
"""

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.responses import Response

from prorl_server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ModelCard,
    ModelList,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)


class VLLMServing(ABC):
    """What an engine answers on vLLM's routes; each method is one route, handed the parsed body."""

    tokenize_body: ClassVar[Any] = TokenizeCompletionRequest | TokenizeChatRequest
    detokenize_body: ClassVar[Any] = DetokenizeRequest
    completion_body: ClassVar[Any] = CompletionRequest
    chat_body: ClassVar[Any] = ChatCompletionRequest
    chats: ClassVar[bool] = True
    """Whether the engine serves `/v1/chat/completions` (without it the route is absent: 404, as unknown)."""

    card: ModelCard
    """The served model, as `GET /v1/models` lists it."""

    async def health(self, request: Request) -> Any:
        """`GET /health`: 200 with an empty body when the engine can serve."""
        return Response(status_code=200)

    async def models(self, request: Request) -> Any:
        """`GET /v1/models`: the served model's card."""
        return ModelList(data=[self.card])

    @abstractmethod
    async def tokenize(self, body: Any, request: Request) -> Any:
        """`POST /tokenize`: the ids of a text, or of messages rendered with the chat template."""

    @abstractmethod
    async def detokenize(self, body: Any, request: Request) -> Any:
        """`POST /detokenize`: the text of some ids."""

    @abstractmethod
    async def completion(self, body: Any, request: Request) -> Any:
        """`POST /v1/completions`: sample from a prompt (text or ids); a bare Response (499) once the client left."""

    async def chat_completion(self, body: Any, request: Request) -> Any:
        """`POST /v1/chat/completions`: sample a reply to messages (engines with `chats` override this)."""
        return Response(status_code=404)


def add_vllm_routes(app: FastAPI, serving: VLLMServing) -> None:
    """Add vLLM's routes to `app`, answered by `serving`."""
    tokenize_body = serving.tokenize_body
    detokenize_body = serving.detokenize_body
    completion_body = serving.completion_body
    chat_body = serving.chat_body

    @app.get("/health", response_model=None)
    async def health(request: Request) -> Any:
        return await serving.health(request)

    @app.get("/v1/models", response_model=None)
    async def models(request: Request) -> Any:
        return await serving.models(request)

    @app.post("/tokenize", response_model=None)
    async def tokenize(body: tokenize_body, request: Request) -> Any:  # type: ignore[valid-type]
        return await serving.tokenize(body, request)

    @app.post("/detokenize", response_model=None)
    async def detokenize(body: detokenize_body, request: Request) -> Any:  # type: ignore[valid-type]
        return await serving.detokenize(body, request)

    @app.post("/v1/completions", response_model=None)
    async def completions(body: completion_body, request: Request) -> Any:  # type: ignore[valid-type]
        return await serving.completion(body, request)

    if serving.chats:

        @app.post("/v1/chat/completions", response_model=None)
        async def chat_completions(body: chat_body, request: Request) -> Any:  # type: ignore[valid-type]
            return await serving.chat_completion(body, request)
