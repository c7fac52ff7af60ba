"""The route of OpenAI's Responses API on a gateway session; the session's own key or the operator's."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from prorl_server.disconnect import CLIENT_CLOSED, until_disconnected
from prorl_server.gateway.responses.protocol import ResponsesRequest
from prorl_server.gateway.responses.serving import create_response, read_responses_request, response_events
from prorl_server.gateway.sessions import SessionRegistry
from prorl_server.request_body import openapi_body

router = APIRouter(tags=["gateway"])


@router.post(
    "/sessions/{session_id}/v1/responses",
    openapi_extra=openapi_body(ResponsesRequest),
    summary="OpenAI Responses, recorded token-exact",
)
async def create(request: Request, session_id: str) -> Any:
    registry: SessionRegistry = request.app.state.gateway
    session = registry.authorize(session_id, request.headers.get("authorization"))
    body = await read_responses_request(request, registry.limits)

    async def call() -> Any:
        async with session.call():
            return await create_response(session, body, registry.limits)

    response = await until_disconnected(request, call())
    if response is None:  # the harness went away; its completion was aborted
        return JSONResponse({}, status_code=CLIENT_CLOSED)
    if body.stream:
        return StreamingResponse(response_events(response), media_type="text/event-stream")
    return JSONResponse(response.model_dump())
