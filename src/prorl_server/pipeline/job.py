"""Job: one task instance on its way through INIT, RUN and EVAL."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from prorl_server.handlers import AgentHandler, JobContext
from prorl_server.pipeline.timer import PausableTimer
from prorl_server.protocol import JobResult, JobStatus

STAGES = ("init", "run", "eval")


class Job:
    """Mutable job state, shared between the API thread and the stage threads.

    `finish()` decides the terminal result exactly once (first caller wins) and wakes every waiter.
    """

    def __init__(
        self, job_id: str, handler: AgentHandler, ctx: JobContext, timer: PausableTimer, request_digest: str = ""
    ) -> None:
        self.id = job_id
        self.request_digest = request_digest  # what was asked, to recognise the same request sent again
        self.handler = handler
        self.ctx = ctx
        self.timer = timer
        self.status = JobStatus.QUEUED
        self.next_stage = "init"
        self.result: JobResult | None = None
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[JobResult]]] = []
        self._task: asyncio.Task[Any] | None = None
        self._task_loop: asyncio.AbstractEventLoop | None = None
        self._holds_ready_permit = False

    @property
    def terminal(self) -> bool:
        """True once a result has been decided."""
        return self.result is not None

    def attach(self, stage: str, task: asyncio.Task[Any]) -> bool:
        """Record the running stage task; False if the job ended meanwhile (the caller drops it)."""
        with self._lock:
            if self.result is not None:
                return False
            self._task = task
            self._task_loop = task.get_loop()
            self.status = JobStatus(stage)
            self.ctx.stage = stage
            return True

    def detach(self, next_stage: str | None = None) -> None:
        """Forget the stage task; with `next_stage`, the job is now queued for it (unless terminal)."""
        with self._lock:
            self._task = None
            self._task_loop = None
            if self.result is None and next_stage is not None:
                self.status = JobStatus.QUEUED
                self.next_stage = next_stage

    def hold_ready_permit(self) -> bool:
        """Record that the job holds a ready-for-RUN permit; False if it ended meanwhile (give it back)."""
        with self._lock:
            if self.result is not None:
                return False
            self._holds_ready_permit = True
            return True

    def drop_ready_permit(self) -> bool:
        """True exactly once after `hold_ready_permit`: the caller must release the permit."""
        with self._lock:
            held, self._holds_ready_permit = self._holds_ready_permit, False
            return held

    def finish(self, result: JobResult) -> bool:
        """Set the terminal result if none is set yet; wake waiters. Returns whether this call won."""
        with self._lock:
            if self.result is not None:
                return False
            self.result = result
            self.status = result.status
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future, result)
        return True

    def interrupt(self) -> bool:
        """Cancel the running stage task from any thread; False when no stage is running."""
        with self._lock:
            task, loop = self._task, self._task_loop
        if task is None or loop is None:
            return False
        try:
            loop.call_soon_threadsafe(task.cancel)
        except RuntimeError:  # the loop closed: the stage is gone already
            return False
        return True

    async def wait(self) -> JobResult:
        """Wait (on any event loop) until the job is terminal and return its result."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self.result is not None:
                return self.result
            future: asyncio.Future[JobResult] = loop.create_future()
            self._waiters.append((loop, future))
        return await future


def _resolve(future: asyncio.Future[JobResult], result: JobResult) -> None:
    if not future.done():
        future.set_result(result)
