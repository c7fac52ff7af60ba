"""`client.groups`: groups of rollouts of one instance (`n_launch` launched, `n` selected), decided server-side."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from typing import Any

from prorl_server.client.errors import RolloutServerError
from prorl_server.client.resources.base import APIResource
from prorl_server.protocol import GroupAccepted, GroupRequest, GroupResult, GroupStatus

GroupRequestLike = GroupRequest | Mapping[str, Any]
"""A group: a GroupRequest, or a dict of its fields (validated before it is sent)."""

GROUP_POLL_S = 30.0
"""Longest single `GET /groups/{id}?wait=` long poll `groups.wait` sends (the server allows 300)."""


class Groups(APIResource):
    """`client.groups`: `POST /groups`, `GET /groups/{id}`, `DELETE /groups/{id}`. The client remembers which
    server has which group (and its members' jobs, for `client.jobs`)."""

    async def submit(self, request: GroupRequestLike, *, server: str | None = None) -> str:
        """`POST /groups?wait=false`: start a group (`n_launch` members of one instance, `n` selected) on
        `server` (default: the least loaded); returns its group id. The request always carries a group id
        (a uuid4 hex when it has none), so a retried submit gets the same group and never launches twice.
        The client remembers the server for `get`, `wait`, `cancel` and the members' jobs."""
        client = self._client
        model = _with_group_id(request)
        body = model.model_dump(mode="json", exclude_none=True)
        server, response = await client._send_new(
            server, "/groups", group_id=str(model.group_id), json=body, params={"wait": "false"}
        )
        accepted = GroupAccepted.model_validate(response.json())
        client._loads.sent[server] += len(accepted.job_ids) - 1  # the placement counted one job; a group is more
        client._group_owners[accepted.group_id] = server
        for job_id in accepted.job_ids:
            client._owners[job_id] = server
        client._ledger.group_submitted(body, server, accepted.job_ids)
        return accepted.group_id

    async def get(self, group_id: str, *, wait: float = 0) -> GroupResult:
        """`GET /groups/{group_id}?wait=`: the group now (`status` running until decided); with `wait` > 0
        the server holds the answer up to `wait` seconds (at most 300) for the group to be decided."""
        client = self._client
        conn_timeout = client._conn(client._group_owners.get(group_id) or client.servers[0]).timeout_s
        params = {"wait": wait} if wait > 0 else None
        response = await client._on_group_owner(
            group_id, "GET", f"/groups/{group_id}", params=params, timeout=wait + conn_timeout
        )
        return GroupResult.model_validate(response.json())

    async def wait(self, group_id: str, timeout: float | None = None) -> GroupResult:
        """Long-poll `GET /groups/{group_id}` until the group is decided; return it. TimeoutError after
        `timeout` seconds."""
        client = self._client
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = GROUP_POLL_S if deadline is None else min(GROUP_POLL_S, deadline - time.monotonic())
            try:
                answer = await self.get(group_id, wait=max(0.0, left))
            except RolloutServerError as exc:
                if not client._failing_over(exc):
                    raise
                answer = None  # its server does not answer: the failover moves the group if it is lost
                await asyncio.sleep(client._roster.policy.heartbeat_s)
            if answer is not None and answer.status is not GroupStatus.RUNNING:
                client._ledger.group_taken(group_id)
                return answer
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"group {group_id} still running after {timeout} s")

    async def cancel(self, group_id: str) -> GroupResult:
        """`DELETE /groups/{group_id}`: cancel the group's running members (idempotent); the group ends with
        the usable results it has, and its answer is returned (decided, unless a member is slow to stop)."""
        self._client._ledger.group_taken(group_id)
        response = await self._client._on_group_owner(group_id, "DELETE", f"/groups/{group_id}")
        return GroupResult.model_validate(response.json())

    def server_of(self, group_id: str) -> str | None:
        """The server this client sent group `group_id` to (None for a group it did not submit)."""
        return self._client._group_owners.get(group_id)


def _with_group_id(request: GroupRequestLike) -> GroupRequest:
    """The group request, validated, with a group id (a fresh uuid4 hex when it has none)."""
    model = request if isinstance(request, GroupRequest) else GroupRequest.model_validate(dict(request))
    return model if model.group_id is not None else model.model_copy(update={"group_id": uuid.uuid4().hex})
