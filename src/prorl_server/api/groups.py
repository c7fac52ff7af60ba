"""Group routes: `n_launch` redundant rollouts of one instance, `n` results selected (protocol/groups.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response

from prorl_server.api.responses import model_response
from prorl_server.pipeline import GroupRunner, wait_done
from prorl_server.protocol import GROUP_ID_MAX_CHARS, GroupAccepted, GroupRequest, GroupResult
from prorl_server.request_body import openapi_body, parse_body

router = APIRouter(tags=["groups"])
GroupIdPath = Annotated[str, Path(min_length=1, max_length=GROUP_ID_MAX_CHARS)]


def _runner(request: Request) -> GroupRunner:
    return request.app.state.groups


@router.post(
    "/groups",
    response_model=GroupResult,
    responses={202: {"model": GroupAccepted, "description": "With `wait=false`: the group was started."}},
    openapi_extra=openapi_body(GroupRequest),
)
async def start_group(
    request: Request,
    wait: Annotated[
        bool, Query(description="true: answer with the group result once decided; false: answer 202 at once")
    ] = True,
) -> Response:
    """Launch `n_launch` members of one instance (job ids `{group_id}:{i}`) and select `n` usable results.

    By default the call blocks until the group is decided and answers its GroupResult (200). With
    `?wait=false` it answers 202 with the group id and member job ids at once; poll `GET /groups/{group_id}`.
    The same request sent again under the same `group_id` gets that group (never a second launch); a
    different request under that id is 409. An instance its handler's `validate_instance` refuses is 400,
    with no member launched. A member that fails for an infrastructure reason is launched again while the
    group needs it, within the server's refill limits (the answer's `refills` lists each).
    """
    body = await parse_body(request, GroupRequest)
    group = _runner(request).start(body)
    if not wait:
        return model_response(GroupAccepted(group_id=group.id, job_ids=group.job_ids), status_code=202)
    await group.done.wait()
    return model_response(group.snapshot())


@router.get("/groups/{group_id}", response_model=GroupResult)
async def get_group(
    group_id: GroupIdPath,
    request: Request,
    wait: Annotated[
        float,
        Query(ge=0, le=300, allow_inf_nan=False, description="Long-poll: seconds to wait for the group to end"),
    ] = 0,
) -> Response:
    """A group's state: `status: "running"` with its members' statuses, or the decided group and results."""
    group = _runner(request).get(group_id)
    if group is None:
        raise HTTPException(404, f"no group {group_id!r} (never started, or finished and past retention)")
    if wait > 0:
        await wait_done(group, wait)
    return model_response(group.snapshot())


@router.delete("/groups/{group_id}", response_model=GroupResult)
async def cancel_group(group_id: GroupIdPath, request: Request) -> Response:
    """Cancel a group's running members (idempotent); the group ends with the usable results it has."""
    runner = _runner(request)
    group = runner.cancel(group_id)
    if group is None:
        raise HTTPException(404, f"no group {group_id!r} (never started, or finished and past retention)")
    await wait_done(group, 5.0)  # cancelled members end at once; the group is decided right after
    return model_response(group.snapshot())
