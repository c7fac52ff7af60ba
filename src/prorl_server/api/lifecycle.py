"""Lifecycle and introspection routes: start, stop, status, health, handlers."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, Response

from prorl_server.api.state import ServerState, get_state
from prorl_server.observability import problems as health_problems
from prorl_server.observability import status_report
from prorl_server.protocol import HandlerInfo, HealthResponse, LifecycleResponse, StatusResponse

router = APIRouter(tags=["server"])
State = Annotated[ServerState, Depends(get_state)]


@router.post("/start", response_model=LifecycleResponse)
async def start(state: State) -> LifecycleResponse:
    """Start (or resume) the stage pools."""
    await asyncio.to_thread(state.orchestrator.start)
    return LifecycleResponse(running=True)


@router.post("/stop", response_model=LifecycleResponse)
async def stop(state: State) -> LifecycleResponse:
    """Cancel every live job, release its resources and stop the pools; /start resumes."""
    cancelled = await asyncio.to_thread(state.orchestrator.stop)
    return LifecycleResponse(running=False, cancelled_jobs=cancelled)


@router.get("/status", response_model=StatusResponse)
async def status(state: State) -> StatusResponse:
    """Queue depths, busy workers per stage, job counts and backend counts."""
    return status_report(state.orchestrator)


@router.get(
    "/health",
    response_model=HealthResponse,
    responses={503: {"model": HealthResponse, "description": "Degraded: see `problems`."}},
)
async def health(state: State, response: Response) -> HealthResponse:
    """200 `ok` while the server can do its work, running or stopped; 503 `degraded` with the problems while
    it cannot (a stage's loop down or blocked, a stage's workers all taken by stuck handler calls, jobs past
    their budget that have not ended, every LLM backend unhealthy)."""
    problems = health_problems(state.orchestrator)
    if problems:
        response.status_code = 503
    return HealthResponse(
        status="degraded" if problems else "ok", running=state.orchestrator.running, problems=problems
    )


@router.get("/handlers", response_model=list[HandlerInfo])
async def handlers(state: State) -> list[HandlerInfo]:
    """Registered handlers by data_source, with the load error of any that failed."""
    return [
        HandlerInfo(data_source=e.data_source, target=e.target, loaded=e.handler is not None, error=e.error)
        for e in state.registry.entries()
    ]
