"""Bounded waits on handler code: a hook or `final_result` called until a deadline, and a cancelled stage
task given until its deadline to unwind. Every wait on handler code after a job's end is bounded by the
cancel grace."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from prorl_server.pipeline.handler_calls import HandlerFault, HandlerMethod
from prorl_server.pipeline.job import Job
from prorl_server.pipeline.stage_pool import StagePool
from prorl_server.protocol import Stage

log = logging.getLogger(__name__)


class HandlerWaits:
    """Waits on the handler code of the stage pools `pools`, within the cancel grace `grace_s`."""

    def __init__(self, pools: Mapping[Stage, StagePool], grace_s: float) -> None:
        self.pools = pools
        self.grace_s = grace_s

    async def call(
        self, job: Job, stage: Stage, method: HandlerMethod, *args: Any, deadline: float | None
    ) -> tuple[bool, Any]:
        """Call a handler method that is not a stage (an exception hook, `final_result`) until `deadline`:
        (True, its value or the Exception it raised), or (False, None) when it overran and was cancelled."""
        task = asyncio.ensure_future(method.call(job.ctx, *args, threads=self.pools[stage].threads))
        task.add_done_callback(retrieve_exception)
        timeout = None if deadline is None else max(0.0, deadline - now())
        await asyncio.wait({task}, timeout=timeout)
        if not task.done():
            task.cancel()
            await self.settle(stage, job, task, deadline)
            return False, None
        if task.cancelled():
            return True, HandlerFault(method.name, asyncio.CancelledError())
        exc = task.exception()
        return (True, exc) if exc is not None else (True, task.result())

    async def settle(self, stage: Stage, job: Job, task: asyncio.Task[Any], deadline: float | None) -> str:
        """Give a cancelled handler task until `deadline` to unwind. Returns what the job's error should add
        when it did not (a task ignoring cancellation, a thread stuck in a plain-def method), else ""."""
        pool = self.pools[stage]
        if deadline is None:
            deadline = now() + self.grace_s
        if not task.done():
            await asyncio.wait({task}, timeout=max(0.0, deadline - now()))
        thread = await pool.threads.settle(job.id, max(0.0, deadline - now()))
        if thread is not None:
            return (
                f"; its plain-def method did not return within the {self.grace_s:g}s cancel grace: "
                f"thread {thread} is left to it and replaced ({pool.threads.stuck} stuck in this stage)"
            )
        if not task.done():
            pool.keep_stuck(task)
            log.warning("a handler of job %s ignored cancellation for %.1fs", job.id, self.grace_s)
            return (
                f"; the handler ignored cancellation for the {self.grace_s:g}s cancel grace and goes "
                f"on running on the {stage} loop ({pool.stuck} such calls in this stage)"
            )
        return ""

    def end_deadline(self, job: Job) -> float | None:
        """When the job must have ended: what is left of its budget plus the cancel grace (None: no budget)."""
        remaining = job.timer.remaining()
        return None if remaining is None else now() + remaining + self.grace_s


def retrieve_exception(task: asyncio.Future[Any]) -> None:
    """Mark a handler task's exception as seen: after a cancel or timeout nobody reads it (the job's result
    is decided), and asyncio would log "Task exception was never retrieved" at ERROR."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("a handler task ended with %r after its job's result was decided", task.exception())


def now() -> float:
    """The monotonic clock every pipeline deadline is on."""
    return time.monotonic()
