"""ServerMonitor: the client's heartbeat over its servers. It probes each one, drives the roster's state
machine, moves a lost server's unfinished work to live servers under the same ids, and, when a lost server
comes back, cancels there what was moved off it before letting it take new work again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import httpx

from prorl_server.client.errors import RolloutServerError
from prorl_server.client.membership import Reachability
from prorl_server.client.work_ledger import PendingGroup, PendingJob
from prorl_server.protocol import ErrorStage, GroupAccepted, JobResult, JobStatusResponse, WeightsStatus

if TYPE_CHECKING:
    from prorl_server.client.rollout_client import RolloutClient

log = logging.getLogger(__name__)

MOVE_CONCURRENCY = 32
"""Submissions at once while moving a lost server's work."""
PROXY_FAILURES = frozenset({502, 504})
"""Answers that come from a proxy in front of a server that did not answer: no sign of life."""


class ServerMonitor:
    """Runs on the client's event loop once started (`ensure_started`), every `heartbeat_s` seconds."""

    def __init__(self, client: RolloutClient) -> None:
        self._client = client
        self._task: asyncio.Task[None] | None = None
        self._moving: dict[str, asyncio.Lock] = {}
        self.recoveries: list[dict[str, Any]] = []
        """One entry per lost server whose work was moved: server, jobs, groups, seconds from its first
        failed probe to the last resubmission."""

    @property
    def running(self) -> bool:
        """Whether the heartbeat task is running."""
        return self._task is not None and not self._task.done()

    def ensure_started(self) -> None:
        """Start the heartbeat on the running loop (once; not with failover off or a single server)."""
        client = self._client
        if self.running or not client._roster.policy.enabled or len(client.servers) < 2:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="prorl-client-monitor")

    async def aclose(self) -> None:
        """Stop the heartbeat."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.tick()
            except Exception:  # one bad round must not end the heartbeat
                log.exception("client monitor round failed")
            await asyncio.sleep(max(0.0, self._client._roster.policy.heartbeat_s - (time.monotonic() - started)))

    async def tick(self) -> None:
        """One round: probe every server, then act on what changed."""
        roster = self._client._roster
        servers = roster.servers()
        outcomes = await asyncio.gather(*(self.probe(server) for server in servers))
        for server, error in zip(servers, outcomes, strict=True):
            if error is None:
                transition = roster.answered(server)
                if transition is not None:
                    log.warning("server %s answers again (was %s)", server, transition[0].value)
                health = roster.health(server)
                if health.rejoining:
                    await self._rejoin(server)
                if health.weights_fence is not None:
                    await self._check_fence(server)
            else:
                transition = roster.failed(server, error)
                if transition == (Reachability.UP, Reachability.SUSPECT):
                    log.warning("server %s is suspect: %s", server, error)
                elif transition == (Reachability.SUSPECT, Reachability.LOST):
                    log.warning(
                        "server %s is lost (no answer for %.1f s): moving its work", server, self._silent(server)
                    )
        for server in roster.in_state(Reachability.LOST):
            await self.move_work(server)

    def _silent(self, server: str) -> float:
        since = self._client._roster.health(server).failing_since
        return 0.0 if since is None else time.monotonic() - since

    async def probe(self, server: str) -> str | None:
        """None when the server answers `GET /status` in time, else why not."""
        conn = self._client._conn(server)
        timeout = self._client._roster.policy.probe_timeout_s
        try:
            response = await conn.send("GET", "/status", timeout=httpx.Timeout(timeout))
        except httpx.TransportError as exc:
            return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if response.status_code in PROXY_FAILURES:
            return f"HTTP {response.status_code} from {server}/status"
        return None

    async def _move_work(self, lost: str) -> None:
        client = self._client
        jobs, groups = client._ledger.work_on(lost)
        if not jobs and not groups:
            return
        if not client._roster.placeable():
            log.warning(
                "server %s is lost, but no server can take its %d jobs and %d groups yet", lost, len(jobs), len(groups)
            )
            return
        gate = asyncio.Semaphore(MOVE_CONCURRENCY)

        async def one(item: PendingJob | PendingGroup) -> bool:
            async with gate:
                try:
                    if isinstance(item, PendingJob):
                        await self._move_job(item, lost)
                    else:
                        await self._move_group(item, lost)
                except RolloutServerError as exc:
                    log.warning("could not move work of lost server %s (tried again next round): %s", lost, exc)
                    return False
                return True

        moved = await asyncio.gather(*(one(item) for item in [*jobs, *groups]))
        entry = {"server": lost, "jobs": len(jobs), "groups": len(groups), "moved": sum(moved)}
        entry["seconds"] = round(self._silent(lost), 3)
        self.recoveries.append(entry)
        log.warning("moved %d of %d jobs and groups of lost server %s", sum(moved), len(moved), lost)

    async def adopt_finished(self, lost: str, replacement: str) -> None:
        """Give `replacement` (started on `lost`'s journal) the jobs of `lost` whose results it serves, so
        that they are not run again; a job it failed at its restart is kept off it (submitted there, the same
        request would get that failure back)."""
        client = self._client
        jobs, _ = client._ledger.work_on(lost)
        conn = client._conn(replacement)
        gate = asyncio.Semaphore(MOVE_CONCURRENCY)

        async def result_there(job: PendingJob) -> JobResult | None:
            async with gate:
                try:
                    response = await conn.request("GET", f"/jobs/{job.job_id}")
                except RolloutServerError:
                    return None
            return JobStatusResponse.model_validate(response.json()).result

        for job, result in zip(jobs, await asyncio.gather(*(result_there(j) for j in jobs)), strict=True):
            if result is None:
                continue
            if result.error is not None and result.error.stage == ErrorStage.RESTART:
                job.avoid = replacement
            else:
                job.owner = replacement
                client._owners[job.job_id] = replacement

    async def move_work(self, lost: str) -> None:
        """Submit the lost server's unfinished jobs and groups again on placeable servers, same ids (one
        mover per server at a time)."""
        lock = self._moving.setdefault(lost, asyncio.Lock())
        async with lock:
            await self._move_work(lost)

    async def _move_job(self, job: PendingJob, lost: str) -> None:
        client = self._client
        target = await client._place(None, exclude=frozenset({job.avoid} if job.avoid else ()))
        await client._conn(target).request("POST", "/jobs", content=job.body, accept=frozenset({409}))
        client._ledger.job_moved(job.job_id, lost, target)
        client._owners[job.job_id] = target

    async def _move_group(self, group: PendingGroup, lost: str) -> None:
        client = self._client
        target = await client._place(None)
        response = await client._conn(target).request("POST", "/groups", json=group.body, params={"wait": "false"})
        accepted = GroupAccepted.model_validate(response.json())
        client._ledger.group_moved(group.group_id, lost, target)
        client._ledger.groups[group.group_id].member_ids = list(accepted.job_ids)
        client._group_owners[group.group_id] = target
        for job_id in accepted.job_ids:
            client._owners[job_id] = target

    async def _rejoin(self, server: str) -> None:
        """Cancel on `server` (back after being lost) the work moved off it, drop those results, lift the
        fence. A failure leaves the fence for the next round."""
        client = self._client
        job_ids, group_ids = client._ledger.take_moved(server)
        conn = client._conn(server)
        try:
            for group_id in group_ids:
                await conn.request("DELETE", f"/groups/{group_id}", accept=frozenset({404}))
            for job_id in job_ids:
                await conn.request("POST", "/cancel", json={"job_id": job_id}, accept=frozenset({404}))
            if job_ids:
                await conn.request("POST", "/jobs/ack", json={"job_ids": sorted(job_ids)})
        except RolloutServerError as exc:
            client._ledger.moved_jobs[server] |= job_ids
            client._ledger.moved_groups[server] |= group_ids
            log.warning("server %s is back, but cancelling the work moved off it failed: %s", server, exc)
            return
        client._roster.rejoined(server)
        log.warning(
            "server %s rejoined: %d jobs and %d groups moved off it cancelled there",
            server,
            len(job_ids),
            len(group_ids),
        )

    async def _check_fence(self, server: str) -> None:
        """Lift the weights fence of a server that reports the version it must have (or is brought to it)."""
        roster = self._client._roster
        target = roster.health(server).weights_fence
        if roster.catch_up is not None:
            reached = await roster.catch_up(server)
        else:
            try:
                response = await self._client._conn(server).request("GET", "/weights")
            except RolloutServerError:
                return
            reached = WeightsStatus.model_validate(response.json()).version == target
        if reached:
            roster.unfence(server)
            log.warning("server %s reports weight version %r: fence lifted", server, target)
