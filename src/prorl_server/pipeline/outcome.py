"""The outcome of a job: its result built (`build_result`), amended by the handler's `final_result`, stored
and published; its resources released; a cancel from any thread.

A job ends in `Outcome.end` (from inside a stage) or `Outcome.cancel` (from any thread). Its resources are
released in `Outcome.release` only. Whatever the handler's `final_result` returns is checked before it
becomes the result (`bad_final_result`); a job whose end itself fails gets the last-resort result
(`last_resort_result`), with its timing and artifacts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from prorl_server.handlers import default_error, exception_location, exception_message, short_traceback
from prorl_server.pipeline.handler_calls import HandlerFault
from prorl_server.pipeline.handler_waits import now
from prorl_server.pipeline.job import Job
from prorl_server.protocol import (
    STAGES,
    TERMINAL_STATUSES,
    ErrorInfo,
    ErrorKind,
    ErrorStage,
    JobResult,
    JobStatus,
    Stage,
    StageTiming,
)
from prorl_server.scheduling import view_of

if TYPE_CHECKING:
    from prorl_server.pipeline.orchestrator import Orchestrator

log = logging.getLogger(__name__)


class Outcome:
    """Ends the jobs of `pipeline` (the orchestrator): results, `final_result`, storing, releasing."""

    def __init__(self, pipeline: Orchestrator) -> None:
        self.pipeline = pipeline

    async def release(self, job: Job, deadline: float | None = None) -> None:
        """Release the job's resources (its `ctx.on_release` cleanups, its backend pin): the only place
        that does. Reached after RUN (sandboxes go before EVAL) and, however the job ended, once it has:
        that final release runs once (the first path to reach it), the other paths skip it.

        Waits until `deadline` at most (at most the cancel grace from now); cleanups still running then go
        on in the background."""
        if job.ctx.finished and not job.claim_final_release():
            return
        if not job.ctx.has_cleanups:  # nothing of the handler's to wait for
            await job.ctx.release()
            return
        task = asyncio.ensure_future(job.ctx.release())
        limit = now() + self.pipeline.settings.cancel_grace_s
        timeout = max(0.0, min(limit, deadline if deadline is not None else limit) - now())
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            log.warning("the release callbacks of job %s are still running after %.1fs; going on", job.id, timeout)
            self.pipeline.pools[job.stage].keep_stuck(task)

    async def end(
        self,
        job: Job,
        status: JobStatus,
        *,
        error: ErrorInfo | None = None,
        reward: float | None = None,
        details: dict[str, Any] | None = None,
        exc: BaseException | None = None,
        deadline: float | None = None,
    ) -> None:
        """End the job from inside a stage with this outcome (through `final_result`); a failed or timed-out
        job is logged once, at WARNING, with `exc`'s traceback when it ended on an exception.

        Release and `final_result` share the time until `deadline` (default: the rest of the job's budget
        plus the cancel grace); a `final_result` that overruns it fails the job."""
        if deadline is None:
            deadline = self.pipeline.waits.end_deadline(job)
        job.ctx.finish()  # first: what a stage still running acquires after this release is released at once
        await self.release(job, deadline)
        result = build_result(job, status, error=error, reward=reward, details=details)
        if status is not JobStatus.CANCELLED and job.methods.final_result.overridden:
            try:
                result, final_exc = await self._final_result(job, result, deadline)
            except Exception as bug:  # a bug of ours with final_result's value: still the result of that step
                log.exception("internal error with the final_result of job %s", job.id)
                error = internal_error(ErrorStage.FINAL_RESULT, bug)
                result, final_exc = last_resort_result(job, error), None
            exc = final_exc or exc
        if job.finish(result):
            self.store(job)
            if result.status in (JobStatus.FAILED, JobStatus.TIMEOUT):
                log_failure(result, exc)
            elif result.status is JobStatus.COMPLETED and result.trajectory.turns:
                # only whole trajectories teach the predictor: a cut-off one would look shorter than it is
                view = view_of(result.trajectory, result.data_source or "", finished=True)
                self.pipeline.dispatch.observe_finished(view)

    async def end_or_force(self, job: Job, error: ErrorInfo) -> None:
        """Fail the job with `error` through `end`; if that raises, or the job's end had begun already (its
        `final_result` is not called again), release it (once) and store the last-resort failed result."""
        try:
            if not job.ctx.finished:
                await self.end(job, JobStatus.FAILED, error=error)
                return
            await self.release(job)  # a no-op when its final release ran already
        except Exception:
            log.exception("ending job %s failed; storing a last-resort failed result", job.id)
        if job.finish(last_resort_result(job, error)):
            self.store(job)

    async def _final_result(
        self, job: Job, result: JobResult, deadline: float | None
    ) -> tuple[JobResult, BaseException | None]:
        """The handler's `final_result` of `result`, or a failed result saying why it could not be used."""
        stage = job.stage
        done, outcome = await self.pipeline.waits.call(job, stage, job.methods.final_result, result, deadline=deadline)
        if not done:
            message = "final_result() did not return within the job's budget and the cancel grace"
            error = ErrorInfo(stage=ErrorStage.FINAL_RESULT, type=ErrorKind.TIMEOUT, message=message)
            return build_result(job, JobStatus.FAILED, error=error), None
        if isinstance(outcome, BaseException):
            if isinstance(outcome, HandlerFault):
                error = fault_error(ErrorStage.FINAL_RESULT, outcome)
                return build_result(job, JobStatus.FAILED, error=error), outcome.original
            return build_result(job, JobStatus.FAILED, error=default_error(ErrorStage.FINAL_RESULT, outcome)), outcome
        problem = bad_final_result(outcome, job.id)
        if problem is not None:
            error = ErrorInfo(stage=ErrorStage.FINAL_RESULT, type=ErrorKind.BAD_FINAL_RESULT, message=problem)
            return build_result(job, JobStatus.FAILED, error=error), None
        if not isinstance(outcome.status, JobStatus):  # a terminal status given as a plain string
            outcome = outcome.model_copy(update={"status": JobStatus(outcome.status)})
        return outcome, None

    def store(self, job: Job) -> None:
        """Store the result of a job that just finished, then let its waiters see it."""
        assert job.result is not None
        try:
            job.ctx.llm.finish()  # a stage that ignored cancellation can no longer pin a backend
            if job.drop_ready_permit():
                self.pipeline.ready_gate.release()
            self.pipeline.results.put(job.result, job.request_digest)
            self.pipeline.live.remove(job)
        finally:
            job.publish()

    def cancel(self, job: Job, kind: ErrorKind, message: str) -> bool:
        """End a live job as cancelled, from any thread; False if it had ended already."""
        if job.status == JobStatus.QUEUED:
            stage, message = job.next_stage, f"{message} (while queued for {job.next_stage})"
        else:
            stage = job.status.value
        result = build_result(job, JobStatus.CANCELLED, error=ErrorInfo(stage=stage, type=kind, message=message))
        job.ctx.finish()  # before the job is terminal: every release from then on comes after the mark
        if not job.finish(result):
            return False
        self.store(job)
        if not job.interrupt():
            # Not inside a stage (the stage releases it when interrupted): release what INIT may have
            # acquired, on the loop of the pool it waits for.
            self.pipeline.pools[job.next_stage].spawn(self.release(job))
        return True


