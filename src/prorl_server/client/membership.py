"""Which of the client's servers may take new work: each server's reachability as a small state machine,
plus the fences that keep a reachable server out of placement.

    reachability                                     fences (any of them keeps a server unplaceable)

        ┌──── answers ────┐                          weights: it missed a weight update; lifted once it
        ▼                 │                                   reports the cluster's version
       UP ── fails ──▶ SUSPECT ── fails for ──▶ LOST  rejoin:  it came back after being LOST; lifted once
        ▲                        lost_after_s     │             the work moved off it is cancelled there
        └────────────── answers (rejoin fence) ───┘

A server is placeable when it is UP and has no fence. SUSPECT keeps its work where it is (a slow answer is
not a dead server); LOST is when the client moves that work to live servers (`ServerMonitor`). Every
transition is one of `TRANSITIONS`; the roster itself does no I/O.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from enum import StrEnum


class Reachability(StrEnum):
    """Whether the client can reach a server."""

    UP = "up"
    SUSPECT = "suspect"
    LOST = "lost"


TRANSITIONS: dict[Reachability, frozenset[Reachability]] = {
    Reachability.UP: frozenset({Reachability.SUSPECT}),
    Reachability.SUSPECT: frozenset({Reachability.UP, Reachability.LOST}),
    Reachability.LOST: frozenset({Reachability.UP}),
}
"""The only moves between reachability states."""


@dataclass(frozen=True)
class FailoverPolicy:
    """When the client suspects a server and when it gives its work to others.

    Every `heartbeat_s` seconds the client probes each server (`GET /status`, at most `probe_timeout_s`);
    a failed probe (or request) makes the server SUSPECT, and one that has failed for `lost_after_s`
    seconds is LOST: its unfinished jobs and groups are submitted again, under the same ids, to live
    servers. So a dead server's work moves within about `heartbeat_s + probe_timeout_s + lost_after_s`.
    `FailoverPolicy(enabled=False)` turns this off (the client of one server never moves work)."""

    enabled: bool = True
    heartbeat_s: float = 1.0
    probe_timeout_s: float = 2.0
    lost_after_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("heartbeat_s", "probe_timeout_s", "lost_after_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"FailoverPolicy.{name} must be positive")


@dataclass
class ServerHealth:
    """What the client knows of one server's reachability and fences."""

    url: str
    state: Reachability = Reachability.UP
    since: float = field(default_factory=time.monotonic)
    """When the server entered `state` (monotonic seconds)."""
    failing_since: float | None = None
    """When the current run of failed probes began (None while it answers)."""
    last_error: str | None = None
    weights_fence: str | int | None = None
    """The weight version the server must report before it takes new jobs again (None: not fenced)."""
    fence_reason: str | None = None
    rejoining: bool = False
    """Came back after LOST: work moved off it must be cancelled there before it takes new jobs."""

    @property
    def placeable(self) -> bool:
        """Whether new work may go to this server."""
        return self.state is Reachability.UP and self.weights_fence is None and not self.rejoining

    @property
    def label(self) -> str:
        """One word for reports: lost, suspect, fenced or live."""
        if self.state is not Reachability.UP:
            return self.state.value
        return "fenced" if self.weights_fence is not None or self.rejoining else "live"


Transition = tuple[Reachability, Reachability]


class ServerRoster:
    """The reachability and fences of every server of one client (see the module docstring)."""

    def __init__(self, servers: Iterable[str], policy: FailoverPolicy | None = None) -> None:
        self.policy = policy or FailoverPolicy()
        self._servers: dict[str, ServerHealth] = {url: ServerHealth(url) for url in servers}
        self.catch_up: Callable[[str], Awaitable[bool]] | None = None
        """Called by the monitor when a server fenced for a weight version answers: bring it to that
        version, True once it reports it (set by the weights resource)."""

    # reading ---------------------------------------------------------------------------------------

    def __contains__(self, server: str) -> bool:
        return server in self._servers

    def health(self, server: str) -> ServerHealth:
        """The server's record."""
        return self._servers[server]

    def servers(self) -> list[str]:
        """Every server, in the order they were added."""
        return list(self._servers)

    def placeable(self) -> list[str]:
        """The servers new work may go to."""
        return [url for url, health in self._servers.items() if health.placeable]

    def in_state(self, state: Reachability) -> list[str]:
        """The servers whose reachability is `state`."""
        return [url for url, health in self._servers.items() if health.state is state]

    def fenced(self) -> dict[str, str | int]:
        """Server -> the weight version it must report before it takes new jobs."""
        return {url: h.weights_fence for url, h in self._servers.items() if h.weights_fence is not None}

    def summary(self) -> dict[str, str]:
        """Server -> live, fenced, suspect or lost."""
        return {url: health.label for url, health in self._servers.items()}

    # changes ---------------------------------------------------------------------------------------

    def add(self, server: str) -> bool:
        """Track a new server (UP); False if it was known already."""
        if server in self._servers:
            return False
        self._servers[server] = ServerHealth(server)
        return True

    def answered(self, server: str, now: float | None = None) -> Transition | None:
        """The server answered: SUSPECT or LOST becomes UP (a LOST one gets the rejoin fence)."""
        health = self._servers[server]
        health.failing_since = None
        health.last_error = None
        if health.state is Reachability.UP:
            return None
        if health.state is Reachability.LOST:
            health.rejoining = True
        return self._move(health, Reachability.UP, now)

    def failed(self, server: str, error: str, now: float | None = None) -> Transition | None:
        """A probe or request got no answer: UP becomes SUSPECT; SUSPECT for `lost_after_s` becomes LOST.
        With failover off only the error is noted (the server stays UP: nothing would bring it back)."""
        now = time.monotonic() if now is None else now
        health = self._servers[server]
        health.last_error = error
        if not self.policy.enabled:
            return None
        if health.failing_since is None:
            health.failing_since = now
        if health.state is Reachability.UP:
            return self._move(health, Reachability.SUSPECT, now)
        if health.state is Reachability.SUSPECT and now - health.failing_since >= self.policy.lost_after_s:
            return self._move(health, Reachability.LOST, now)
        return None

    def declare_lost(self, server: str, now: float | None = None) -> Transition | None:
        """The caller knows the server is gone (replaced, say): LOST now, whatever its state."""
        health = self._servers[server]
        if health.state is Reachability.LOST:
            return None
        if health.state is Reachability.UP:
            self._move(health, Reachability.SUSPECT, now)
        return self._move(health, Reachability.LOST, now)

    def rejoined(self, server: str) -> None:
        """The work moved off the server is cancelled there: lift its rejoin fence."""
        self._servers[server].rejoining = False

    def fence(self, server: str, version: str | int, reason: str) -> None:
        """No new jobs to `server` until it reports weight version `version`."""
        health = self._servers[server]
        health.weights_fence = version
        health.fence_reason = reason

    def unfence(self, server: str) -> None:
        """Lift the server's weights fence."""
        health = self._servers[server]
        health.weights_fence = None
        health.fence_reason = None

    def _move(self, health: ServerHealth, to: Reachability, now: float | None) -> Transition:
        old = health.state
        if to not in TRANSITIONS[old]:
            raise AssertionError(f"no transition {old} -> {to} for {health.url}")
        health.state = to
        health.since = time.monotonic() if now is None else now
        return old, to
