"""Lifecycle and introspection routes: start, stop, status, health, handlers."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends

from prorl_server.api.state import ServerState, get_state
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
    return state.orchestrator.status()


@router.get("/health", response_model=HealthResponse)
async def health(state: State) -> HealthResponse:
    """Liveness: answers while the process serves HTTP, running or stopped."""
    return HealthResponse(status="ok", running=state.orchestrator.running)


@router.get("/handlers", response_model=list[HandlerInfo])
async def handlers(state: State) -> list[HandlerInfo]:
    """Registered handlers by data_source, with the load error of any that failed."""
    return [
        HandlerInfo(data_source=e.data_source, target=e.target, loaded=e.handler is not None, error=e.error)
        for e in state.registry.entries()
    ]
