"""Weight-update routes: the trainer pauses LLM dispatching, updates the engines, sets the version, resumes.

While paused, LLM calls wait at the backend pool's weight-pause gate (`llm/weight_pause_gate.py`): the wait does
not spend their retry budget and is no backend failure. Every turn records the weight version of the
backend that sampled it, and requests carry `cache_salt` naming that version.

With `reload` in the body, each engine loads the new weights from a checkpoint directory and resets its
prefix cache (vLLM's development endpoints, `llm/vllm_admin.py`) before the version is set.

A pause in mode "keep" first freezes every engine (`llm/engine_freeze.py`): the calls in flight stay open
and go on under the new weights after the resume, which resumes the engines first; each such turn records
the versions it was resumed under (`TurnRecord.resumed_under`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Request, Response

from prorl_server.api.body import openapi_body, parse_body
from prorl_server.api.responses import model_response
from prorl_server.api.state import ServerState, get_state
from prorl_server.llm import BackendPool
from prorl_server.llm.backend import Backend
from prorl_server.llm.engine_freeze import FreezeRefused
from prorl_server.llm.errors import LLMError
from prorl_server.llm.vllm_admin import Reloaded, reload_weights, restore_weights
from prorl_server.protocol import (
    PauseRequest,
    PauseResponse,
    SwapRequest,
    SwapResponse,
    UpdateRequest,
    UpdateResponse,
    WeightsStatus,
)

log = logging.getLogger(__name__)
router = APIRouter(tags=["weights"])
WEIGHTS_PATH = "weights_path"  # per-backend cache key: the checkpoint it last reloaded (loaded back on a failure)
_SHOWN_FAILURES = 8  # failed backends a 502 names one by one
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
    pool = state.backends
    _check_paused(pool, "update the weight version")
    _check_version(pool, body.version)
    state.pause_lease.renew()
    await _reload_and_apply(state, body, "update the weight version")
    return model_response(UpdateResponse(**_status(state).model_dump(), servers=[b.info() for b in pool.backends()]))


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
    pool = state.backends
    gate = pool.gate
    _check_version(pool, body.version)
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
    _check_paused(pool, "swap weights")
    try:
        await _reload_and_apply(state, body, "swap weights")
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
        raise HTTPException(409, str(exc)) from None


async def _thaw(state: ServerState) -> None:
    """Resume the engines a keep pause froze, their next tokens labelled with the current version."""
    for failure in await state.engine_freeze.thaw(state.backends.current_version):
        log.warning("resuming a frozen LLM engine failed (its kept calls may stall and be resent): %s", failure)


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


def _apply(state: ServerState, body: UpdateRequest) -> list[Backend]:
    """Check and set the version (no await in between: routes run on one loop, so this is atomic)."""
    pool = state.backends
    _check_version(pool, body.version)
    servers = None if body.servers is None else [(s.address, s.tags) for s in body.servers]
    backends = pool.set_weight_version(body.version, servers)
    pool.gate.note_version(body.version)  # the calls a keep pause froze go on under it
    if servers is not None:
        state.probe_soon()
    return backends


async def _reload_and_apply(state: ServerState, body: UpdateRequest, what: str) -> None:
    """Without `reload`, set the version; with it, reload every engine first (502 if one fails), then check
    again that nothing was resumed meanwhile and set the version. One reload at a time (409 otherwise)."""
    if body.reload is None:
        _apply(state, body)
        return
    pool = state.backends
    lock = state.pause_lease.updating
    if lock.locked():
        raise HTTPException(409, "another weight update is reloading the engines; wait for its answer")
    async with lock:
        loaded = await _reload(state, body)
        if not pool.gate.paused or pool.gate.in_flight:
            raise HTTPException(
                409,
                f"LLM dispatching was resumed while {len(loaded)} engine(s) loaded {body.reload.path!r}; "
                f"the weight version is unchanged: pause, then {what} again",
            )
        for backend in _apply(state, body):
            pool.cache(backend, WEIGHTS_PATH, body.reload.path)


async def _reload(state: ServerState, body: UpdateRequest) -> list[Reloaded]:
    """Every target engine loads `body.reload.path` and resets its prefix cache, all at once; 502 naming the
    ones that failed. Each failed engine is given its previous checkpoint back, and so is each engine that
    did load it, so that all of them serve the weights of the version that stays.

    The engine calls run on the health-check loop, whose HTTP connections the server closes when it stops."""
    assert body.reload is not None
    reload, pool = body.reload, state.backends
    known = {b.address: b for b in pool.backends()}
    if body.servers is None:
        addresses = list(known)
    else:
        addresses = list(dict.fromkeys(s.address.rstrip("/") for s in body.servers))
    previous = {a: pool.cached(known[a], WEIGHTS_PATH) if a in known else None for a in addresses}

    async def reload_all() -> list[Reloaded | BaseException]:
        calls = (
            reload_weights(
                pool.client,
                a,
                reload.path,
                previous=previous[a],
                timeout_s=reload.timeout_s,
                reset_prefix=not state.engine_freeze.frozen,
            )
            for a in addresses
        )
        return await asyncio.gather(*calls, return_exceptions=True)

    outcomes = await asyncio.wrap_future(state.health.submit(reload_all()))
    loaded = [o for o in outcomes if isinstance(o, Reloaded)]
    for address, outcome in zip(addresses, outcomes, strict=True):
        if isinstance(outcome, Reloaded) and address in known:
            pool.cache(known[address], WEIGHTS_PATH, reload.path)  # what the engine holds now, whatever follows
        elif isinstance(outcome, BaseException) and not isinstance(outcome, LLMError):
            raise outcome
    failed = [str(o) for o in outcomes if isinstance(o, LLMError)]
    if failed:
        rolled_back = await _roll_back(state, loaded, previous, reload.timeout_s) if loaded else ""
        raise HTTPException(
            502,
            f"{len(failed)} of {len(addresses)} LLM backend(s) did not reload their weights, so the weight "
            f"version is unchanged: {_shown(failed)}{rolled_back}",
        )
    return loaded


async def _roll_back(
    state: ServerState, loaded: list[Reloaded], previous: dict[str, str | None], timeout_s: float
) -> str:
    """Give the engines in `loaded` their previous checkpoint back (prefix caches reset); a clause for the 502."""
    pool = state.backends
    known = {b.address: b for b in pool.backends()}

    async def restore_all() -> list[tuple[bool, str]]:
        calls = (restore_weights(pool.client, r.address, previous[r.address], timeout_s, reset=True) for r in loaded)
        return await asyncio.gather(*calls)

    outcomes = await asyncio.wrap_future(state.health.submit(restore_all()))
    stuck = []
    for reloaded, (ok, sentence) in zip(loaded, outcomes, strict=True):
        if ok and reloaded.address in known:
            pool.cache(known[reloaded.address], WEIGHTS_PATH, previous[reloaded.address])
        elif not ok:
            stuck.append(f"{reloaded.address}: {sentence}")
    restored = len(loaded) - len(stuck)
    clause = f"; the {len(loaded)} that did load it were rolled back"
    if stuck:
        clause += f" ({restored} to their previous weights; not: {_shown(stuck)})"
    else:
        clause += f" to their previous weights: {_shown([r.address for r in loaded])}"
    return clause


def _shown(items: list[str]) -> str:
    more = len(items) - _SHOWN_FAILURES
    return " | ".join(items[:_SHOWN_FAILURES]) + (f" | and {more} more" if more > 0 else "")
