"""Thin FastAPI routes of the gateway: the OpenAI API per session, and the trainer's session endpoints.

- `POST /sessions` and `DELETE /sessions/{id}` are the trainer's (behind `--api-key` like every endpoint).
- `/sessions/{id}/v1/...` is the harness's: it needs the session's own key or the operator's
  (`Authorization: Bearer`), checked here; the API-key middleware lets these paths through to this check.
- `GET` and `HEAD` of `/sessions/{id}` and `/sessions/{id}/v1` (the Anthropic and the OpenAI base URL, which
  harnesses probe: Claude Code sends `HEAD` to its base URL) answer the session's model names, with the
  session's key in `x-api-key` or `Authorization` (HEAD: the same status and headers, no body).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from prorl_server.disconnect import CLIENT_CLOSED, until_disconnected
from prorl_server.gateway.anthropic.router import authorized as authorized_either_key
from prorl_server.gateway.anthropic.router import router as anthropic_router
from prorl_server.gateway.errors import GatewayError, gateway_error_handler, session_not_found
from prorl_server.gateway.protocol import ChatCompletionRequest, ModelCard, ModelList, SessionProbe
from prorl_server.gateway.responses.router import router as responses_router
from prorl_server.gateway.serving import complete, completion_body, completion_events, read_chat_request
from prorl_server.gateway.sessions import GatewaySession, SessionRegistry
from prorl_server.protocol import OpenSessionRequest, SessionOpened, SessionResult
from prorl_server.request_body import openapi_body, parse_body

router = APIRouter(tags=["gateway"])


def install(app: FastAPI, registry: SessionRegistry) -> None:
    """Add the gateway's routes and its error shape to `app`."""
    app.state.gateway = registry
    app.add_exception_handler(GatewayError, gateway_error_handler)
    app.include_router(router)
    app.include_router(responses_router)
    app.include_router(anthropic_router)


async def get_registry(request: Request) -> SessionRegistry:
    """FastAPI dependency: the app's session registry."""
    return request.app.state.gateway


Registry = Annotated[SessionRegistry, Depends(get_registry)]


def authorized(request: Request, session_id: str) -> GatewaySession:
    """The session the request's key opens (401/404 otherwise)."""
    registry: SessionRegistry = request.app.state.gateway
    return registry.authorize(session_id, request.headers.get("authorization"))


@router.post(
    "/sessions",
    response_model=SessionOpened,
    openapi_extra=openapi_body(OpenSessionRequest),
    summary="Open a standalone gateway session",
)
async def open_session(request: Request, registry: Registry) -> SessionOpened:
    body = await parse_body(request, OpenSessionRequest)
    session = await registry.open(body)
    return SessionOpened(
        session_id=session.id,
        base_url=registry.base_url(session, str(request.base_url)),
        api_key=session.key,
        model=session.alias or session.model,
    )


@router.delete("/sessions/{session_id}", response_model=SessionResult, summary="Close a session: its trajectory")
async def close_session(session_id: str, registry: Registry) -> SessionResult:
    result = await registry.close(session_id)
    if result is None:
        raise session_not_found(session_id)
    return result


@router.get("/sessions/{session_id}", response_model=SessionProbe, summary="A harness's probe")
@router.get("/sessions/{session_id}/v1", response_model=SessionProbe, summary="A harness's probe")
@router.head("/sessions/{session_id}", include_in_schema=False)  # Claude Code's probe; its GET twin is in the schema
@router.head("/sessions/{session_id}/v1", include_in_schema=False)
async def probe_session(request: Request, session_id: str) -> SessionProbe:
    session = authorized_either_key(request, session_id)
    return SessionProbe(id=session.id, models=session.model_names)


@router.get("/sessions/{session_id}/v1/models", response_model=ModelList, summary="The session's model")
async def list_models(request: Request, session_id: str) -> ModelList:
    session = authorized(request, session_id)
    created = int(time.time())
    return ModelList(data=[ModelCard(id=name, created=created) for name in session.model_names])


@router.post(
    "/sessions/{session_id}/v1/chat/completions",
    openapi_extra=openapi_body(ChatCompletionRequest),
    summary="OpenAI chat completion, recorded token-exact",
)
async def chat_completions(request: Request, session_id: str) -> Any:
    session = authorized(request, session_id)
    registry: SessionRegistry = request.app.state.gateway
    chat = await read_chat_request(request, registry.limits)

    async def call() -> Any:
        async with session.call():
            return await complete(session, chat)

    recorded = await until_disconnected(request, call())
    if recorded is None:  # the harness went away; its completion was aborted
        return JSONResponse({}, status_code=CLIENT_CLOSED)
    if chat.stream:
        return StreamingResponse(completion_events(chat, recorded), media_type="text/event-stream")
    return JSONResponse(completion_body(chat, recorded))
