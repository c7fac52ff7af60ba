"""Weight-update routes: the trainer pauses LLM dispatching, updates the engines, sets the version, resumes.

While paused, LLM calls wait at the backend pool's weight-pause gate (`llm/weight_pause_gate.py`): the wait does
not spend their retry budget and is no backend failure. Every turn records the weight version of the
backend that sampled it, and requests carry `cache_salt` naming that version.

With `reload` in the body, each engine loads the new weights from a checkpoint directory and resets its
prefix cache (vLLM's development endpoints, `llm/vllm_admin.py`) before the version is set: the sequence
(reload, set the version, roll back on a failure) is `llm/weight_update.py`'s, whose refusals are 409 and
502 here. While the same pause lasts, `POST /weights/rollback` undoes the last update (the trainer's client
does when another server's update failed: `client/weight_sync.py`).

A pause in mode "keep" first freezes every engine (`llm/engine_freeze.py`): the calls in flight stay open
and go on under the new weights after the resume, which resumes the engines first; each such turn records
the versions it was resumed under (`TurnRecord.resumed_under`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response

from prorl_server.api.responses import model_response
from prorl_server.api.state import ServerState, get_state
from prorl_server.llm import FreezeRefused, WeightReloadFailed, WeightRestoreFailed, WeightUpdateConflict
from prorl_server.protocol import (
    PauseRequest,
    PauseResponse,
    RollbackResponse,
    SwapRequest,
    SwapResponse,
    UpdateRequest,
    UpdateResponse,
    WeightsStatus,
)
from prorl_server.request_body import openapi_body, parse_body

log = logging.getLogger(__name__)
router = APIRouter(tags=["weights"])
State = Annotated[ServerState, Depends(get_state)]


@router.get("/weights", response_model=WeightsStatus)
async def weights(state: State) -> Response:
    """Whether dispatching is paused (and how), the current weight version, calls in flight and waiting."""
    return model_response(_status(state))


@router.post("/weights/pause", response_model=PauseResponse, openapi_extra=openapi_body(PauseRequest))
async def pause(request: Request, state: State) -> Response:
    """Stop dispatching LLM calls; answer once none is in flight (or after `timeout_s`: `drained` false).

    mode "wait" (default: `{}`) lets calls in flight finish; "abort" closes them now (the
    engine aborts them, their partial output is dropped) and they are sent again from the same prompt after
    the resume; "keep" freezes every engine first (409 naming those that cannot, and nothing changes) and
    the calls in flight stay open, to go on after the resume. Pausing a paused server is idempotent: it
    stays paused, waits for the calls still in flight again, and takes the stronger mode (abort, keep, wait).

    The pause is a lease: without an update or a resume within `lease_s` (default: `--weight-pause-lease`),
    dispatching resumes by itself, so a trainer that dies mid-update never leaves the server paused."""
    body = await parse_body(request, PauseRequest)
    gate = state.backends.gate
    if body.mode == "keep":
        await _freeze(state)
    paused = gate.pause(body.mode)
    state.pause_lease.arm(body.lease_s)
    drained = await gate.wait_idle(body.timeout_s)
    status = _status(state)
    return model_response(PauseResponse(**status.model_dump(), **paused._asdict(), drained=drained))


@router.post("/weights/update", response_model=UpdateResponse, openapi_extra=openapi_body(UpdateRequest))
async def update(request: Request, state: State) -> Response:
    """Set the new weight version on every backend, or make `servers` the backends (all at the version).

    Only while paused and drained (409 otherwise: POST /weights/pause first). 409 when the version goes
    backwards: an integer must exceed every earlier integer version, a string must differ from every
    earlier version. Jobs pinned to a removed backend move to another one on their next call.

    With `reload`, every backend (those of `servers`, if given) first loads the checkpoint and resets its
    prefix cache; when one fails the answer is 502 naming it and the version stays as it was."""
    body = await parse_body(request, UpdateRequest)
    pool, update = state.backends, state.weight_update
    with _refusals():
        update.check_paused("update the weight version")
        update.check_version(body.version)
    state.pause_lease.renew()
    with _refusals():
        await update.apply(body, "update the weight version")
    return model_response(UpdateResponse(**_status(state).model_dump(), servers=[b.info() for b in pool.backends()]))


@router.post("/weights/rollback", response_model=RollbackResponse)
async def rollback(state: State) -> Response:
    """Undo the last `/weights/update` of the current pause (before its resume): every backend that reloaded
    loads its previous checkpoint back, the backend set and the weight version return to what they were, and
    the undone version may be used again. The server stays paused (resume next).

    409 when there is nothing to undo: not paused, no update in this pause, or rolled back already. 502 naming
    the backends that did not load their previous checkpoint back (the version and backends are back anyway)."""
    with _refusals():
        state.weight_update.check_rollback()
    state.pause_lease.renew()
    with _refusals():
        undo = await state.weight_update.rollback()
    return model_response(
        RollbackResponse(
            **_status(state).model_dump(),
            rolled_back_from=undo.version,
            restored=[r.address for r in undo.reloaded],
            servers=[b.info() for b in state.backends.backends()],
        )
    )


@router.post("/weights/resume", response_model=WeightsStatus)
async def resume(state: State) -> Response:
    """Resume the engines a keep pause froze, then dispatch LLM calls again (the held ones first); 409 when
    not paused."""
    if not state.backends.gate.paused:
        raise HTTPException(409, "LLM dispatching is not paused; nothing to resume")
    await _thaw(state)
    state.backends.gate.resume()
    state.pause_lease.end()
    return model_response(_status(state))


@router.post("/weights/swap", response_model=SwapResponse, openapi_extra=openapi_body(SwapRequest))
async def swap(request: Request, state: State) -> Response:
    """Pause (`mode`), set the version (and `servers`) once no call is in flight, and resume, in one call.

    The body is checked before pausing: a bad version is 409 and changes nothing. When calls are still in
    flight after `timeout_s`, or someone resumed meanwhile, it is 409 and the server stays as it was then
    (paused by this call unless it had been paused before: then a resume is up to the caller). When a
    `reload` fails it is 502 and the server stays paused (update again, or resume) until its lease runs out."""
    body = await parse_body(request, SwapRequest)
    pool, update = state.backends, state.weight_update
    gate = pool.gate
    with _refusals():
        update.check_version(body.version)
    was_paused = gate.paused
    if body.mode == "keep":
        await _freeze(state)
    paused = gate.pause(body.mode)
    if was_paused:
        state.pause_lease.renew()
    else:
        state.pause_lease.arm()
    if not await gate.wait_idle(body.timeout_s):
        if not was_paused:
            await _thaw(state)
            gate.resume()
            state.pause_lease.end()
        raise HTTPException(409, f"{gate.in_flight} LLM call(s) still in flight after {body.timeout_s:g}s")
    try:
        with _refusals():
            update.check_paused("swap weights")
            await update.apply(body, "swap weights")
    except HTTPException as exc:
        if exc.status_code == 502:
            exc.detail += (
                "; LLM dispatching stays paused: POST /weights/update with the reload again, or resume "
                "(the pause ends by itself when its lease runs out)"
            )
        raise
    await _thaw(state)
    gate.resume()
    state.pause_lease.end()
    return model_response(
        SwapResponse(**_status(state).model_dump(), servers=[b.info() for b in pool.backends()], **paused._asdict())
    )


# helpers -------------------------------------------------------------------------------------------


def _status(state: ServerState) -> WeightsStatus:
    pool, lease = state.backends, state.pause_lease
    gate = pool.gate
    return WeightsStatus(
        paused=gate.paused,
        mode=gate.mode,
        version=pool.current_version,
        in_flight_calls=gate.in_flight,
        kept_calls=gate.kept,
        waiting_calls=gate.waiting,
        lease_left_s=lease.left_s if gate.paused else None,
        lease_expired=lease.expired,
    )


async def _freeze(state: ServerState) -> None:
    """Freeze every engine for a keep pause; 409 naming the engines that cannot (none is left frozen)."""
    pool = state.backends
    try:
        await state.engine_freeze.freeze([b.address for b in pool.backends()], pool.current_version)
    except FreezeRefused as exc:
        raise HTTPException(exc.http_status, str(exc)) from None


async def _thaw(state: ServerState) -> None:
    """Resume the engines a keep pause froze, their next tokens labelled with the current version."""
    for failure in await state.engine_freeze.thaw(state.backends.current_version):
        log.warning("resuming a frozen LLM engine failed (its kept calls may stall and be resent): %s", failure)


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """The weight update's refusals as HTTP errors, each with its class's status: a conflict is 409, a failed
    reload or restore 502."""
    try:
        yield
    except (WeightUpdateConflict, WeightReloadFailed, WeightRestoreFailed) as exc:
        raise HTTPException(exc.http_status, str(exc)) from None
