"""Job routes: blocking `/process`, submit-and-poll `/jobs`, listing, acknowledgement, cancellation.

With a results journal, an answer that accepts a job, hands out a result or confirms an acknowledgement
waits (without blocking the event loop) until that change is on disk: what a client was told survives a
crash of the server."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response

from prorl_server.api.responses import model_response
from prorl_server.api.state import ServerState, get_state
from prorl_server.protocol import (
    JOB_ID_MAX_CHARS,
    TERMINAL_STATUSES,
    AckRequest,
    AckResponse,
    CancelRequest,
    CancelResponse,
    JobAccepted,
    JobList,
    JobResult,
    JobStatus,
    JobStatusResponse,
    ProcessRequest,
)
from prorl_server.request_body import openapi_body, parse_body

router = APIRouter(tags=["jobs"])
State = Annotated[ServerState, Depends(get_state)]
JobIdPath = Annotated[str, Path(min_length=1, max_length=JOB_ID_MAX_CHARS)]


@router.post("/process", response_model=JobResult, openapi_extra=openapi_body(ProcessRequest))
async def process(request: Request) -> Response:
    """Run one job and return its result when it is terminal (the result is also kept for `GET /jobs`)."""
    body = await parse_body(request, ProcessRequest)
    state: ServerState = request.app.state.server
    job = state.orchestrator.admit(body)
    result = await job.wait()
    await state.durable(admissions=False)
    return model_response(result)


@router.post("/jobs", status_code=202, response_model=JobAccepted, openapi_extra=openapi_body(ProcessRequest))
async def submit(request: Request) -> Response:
    """Queue a job and return its id at once."""
    body = await parse_body(request, ProcessRequest)
    state: ServerState = request.app.state.server
    job = state.orchestrator.admit(body)
    await state.durable()
    return model_response(JobAccepted(job_id=job.id), status_code=202)


@router.get("/jobs", response_model=JobList)
async def list_results(
    state: State,
    status: Annotated[
        list[str] | None, Query(description="Terminal statuses to include (repeat or comma-separate)")
    ] = None,
    after: Annotated[int, Query(ge=0, description="Cursor: list results stored after this one")] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    wait: Annotated[
        float, Query(ge=0, le=300, allow_inf_nan=False, description="Long-poll: seconds to wait for a first result")
    ] = 0,
) -> Response:
    """Finished results in completion order, after a cursor; pass `next_cursor` back as `after`."""
    statuses = _parse_statuses(status)
    deadline = time.monotonic() + wait
    with state.signal.watching():
        while True:
            results, cursor = state.orchestrator.results.page(statuses, after, limit)
            remaining = deadline - time.monotonic()
            if results or remaining <= 0:
                await state.durable(admissions=False)
                return model_response(JobList(results=results, next_cursor=cursor))
            await state.signal.wait(remaining)


@router.post("/jobs/ack", response_model=AckResponse, openapi_extra=openapi_body(AckRequest))
async def acknowledge(request: Request, state: State) -> AckResponse:
    """Drop stored results the trainer has safely received."""
    body = await parse_body(request, AckRequest)
    acknowledged = state.orchestrator.results.ack(body.job_ids, body.through)
    await state.durable(admissions=False)
    return AckResponse(acknowledged=acknowledged)


@router.get("/jobs/{job_id}", response_model=JobStatusResponse)
async def get_job(job_id: JobIdPath, state: State) -> Response:
    """A job's status, and its result once terminal."""
    found = state.orchestrator.lookup(job_id)
    if found is None:
        raise HTTPException(404, f"no job {job_id!r} (never submitted, acknowledged, or past retention)")
    status, result = found
    if result is not None:
        await state.durable(admissions=False)
    return model_response(JobStatusResponse(job_id=job_id, status=status, result=result))


@router.delete("/jobs/{job_id}", response_model=CancelResponse)
async def delete_job(job_id: JobIdPath, state: State) -> CancelResponse:
    """Cancel a job (idempotent; a finished job keeps its result)."""
    return _cancel(state, job_id)


@router.post("/cancel", response_model=CancelResponse, openapi_extra=openapi_body(CancelRequest))
async def cancel(request: Request, state: State) -> CancelResponse:
    """Cancel a job (idempotent; a finished job keeps its result)."""
    return _cancel(state, (await parse_body(request, CancelRequest)).job_id)


def _cancel(state: ServerState, job_id: str) -> CancelResponse:
    status = state.orchestrator.cancel(job_id)
    if status is None:
        raise HTTPException(404, f"no job {job_id!r} (never submitted, acknowledged, or past retention)")
    return CancelResponse(job_id=job_id, status=status.value)


def _parse_statuses(raw: list[str] | None) -> set[JobStatus] | None:
    if not raw:
        return None
    names = [name.strip() for item in raw for name in item.split(",") if name.strip()]
    allowed = sorted(s.value for s in TERMINAL_STATUSES)
    statuses: set[JobStatus] = set()
    for name in names:
        try:
            status = JobStatus(name)
        except ValueError:
            status = None
        if status not in TERMINAL_STATUSES:
            raise HTTPException(
                400, f"status {name[:40]!r} cannot be listed; GET /jobs lists finished results: {allowed}"
            )
        statuses.add(status)
    return statuses
