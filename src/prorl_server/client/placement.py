"""Which server gets a job (the least loaded), and which server gets which LLM backend (its own host first)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import urlsplit

from prorl_server.protocol import StatusResponse

TERMINAL_KEYS = frozenset({"stored_results"})
"""Keys of `StatusResponse.jobs` that are no live jobs."""


def server_load(status: StatusResponse) -> float:
    """Live jobs (queued or in a stage) per worker; infinite for a server that cannot take jobs now."""
    if not status.running or status.healthy_llm_servers == 0:
        return math.inf
    live = sum(n for key, n in status.jobs.items() if key not in TERMINAL_KEYS)
    return live / max(1, sum(status.workers.values()))


class LoadTracker:
    """Picks the least loaded server: its load from `GET /status` (fetched at most every `refresh_s` seconds)
    plus the jobs this client sent it since, per worker. A server whose status cannot be read comes last."""

    def __init__(self, servers: Sequence[str], refresh_s: float = 1.0) -> None:
        self.servers = list(servers)
        self.refresh_s = refresh_s
        self.loads: dict[str, float] = dict.fromkeys(self.servers, 0.0)
        self.capacity: dict[str, int] = dict.fromkeys(self.servers, 1)
        self.sent: dict[str, int] = dict.fromkeys(self.servers, 0)
        self._refreshed_at = -math.inf
        self._lock: asyncio.Lock | None = None

    async def pick(
        self, fetch_status: Callable[[str], Awaitable[StatusResponse]], candidates: Sequence[str] | None = None
    ) -> str:
        """The server for the next job among `candidates` (default: every server), counted as sent to it."""
        choices = self.servers if candidates is None else [s for s in self.servers if s in candidates]
        if not choices:
            raise ValueError("no server to pick from")
        if len(choices) > 1:
            await self._refresh(fetch_status, choices)
            server = min(choices, key=lambda s: (self.score(s), self.sent[s]))
        else:
            server = choices[0]
        self.sent[server] += 1
        return server

    def add(self, server: str) -> None:
        """Place jobs on `server` too (its load read at the next refresh)."""
        if server not in self.loads:
            self.servers.append(server)
            self.loads[server] = 0.0
            self.capacity[server] = 1
            self.sent[server] = 0
            self._refreshed_at = -math.inf

    def score(self, server: str) -> float:
        """Load at the last refresh plus this client's jobs since, per worker."""
        return self.loads[server] + self.sent[server] / self.capacity[server]

    async def _refresh(self, fetch_status: Callable[[str], Awaitable[StatusResponse]], servers: Sequence[str]) -> None:
        if time.monotonic() - self._refreshed_at < self.refresh_s:
            return  # the common case, without taking the lock
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if time.monotonic() - self._refreshed_at < self.refresh_s:
                return  # refreshed while this pick waited for the lock
            answers = await asyncio.gather(*(fetch_status(s) for s in servers), return_exceptions=True)
            for server, answer in zip(servers, answers, strict=True):
                if isinstance(answer, StatusResponse):
                    self.loads[server] = server_load(answer)
                    self.capacity[server] = max(1, sum(answer.workers.values()))
                elif isinstance(answer, Exception):
                    self.loads[server] = math.inf
                else:  # BaseException (cancellation): not ours to swallow
                    raise answer
                self.sent[server] = 0
            self._refreshed_at = time.monotonic()


def host_of(url: str) -> str:
    """The host of a URL, lower-case; every loopback name (localhost, 127.x.y.z, ::1) is "localhost"."""
    host = (urlsplit(url if "//" in url else f"//{url}").hostname or "").lower()
    return "localhost" if host in ("localhost", "::1") or host.startswith("127.") else host


def assign_backends(servers: Sequence[str], addresses: Sequence[str]) -> dict[str, list[str]]:
    """ProRL's two-phase registration: each backend on the host of a server goes to that server (to the one
    with the fewest backends when several share the host); the rest go round robin, each to the server with
    the fewest backends so far (the first such in `servers` order). Returns server -> backend addresses."""
    if not servers:
        raise ValueError("no servers to assign backends to")
    assignment: dict[str, list[str]] = {server: [] for server in servers}
    by_host: dict[str, list[str]] = {}
    for server in servers:
        by_host.setdefault(host_of(server), []).append(server)
    remote: list[str] = []
    for address in addresses:
        local = by_host.get(host_of(address))
        if local:
            assignment[min(local, key=lambda s: len(assignment[s]))].append(address)
        else:
            remote.append(address)
    for address in remote:
        assignment[min(servers, key=lambda s: len(assignment[s]))].append(address)
    return assignment
