"""The live dashboard: `GET /dashboard` (a static page, no build step) and `GET /dashboard/data`, the JSON it
polls.

The page and its script and style sheet carry no server data, so they are served without the API key (auth.py's
`OPEN_PATHS` lists them); the data needs it like every other endpoint (the page asks for the key and sends it as a Bearer header;
docs/security.md).
"""

from __future__ import annotations

import math
import time
from functools import cache
from importlib import resources
from typing import Annotated

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, Field

from prorl_server.api.state import ServerState, get_state
from prorl_server.observability import BUCKET_S, JobSummary, ThroughputPoint, status_report
from prorl_server.protocol import StatusResponse

router = APIRouter(tags=["observability"])
State = Annotated[ServerState, Depends(get_state)]

PAGE_PATH = "/dashboard"

_PAGE_HEADERS = {
    # the page runs only its own script and style, talks only to this server, and is never framed
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


class BackendLoad(BaseModel):
    """One backend's load and health."""

    address: str
    healthy: bool
    circuit: str
    jobs_pinned: int
    calls_in_flight: int
    tokens_per_s: float | None
    last_error: str | None


class LengthBucket(BaseModel):
    """Finished trajectories with more tokens than the previous bucket's bound and at most `le` (null: no bound)."""

    le: float | None
    count: int


class DashboardData(BaseModel):
    """What the dashboard shows, in one answer."""

    generated_at: float = Field(description="Unix seconds.")
    status: StatusResponse
    backends: list[BackendLoad]
    finished: dict[str, int] = Field(description="Jobs ended since the server started, by status.")
    recent_jobs: list[JobSummary] = Field(description="The last finished jobs, newest first.")
    lengths: list[LengthBucket] = Field(description="Trajectory lengths in tokens (prorl_trajectory_tokens).")
    bucket_s: int
    throughput: list[ThroughputPoint]


@router.get(PAGE_PATH, include_in_schema=False)
async def page() -> Response:
    """The dashboard page."""
    return Response(_static("dashboard.html"), media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)


@router.get(PAGE_PATH + "/data", response_model=DashboardData)
async def data(state: State) -> DashboardData:
    """Everything the dashboard shows: pipeline, backends, recent jobs, trajectory lengths, throughput."""
    metrics, pool = state.metrics, state.backends
    backends = [
        BackendLoad(
            address=b.address,
            healthy=b.healthy,
            circuit=b.breaker.state.value,
            jobs_pinned=b.in_flight,
            calls_in_flight=pool.calls_on(b),
            tokens_per_s=b.tokens_per_s,
            last_error=b.last_error,
        )
        for b in pool.backends()
    ]
    finished: dict[str, int] = {}
    for sample in metrics.jobs_finished.collect()[0].samples:
        if sample.name.endswith("_total"):
            status = sample.labels["status"]
            finished[status] = finished.get(status, 0) + int(sample.value)
    return DashboardData(
        generated_at=time.time(),
        status=status_report(state.orchestrator),
        backends=backends,
        finished=finished,
        recent_jobs=metrics.activity.recent_jobs(),
        lengths=_length_buckets(state),
        bucket_s=BUCKET_S,
        throughput=metrics.activity.throughput(),
    )


@router.get(PAGE_PATH + "/dashboard.js", include_in_schema=False)
async def script() -> Response:
    """The page's script."""
    return Response(_static("dashboard.js"), media_type="text/javascript; charset=utf-8", headers=_PAGE_HEADERS)


@router.get(PAGE_PATH + "/dashboard.css", include_in_schema=False)
async def style_sheet() -> Response:
    """The page's style sheet."""
    return Response(_static("dashboard.css"), media_type="text/css; charset=utf-8", headers=_PAGE_HEADERS)


def _length_buckets(state: ServerState) -> list[LengthBucket]:
    """The trajectory-length histogram, per bucket (Prometheus keeps it cumulative)."""
    buckets: list[LengthBucket] = []
    below = 0
    for sample in state.metrics.trajectory_tokens.collect()[0].samples:
        if sample.name.endswith("_bucket"):
            bound = float(sample.labels["le"])
            count = int(sample.value)
            buckets.append(LengthBucket(le=None if math.isinf(bound) else bound, count=count - below))
            below = count
    return buckets


@cache
def _static(name: str) -> bytes:
    return resources.files("prorl_server.api").joinpath("static", name).read_bytes()
