"""`client.weights`: the servers' weight version, pausing their backends around a weight update, and one
update over every server (`update_all`, `client/weight_sync.py`)."""

from __future__ import annotations

from prorl_server.client.resources.base import APIResource
from prorl_server.client.weight_sync import RELOAD_TIMEOUT_S, ClusterUpdateReport
from prorl_server.protocol import (
    PauseRequest,
    PauseResponse,
    SwapRequest,
    SwapResponse,
    UpdateRequest,
    UpdateResponse,
    WeightsStatus,
)


class Weights(APIResource):
    """`client.weights`: `/weights` and `/weights/{pause,update,resume,swap}`, on one server (`server=`) or on
    every server at once; each call answers server -> that server's answer. `update_all` is one update over
    every server: all reach the new version, or all are rolled back."""

    async def status(self, *, server: str | None = None) -> dict[str, WeightsStatus]:
        """`GET /weights` of `server`, or of every server: server -> pause state and weight version."""
        return await self._client._on_servers(server, "GET", "/weights", None, WeightsStatus)

    async def pause(
        self,
        mode: str = "wait",
        *,
        timeout_s: float | None = None,
        lease_s: float | None = None,
        server: str | None = None,
    ) -> dict[str, PauseResponse]:
        """`POST /weights/pause` on `server`, or on every server; each answers once no call is in flight (with
        mode "keep", the calls its engines froze aside). The pause ends by itself after `lease_s` without an
        update or a resume (default: the server's --weight-pause-lease)."""
        body = PauseRequest(mode=mode, timeout_s=timeout_s, lease_s=lease_s).model_dump(mode="json", exclude_none=True)
        return await self._client._on_servers(server, "POST", "/weights/pause", body, PauseResponse)

    async def update(
        self, version: str | int, *, reload_path: str | None = None, server: str | None = None
    ) -> dict[str, UpdateResponse]:
        """`POST /weights/update` (while paused) on `server`, or on every server; with `reload_path` each
        backend first reloads its weights from that directory."""
        body = UpdateRequest(version=version, reload={"path": reload_path} if reload_path else None)
        return await self._client._on_servers(
            server, "POST", "/weights/update", body.model_dump(mode="json", exclude_none=True), UpdateResponse
        )

    async def update_all(
        self,
        version: str | int,
        *,
        reload_path: str | None = None,
        mode: str = "wait",
        lease_s: float | None = None,
        timeout_s: float = 300.0,
        reload_timeout_s: float = RELOAD_TIMEOUT_S,
    ) -> ClusterUpdateReport:
        """Pause, update (with `reload_path`, every engine reloads from it) and resume every server as one
        operation: each reachable server reaches `version`, or each one that did is rolled back and
        ClusterUpdateFailed (carrying the report) is raised; a server that does not answer is fenced (no new
        jobs) until it reports the version. `lease_s` is each pause's lease, `timeout_s` how long each pause
        waits for the calls in flight, `reload_timeout_s` each engine's reload."""
        return await self._client._weight_sync.run(
            version,
            reload_path=reload_path,
            mode=mode,
            lease_s=lease_s,
            timeout_s=timeout_s,
            reload_timeout_s=reload_timeout_s,
        )

    async def resume(self, *, server: str | None = None) -> dict[str, WeightsStatus]:
        """`POST /weights/resume` on `server`, or on every server."""
        return await self._client._on_servers(server, "POST", "/weights/resume", None, WeightsStatus)

    async def swap(
        self,
        version: str | int,
        *,
        mode: str = "wait",
        reload_path: str | None = None,
        server: str | None = None,
    ) -> dict[str, SwapResponse]:
        """`POST /weights/swap` (pause, update, resume in one call) on `server`, or on every server."""
        body = SwapRequest(version=version, mode=mode, reload={"path": reload_path} if reload_path else None)
        return await self._client._on_servers(
            server, "POST", "/weights/swap", body.model_dump(mode="json", exclude_none=True), SwapResponse
        )
