"""The trainer-side client of prorl-server: submit jobs, wait for them or stream their results, over one or
several servers, with typed answers, retries and one exception type."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, TypeVar

import httpx
from pydantic import BaseModel

from prorl_server.auth_key import client_api_key
from prorl_server.client.connection import Answer, ServerConnection
from prorl_server.client.deprecated import add_deprecated_aliases
from prorl_server.client.errors import RolloutServerError
from prorl_server.client.membership import FailoverPolicy, ServerRoster
from prorl_server.client.monitor import ServerMonitor
from prorl_server.client.placement import LoadTracker
from prorl_server.client.resources import APIResource, Backends, Groups, Jobs, Weights
from prorl_server.client.resources.groups import GroupRequestLike
from prorl_server.client.resources.jobs import Request
from prorl_server.client.retry import RetryPolicy
from prorl_server.client.stream import Cursor
from prorl_server.client.weight_sync import ClusterWeightUpdate
from prorl_server.client.work_ledger import WorkLedger
from prorl_server.protocol import HandlerInfo, HealthResponse, JobList, StatusResponse, read_endpoints

__all__ = ["GroupRequestLike", "Request", "RolloutClient"]

M = TypeVar("M", bound=BaseModel)


class RolloutClient:
    """Async client of one or several prorl-servers, its calls grouped by resource:

        async with RolloutClient("http://127.0.0.1:8000") as client:
            job_ids = await client.jobs.submit_many(requests)
            async for result in client.jobs.as_completed(job_ids, progress=True, ack=True):
                ...

    - `client.jobs` (submit, submit_many, process, get, wait, cancel, stream, as_completed, collect, ack),
      `client.groups` (submit, get, wait, cancel), `client.weights` (status, pause, update, resume, swap,
      update_all),
      `client.backends` (add, remove, list, clear, register); `status`, `health` and `handlers` of a
      server are the client's own. The flat names of before (`client.submit`, `client.pause_weights`, ...)
      still work, with a DeprecationWarning (see `prorl_server.client.deprecated`).
    - Answers are the `prorl_server.protocol` models (JobResult, StatusResponse, ...).
    - Every failed request raises RolloutServerError (`status_code` None when no answer came).
    - Connection errors, timeouts and 502/503/504 are retried per `retry` (a RetryPolicy). A submit always
      carries a job id (a uuid4 hex when the request has none), so a retried submit cannot run a job twice;
      a 409 on a retry means the first attempt got through.
    - With several servers, each submit goes to the least loaded one (`GET /status`, at most every
      `load_refresh_s` seconds, plus the jobs sent since); the client remembers which server has which job
      for `wait`, `cancel` and `ack`, and `jobs.stream` merges the servers' results. Calls about one
      server take `server=`, which may be left out when the client has one.
    - `api_key` defaults to `$PRORL_API_KEY`, else the key in this user's key file when there is one (where
      `prorl-server serve` keeps the key it uses when given none: `prorl_server.auth_key`; ApiKeyFileError if
      that file may not be used); pass "" to send none.
    """

    RESOURCES: ClassVar[dict[str, type[APIResource]]] = {
        "jobs": Jobs,
        "groups": Groups,
        "weights": Weights,
        "backends": Backends,
    }
    """Attribute name -> resource class; the sync client makes its resources from this too."""

    jobs: Jobs
    groups: Groups
    weights: Weights
    backends: Backends

    def __init__(
        self,
        servers: str | Sequence[str],
        *,
        api_key: str | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        load_refresh_s: float = 1.0,
        poll_interval_s: float = 0.5,
        trust_env: bool = True,
        failover: FailoverPolicy | None = None,
    ) -> None:
        urls = [servers] if isinstance(servers, str) else list(servers)
        urls = list(dict.fromkeys(url.rstrip("/") for url in urls))
        if not urls:
            raise ValueError("RolloutClient needs at least one server URL")
        key = client_api_key() if api_key is None else api_key
        self.retry = retry or RetryPolicy()
        self.poll_interval_s = poll_interval_s
        self._connect = functools.partial(
            ServerConnection, api_key=key, timeout_s=timeout, retry=self.retry, trust_env=trust_env
        )
        """url -> a ServerConnection with this client's key, timeout, retries and proxy setting."""
        self._connections = {url: self._connect(url) for url in urls}
        self._loads = LoadTracker(urls, load_refresh_s)
        self._roster = ServerRoster(urls, failover)
        self._ledger = WorkLedger()
        self._monitor = ServerMonitor(self)
        self._weight_sync = ClusterWeightUpdate(self)  # client.weights.update_all
        self._roster.catch_up = self._weight_sync.catch_up  # a fenced server that answers again catches up
        self._owners: dict[str, str] = {}
        self._group_owners: dict[str, str] = {}
        for name, resource in self.RESOURCES.items():
            setattr(self, name, resource(self))

    @classmethod
    def from_endpoints(cls, path: str | Path, **options: Any) -> RolloutClient:
        """A client of the servers listed in an endpoints file (written by deploy/slurm/); `options` as for
        the constructor."""
        return cls(read_endpoints(path).servers, **options)

    # lifetime --------------------------------------------------------------------------------------

    @property
    def servers(self) -> list[str]:
        """The servers' base URLs."""
        return list(self._connections)

    def server_states(self) -> dict[str, str]:
        """Each server as the client sees it: live, fenced (no new jobs: it missed a weight update, or is back
        after being lost), suspect (not answering) or lost (its unfinished work was moved to live servers)."""
        return self._roster.summary()

    @property
    def recoveries(self) -> list[dict[str, Any]]:
        """One entry per lost server whose work was moved: server, jobs, groups, moved, seconds."""
        return list(self._monitor.recoveries)

    def add_server(self, url: str) -> str:
        """Use one more server (a replacement started on another node, say); its stored results are streamed
        with the others'. Returns its normalized URL."""
        url = url.rstrip("/")
        if url not in self._connections:
            self._connections[url] = self._connect(url)
            self._roster.add(url)
            self._loads.add(url)
        return url

    async def replace_server(self, lost: str, replacement: str) -> str:
        """`lost` is gone for good and `replacement` takes its place (started on `lost`'s journal, it serves
        the results `lost` had finished): `lost` is declared lost now and its unfinished work moved, without
        waiting for the heartbeat; the jobs whose results `replacement` already serves stay with it. Returns
        the replacement's URL."""
        url = self.add_server(replacement)
        lost = self._conn(lost).url
        await self._monitor.adopt_finished(lost, url)
        self._roster.declare_lost(lost)
        self._monitor.ensure_started()
        await self._monitor.move_work(lost)
        return url

    async def aclose(self) -> None:
        """Stop the heartbeat and close the connection pools."""
        await self._monitor.aclose()
        await asyncio.gather(*(conn.aclose() for conn in self._connections.values()))

    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # one server ------------------------------------------------------------------------------------

    async def status(self, *, server: str | None = None) -> StatusResponse:
        """`GET /status`: queue depths, busy workers, live jobs per status, backend counts."""
        return await self._status(self._one(server))

    async def health(self, *, server: str | None = None) -> HealthResponse:
        """`GET /health`: `status` is `ok`, or `degraded` (the server answered 503) with its `problems`."""
        response = await self._conn(self._one(server)).request("GET", "/health", accept=frozenset({503}))
        try:
            return HealthResponse.model_validate(response.json())
        except ValueError as exc:  # a 503 from something else than a prorl-server (a proxy)
            raise RolloutServerError.from_response(response, "") from exc

    async def handlers(self, *, server: str | None = None) -> list[HandlerInfo]:
        """`GET /handlers`: data sources and whether their handler loaded."""
        response = await self._conn(self._one(server)).request("GET", "/handlers")
        return [HandlerInfo.model_validate(item) for item in response.json()]

    # internals, for the resources ------------------------------------------------------------------

    def _conn(self, server: str) -> ServerConnection:
        try:
            return self._connections[server.rstrip("/")]
        except KeyError:
            raise ValueError(f"{server!r} is not one of this client's servers: {self.servers}") from None

    def _one(self, server: str | None) -> str:
        if server is not None:
            return self._conn(server).url
        if len(self._connections) > 1:
            raise ValueError(f"this client has several servers; name one with server=: {self.servers}")
        return self.servers[0]

    async def _place(self, server: str | None, exclude: frozenset[str] = frozenset()) -> str:
        """`server`, or the least loaded placeable one not in `exclude`; waits (about `lost_after_s` at most)
        while there is none, then RolloutServerError naming each server's state."""
        if server is not None:
            return self._conn(server).url
        if len(self._connections) == 1:
            return self.servers[0]
        self._monitor.ensure_started()
        policy = self._roster.policy
        deadline = time.monotonic() + policy.lost_after_s + policy.probe_timeout_s + policy.heartbeat_s
        while not (candidates := [s for s in self._roster.placeable() if s not in exclude]):
            if time.monotonic() > deadline or not self._monitor.running:
                raise RolloutServerError(f"no server can take jobs now: {self._roster.summary()}")
            await asyncio.sleep(min(0.1, policy.heartbeat_s))
        return await self._loads.pick(self._placement_status, candidates)

    async def _send_new(
        self,
        server: str | None,
        path: str,
        *,
        job_id: str | None = None,
        group_id: str | None = None,
        json: dict[str, Any] | None = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        accept_on_retry: frozenset[int] = frozenset(),
    ) -> tuple[str, Answer]:
        """POST new work, the job `job_id` or the group `group_id` (its body `json`, or `content` encoded), to
        `server`, default the least loaded placeable one; while failing over, a placed server that cannot be
        reached is reported and the next placeable one tried (the attempt may have got through: that copy is
        cancelled if the server comes back)."""
        self._monitor.ensure_started()
        while True:
            target = await self._place(server)
            try:
                response = await self._conn(target).request(
                    "POST", path, json=json, content=content, params=params, accept_on_retry=accept_on_retry
                )
            except RolloutServerError as exc:
                if server is not None or not self._failing_over(exc):
                    raise
                self._roster.failed(target, str(exc))
                if group_id is not None:
                    self._ledger.moved_groups[target].add(group_id)
                elif job_id is not None:
                    self._ledger.moved_jobs[target].add(job_id)
                if not self._roster.placeable():
                    raise
                continue
            return target, response

    def _failing_over(self, exc: RolloutServerError) -> bool:
        """Whether `exc` (no answer from a server) is for the failover to handle rather than the caller."""
        return exc.status_code is None and self._monitor.running

    def _monitor_for_streams(self) -> bool:
        """Start the heartbeat if failover applies; whether it runs."""
        self._monitor.ensure_started()
        return self._monitor.running

    def _stream_retry_delay(self, server: str, exc: RolloutServerError) -> float | None:
        """For a result stream whose long poll to `server` failed: poll again after a heartbeat while the
        failover handles that server (no answer, or a proxy's 502/503/504), else end the stream."""
        if exc.status_code is None or self.retry.retryable_status(exc.status_code):
            self._roster.failed(server, str(exc))
            return self._roster.policy.heartbeat_s
        return None

    async def _placement_status(self, server: str) -> StatusResponse:
        """`GET /status` for placement: one try, within the failover probe's timeout (a dead server must not
        hold placement up); a server that does not answer is reported to the roster."""
        conn = self._conn(server)
        try:
            response = await conn.send("GET", "/status", timeout=httpx.Timeout(self._roster.policy.probe_timeout_s))
        except httpx.TransportError as exc:
            self._roster.failed(server, f"{type(exc).__name__}: {exc}")
            raise
        if not response.is_success:
            raise RolloutServerError.from_response(response)
        return StatusResponse.model_validate_json(response.content)

    async def _status(self, server: str) -> StatusResponse:
        response = await self._conn(server).request("GET", "/status")
        return StatusResponse.model_validate(response.json())

    async def _page(self, server: str, after: int, limit: int, wait: float) -> JobList:
        conn = self._conn(server)
        params = {"after": after, "limit": limit, "wait": wait}
        response = await conn.request("GET", "/jobs", params=params, timeout=wait + conn.timeout_s)
        return JobList.model_validate_json(response.content)

    async def _ack_through(self, server: str, cursor: int) -> int:
        response = await self._conn(server).request("POST", "/jobs/ack", json={"through": cursor})
        return int(response.json()["acknowledged"])

    def _cursor(self, after: Cursor | int | None) -> Cursor:
        if after is None:
            return dict.fromkeys(self.servers, 0)
        if isinstance(after, int):
            return {self._one(None): after}
        return {self._conn(server).url: position for server, position in after.items()}

    async def _on_servers(
        self, server: str | None, method: str, path: str, body: dict[str, Any] | None, model: type[M]
    ) -> dict[str, M]:
        """The same request on `server`, or on every server at once; server -> parsed answer."""
        servers = [self._one(server)] if server is not None else self.servers
        kwargs = {"json": body} if body is not None else {}
        responses = await asyncio.gather(*(self._conn(s).request(method, path, **kwargs) for s in servers))
        return {s: model.model_validate(r.json()) for s, r in zip(servers, responses, strict=True)}

    async def _on_owner(self, job_id: str, method: str, path: str, **kwargs: Any) -> Any:
        """The request on the server that has the job: the one it was sent to, else the first that knows it."""
        return await self._on_first_knowing(self._owners.get(job_id), method, path, **kwargs)

    async def _on_group_owner(self, group_id: str, method: str, path: str, **kwargs: Any) -> Any:
        """The request on the server that has the group: the one it was sent to, else the first that knows it."""
        return await self._on_first_knowing(self._group_owners.get(group_id), method, path, **kwargs)

    async def _on_first_knowing(self, owner: str | None, method: str, path: str, **kwargs: Any) -> Any:
        """The request on `owner`, or, unknown, on each server in turn until one does not answer 404."""
        candidates = [owner] if owner else self.servers
        for server in candidates:
            try:
                return await self._conn(server).request(method, path, **kwargs)
            except RolloutServerError as exc:
                if exc.status_code != 404 or server == candidates[-1]:
                    raise
        raise AssertionError("unreachable")


add_deprecated_aliases(RolloutClient, RolloutClient.RESOURCES)
