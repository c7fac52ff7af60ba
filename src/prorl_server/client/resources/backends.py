"""`client.backends`: the LLM backends (OpenAI-compatible servers) each prorl-server sends its model calls to."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from prorl_server.client.placement import assign_backends
from prorl_server.client.resources.base import APIResource
from prorl_server.protocol import (
    AddLLMServerRequest,
    LLMServerInfo,
    LLMServerList,
    RemoveLLMServerRequest,
    RemoveLLMServerResponse,
)


class Backends(APIResource):
    """`client.backends`: `/add_llm_server`, `/remove_llm_server`, `/llm_servers`, `/clear_llm_server`, and
    `register` to spread backends over the client's servers."""

    async def add(
        self,
        address: str,
        weight_version: str | int | None = None,
        tags: Mapping[str, Any] | None = None,
        *,
        server: str | None = None,
    ) -> LLMServerInfo:
        """`POST /add_llm_server`: register a backend (or update a known one's weight version)."""
        client = self._client
        body = AddLLMServerRequest(address=address, weight_version=weight_version, tags=dict(tags or {}))
        response = await client._conn(client._one(server)).request(
            "POST", "/add_llm_server", json=body.model_dump(mode="json")
        )
        return LLMServerInfo.model_validate(response.json())

    async def remove(
        self, address: str, *, abort: bool = False, timeout_s: float | None = None, server: str | None = None
    ) -> RemoveLLMServerResponse:
        """`POST /remove_llm_server`: drain one backend (its pinned jobs move to others; its calls in flight
        finish first, or are aborted and resent elsewhere with `abort=True`)."""
        client = self._client
        body = RemoveLLMServerRequest(address=address, abort=abort, timeout_s=timeout_s)
        response = await client._conn(client._one(server)).request(
            "POST",
            "/remove_llm_server",
            json=body.model_dump(mode="json"),
            timeout=3600.0 if timeout_s is None else timeout_s + 30,  # it answers once the backend drained
        )
        return RemoveLLMServerResponse.model_validate(response.json())

    async def clear(self, *, server: str | None = None) -> int:
        """`POST /clear_llm_server` on `server`, or on every server; returns how many backends were removed."""
        client = self._client
        servers = [client._one(server)] if server is not None else client.servers
        responses = await asyncio.gather(*(client._conn(s).request("POST", "/clear_llm_server") for s in servers))
        return sum(int(response.json()["removed"]) for response in responses)

    async def register(
        self,
        addresses: Sequence[str],
        weight_version: str | int | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> dict[str, list[str]]:
        """Register backends with ProRL's two-phase rule (see `assign_backends`): each server first gets the
        backends on its own host, then the rest are spread evenly. Returns server -> backend addresses."""
        assignment = assign_backends(self._client.servers, addresses)
        await asyncio.gather(
            *(
                self.add(address, weight_version, tags, server=server)
                for server, assigned in assignment.items()
                for address in assigned
            )
        )
        return assignment

    async def list(self, *, server: str | None = None) -> LLMServerList:  # last: it shadows `list` in this class
        """`GET /llm_servers`: the registered backends with their health and load."""
        client = self._client
        response = await client._conn(client._one(server)).request("GET", "/llm_servers")
        return LLMServerList.model_validate(response.json())
