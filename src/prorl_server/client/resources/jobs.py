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
    ErrorStage,
    JobAccepted,
    JobResult,
    JobStatusResponse,
    ProcessRequest,
)

Request = ProcessRequest | Mapping[str, Any]
"""A job: a ProcessRequest, or a dict of its fields (validated before it is sent)."""

ACK_BATCH = 256
"""Results `as_completed(ack=True)` acknowledges per request."""
YIELD_EVERY = 100
"""Requests `submit_many` validates between two turns of the event loop (about 3 ms of CPU)."""


class Jobs(APIResource):
    """`client.jobs`: one rollout each (`POST /jobs`, `/process`, `GET /jobs/...`, `/cancel`, `/jobs/ack`).

    A submit always carries a job id (a uuid4 hex when the request has none), so a retried submit cannot
    run a job twice; a 409 on a retry means the first attempt got through. The client remembers which
    server has which job for `get`, `wait`, `cancel` and `ack`."""

    async def submit(self, request: Request, *, server: str | None = None) -> str:
        """`POST /jobs`: queue a job on `server` (default: the least loaded); returns its job id."""
        job_id, body = _encode(request)
        return await self._submit(job_id, body, server)

    async def submit_many(self, requests: Iterable[Request], *, concurrency: int = 32) -> list[str]:
        """Submit every request (at most `concurrency` at once); returns their job ids in order. Every request
        is validated before the first is sent. If one is refused, the others that got through are cancelled
        and acknowledged, then the error is raised."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        jobs: list[tuple[str, bytes]] = []
        for request in requests:
            jobs.append(_encode(request))
            if len(jobs) % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a long batch does not hold the event loop
        outcomes: list[str | Exception] = [""] * len(jobs)
        queue = iter(enumerate(jobs))

        async def sender() -> None:  # one of `concurrency`, each sending the next job not taken yet
            for index, (job_id, body) in queue:
                try:
                    outcomes[index] = await self._submit(job_id, body, None)
                except Exception as exc:
                    outcomes[index] = exc

        await asyncio.gather(*(sender() for _ in range(min(concurrency, len(jobs)))))
        accepted = [o for o in outcomes if isinstance(o, str)]
        if len(accepted) < len(outcomes):
            await self._abandon(accepted)
            raise next(o for o in outcomes if isinstance(o, Exception))
        return accepted

    async def _submit(self, job_id: str, body: bytes, server: str | None) -> str:
        """`POST /jobs` of one encoded job (see `submit`)."""
        client = self._client
        if server is None:  # a job id this client has already: to the server that has it (one job, or 409)
            server = client._ledger.owner(job_id) or client._owners.get(job_id)
        server, response = await client._send_new(
            server, "/jobs", job_id=job_id, content=body, accept_on_retry=_CONFLICT
        )
        accepted = response.status_code != 409  # a 409 answers a retry: the first attempt got through
        answered = JobAccepted.model_validate_json(response.content).job_id if accepted else job_id
        client._owners[answered] = server
        client._ledger.job_submitted(job_id, body, server)
        return answered

    async def process(self, request: Request, *, server: str | None = None) -> JobResult:
        """`POST /process`: run a job and return its result once terminal. A retry that finds the job
        already running (409) waits for it instead, and so does a call whose server stops answering while
        the client fails over (the job is moved if that server is lost)."""
        client = self._client
        job_id, body = _encode(request)
        client._monitor.ensure_started()
        server = await client._place(server)
        client._owners[job_id] = server
        client._ledger.job_submitted(job_id, body, server)
        try:
            response = await client._conn(server).request(
                "POST", "/process", content=body, timeout=_NO_READ_TIMEOUT, accept_on_retry=_CONFLICT
            )
        except RolloutServerError as exc:
            if not client._failing_over(exc):
                client._ledger.job_taken(job_id)
                raise
            client._roster.failed(server, str(exc))
            return await self.wait(job_id)
        if response.status_code == 409:
            return await self.wait(job_id)
        client._ledger.job_taken(job_id)
        return JobResult.model_validate_json(response.content)

    async def get(self, job_id: str) -> JobStatusResponse:
        """`GET /jobs/{job_id}`: the job's status, and its result once terminal."""
        response = await self._client._on_owner(job_id, "GET", f"/jobs/{job_id}")
        return JobStatusResponse.model_validate_json(response.content)

    async def wait(self, job_id: str, *, timeout: float | None = None) -> JobResult:
        """Poll `GET /jobs/{job_id}` until the job is terminal; return its result. TimeoutError after
        `timeout` seconds. While the client fails over, a server that does not answer is waited for (or its
        job followed to the server it was moved to)."""
        client = self._client
        deadline = None if timeout is None else time.monotonic() + timeout
        poll_interval_s = client.poll_interval_s
        interval = min(0.05, poll_interval_s)
        while True:
            try:
                answer = await self.get(job_id)
            except RolloutServerError as exc:
                if not client._failing_over(exc):
                    raise
                answer = None
            if answer is not None and answer.status in TERMINAL_STATUSES and answer.result is not None:
                client._ledger.job_taken(job_id)
                return answer.result
            if deadline is not None and time.monotonic() + interval > deadline:
                status = answer.status.value if answer is not None else "unreachable"
                raise TimeoutError(f"job {job_id} still {status} after {timeout} s")
            await asyncio.sleep(interval)
            interval = min(interval * 2, poll_interval_s)

    async def cancel(self, job_id: str) -> CancelResponse:
        """`POST /cancel`: cancel a job (idempotent; a finished job keeps its result)."""
        self._client._ledger.job_taken(job_id)
        response = await self._client._on_owner(job_id, "POST", "/cancel", json={"job_id": job_id})
        return CancelResponse.model_validate_json(response.content)

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
        failover = client._monitor_for_streams()
        if failover:
            servers = client.servers
        else:
            owners = {client._owners.get(job_id) for job_id in remaining}
            servers = client.servers if None in owners else [s for s in client.servers if s in owners]
        label = progress if isinstance(progress, str) else "jobs"
        taken: list[str] = []
        strays = _Strays(client)
        with tqdm(total=len(remaining), unit="job", desc=label, disable=not progress) as bar:
            stream = ResultStream(
                dict.fromkeys(servers, 0),
                client._page,
                client._ack_through,
                wait=wait,
                limit=limit,
                timeout=timeout,
                on_error=client._stream_retry_delay if failover else None,
                watch=(lambda: client.servers) if failover else None,
            )
            try:
                async with stream:
                    async for result in stream:
                        if result.job_id not in remaining:
                            continue
                        if failover and not strays.accept(result, stream.last_server):
                            continue
                        remaining.discard(result.job_id)
                        client._ledger.job_taken(result.job_id)
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
                await strays.settle()

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
            client._ledger.job_taken(job_id)
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


