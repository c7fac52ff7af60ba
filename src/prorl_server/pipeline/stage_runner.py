"""The stage runner: a job's way through one stage of the INIT, RUN and EVAL pools.

A stage's way with a job is a few named steps: `_enter` (skip a job that ended while queued, take INIT's
ready-for-RUN permit, start the handler's method), waiting within the job's budget (`wait_within_budget`),
and `_leave` (timeout, stale, failure, or on to the next stage: `_advance`; EVAL's value completes it). The
job's end is the outcome's (outcome.py).

Handler code is contained: whatever a handler method raises ends its job only (see HandlerFault), and a
stage whose event loop dies has its jobs failed (`loop_died`) and is restarted by its StagePool.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from prorl_server.errors import error_kind_of
from prorl_server.handlers import default_error, exception_message
from prorl_server.pipeline.handler_calls import HandlerFault, parse_eval_outcome
from prorl_server.pipeline.handler_waits import now, retrieve_exception
from prorl_server.pipeline.job import Job
from prorl_server.pipeline.outcome import fault_error, internal_error, with_origin
from prorl_server.pipeline.timer import PausableTimer
from prorl_server.protocol import ErrorInfo, ErrorKind, JobStatus, Stage

if TYPE_CHECKING:
    from prorl_server.pipeline.orchestrator import Orchestrator

log = logging.getLogger(__name__)

_HELD_POLL_S = 0.5
"""How often a stage whose clock is held (its LLM call waits at a weight pause) looks at its budget again."""


class StageRunner:
    """Runs the stages of the jobs of `pipeline` (the orchestrator) on its stage pools."""

    def __init__(self, pipeline: Orchestrator) -> None:
        self.pipeline = pipeline

    def processor(self, stage: Stage) -> Callable[[Job], Awaitable[None]]:
        """What `stage`'s pool does with each job it takes."""

        async def process(job: Job) -> None:
            try:
                await self._run(stage, job)
            except Exception as exc:  # a bug here must still end the job, never leave its caller waiting
                log.exception("internal error in %s stage of job %s", stage, job.id)
                await self.pipeline.outcome.end_or_force(job, internal_error(stage, exc))

        return process

    def loop_died(self, jobs: list[Job], dead_loop: asyncio.AbstractEventLoop, why: str) -> None:
        """A stage's event loop died and was restarted: fail the jobs that were inside it (on the new loop)."""
        pipeline = self.pipeline
        pipeline.ready_gate.abandon_loop(dead_loop)
        pipeline.services.abandon_loop(dead_loop)
        if pipeline.model_services is not None:
            pipeline.model_services.abandon_loop(dead_loop)
        if pipeline.sandboxes is not None and pipeline.sandboxes.runtime.cpu_pool is not None:
            pipeline.sandboxes.runtime.cpu_pool.scheduler.abandon_loop(dead_loop)
        for job in jobs:
            stage = job.stage
            error = ErrorInfo(
                stage=stage,
                type=ErrorKind.STAGE_LOOP_DIED,
                message=f"the {stage} stage's event loop died while the job was in it ({why}); the server "
                "restarted the stage",
            )
            job.leave_stage()
            job.timer.pause()
            pipeline.pools[stage].spawn(pipeline.outcome.end_or_force(job, error))

    async def _run(self, stage: Stage, job: Job) -> None:
        """One stage of a job: enter it, wait for the handler's method within the job's budget, leave it."""
        outcome, waits = self.pipeline.outcome, self.pipeline.waits
        task = await self._enter(stage, job)
        if task is None:  # the job ended while it was queued
            await outcome.release(job)
            return
        try:
            done = await wait_within_budget(task, job.timer, job.interrupted)
        except asyncio.CancelledError:  # the pool is shutting down
            task.cancel()
            await waits.settle(stage, job, task, None)
            job.timer.pause()
            job.leave_stage()
            await outcome.release(job)
            raise
        job.timer.pause()
        job.leave_stage()
        await self._leave(stage, job, task, done)

    async def _enter(self, stage: Stage, job: Job) -> asyncio.Task[Any] | None:
        """Start the handler's method for `stage` as the job's stage task; None if the job has ended."""
        if job.terminal:
            return None
        if stage is Stage.INIT:
            # Backpressure: INIT may run ahead of RUN by at most `max_ready_for_run` jobs.
            await self.pipeline.ready_gate.acquire()
            if not job.hold_ready_permit():
                self.pipeline.ready_gate.release()
                return None
        elif stage is Stage.RUN and job.drop_ready_permit():
            self.pipeline.ready_gate.release()
        job.ctx._loop = asyncio.get_running_loop()
        method = job.methods.stage(stage)
        threads = self.pipeline.pools[stage].threads
        if stage is Stage.INIT and job.fork is not None:  # INIT once for the group, each member in a fork
            task = asyncio.ensure_future(job.fork.init(job.ctx, lambda: method.call(job.ctx, threads=threads)))
        else:
            task = asyncio.ensure_future(method.call(job.ctx, threads=threads))
        task.add_done_callback(retrieve_exception)  # read only when the job still wants it (not cancelled)
        try:
            entered = job.enter_stage(task)
        except BaseException:  # an illegal transition (a bug): the task must not run unseen
            task.cancel()
            raise
        if not entered:  # it ended meanwhile
            task.cancel()
            return None
        job.timer.start(stage)
        return task

    async def _leave(self, stage: Stage, job: Job, task: asyncio.Task[Any], done: bool) -> None:
        """Decide where the job goes after its stage task: ended (timeout, stale, failed, completed, or
        ended elsewhere meanwhile) or on to the next stage."""
        outcome, waits = self.pipeline.outcome, self.pipeline.waits
        grace = self.pipeline.settings.cancel_grace_s
        if not done:
            job.ctx.finish()  # as a cancel does: a plain-def method waiting in ctx.wait() is let go at once
            task.cancel()
            stuck = await waits.settle(stage, job, task, now() + grace)
            message = f"the job used up its {job.timer.budget_s:g}s budget during {stage}{stuck}"
            error = ErrorInfo(stage=stage, type=ErrorKind.TIMEOUT, message=message)
            await outcome.end(job, JobStatus.TIMEOUT, error=error, deadline=now() + grace)
            return
        if job.terminal:  # cancelled or stopped meanwhile: its result is decided
            await waits.settle(stage, job, task, now() + grace)
            await outcome.release(job)
            return
        if task.cancelled():  # not by the server: the handler cancelled its own task
            error = ErrorInfo(
                stage=stage,
                type=ErrorKind.CANCELLED_ERROR,
                message=f"{stage}() was cancelled, not by the server (did the handler cancel its own task?)",
            )
            await outcome.end(job, JobStatus.FAILED, error=error)
            return
        exc = task.exception()
        if job.ctx.llm.stale is not None:  # bounded staleness ended it, whatever the handler made of that
            error = ErrorInfo(stage=stage, type=ErrorKind.STALE_ROLLOUT, message=job.ctx.llm.stale)
            await outcome.end(job, JobStatus.STALE, error=error)
            return
        if exc is None:
            await self._complete(stage, job, task.result())
            return
        if isinstance(exc, HandlerFault):  # SystemExit and the like: the hooks are for the handler's exceptions
            await outcome.end(job, JobStatus.FAILED, error=fault_error(stage, exc), exc=exc.original)
            return
        error = await self._stage_exception(job, stage, exc)
        if error is not None:
            await outcome.end(job, JobStatus.FAILED, error=with_origin(error, exc), exc=exc)
        elif stage is Stage.EVAL:
            await outcome.end(job, JobStatus.COMPLETED, reward=0.0, details={})
        else:
            await self._advance(job, stage)

    async def _complete(self, stage: Stage, job: Job, value: Any) -> None:
        """The stage returned `value`: EVAL's completes the job (or fails it if it is no reward)."""
        if stage is not Stage.EVAL:
            await self._advance(job, stage)
            return
        try:
            reward, details = parse_eval_outcome(value)
        except (TypeError, ValueError) as exc:
            await self.pipeline.outcome.end(job, JobStatus.FAILED, error=default_error(Stage.EVAL, exc), exc=exc)
            return
        await self.pipeline.outcome.end(job, JobStatus.COMPLETED, reward=reward, details=details)

    async def _advance(self, job: Job, stage: Stage) -> None:
        """Queue the job for the stage after `stage` (INIT or RUN)."""
        if stage is Stage.RUN:
            await self.pipeline.outcome.release(job)  # sandboxes go before EVAL, so slow evals never hold them
        nxt = stage.next
        assert nxt is not None, "EVAL has no next stage"
        if not job.queue_for(nxt):  # it ended meanwhile
            await self.pipeline.outcome.release(job)
            return
        self.pipeline.pools[nxt].put(job)

    async def _stage_exception(self, job: Job, stage: Stage, exc: BaseException) -> ErrorInfo | None:
        """The handler's exception hook for `stage` decides what `exc` makes of the job (within the job's
        budget and the cancel grace; a hook that raises or overruns fails it with both messages)."""
        waits = self.pipeline.waits
        hook = job.methods.exception_hook(stage)
        done, outcome = await waits.call(job, stage, hook, exc, deadline=waits.end_deadline(job))
        if done and not isinstance(outcome, BaseException):
            return outcome
        problem = (
            f"{type(outcome).__name__}: {exception_message(outcome)}"
            if done
            else "did not return within the job's budget"
        )
        log.warning("%s of handler %s %s", stage.exception_hook, type(job.handler).__name__, problem)
        return ErrorInfo(
            stage=stage,
            type=error_kind_of(exc),
            message=f"{exception_message(exc)} (and {stage.exception_hook} {'raised ' if done else ''}{problem})",
        )


async def wait_within_budget(
    task: asyncio.Future[Any], timer: PausableTimer, interrupted: asyncio.Future[None] | None
) -> bool:
    """Wait for a stage's task within the job's budget: True when it finished or the job was interrupted
    (cancelled: the task may still unwind), False when the budget ran out. Time the timer is held (a
    weight-update pause) does not count."""
    waited = {task} if interrupted is None else {task, interrupted}
    while True:
        remaining = timer.remaining()
        held = timer.held
        if remaining is not None and remaining <= 0 and not held:
            return task.done()
        timeout = _HELD_POLL_S if held else remaining
        done, _ = await asyncio.wait(waited, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if done:
            return True
