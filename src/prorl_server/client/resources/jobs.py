"""`client.jobs`: submit jobs, wait for them, stream their results, acknowledge them."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import httpx
from tqdm.auto import tqdm

from prorl_server.client.connection import CONNECT_TIMEOUT_S
from prorl_server.client.errors import RolloutServerError
from prorl_server.client.resources.base import APIResource
from prorl_server.client.stream import Cursor, ResultStream
from prorl_server.protocol import (
    TERMINAL_STATUSES,
    CancelResponse,
    JobAccepted,
    JobResult,
    JobStatusResponse,
    ProcessRequest,
)

Request = ProcessRequest | Mapping[str, Any]
"""A job: a ProcessRequest, or a dict of its fields (validated before it is sent)."""

ACK_BATCH = 256
"""Results `as_completed(ack=True)` acknowledges per request."""


class Jobs(APIResource):
    """`client.jobs`: one rollout each (`POST /jobs`, `/process`, `GET /jobs/...`, `/cancel`, `/jobs/ack`).

    A submit always carries a job id (a uuid4 hex when the request has none), so a retried submit cannot
    run a job twice; a 409 on a retry means the first attempt got through. The client remembers which
    server has which job for `get`, `wait`, `cancel` and `ack`."""

    async def submit(self, request: Request, *, server: str | None = None) -> str:
        """`POST /jobs`: queue a job on `server` (default: the least loaded); returns its job id."""
        client = self._client
        body = _body(request)
        server = await client._place(server)
        response = await client._conn(server).request("POST", "/jobs", json=body, accept_on_retry=_CONFLICT)
        accepted = response.status_code != 409  # a 409 answers a retry: the first attempt got through
        job_id = JobAccepted.model_validate(response.json()).job_id if accepted else body["job_id"]
        client._owners[job_id] = server
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
        client = self._client
        body = _body(request)
        server = await client._place(server)
        response = await client._conn(server).request(
            "POST", "/process", json=body, timeout=_NO_READ_TIMEOUT, accept_on_retry=_CONFLICT
        )
        client._owners[body["job_id"]] = server
        if response.status_code == 409:
            return await self.wait(body["job_id"])
        return JobResult.model_validate(response.json())

    async def get(self, job_id: str) -> JobStatusResponse:
        """`GET /jobs/{job_id}`: the job's status, and its result once terminal."""
        response = await self._client._on_owner(job_id, "GET", f"/jobs/{job_id}")
        return JobStatusResponse.model_validate(response.json())

    async def wait(self, job_id: str, *, timeout: float | None = None) -> JobResult:
        """Poll `GET /jobs/{job_id}` until the job is terminal; return its result. TimeoutError after
        `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        poll_interval_s = self._client.poll_interval_s
        interval = min(0.05, poll_interval_s)
        while True:
            answer = await self.get(job_id)
            if answer.status in TERMINAL_STATUSES and answer.result is not None:
                return answer.result
            if deadline is not None and time.monotonic() + interval > deadline:
                raise TimeoutError(f"job {job_id} still {answer.status.value} after {timeout} s")
            await asyncio.sleep(interval)
            interval = min(interval * 2, poll_interval_s)

    async def cancel(self, job_id: str) -> CancelResponse:
        """`POST /cancel`: cancel a job (idempotent; a finished job keeps its result)."""
        response = await self._client._on_owner(job_id, "POST", "/cancel", json={"job_id": job_id})
        return CancelResponse.model_validate(response.json())

    def server_of(self, job_id: str) -> str | None:
        """The server this client sent `job_id` to (None for a job it did not submit)."""
        return self._client._owners.get(job_id)

    # results ---------------------------------------------------------------------------------------

    def stream(
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
        client = self._client
        return ResultStream(
            client._cursor(after), client._page, client._ack_through, wait=wait, limit=limit, ack=ack, timeout=timeout
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
        client = self._client
        remaining = set(job_ids)
        if not remaining:
            return
        owners = {client._owners.get(job_id) for job_id in remaining}
        servers = client.servers if None in owners else [s for s in client.servers if s in owners]
        label = progress if isinstance(progress, str) else "jobs"
        taken: list[str] = []
        with tqdm(total=len(remaining), unit="job", desc=label, disable=not progress) as bar:
            stream = ResultStream(
                dict.fromkeys(servers, 0), client._page, client._ack_through, wait=wait, limit=limit, timeout=timeout
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
        client = self._client
        by_server: dict[str, list[str]] = {}
        for job_id in job_ids:
            owner = client._owners.pop(job_id, None)
            for server in [owner] if owner else client.servers:
                by_server.setdefault(server, []).append(job_id)
        cursor = client._cursor(through) if through is not None else {}
        calls = []
        for server in client.servers:
            body: dict[str, Any] = {"job_ids": by_server.get(server, [])}
            if server in cursor:
                body["through"] = cursor[server]
            if body["job_ids"] or "through" in body:
                calls.append(client._conn(server).request("POST", "/jobs/ack", json=body))
        responses = await asyncio.gather(*calls)
        return sum(response.json()["acknowledged"] for response in responses)

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


def _body(request: Request) -> dict[str, Any]:
    """The JSON body of a job (see `_with_job_id`)."""
    return _with_job_id(request).model_dump(mode="json", exclude_none=True)
