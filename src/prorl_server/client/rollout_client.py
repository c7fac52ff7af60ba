"""The trainer-side client of prorl-server: submit jobs, wait for them or stream their results, over one or
several servers, with typed answers, retries and one exception type."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel
from tqdm.auto import tqdm

from prorl_server.auth_key import client_api_key
from prorl_server.client.connection import CONNECT_TIMEOUT_S, ServerConnection
from prorl_server.client.errors import RolloutServerError
from prorl_server.client.placement import LoadTracker, assign_backends
from prorl_server.client.retry import RetryPolicy
from prorl_server.client.stream import Cursor, ResultStream
from prorl_server.protocol import (
    TERMINAL_STATUSES,
    AddLLMServerRequest,
    CancelResponse,
    GroupAccepted,
    GroupRequest,
    GroupResult,
    GroupStatus,
    HandlerInfo,
    HealthResponse,
    JobAccepted,
    JobList,
    JobResult,
    JobStatusResponse,
    LLMServerInfo,
    LLMServerList,
    PauseRequest,
    PauseResponse,
    ProcessRequest,
    RemoveLLMServerRequest,
    RemoveLLMServerResponse,
    StatusResponse,
    SwapRequest,
    SwapResponse,
    UpdateRequest,
    UpdateResponse,
    WeightsStatus,
)
from prorl_server.protocol.endpoints import read_endpoints

M = TypeVar("M", bound=BaseModel)

Request = ProcessRequest | Mapping[str, Any]
"""A job: a ProcessRequest, or a dict of its fields (validated before it is sent)."""

GroupRequestLike = GroupRequest | Mapping[str, Any]
"""A group: a GroupRequest, or a dict of its fields (validated before it is sent)."""

GROUP_POLL_S = 30.0
"""Longest single `GET /groups/{id}?wait=` long poll `wait_group` sends (the server allows 300)."""

ACK_BATCH = 256
"""Results `as_completed(ack=True)` acknowledges per request."""


class RolloutClient:
    """Async client of one or several prorl-servers.

        async with RolloutClient("http://127.0.0.1:8000") as client:
            job_ids = await client.submit_many(requests)
            async for result in client.as_completed(job_ids, progress=True, ack=True):
                ...

    - Answers are the `prorl_server.protocol` models (JobResult, StatusResponse, ...).
    - Every failed request raises RolloutServerError (`status_code` None when no answer came).
    - Connection errors, timeouts and 502/503/504 are retried per `retry` (a RetryPolicy). A submit always
      carries a job id (a uuid4 hex when the request has none), so a retried submit cannot run a job twice;
      a 409 on a retry means the first attempt got through.
    - With several servers, each submit goes to the least loaded one (`GET /status`, at most every
      `load_refresh_s` seconds, plus the jobs sent since); the client remembers which server has which job
      for `wait`, `cancel` and `ack`, and `stream_results` merges the servers' results. Methods about one
      server take `server=`, which may be left out when the client has one.
    - `api_key` defaults to `$PRORL_API_KEY`, else the key in this user's key file when there is one (where
      `prorl-server serve` keeps the key it uses when given none: `prorl_server.auth_key`; ApiKeyFileError if
      that file may not be used); pass "" to send none.
    """

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
    ) -> None:
        urls = [servers] if isinstance(servers, str) else list(servers)
        urls = list(dict.fromkeys(url.rstrip("/") for url in urls))
        if not urls:
            raise ValueError("RolloutClient needs at least one server URL")
        key = client_api_key() if api_key is None else api_key
        self.retry = retry or RetryPolicy()
        self.poll_interval_s = poll_interval_s
        self._connections = {
            url: ServerConnection(url, api_key=key, timeout_s=timeout, retry=self.retry, trust_env=trust_env)
            for url in urls
        }
        self._loads = LoadTracker(urls, load_refresh_s)
        self._owners: dict[str, str] = {}
        self._group_owners: dict[str, str] = {}

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

    async def aclose(self) -> None:
        """Close the connection pools."""
        await asyncio.gather(*(conn.aclose() for conn in self._connections.values()))

    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def server_of(self, job_id: str) -> str | None:
        """The server this client sent `job_id` to (None for a job it did not submit)."""
        return self._owners.get(job_id)

    def server_of_group(self, group_id: str) -> str | None:
        """The server this client sent group `group_id` to (None for a group it did not submit)."""
        return self._group_owners.get(group_id)

    # jobs ------------------------------------------------------------------------------------------

    async def submit(self, request: Request, *, server: str | None = None) -> str:
        """`POST /jobs`: queue a job on `server` (default: the least loaded); returns its job id."""
        body = _body(request)
        server = await self._place(server)
        response = await self._conn(server).request("POST", "/jobs", json=body, accept_on_retry=_CONFLICT)
        accepted = response.status_code != 409  # a 409 answers a retry: the first attempt got through
        job_id = JobAccepted.model_validate(response.json()).job_id if accepted else body["job_id"]
        self._owners[job_id] = server
        return job_id

    async def submit_many(self, requests: Iterable[Request], *, concurrency: int = 32) -> list[str]:
        """Submit every request (at most `concurrency` at once); returns their job ids in order. If one is
        refused, the others that got through are cancelled and acknowledged, then the error is raised."""
        jobs = [_with_job_id(request) for request in requests]
        gate = asyncio.Semaphore(concurrency)

        async def one(job: ProcessRequest) -> str:
            async with gate:
                return await self.submit(job)

        outcomes = await asyncio.gather(*(one(job) for job in jobs), return_exceptions=True)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            accepted = [o for o in outcomes if isinstance(o, str)]
            await self._abandon(accepted)
            raise failures[0]
        return [o for o in outcomes if isinstance(o, str)]

    async def process(self, request: Request, *, server: str | None = None) -> JobResult:
        """`POST /process`: run a job and return its result once terminal. A retry that finds the job
        already running (409) waits for it instead."""
        body = _body(request)
        server = await self._place(server)
        response = await self._conn(server).request(
            "POST", "/process", json=body, timeout=_NO_READ_TIMEOUT, accept_on_retry=_CONFLICT
        )
        self._owners[body["job_id"]] = server
        if response.status_code == 409:
            return await self.wait(body["job_id"])
        return JobResult.model_validate(response.json())

    async def get(self, job_id: str) -> JobStatusResponse:
        """`GET /jobs/{job_id}`: the job's status, and its result once terminal."""
        response = await self._on_owner(job_id, "GET", f"/jobs/{job_id}")
        return JobStatusResponse.model_validate(response.json())

    async def wait(self, job_id: str, *, timeout: float | None = None) -> JobResult:
        """Poll `GET /jobs/{job_id}` until the job is terminal; return its result. TimeoutError after
        `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        interval = min(0.05, self.poll_interval_s)
        while True:
            answer = await self.get(job_id)
            if answer.status in TERMINAL_STATUSES and answer.result is not None:
                return answer.result
            if deadline is not None and time.monotonic() + interval > deadline:
                raise TimeoutError(f"job {job_id} still {answer.status.value} after {timeout} s")
            await asyncio.sleep(interval)
            interval = min(interval * 2, self.poll_interval_s)

    async def cancel(self, job_id: str) -> CancelResponse:
        """`POST /cancel`: cancel a job (idempotent; a finished job keeps its result)."""
        response = await self._on_owner(job_id, "POST", "/cancel", json={"job_id": job_id})
        return CancelResponse.model_validate(response.json())

    # groups ----------------------------------------------------------------------------------------

    async def submit_group(self, request: GroupRequestLike, *, server: str | None = None) -> str:
        """`POST /groups?wait=false`: start a group (`n_launch` members of one instance, `n` selected) on
        `server` (default: the least loaded); returns its group id. The request always carries a group id
        (a uuid4 hex when it has none), so a retried submit gets the same group and never launches twice.
        The client remembers the server for `group`, `wait_group`, `cancel_group` and the members' jobs."""
        model = _with_group_id(request)
        body = model.model_dump(mode="json", exclude_none=True)
        server = await self._place(server)
        self._loads.sent[server] += model.expected_launch - 1  # the placement counted one job; a group is more
        response = await self._conn(server).request("POST", "/groups", json=body, params={"wait": "false"})
        accepted = GroupAccepted.model_validate(response.json())
        self._loads.sent[server] += len(accepted.job_ids) - model.expected_launch  # what the server launched
        self._group_owners[accepted.group_id] = server
        for job_id in accepted.job_ids:
            self._owners[job_id] = server
        return accepted.group_id

    async def group(self, group_id: str, *, wait: float = 0) -> GroupResult:
        """`GET /groups/{group_id}?wait=`: the group now (`status` running until decided); with `wait` > 0
        the server holds the answer up to `wait` seconds (at most 300) for the group to be decided."""
        conn_timeout = self._conn(self._group_owners.get(group_id) or self.servers[0]).timeout_s
        params = {"wait": wait} if wait > 0 else None
        response = await self._on_group_owner(
            group_id, "GET", f"/groups/{group_id}", params=params, timeout=wait + conn_timeout
        )
        return GroupResult.model_validate(response.json())

    async def wait_group(self, group_id: str, timeout: float | None = None) -> GroupResult:
        """Long-poll `GET /groups/{group_id}` until the group is decided; return it. TimeoutError after
        `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = GROUP_POLL_S if deadline is None else min(GROUP_POLL_S, deadline - time.monotonic())
            answer = await self.group(group_id, wait=max(0.0, left))
            if answer.status is not GroupStatus.RUNNING:
                return answer
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"group {group_id} still running after {timeout} s")

    async def cancel_group(self, group_id: str) -> GroupResult:
        """`DELETE /groups/{group_id}`: cancel the group's running members (idempotent); the group ends with
        the usable results it has, and its answer is returned (decided, unless a member is slow to stop)."""
        response = await self._on_group_owner(group_id, "DELETE", f"/groups/{group_id}")
        return GroupResult.model_validate(response.json())

    # results ---------------------------------------------------------------------------------------

    def stream_results(
        self,
        after: Cursor | int | None = None,
        *,
        wait: float = 10.0,
        limit: int = 100,
        ack: bool = False,
        timeout: float | None = None,
    ) -> ResultStream:
        """Every finished result of every server, as it arrives (`GET /jobs` long polls, `wait` seconds each).
        `after` is a cursor from an earlier `stream.cursor` (an int with one server); with `ack=True` each
        page is acknowledged through its cursor once taken. See ResultStream."""
        return ResultStream(
            self._cursor(after), self._page, self._ack_through, wait=wait, limit=limit, ack=ack, timeout=timeout
        )

    async def as_completed(
        self,
        job_ids: Iterable[str],
        *,
        progress: bool | str = False,
        ack: bool = False,
        timeout: float | None = None,
        wait: float = 5.0,
        limit: int = 100,
    ) -> AsyncIterator[JobResult]:
        """The results of `job_ids` as they finish (other jobs' results are skipped, and left stored).

        `progress` shows a tqdm bar (a string is its label). With `ack=True` the results handed out are
        acknowledged by id. Iteration ends when every job has a result, or when `timeout` seconds have passed.
        Results come from `GET /jobs` long polls (`wait` seconds, `limit` results a page) from the start of
        each server's stored results.
        """
        remaining = set(job_ids)
        if not remaining:
            return
        owners = {self._owners.get(job_id) for job_id in remaining}
        servers = self.servers if None in owners else [s for s in self.servers if s in owners]
        label = progress if isinstance(progress, str) else "jobs"
        taken: list[str] = []
        with tqdm(total=len(remaining), unit="job", desc=label, disable=not progress) as bar:
            stream = ResultStream(
                dict.fromkeys(servers, 0), self._page, self._ack_through, wait=wait, limit=limit, timeout=timeout
            )
            try:
                async with stream:
                    async for result in stream:
                        if result.job_id not in remaining:
                            continue
                        remaining.discard(result.job_id)
                        bar.update(1)
                        if ack:
                            taken.append(result.job_id)  # handed out: acknowledged even if the caller stops here
                        yield result
                        if len(taken) >= ACK_BATCH:
                            await self.ack(job_ids=taken)
                            taken = []
                        if not remaining:
                            break
            finally:
                if taken:
                    await self.ack(job_ids=taken)

    async def collect(
        self, job_ids: Iterable[str], *, progress: bool | str = False, ack: bool = False, timeout: float | None = None
    ) -> list[JobResult]:
        """The results of `job_ids` in completion order (see `as_completed`); TimeoutError, naming how many
        are missing, when `timeout` passes first."""
        wanted = list(dict.fromkeys(job_ids))
        results = [r async for r in self.as_completed(wanted, progress=progress, ack=ack, timeout=timeout)]
        if len(results) < len(wanted):
            missing = len(wanted) - len(results)
            raise TimeoutError(f"{missing} of {len(wanted)} jobs had no result after {timeout} s")
        return results

    async def ack(self, through: Cursor | int | None = None, job_ids: Iterable[str] = ()) -> int:
        """`POST /jobs/ack`: drop stored results by job id and/or every result up to a cursor (per server).
        Returns how many were dropped."""
        by_server: dict[str, list[str]] = {}
        for job_id in job_ids:
            owner = self._owners.pop(job_id, None)
            for server in [owner] if owner else self.servers:
                by_server.setdefault(server, []).append(job_id)
        cursor = self._cursor(through) if through is not None else {}
        calls = []
        for server in self.servers:
            body: dict[str, Any] = {"job_ids": by_server.get(server, [])}
            if server in cursor:
                body["through"] = cursor[server]
            if body["job_ids"] or "through" in body:
                calls.append(self._conn(server).request("POST", "/jobs/ack", json=body))
        responses = await asyncio.gather(*calls)
        return sum(response.json()["acknowledged"] for response in responses)

    # servers ---------------------------------------------------------------------------------------

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

    async def add_llm_server(
        self,
        address: str,
        weight_version: str | int | None = None,
        tags: Mapping[str, Any] | None = None,
        *,
        server: str | None = None,
    ) -> LLMServerInfo:
        """`POST /add_llm_server`: register a backend (or update a known one's weight version)."""
        body = AddLLMServerRequest(address=address, weight_version=weight_version, tags=dict(tags or {}))
        response = await self._conn(self._one(server)).request(
            "POST", "/add_llm_server", json=body.model_dump(mode="json")
        )
        return LLMServerInfo.model_validate(response.json())

    async def remove_llm_server(
        self, address: str, *, abort: bool = False, timeout_s: float | None = None, server: str | None = None
    ) -> RemoveLLMServerResponse:
        """`POST /remove_llm_server`: drain one backend (its pinned jobs move to others; its calls in flight
        finish first, or are aborted and resent elsewhere with `abort=True`)."""
        body = RemoveLLMServerRequest(address=address, abort=abort, timeout_s=timeout_s)
        response = await self._conn(self._one(server)).request(
            "POST",
            "/remove_llm_server",
            json=body.model_dump(mode="json"),
            timeout=3600.0 if timeout_s is None else timeout_s + 30,  # it answers once the backend drained
        )
        return RemoveLLMServerResponse.model_validate(response.json())

    async def llm_servers(self, *, server: str | None = None) -> LLMServerList:
        """`GET /llm_servers`: the registered backends with their health and load."""
        response = await self._conn(self._one(server)).request("GET", "/llm_servers")
        return LLMServerList.model_validate(response.json())

    async def clear_llm_servers(self, *, server: str | None = None) -> int:
        """`POST /clear_llm_server` on `server`, or on every server; returns how many backends were removed."""
        servers = [self._one(server)] if server is not None else self.servers
        responses = await asyncio.gather(*(self._conn(s).request("POST", "/clear_llm_server") for s in servers))
        return sum(int(response.json()["removed"]) for response in responses)

    async def weights(self, *, server: str | None = None) -> dict[str, WeightsStatus]:
        """`GET /weights` of `server`, or of every server: server -> pause state and weight version."""
        return await self._on_servers(server, "GET", "/weights", None, WeightsStatus)

    async def pause_weights(
        self, mode: str = "wait", *, timeout_s: float | None = None, server: str | None = None
    ) -> dict[str, PauseResponse]:
        """`POST /weights/pause` on `server`, or on every server; each answers once no call is in flight (with
        mode "keep", the calls its engines froze aside)."""
        body = PauseRequest(mode=mode, timeout_s=timeout_s).model_dump(mode="json", exclude_none=True)
        return await self._on_servers(server, "POST", "/weights/pause", body, PauseResponse)

    async def update_weights(
        self, version: str | int, *, reload_path: str | None = None, server: str | None = None
    ) -> dict[str, UpdateResponse]:
        """`POST /weights/update` (while paused) on `server`, or on every server; with `reload_path` each
        backend first reloads its weights from that directory."""
        body = UpdateRequest(version=version, reload={"path": reload_path} if reload_path else None)
        return await self._on_servers(
            server, "POST", "/weights/update", body.model_dump(mode="json", exclude_none=True), UpdateResponse
        )

    async def resume_weights(self, *, server: str | None = None) -> dict[str, WeightsStatus]:
        """`POST /weights/resume` on `server`, or on every server."""
        return await self._on_servers(server, "POST", "/weights/resume", None, WeightsStatus)

    async def swap_weights(
        self,
        version: str | int,
        *,
        mode: str = "wait",
        reload_path: str | None = None,
        server: str | None = None,
    ) -> dict[str, SwapResponse]:
        """`POST /weights/swap` (pause, update, resume in one call) on `server`, or on every server."""
        body = SwapRequest(version=version, mode=mode, reload={"path": reload_path} if reload_path else None)
        return await self._on_servers(
            server, "POST", "/weights/swap", body.model_dump(mode="json", exclude_none=True), SwapResponse
        )

    async def _on_servers(
        self, server: str | None, method: str, path: str, body: dict[str, Any] | None, model: type[M]
    ) -> dict[str, M]:
        """The same request on `server`, or on every server at once; server -> parsed answer."""
        servers = [self._one(server)] if server is not None else self.servers
        kwargs = {"json": body} if body is not None else {}
        responses = await asyncio.gather(*(self._conn(s).request(method, path, **kwargs) for s in servers))
        return {s: model.model_validate(r.json()) for s, r in zip(servers, responses, strict=True)}

    async def register_backends(
        self,
        addresses: Sequence[str],
        weight_version: str | int | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> dict[str, list[str]]:
        """Register backends with ProRL's two-phase rule (see `assign_backends`): each server first gets the
        backends on its own host, then the rest are spread evenly. Returns server -> backend addresses."""
        assignment = assign_backends(self.servers, addresses)
        await asyncio.gather(
            *(
                self.add_llm_server(address, weight_version, tags, server=server)
                for server, assigned in assignment.items()
                for address in assigned
            )
        )
        return assignment

    # internals -------------------------------------------------------------------------------------

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

    async def _place(self, server: str | None) -> str:
        if server is not None:
            return self._conn(server).url
        return await self._loads.pick(self._status)

    async def _status(self, server: str) -> StatusResponse:
        response = await self._conn(server).request("GET", "/status")
        return StatusResponse.model_validate(response.json())

    async def _page(self, server: str, after: int, limit: int, wait: float) -> JobList:
        conn = self._conn(server)
        params = {"after": after, "limit": limit, "wait": wait}
        response = await conn.request("GET", "/jobs", params=params, timeout=wait + conn.timeout_s)
        return JobList.model_validate(response.json())

    async def _ack_through(self, server: str, cursor: int) -> int:
        response = await self._conn(server).request("POST", "/jobs/ack", json={"through": cursor})
        return int(response.json()["acknowledged"])

    def _cursor(self, after: Cursor | int | None) -> Cursor:
        if after is None:
            return dict.fromkeys(self.servers, 0)
        if isinstance(after, int):
            return {self._one(None): after}
        return {self._conn(server).url: position for server, position in after.items()}

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

    async def _abandon(self, job_ids: list[str]) -> None:
        """Best effort: cancel jobs given up on and drop their results."""
        await asyncio.gather(*(self.cancel(job_id) for job_id in job_ids), return_exceptions=True)
        with contextlib.suppress(RolloutServerError):
            await self.ack(job_ids=job_ids)


_NO_READ_TIMEOUT = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
"""`POST /process` answers when the job is terminal, however long that takes."""
_CONFLICT = frozenset({409})


def _with_job_id(request: Request) -> ProcessRequest:
    """The job, validated, with a job id (a fresh uuid4 hex when it has none)."""
    model = request if isinstance(request, ProcessRequest) else ProcessRequest.model_validate(dict(request))
    return model if model.job_id is not None else model.model_copy(update={"job_id": uuid.uuid4().hex})


def _with_group_id(request: GroupRequestLike) -> GroupRequest:
    """The group request, validated, with a group id (a fresh uuid4 hex when it has none)."""
    model = request if isinstance(request, GroupRequest) else GroupRequest.model_validate(dict(request))
    return model if model.group_id is not None else model.model_copy(update={"group_id": uuid.uuid4().hex})


def _body(request: Request) -> dict[str, Any]:
    """The JSON body of a job (see `_with_job_id`)."""
    return _with_job_id(request).model_dump(mode="json", exclude_none=True)
