"""The route of Anthropic's Messages API on a gateway session: `POST /sessions/{id}/v1/messages`.

The key is read from `x-api-key` (as Anthropic's clients send it) or `Authorization: Bearer`, and checked
like the OpenAI paths' (the session's own key or the operator's). Every error, the OpenAI path's included,
is answered in Anthropic's shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from prorl_server.disconnect import CLIENT_CLOSED, until_disconnected
from prorl_server.gateway.anthropic.errors import error_response
from prorl_server.gateway.anthropic.protocol import MessagesRequest
from prorl_server.gateway.anthropic.serving import message_events, read_messages_request
from prorl_server.gateway.anthropic.translate import chat_request, message_of
from prorl_server.gateway.errors import GatewayError
from prorl_server.gateway.serving import complete
from prorl_server.gateway.sessions import GatewaySession, SessionRegistry
from prorl_server.request_body import openapi_body

router = APIRouter(tags=["gateway"])


def authorized(request: Request, session_id: str) -> GatewaySession:
    """The session the request's key opens (`x-api-key`, else `Authorization`); 401/404 otherwise."""
    registry: SessionRegistry = request.app.state.gateway
    api_key = request.headers.get("x-api-key")
    authorization = f"Bearer {api_key}" if api_key is not None else request.headers.get("authorization")
    return registry.authorize(session_id, authorization)


@router.post(
    "/sessions/{session_id}/v1/messages",
    openapi_extra=openapi_body(MessagesRequest),
    summary="Anthropic Messages, recorded token-exact",
)
async def messages(request: Request, session_id: str) -> Any:
    try:
        session = authorized(request, session_id)
        registry: SessionRegistry = request.app.state.gateway
        body = await read_messages_request(request, registry.limits)
        chat = chat_request(body)
        if len(chat.messages) > registry.limits.max_messages:
            raise GatewayError(
                400,
                f"{len(chat.messages)} messages once tool results are split out; at most {registry.limits.max_messages}",
            )

        async def call() -> Any:
            async with session.call():
                return await complete(session, chat, "anthropic")

        recorded = await until_disconnected(request, call())
    except GatewayError as exc:
        return error_response(exc)
    if recorded is None:  # the harness went away; its completion was aborted
        return JSONResponse({}, status_code=CLIENT_CLOSED)
    message = message_of(body, recorded)
    if body.stream:
        return StreamingResponse(message_events(message), media_type="text/event-stream")
    return JSONResponse(message.model_dump())
