"""`GET /metrics`: the server's Prometheus metrics (docs/metrics.md); with an API key set, it needs the key."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from prorl_server.api.state import ServerState, get_state

router = APIRouter(tags=["observability"])
State = Annotated[ServerState, Depends(get_state)]


@router.get("/metrics", response_class=Response)
async def metrics(state: State) -> Response:
    """The server's metrics in the Prometheus text format."""
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