def build_result(
    job: Job,
    status: JobStatus,
    *,
    error: ErrorInfo | None = None,
    reward: float | None = None,
    details: dict[str, Any] | None = None,
) -> JobResult:
    """The job's result with this outcome, its timing, trajectory and artifacts (a failed one naming the
    problem when its artifacts or eval details are no JSON values)."""
    timer = job.timer
    stage_s = {s: timer.stage_seconds(s) for s in STAGES}
    held = timer.held_s
    total = timer.wall_s()
    telemetry = job.ctx.llm.telemetry.snapshot()
    fields: dict[str, Any] = {
        "job_id": job.id,
        "reward": reward,
        "trajectory": job.ctx.llm.tokens.snapshot(),  # consistent while a stage may still append
        "timing": StageTiming.model_construct(
            queue_s=max(0.0, total - sum(stage_s.values()) - held),
            init_s=stage_s[Stage.INIT],
            run_s=stage_s[Stage.RUN],
            eval_s=stage_s[Stage.EVAL],
            weight_pause_s=held,
            total_s=total,
            turns=telemetry.turns,
            llm_s=telemetry.llm_s,
            llm_queue_s=telemetry.llm_queue_s,
            tool_s=telemetry.tool_s,
        ),
        "data_source": job.ctx.data_source,
    }
    try:
        return JobResult(status=status, eval=details or {}, artifacts=dict(job.ctx.artifacts), error=error, **fields)
    except (ValidationError, TypeError, ValueError) as exc:  # not JSON, or ctx.artifacts is no mapping
        fields["reward"] = None
        message = f"artifacts and eval details must be JSON values (str, number, bool, None, list, dict): {exc}"
        return JobResult(
            status=JobStatus.FAILED,
            error=ErrorInfo(stage=ErrorStage.RESULT, type=ErrorKind.INVALID_RESULT, message=message),
            **fields,
        )


