"""LLM backend routes: register, drain one (POST /remove_llm_server or DELETE /llm_servers/{address}), clear,
list."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from prorl_server.api.responses import model_response
from prorl_server.api.state import ServerState, get_state
from prorl_server.protocol import (
    AddLLMServerRequest,
    LLMServerInfo,
    LLMServerList,
    RemoveLLMServerRequest,
    RemoveLLMServerResponse,
)
from prorl_server.request_body import openapi_body, parse_body

router = APIRouter(tags=["llm servers"])
State = Annotated[ServerState, Depends(get_state)]

_DRAIN_POLL_S = 0.02


@router.post("/add_llm_server", response_model=LLMServerInfo, openapi_extra=openapi_body(AddLLMServerRequest))
async def add_llm_server(request: Request, state: State) -> LLMServerInfo:
    """Register a backend (or update the weight version of a known one); kept across /stop and /start."""
    body = await parse_body(request, AddLLMServerRequest)
    backend = state.backends.add(body.address, body.weight_version, body.tags)
    state.probe_soon()
    return backend.info()


@router.post(
    "/remove_llm_server", response_model=RemoveLLMServerResponse, openapi_extra=openapi_body(RemoveLLMServerRequest)
)
async def remove_llm_server(request: Request, state: State) -> Response:
    """Drain one backend: it takes no new job or call at once; jobs pinned to it move to another backend at
    their next call (resending their whole token context there); its calls in flight finish there, or with
    `abort` are closed now and sent again elsewhere. Answers once none is in flight on it (or after
    `timeout_s`: `drained` false). 404 for an address not registered.

    Removing the last backend is allowed: the jobs' next calls then wait, within `--llm-retry-budget`, for a
    backend to be added (POST /add_llm_server), and fail past it; new jobs get 503 meanwhile."""
    return await _drain(state, await parse_body(request, RemoveLLMServerRequest))


@router.delete("/llm_servers/{address:path}", response_model=RemoveLLMServerResponse)
async def delete_llm_server(
    state: State,
    address: str,
    abort: bool = False,
    timeout_s: Annotated[float | None, Query(gt=0, le=86400, allow_inf_nan=False)] = None,
) -> Response:
    """The same drain as `POST /remove_llm_server`, with the address URL-encoded in the path
    (`DELETE /llm_servers/http%3A%2F%2Fnode7%3A8000%2Fv1?abort=true`) and the options as query parameters."""
    try:
        body = RemoveLLMServerRequest(address=address, abort=abort, timeout_s=timeout_s)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False)
        raise RequestValidationError([{**err, "loc": ("path", *err["loc"])} for err in errors]) from None
    return await _drain(state, body)


async def _drain(state: ServerState, body: RemoveLLMServerRequest) -> Response:
    pool = state.backends
    removed = pool.remove(body.address, abort=body.abort)
    if removed is None:
        known = ", ".join(b.address for b in pool.backends()[:8]) or "none"
        raise HTTPException(404, f"no LLM backend {body.address!r} is registered (registered: {known})")
    backend, moved, aborted = removed
    info = backend.info()
    deadline = None if body.timeout_s is None else time.monotonic() + body.timeout_s
    while (in_flight := pool.calls_on(backend)) and (deadline is None or time.monotonic() < deadline):
        await asyncio.sleep(_DRAIN_POLL_S)
    return model_response(
        RemoveLLMServerResponse(
            removed=info,
            moved_jobs=moved,
            aborted_calls=aborted,
            in_flight_calls=in_flight,
            drained=in_flight == 0,
            remaining=pool.counts()[0],
        )
    )


@router.post("/clear_llm_server")
async def clear_llm_server(state: State) -> dict[str, int]:
    """Forget every backend; jobs in flight move to backends registered next."""
    return {"removed": state.backends.clear()}


@router.get("/llm_servers", response_model=LLMServerList)
async def llm_servers(state: State) -> LLMServerList:
    """Registered backends with weight version, jobs assigned, jobs in flight and health."""
    return LLMServerList(policy=state.backends.policy.name, servers=[b.info() for b in state.backends.backends()])
