"""`SyncRolloutClient`: the async RolloutClient for code without an event loop, run on a thread of its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from prorl_server.client.rollout_client import GroupRequestLike, Request, RolloutClient
from prorl_server.client.stream import Cursor, ResultStream
from prorl_server.protocol import (
    CancelResponse,
    GroupResult,
    HandlerInfo,
    HealthResponse,
    JobResult,
    JobStatusResponse,
    LLMServerInfo,
    LLMServerList,
    PauseResponse,
    RemoveLLMServerResponse,
    StatusResponse,
    SwapResponse,
    UpdateResponse,
    WeightsStatus,
)
from prorl_server.protocol.endpoints import read_endpoints
from prorl_server.threadsafe import call_in_loop, run_in_loop

T = TypeVar("T")


class SyncRolloutClient:
    """Blocking twin of RolloutClient (same arguments, same methods, same errors): each call runs the async
    client on an event loop thread this object owns (`prorl-client-loop`). `close()` (or `with`) stops it.

        with SyncRolloutClient("http://127.0.0.1:8000") as client:
            job_ids = client.submit_many(requests)
            for result in client.as_completed(job_ids, progress=True, ack=True):
                ...
    """

    def __init__(self, servers: str | Sequence[str], **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="prorl-client-loop", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self.client: RolloutClient = self._run(_build(servers, options))
        except BaseException:
            self._stop_loop()
            raise

    @classmethod
    def from_endpoints(cls, path: str | Path, **options: Any) -> SyncRolloutClient:
        """A client of the servers listed in an endpoints file (written by deploy/slurm/)."""
        return cls(read_endpoints(path).servers, **options)

    # lifetime --------------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connections and stop the loop thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self.client.aclose())
        finally:
            self._stop_loop()

    def __enter__(self) -> SyncRolloutClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @property
    def servers(self) -> list[str]:
        """The servers' base URLs."""
        return self.client.servers

    def server_of(self, job_id: str) -> str | None:
        """The server this client sent `job_id` to."""
        return self.client.server_of(job_id)

    # the async client's calls ----------------------------------------------------------------------

    def submit(self, request: Request, *, server: str | None = None) -> str:
        """See RolloutClient.submit."""
        return self._run(self.client.submit(request, server=server))

    def submit_many(self, requests: Iterable[Request], *, concurrency: int = 32) -> list[str]:
        """See RolloutClient.submit_many."""
        return self._run(self.client.submit_many(requests, concurrency=concurrency))

    def process(self, request: Request, *, server: str | None = None) -> JobResult:
        """See RolloutClient.process."""
        return self._run(self.client.process(request, server=server))

    def get(self, job_id: str) -> JobStatusResponse:
        """See RolloutClient.get."""
        return self._run(self.client.get(job_id))

    def wait(self, job_id: str, *, timeout: float | None = None) -> JobResult:
        """See RolloutClient.wait."""
        return self._run(self.client.wait(job_id, timeout=timeout))

    def cancel(self, job_id: str) -> CancelResponse:
        """See RolloutClient.cancel."""
        return self._run(self.client.cancel(job_id))

    def submit_group(self, request: GroupRequestLike, *, server: str | None = None) -> str:
        """See RolloutClient.submit_group."""
        return self._run(self.client.submit_group(request, server=server))

    def group(self, group_id: str, *, wait: float = 0) -> GroupResult:
        """See RolloutClient.group."""
        return self._run(self.client.group(group_id, wait=wait))

    def wait_group(self, group_id: str, timeout: float | None = None) -> GroupResult:
        """See RolloutClient.wait_group."""
        return self._run(self.client.wait_group(group_id, timeout=timeout))

    def cancel_group(self, group_id: str) -> GroupResult:
        """See RolloutClient.cancel_group."""
        return self._run(self.client.cancel_group(group_id))

    def server_of_group(self, group_id: str) -> str | None:
        """See RolloutClient.server_of_group."""
        return self.client.server_of_group(group_id)

    def stream_results(
        self,
        after: Cursor | int | None = None,
        *,
        wait: float = 10.0,
        limit: int = 100,
        ack: bool = False,
        timeout: float | None = None,
    ) -> SyncResultStream:
        """See RolloutClient.stream_results; iterate it with `for`, resume from its `cursor`."""
        stream = self.client.stream_results(after, wait=wait, limit=limit, ack=ack, timeout=timeout)
        return SyncResultStream(self, stream)

    def as_completed(
        self,
        job_ids: Iterable[str],
        *,
        progress: bool | str = False,
        ack: bool = False,
        timeout: float | None = None,
        wait: float = 5.0,
        limit: int = 100,
    ) -> Iterator[JobResult]:
        """See RolloutClient.as_completed."""
        results = self.client.as_completed(job_ids, progress=progress, ack=ack, timeout=timeout, wait=wait, limit=limit)
        return self._iterate(results)

    def collect(
        self, job_ids: Iterable[str], *, progress: bool | str = False, ack: bool = False, timeout: float | None = None
    ) -> list[JobResult]:
        """See RolloutClient.collect."""
        return self._run(self.client.collect(job_ids, progress=progress, ack=ack, timeout=timeout))

    def ack(self, through: Cursor | int | None = None, job_ids: Iterable[str] = ()) -> int:
        """See RolloutClient.ack."""
        return self._run(self.client.ack(through, list(job_ids)))

    def status(self, *, server: str | None = None) -> StatusResponse:
        """See RolloutClient.status."""
        return self._run(self.client.status(server=server))

    def health(self, *, server: str | None = None) -> HealthResponse:
        """See RolloutClient.health."""
        return self._run(self.client.health(server=server))

    def handlers(self, *, server: str | None = None) -> list[HandlerInfo]:
        """See RolloutClient.handlers."""
        return self._run(self.client.handlers(server=server))

    def add_llm_server(
        self,
        address: str,
        weight_version: str | int | None = None,
        tags: Mapping[str, Any] | None = None,
        *,
        server: str | None = None,
    ) -> LLMServerInfo:
        """See RolloutClient.add_llm_server."""
        return self._run(self.client.add_llm_server(address, weight_version, tags, server=server))

    def remove_llm_server(
        self, address: str, *, abort: bool = False, timeout_s: float | None = None, server: str | None = None
    ) -> RemoveLLMServerResponse:
        """See RolloutClient.remove_llm_server."""
        return self._run(self.client.remove_llm_server(address, abort=abort, timeout_s=timeout_s, server=server))

    def llm_servers(self, *, server: str | None = None) -> LLMServerList:
        """See RolloutClient.llm_servers."""
        return self._run(self.client.llm_servers(server=server))

    def clear_llm_servers(self, *, server: str | None = None) -> int:
        """See RolloutClient.clear_llm_servers."""
        return self._run(self.client.clear_llm_servers(server=server))

    def weights(self, *, server: str | None = None) -> dict[str, WeightsStatus]:
        """See RolloutClient.weights."""
        return self._run(self.client.weights(server=server))

    def pause_weights(
        self, mode: str = "wait", *, timeout_s: float | None = None, server: str | None = None
    ) -> dict[str, PauseResponse]:
        """See RolloutClient.pause_weights."""
        return self._run(self.client.pause_weights(mode, timeout_s=timeout_s, server=server))

    def update_weights(
        self, version: str | int, *, reload_path: str | None = None, server: str | None = None
    ) -> dict[str, UpdateResponse]:
        """See RolloutClient.update_weights."""
        return self._run(self.client.update_weights(version, reload_path=reload_path, server=server))

    def resume_weights(self, *, server: str | None = None) -> dict[str, WeightsStatus]:
        """See RolloutClient.resume_weights."""
        return self._run(self.client.resume_weights(server=server))

    def swap_weights(
        self, version: str | int, *, mode: str = "wait", reload_path: str | None = None, server: str | None = None
    ) -> dict[str, SwapResponse]:
        """See RolloutClient.swap_weights."""
        return self._run(self.client.swap_weights(version, mode=mode, reload_path=reload_path, server=server))

    def register_backends(
        self,
        addresses: Sequence[str],
        weight_version: str | int | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> dict[str, list[str]]:
        """See RolloutClient.register_backends."""
        return self._run(self.client.register_backends(addresses, weight_version, tags))

    # internals -------------------------------------------------------------------------------------

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop thread and wait for it; an interrupt (Ctrl-C) cancels it."""
        if not self._thread.is_alive():
            call.close()
            raise RuntimeError("this SyncRolloutClient is closed")
        future = run_in_loop(self._loop, call)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def _iterate(self, results: AsyncIterator[T]) -> Iterator[T]:
        try:
            while True:
                try:
                    yield self._run(_next(results))
                except StopAsyncIteration:
                    return
        finally:
            close = getattr(results, "aclose", None)
            if close is not None and self._thread.is_alive():
                self._run(close())

    def _stop_loop(self) -> None:
        call_in_loop(self._loop, self._loop.stop)
        self._thread.join()
        self._loop.close()


class SyncResultStream:
    """Blocking view of a ResultStream: `for result in stream`, `stream.cursor`, `stream.close()`."""

    def __init__(self, owner: SyncRolloutClient, stream: ResultStream) -> None:
        self._stream = stream
        self._results = owner._iterate(stream)

    @property
    def cursor(self) -> Cursor:
        """Per server, where the stream is; pass it as `after=` to resume."""
        return self._stream.cursor

    def __iter__(self) -> Iterator[JobResult]:
        return self._results

    def __next__(self) -> JobResult:
        return next(self._results)

    def close(self) -> None:
        """Stop the stream (its long polls are cancelled)."""
        self._results.close()

    def __enter__(self) -> SyncResultStream:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


async def _build(servers: str | Sequence[str], options: dict[str, Any]) -> RolloutClient:
    return RolloutClient(servers, **options)


async def _next(results: AsyncIterator[T]) -> T:
    return await anext(results)
