"""Weight-update routes: the trainer pauses LLM dispatching, updates the engines, sets the version, resumes.

While paused, LLM calls wait at the backend pool's dispatch gate (`llm/dispatch_gate.py`): the wait does
not spend their retry budget and is no backend failure. Every turn records the weight version of the
backend that sampled it, and requests carry `cache_salt` naming that version.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response

from prorl_server.api.body import openapi_body, parse_body
from prorl_server.api.responses import model_response
from prorl_server.api.state import ServerState, get_state
from prorl_server.llm import BackendPool
from prorl_server.protocol import (
    PauseRequest,
    PauseResponse,
    SwapRequest,
    SwapResponse,
    UpdateRequest,
    UpdateResponse,
    WeightsStatus,
)

router = APIRouter(tags=["weights"])
State = Annotated[ServerState, Depends(get_state)]


@router.get("/weights", response_model=WeightsStatus)
async def weights(state: State) -> Response:
    """Whether dispatching is paused (and how), the current weight version, calls in flight and waiting."""
    return model_response(_status(state.backends))


@router.post("/weights/pause", response_model=PauseResponse, openapi_extra=openapi_body(PauseRequest))
async def pause(request: Request, state: State) -> Response:
    """Stop dispatching LLM calls; answer once none is in flight (or after `timeout_s`: `drained` false).

    mode "wait" (default: `{}`) lets calls in flight finish; "abort" closes them now (the
    engine aborts them, their partial output is dropped) and they are sent again from the same prompt after
    the resume. Pausing a paused server is idempotent: it stays paused, waits for the calls still in flight
    again, and an "abort" pause aborts them (the mode becomes "abort")."""
    body = await parse_body(request, PauseRequest)
    gate = state.backends.gate
    waited_for, aborted = gate.pause(body.mode)
    drained = await gate.wait_idle(body.timeout_s)
    status = _status(state.backends)
    return model_response(PauseResponse(**status.model_dump(), waited_for=waited_for, aborted=aborted, drained=drained))


@router.post("/weights/update", response_model=UpdateResponse, openapi_extra=openapi_body(UpdateRequest))
async def update(request: Request, state: State) -> Response:
    """Set the new weight version on every backend, or make `servers` the backends (all at the version).

    Only while paused and drained (409 otherwise: POST /weights/pause first). 409 when the version goes
    backwards: an integer must exceed every earlier integer version, a string must differ from every
    earlier version. Jobs pinned to a removed backend move to another one on their next call."""
    body = await parse_body(request, UpdateRequest)
    pool = state.backends
    _check_paused(pool, "update the weight version")
    _apply(state, body)
    return model_response(UpdateResponse(**_status(pool).model_dump(), servers=[b.info() for b in pool.backends()]))


@router.post("/weights/resume", response_model=WeightsStatus)
async def resume(state: State) -> Response:
    """Dispatch LLM calls again (the held ones first); 409 when not paused."""
    if not state.backends.gate.resume():
        raise HTTPException(409, "LLM dispatching is not paused; nothing to resume")
    return model_response(_status(state.backends))


@router.post("/weights/swap", response_model=SwapResponse, openapi_extra=openapi_body(SwapRequest))
async def swap(request: Request, state: State) -> Response:
    """Pause (`mode`), set the version (and `servers`) once no call is in flight, and resume, in one call.

    The body is checked before pausing: a bad version is 409 and changes nothing. When calls are still in
    flight after `timeout_s`, or someone resumed meanwhile, it is 409 and the server stays as it was then
    (paused by this call unless it had been paused before: then a resume is up to the caller)."""
    body = await parse_body(request, SwapRequest)
    pool = state.backends
    gate = pool.gate
    _check_version(pool, body.version)
    was_paused = gate.paused
    waited_for, aborted = gate.pause(body.mode)
    if not await gate.wait_idle(body.timeout_s):
        if not was_paused:
            gate.resume()
        raise HTTPException(409, f"{gate.in_flight} LLM call(s) still in flight after {body.timeout_s:g}s")
    _check_paused(pool, "swap weights")
    _apply(state, body)
    gate.resume()
    return model_response(
        SwapResponse(
            **_status(pool).model_dump(),
            servers=[b.info() for b in pool.backends()],
            waited_for=waited_for,
            aborted=aborted,
        )
    )


# helpers -------------------------------------------------------------------------------------------


def _status(pool: BackendPool) -> WeightsStatus:
    gate = pool.gate
    return WeightsStatus(
        paused=gate.paused,
        mode=gate.mode,
        version=pool.current_version,
        in_flight_calls=gate.in_flight,
        waiting_calls=gate.waiting,
    )


def _check_paused(pool: BackendPool, what: str) -> None:
    if not pool.gate.paused:
        raise HTTPException(409, f"LLM dispatching is not paused: POST /weights/pause first, then {what}")
    if in_flight := pool.gate.in_flight:
        raise HTTPException(
            409, f"{in_flight} LLM call(s) still in flight; POST /weights/pause answers once they are done"
        )


def _check_version(pool: BackendPool, version: str | int) -> None:
    if conflict := pool.version_conflict(version):
        raise HTTPException(409, conflict)


def _apply(state: ServerState, body: UpdateRequest) -> None:
    """Check and set the version (no await in between: routes run on one loop, so this is atomic)."""
    pool = state.backends
    _check_version(pool, body.version)
    servers = None if body.servers is None else [(s.address, s.tags) for s in body.servers]
    pool.set_weight_version(body.version, servers)
    if servers is not None:
        state.probe_soon()
