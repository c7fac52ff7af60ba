"""Job: one task instance on its way through INIT, RUN and EVAL, and its lifecycle."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from prorl_server.handlers import JobContext
from prorl_server.pipeline.fork import GroupFork
from prorl_server.pipeline.handler_calls import HandlerMethods
from prorl_server.pipeline.timer import PausableTimer
from prorl_server.protocol import STAGES, TERMINAL_STATUSES, JobResult, JobStatus, Stage
from prorl_server.threadsafe import call_in_loop, try_call_in_loop

__all__ = ["STAGES", "Job"]

_IN_STAGE = frozenset(JobStatus(stage) for stage in Stage)
_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.QUEUED: _IN_STAGE | TERMINAL_STATUSES,  # enter_stage (the stage it is queued for), finish
    **{status: frozenset({JobStatus.QUEUED}) | TERMINAL_STATUSES for status in _IN_STAGE},  # queue_for, finish
    **{status: frozenset() for status in TERMINAL_STATUSES},
}
"""The job's lifecycle: which `status` may follow which. Once a result is decided nothing follows; the
status is then the result's (a handler's `final_result` has the last word on it)."""


class Job:
    """Mutable job state, shared between the API thread and the stage threads.

    Its lifecycle is `status`, changed only by these transitions (under the job's lock, see `_TRANSITIONS`):

        QUEUED for a stage --enter_stage--> that stage (INIT, RUN or EVAL): its task runs
        in a stage         --queue_for----> QUEUED for the next stage
        QUEUED or in stage --finish-------> terminal (COMPLETED, FAILED, ...): the result is decided

    `finish()` decides the terminal result exactly once (first caller wins) and wakes every waiter. Apart
    from that, the job's final release (its resources freed once it has ended) is claimed exactly once
    (`claim_final_release`).
    """

    def __init__(
        self,
        job_id: str,
        methods: HandlerMethods,
        ctx: JobContext,
        timer: PausableTimer,
        request_digest: str = "",
        first_stage: Stage = Stage.INIT,
        fork: GroupFork | None = None,
    ) -> None:
        self.id = job_id
        self.request_digest = request_digest  # what was asked, to recognise the same request sent again
        self.methods = methods
        self.handler = methods.handler
        self.ctx = ctx
        self.fork = fork  # its group's shared INIT, for a handler with fork_after_init (fork.py)
        self.timer = timer
        self.status = JobStatus.QUEUED
        self.next_stage = first_stage
        self.result: JobResult | None = None
        self._status_before_end = JobStatus.QUEUED  # what `visible` shows between `finish` and `publish`
        self._published = False  # the result is stored (`publish`)
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[JobResult]]] = []
        self._task: asyncio.Task[Any] | None = None
        self._task_loop: asyncio.AbstractEventLoop | None = None
        self.interrupted: asyncio.Future[None] | None = None  # done once the running stage is interrupted
        self._holds_ready_permit = False
        self._final_release_claimed = False

    @property
    def stage(self) -> Stage:
        """The stage the job is in, or (before its first) the one it is queued for."""
        return Stage(self.ctx.stage or self.next_stage)

    @property
    def terminal(self) -> bool:
        """True once a result has been decided."""
        return self.result is not None

    def _move_locked(self, status: JobStatus) -> None:
        """Take a transition of the lifecycle (before the result is decided); an illegal one is a bug."""
        if status not in _TRANSITIONS[self.status]:
            raise RuntimeError(f"job {self.id}: no transition from {self.status.value} to {status.value}")
        self.status = status

    def enter_stage(self, task: asyncio.Task[Any]) -> bool:
        """QUEUED -> the stage it was queued for, running `task`; False if the job ended meanwhile (the
        caller drops the task)."""
        with self._lock:
            if self.result is not None:
                return False
            self._move_locked(JobStatus(self.next_stage))
            self._task = task
            self._task_loop = task.get_loop()
            self.interrupted = self._task_loop.create_future()
            self.ctx.stage = self.next_stage
            return True

    def leave_stage(self) -> None:
        """Forget the stage task once it is over (the job stays in its stage until its next transition)."""
        with self._lock:
            self._task = None
            self._task_loop = None
            self.interrupted = None

    def queue_for(self, stage: Stage) -> bool:
        """In a stage -> QUEUED for `stage`; False if the job ended meanwhile."""
        with self._lock:
            if self.result is not None:
                return False
            self._move_locked(JobStatus.QUEUED)
            self.next_stage = stage
            return True

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
        """-> terminal: set the result if none is set yet. Returns whether this call won; the winner stores
        the result, then calls `publish`. Until then the job looks unfinished from outside (`visible`,
        `wait`): whatever a client learns of the result comes after it is stored (and journaled)."""
        with self._lock:
            if self.result is not None:
                return False
            self._status_before_end = self.status
            self.status = result.status
            self.result = result
            return True

    def publish(self) -> None:
        """The result is stored: wake the waiters."""
        with self._lock:
            self._published = True
            waiters, self._waiters = self._waiters, []
        assert self.result is not None
        for loop, future in waiters:
            call_in_loop(loop, _resolve, future, self.result)

    def visible(self) -> tuple[JobStatus, JobResult | None]:
        """(status, result) as a client may see them: the status before the end until the result is stored."""
        with self._lock:
            if self._published:
                return self.status, self.result
            if self.result is not None:
                return self._status_before_end, None
            return self.status, None

    def claim_final_release(self) -> bool:
        """True for the first caller only: it releases the ended job's resources, later callers skip."""
        with self._lock:
            claimed, self._final_release_claimed = self._final_release_claimed, True
            return not claimed

    def interrupt(self) -> bool:
        """Cancel the running stage task from any thread; False when no stage is running."""
        with self._lock:
            task, loop, interrupted = self._task, self._task_loop, self.interrupted
        if task is None or loop is None or interrupted is None:
            return False
        return try_call_in_loop(loop, _interrupt, task, interrupted)  # False: the loop closed, the stage is gone

    async def wait(self) -> JobResult:
        """Wait (on any event loop) until the job is terminal and return its result."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._published:
                assert self.result is not None
                return self.result
            future: asyncio.Future[JobResult] = loop.create_future()
            self._waiters.append((loop, future))
        return await future


def _interrupt(task: asyncio.Task[Any], interrupted: asyncio.Future[None]) -> None:
    task.cancel()
    if not interrupted.done():
        interrupted.set_result(None)


def _resolve(future: asyncio.Future[JobResult], result: JobResult) -> None:
    if not future.done():
        future.set_result(result)
