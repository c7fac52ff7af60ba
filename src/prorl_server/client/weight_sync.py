"""One weight update over every server of a client: each server reaches the new version, or each one is
rolled back to the old one; a server that does not answer is fenced until it reports the new version.

Rollout servers stay independent (no server-to-server protocol, no consensus, DESIGN.md §15): the trainer's
client makes every cross-server decision, from what each server answers. `ClusterWeightUpdate.run` is
`client.weights.update_all`:

1. pause every server (`POST /weights/pause` with `lease_s`: a trainer that dies from here on leaves no
   server paused past its lease). A server that does not answer is left out and fenced; one that refuses
   the pause (a keep pause its engines cannot take, say) fails the update: the others are resumed.
2. update every paused server at once (`POST /weights/update`, with `reload` each engine loads the
   checkpoint). An update without an answer is checked with `GET /weights`: a server reporting the new
   version has it, one that cannot be reached is fenced.
3. when any reachable server refused its update (its reload failed: 502), every server that reached the
   new version is rolled back (`POST /weights/rollback`), all are resumed, and ClusterUpdateFailed carries
   the per-server report; else all are resumed. A server that fails between its update and its resume is
   fenced too.

A fenced server (the client's `ServerRoster`) gets no new jobs until it reports the version it is fenced
for; when it answers again the client's monitor calls `catch_up`, which brings it there (`POST
/weights/swap`, reloading the cluster's latest checkpoint) and lifts the fence. Bounded staleness needs
nothing more: each server checks its jobs against its own version, and every placeable server has the
cluster's.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from prorl_server.client.errors import ClusterUpdateFailed, RolloutServerError
from prorl_server.errors import TrainerError
from prorl_server.protocol import PauseRequest, PauseResponse, RollbackResponse, UpdateRequest, WeightsStatus

if TYPE_CHECKING:
    from prorl_server.client.rollout_client import RolloutClient

M = TypeVar("M", bound=BaseModel)

RELOAD_TIMEOUT_S = 600.0  # the server's default for one engine's reload (`WeightReload.timeout_s`)


class SyncOutcome(StrEnum):
    """How one server came out of a cluster weight update."""

    REACHED = "reached"  # at the new version, dispatching again
    ROLLED_BACK = "rolled_back"  # reached it, then went back to the old version because another server failed
    UNCHANGED = "unchanged"  # paused and resumed at its old version: the update stopped before reaching it
    FENCED = "fenced"  # did not answer: no new jobs to it until it reports `fenced_until`
    ERROR = "error"  # refused its pause, update or rollback (`error` says why)


@dataclass
class ServerSync:
    """One server's part in a cluster weight update."""

    server: str
    outcome: SyncOutcome = SyncOutcome.UNCHANGED
    version: str | int | None = None
    """The weight version it last reported (None: unknown, or never set)."""
    fenced_until: str | int | None = None
    """The version it must report before it takes new jobs (None: not fenced)."""
    error: str | None = None
    """What went wrong on it (its server's message), if anything."""
    status_code: int | None = None
    """The HTTP status of its refusal (None when it did not answer or nothing went wrong)."""


@dataclass
class ClusterUpdateReport:
    """What `update_all` did on each server (`servers`: server -> ServerSync, in the client's order)."""

    version: str | int
    previous: str | int | None
    """The cluster's version before (what the servers reported at the pause)."""
    servers: dict[str, ServerSync] = field(default_factory=dict)

    def with_outcome(self, outcome: SyncOutcome) -> list[str]:
        """The servers that came out with `outcome`."""
        return [s for s, sync in self.servers.items() if sync.outcome is outcome]

    @property
    def fenced(self) -> dict[str, str | int]:
        """Server -> the version it must report before it takes new jobs."""
        return {s: sync.fenced_until for s, sync in self.servers.items() if sync.fenced_until is not None}

    def summary(self) -> str:
        """One line: each server's outcome (and error)."""
        parts = []
        for server, sync in self.servers.items():
            part = f"{server}: {sync.outcome.value}"
            if sync.error:
                part += f" ({sync.error})"
            parts.append(part)
        return "; ".join(parts)


class _Failure(TrainerError):
    """A request of the update failed; `answered` says whether the server answered at all."""

    def __init__(self, error: RolloutServerError) -> None:
        super().__init__(str(error))
        self.error = error
        self.answered = error.status_code is not None


