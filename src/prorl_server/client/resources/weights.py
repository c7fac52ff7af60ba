"""`client.weights`: the servers' weight version, and pausing their backends around a weight update."""

from __future__ import annotations

from prorl_server.client.resources.base import APIResource
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
    every server at once; each call answers server -> that server's answer."""

    async def status(self, *, server: str | None = None) -> dict[str, WeightsStatus]:
        """`GET /weights` of `server`, or of every server: server -> pause state and weight version."""
        return await self._client._on_servers(server, "GET", "/weights", None, WeightsStatus)

    async def pause(
        self, mode: str = "wait", *, timeout_s: float | None = None, server: str | None = None
    ) -> dict[str, PauseResponse]:
        """`POST /weights/pause` on `server`, or on every server; each answers once no call is in flight (with
        mode "keep", the calls its engines froze aside)."""
        body = PauseRequest(mode=mode, timeout_s=timeout_s).model_dump(mode="json", exclude_none=True)
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