def last_resort_result(job: Job, error: ErrorInfo) -> JobResult:
    """A failed result with `error`, its timing, trajectory and artifacts; if even that cannot be built, one
    with nothing the handler could have spoilt."""
    try:
        return build_result(job, JobStatus.FAILED, error=error)
    except Exception:
        log.exception("building the result of job %s failed; storing a bare one", job.id)
        return JobResult(job_id=job.id, status=JobStatus.FAILED, error=error, data_source=job.ctx.data_source)


def internal_error(stage: Stage | ErrorStage, exc: BaseException) -> ErrorInfo:
    """The error of a job that a bug of prorl-server's ended."""
    message = f"prorl-server internal error ({type(exc).__name__}: {exception_message(exc)}); please report it"
    return ErrorInfo(stage=stage, type=ErrorKind.INTERNAL_ERROR, message=message)


def fault_error(stage: Stage | ErrorStage, fault: HandlerFault) -> ErrorInfo:
    """The error of a job whose handler raised what no `except Exception` catches (see HandlerFault)."""
    original = fault.original
    return ErrorInfo(
        stage=stage,
        type=type(original).__name__,
        message=f"{fault.method}() raised {type(original).__name__}: {exception_message(original)}"
        + _FAULT_NOTES.get(type(original), ""),
        location=exception_location(original),
        traceback=short_traceback(original),
    )


_FAULT_NOTES: dict[type[BaseException], str] = {
    asyncio.CancelledError: " (raised by the handler, not a cancel the server asked for)",
    SystemExit: " (sys.exit() in handler code: the server does not exit)",
    KeyboardInterrupt: " (raised in handler code: the server goes on)",
}


def bad_final_result(value: Any, job_id: str) -> str | None:
    """Why `final_result`'s return value cannot be the job's result, or None if it can."""
    if not isinstance(value, JobResult):
        return f"final_result() must return a JobResult, got {type(value).__name__}"
    if value.job_id != job_id:
        return f"final_result() returned the result of job {value.job_id!r}, not of {job_id!r}"
    status = value.status  # a plain string when the handler assigned one (assignment is not validated)
    if not isinstance(status, str) or status not in TERMINAL_STATUSES:
        shown = status.value if isinstance(status, JobStatus) else status
        return f"final_result() returned status {shown!r}; a result's status must be terminal"
    return None


def with_origin(error: ErrorInfo, exc: BaseException) -> ErrorInfo:
    """`error` with `exc`'s location and short traceback, unless it already has either."""
    if error.location is not None or error.traceback is not None:
        return error
    return error.model_copy(update={"location": exception_location(exc), "traceback": short_traceback(exc)})


def log_failure(result: JobResult, exc: BaseException | None) -> None:
    """Log a failed or timed-out job once, at WARNING (with `exc`'s traceback when it ended on one)."""
    error = result.error  # final_result may have dropped it
    outcome = "timed out" if result.status == JobStatus.TIMEOUT else "failed"
    if error is None:
        what = "(no error given)"
    else:
        where = f" at {error.location}" if error.location else ""
        what = f"in {error.stage}: {error.type}: {error.message}{where}"
    log.warning("job %s (data_source %r) %s %s", result.job_id, result.data_source, outcome, what, exc_info=exc)