class ClusterWeightUpdate:
    """The client's cross-server weight updates and the catch-up of fenced servers; one at a time."""

    def __init__(self, client: RolloutClient) -> None:
        self._client = client
        self._lock = asyncio.Lock()
        self.latest: tuple[str | int, str | None] | None = None
        """The last version every reachable server reached, with its checkpoint (what catch-up reloads)."""

    # the update -------------------------------------------------------------------------------------

    async def run(
        self,
        version: str | int,
        *,
        reload_path: str | None = None,
        mode: str = "wait",
        lease_s: float | None = None,
        timeout_s: float = 300.0,
        reload_timeout_s: float = RELOAD_TIMEOUT_S,
    ) -> ClusterUpdateReport:
        """Pause, update and resume every server as one operation (the module docstring); the report, or
        ClusterUpdateFailed carrying it when the update was undone."""
        body = UpdateRequest(
            version=version, reload={"path": reload_path, "timeout_s": reload_timeout_s} if reload_path else None
        )
        pause = PauseRequest(mode=mode, timeout_s=timeout_s, lease_s=lease_s)
        update_timeout_s = reload_timeout_s * 2 if reload_path else 0.0  # a failed reload loads the old one back
        async with self._lock:
            servers = self._client.servers
            syncs = {s: ServerSync(s) for s in servers}
            silent = await self._silent(servers, syncs)
            answering = [s for s in servers if s not in silent]
            paused = await self._each(answering, "POST", "/weights/pause", pause, PauseResponse, timeout_s)
            previous = _common_version([a.version for a in paused.values() if isinstance(a, PauseResponse)])
            report = ClusterUpdateReport(version, previous, syncs)
            reachable = [s for s, a in paused.items() if isinstance(a, PauseResponse)]
            unanswered = silent + [s for s, a in paused.items() if isinstance(a, _Failure) and not a.answered]
            refused = [s for s, a in paused.items() if isinstance(a, _Failure) and a.answered]
            for server, answer in paused.items():
                if isinstance(answer, PauseResponse):
                    syncs[server].version = answer.version
                else:
                    self._failed(syncs[server], answer)
            if refused or not reachable:
                await self._resume(reachable, syncs, previous)
                why = f"{len(refused)} server(s) refused the pause" if refused else "no server answered the pause"
                raise self._undone(report, f"{why}; nothing changed")

            updated = await self._each(reachable, "POST", "/weights/update", body, WeightsStatus, update_timeout_s)
            reached, failed, lost = await self._sort_updates(version, updated, syncs)
            if failed:
                await self._roll_back(reached, syncs, previous)
                for server in lost:
                    self._fence(syncs[server], previous, "it did not answer its update, which was rolled back")
                await self._resume([s for s in reachable if s not in lost], syncs, previous)
                raise self._undone(
                    report, "the update failed on a server; every server that reached it was rolled back"
                )

            for server in unanswered:
                self._fence(syncs[server], version, "it did not answer the pause of the update")
            for server in lost:
                self._fence(syncs[server], version, "it did not answer its update")
            await self._resume(reached, syncs, version)
            for server in reached:
                if syncs[server].fenced_until is None:
                    self._client._roster.unfence(server)
            self.latest = (version, reload_path)
            return report

    async def _silent(self, servers: list[str], syncs: dict[str, ServerSync]) -> list[str]:
        """The servers that do not answer a probe now (within the failover's probe timeout): left out of the
        update and fenced, rather than holding every other server paused while their pause times out."""
        monitor = self._client._monitor
        errors = await asyncio.gather(*(monitor.probe(s) for s in servers))
        silent = []
        for server, error in zip(servers, errors, strict=True):
            if error is not None:
                syncs[server].error = f"it did not answer before the pause: {error}"
                self._client._roster.failed(server, error)
                silent.append(server)
        return silent

    async def _sort_updates(
        self, version: str | int, updated: dict[str, WeightsStatus | _Failure], syncs: dict[str, ServerSync]
    ) -> tuple[list[str], list[str], list[str]]:
        """(reached, failed, lost): a server whose update failed but that reports `version` reached it (an
        answer lost and its retry refused); one that cannot be asked is lost."""
        reached, failed, lost = [], [], []
        for server, answer in updated.items():
            sync = syncs[server]
            if isinstance(answer, WeightsStatus):
                sync.outcome, sync.version = SyncOutcome.REACHED, answer.version
                reached.append(server)
                continue
            now = await self._status(server)
            if isinstance(now, WeightsStatus) and _same(now.version, version):
                sync.outcome, sync.version = SyncOutcome.REACHED, now.version
                reached.append(server)
            elif isinstance(now, WeightsStatus) and answer.answered:
                self._failed(sync, answer)
                sync.version = now.version
                failed.append(server)
            else:
                self._failed(sync, answer)
                lost.append(server)
        return reached, failed, lost

    async def _roll_back(self, reached: list[str], syncs: dict[str, ServerSync], previous: str | int | None) -> None:
        """`POST /weights/rollback` on every server in `reached`; one that does not roll back is fenced."""
        answers = await self._each(reached, "POST", "/weights/rollback", None, RollbackResponse, RELOAD_TIMEOUT_S)
        for server, answer in answers.items():
            sync = syncs[server]
            if isinstance(answer, RollbackResponse):
                sync.outcome, sync.version = SyncOutcome.ROLLED_BACK, answer.version
            else:
                self._failed(sync, answer)
                self._fence(sync, previous, "its rollback failed")

    async def _resume(self, servers: list[str], syncs: dict[str, ServerSync], version: str | int | None) -> None:
        """`POST /weights/resume` on `servers` (409, not paused any more: its lease ended the pause, which is
        as good); one that does not answer is fenced at `version`."""
        answers = await self._each(servers, "POST", "/weights/resume", None, WeightsStatus, 0.0, accept={409})
        for server, answer in answers.items():
            if isinstance(answer, _Failure) and answer.error.status_code != 409:
                syncs[server].error = syncs[server].error or str(answer.error)
                self._fence(syncs[server], version, "it did not answer the resume after the update")

    # catch-up ---------------------------------------------------------------------------------------

    async def catch_up(self, server: str) -> bool:
        """Bring a fenced server to the version it is fenced for (`POST /weights/swap`, with the checkpoint
        of the cluster's latest version when that is the one); True, and the fence lifted, once it reports it.
        False while an update runs, or when the server cannot be brought there now."""
        roster = self._client._roster
        if self._lock.locked():
            return False  # an update runs: the monitor asks again next round
        async with self._lock:
            target = roster.fenced().get(server)
            if target is None:
                return True
            now = await self._status(server)
            if not isinstance(now, WeightsStatus):
                return False
            if not _same(now.version, target):
                path = self.latest[1] if self.latest is not None and _same(self.latest[0], target) else None
                swap: dict[str, Any] = {"version": target}
                if path is not None:
                    swap["reload"] = {"path": path}
                try:
                    answer = await self._client._conn(server).request(
                        "POST", "/weights/swap", json=swap, timeout=RELOAD_TIMEOUT_S * 2, accept=frozenset({502})
                    )
                except RolloutServerError:
                    return False
                if not answer.is_success or not _same(WeightsStatus.model_validate(answer.json()).version, target):
                    return False
            roster.unfence(server)
            return True

    # helpers ----------------------------------------------------------------------------------------

    async def _each(
        self,
        servers: list[str],
        method: str,
        path: str,
        body: BaseModel | None,
        model: type[M],
        wait_s: float,
        accept: frozenset[int] | set[int] = frozenset(),
    ) -> dict[str, M | _Failure]:
        """The request on every server at once (read timeout: the connection's plus `wait_s`); a 502 (a failed
        reload or rollback) or a status in `accept` is not retried; server -> parsed answer, or the failure."""
        payload = None if body is None else body.model_dump(mode="json", exclude_none=True)

        async def one(server: str) -> M | _Failure:
            conn = self._client._conn(server)
            try:
                response = await conn.request(
                    method, path, json=payload, timeout=conn.timeout_s + wait_s, accept=frozenset({502, *accept})
                )
            except RolloutServerError as exc:
                return _Failure(exc)
            if not response.is_success:  # a 502, or a status of `accept`
                return _Failure(RolloutServerError.from_response(response))
            return model.model_validate(response.json())

        answers = await asyncio.gather(*(one(s) for s in servers))
        return dict(zip(servers, answers, strict=True))

    async def _status(self, server: str) -> WeightsStatus | None:
        try:
            response = await self._client._conn(server).request("GET", "/weights")
        except RolloutServerError:
            return None
        return WeightsStatus.model_validate(response.json())

    def _fence(self, sync: ServerSync, version: str | int | None, reason: str) -> None:
        """Fence the server at `version` (none to fence at when the cluster never had a version: reported only)."""
        if sync.outcome is not SyncOutcome.ERROR:
            sync.outcome = SyncOutcome.FENCED
        if version is None or not self._client._roster.policy.enabled:
            return  # nothing to fence at, or failover is off (nothing would lift the fence): reported only
        sync.fenced_until = version
        self._client._roster.fence(sync.server, version, reason)
        self._client._monitor.ensure_started()  # its heartbeat calls `catch_up` once the server answers

    @staticmethod
    def _failed(sync: ServerSync, failure: _Failure) -> None:
        """Note a failed request: a refusal is an error; a server that did not answer is fenced where needed."""
        if failure.answered:
            sync.outcome = SyncOutcome.ERROR
        sync.error, sync.status_code = str(failure.error), failure.error.status_code

    @staticmethod
    def _undone(report: ClusterUpdateReport, why: str) -> ClusterUpdateFailed:
        refusals = [s for s in report.servers.values() if s.status_code is not None]
        first = refusals[0] if refusals else None
        return ClusterUpdateFailed(
            f"weight update to version {report.version!r} not made ({why}): {report.summary()}",
            report,
            status_code=first.status_code if first else None,
            detail=first.error or "" if first else "",
            url=first.server if first else "",
        )


def _common_version(versions: list[str | int | None]) -> str | int | None:
    """The version most servers report (the cluster's, when they agree)."""
    known = Counter(repr(v) for v in versions)
    if not known:
        return None
    wanted = known.most_common(1)[0][0]
    return next(v for v in versions if repr(v) == wanted)


def _same(a: str | int | None, b: str | int | None) -> bool:
    return type(a) is type(b) and a == b