class _Strays:
    """While failing over, the same job id may finish on two servers (the one it was moved off, or a
    replacement serving that server's journal, and the one it was moved to): the first real result is
    handed out, a restart failure from a server that no longer has the job is skipped, and the other copy
    is cancelled and acknowledged where it is (`settle`)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._drop: dict[str, set[str]] = {}

    def accept(self, result: JobResult, server: str | None) -> bool:
        """Whether to hand out `result`, which came from `server`."""
        owner = self._client._owners.get(result.job_id)
        if server is None or owner is None or server == owner:
            return True
        if result.error is not None and result.error.stage == ErrorStage.RESTART:
            self._drop.setdefault(server, set()).add(result.job_id)
            return False
        self._drop.setdefault(owner, set()).add(result.job_id)  # the copy still running there
        self._client._owners[result.job_id] = server
        return True

    async def settle(self) -> None:
        """Cancel and acknowledge the copies not handed out (best effort)."""
        for server, job_ids in self._drop.items():
            conn = self._client._conn(server)
            with contextlib.suppress(RolloutServerError):
                for job_id in job_ids:
                    await conn.request("POST", "/cancel", json={"job_id": job_id}, accept=frozenset({404}))
                await conn.request("POST", "/jobs/ack", json={"job_ids": sorted(job_ids)})
        self._drop.clear()


_NO_READ_TIMEOUT = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
"""`POST /process` answers when the job is terminal, however long that takes."""
_CONFLICT = frozenset({409})


def _with_job_id(request: Request) -> ProcessRequest:
    """The job, validated, with a job id (a fresh uuid4 hex when it has none)."""
    model = request if isinstance(request, ProcessRequest) else ProcessRequest.model_validate(dict(request))
    return model if model.job_id is not None else model.model_copy(update={"job_id": uuid.uuid4().hex})


def _encode(request: Request) -> tuple[str, bytes]:
    """The job's id and its JSON body (see `_with_job_id`)."""
    model = _with_job_id(request)
    return str(model.job_id), model.model_dump_json(exclude_none=True).encode()
