"""Orchestrator: admits jobs, moves them through the INIT, RUN and EVAL pools, decides their results.

A stage's way with a job is a few named steps: `_enter_stage` (skip a job that ended while queued, take
INIT's ready-for-RUN permit, start the handler's method), waiting within the job's budget, and `_leave_stage`
(timeout, stale, failure, or on to the next stage: `_advance`; EVAL's value completes it). A job ends in
`_end` (from inside a stage) or `_cancel_job` (from any thread). Its resources are released in `_release`
only.

Handler code is contained: whatever a handler method raises ends its job only (see HandlerFault), every
wait on handler code after a job's end is bounded by the cancel grace (`_settle`, `_call_handler`,
`_release`), and a stage whose event loop dies has its jobs failed (`_stage_loop_died`) and is restarted by
its StagePool. `problems` says what makes the server degraded.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from typing import Any

from pydantic import ValidationError

from prorl_server.actions.model_services import ModelServiceCache
from prorl_server.actions.quota import QuotaRegistry
from prorl_server.config import ServerSettings
from prorl_server.gateway.sessions import SessionRegistry
from prorl_server.handlers import (
    AGENT_CONFIG_KEYS,
    HandlerRegistry,
    JobContext,
    default_error,
)
from prorl_server.handlers.failure import exception_location, exception_message, short_traceback
from prorl_server.llm import BackendPool, LLMSession
from prorl_server.llm.judge import JudgePool
from prorl_server.pipeline.cross_loop_semaphore import CrossLoopSemaphore
from prorl_server.pipeline.errors import DuplicateJob, InvalidInstance, NotAccepting
from prorl_server.pipeline.fork import GroupFork
from prorl_server.pipeline.handler_calls import (
    HandlerFault,
    HandlerMethod,
    HandlerMethodCache,
    HandlerMethods,
    parse_eval_outcome,
)
from prorl_server.pipeline.job import Job
from prorl_server.pipeline.result_store import ResultStore
from prorl_server.pipeline.stage_pool import StagePool
from prorl_server.pipeline.submission import AdmissionLog, FinishedJob, request_digest
from prorl_server.pipeline.timer import PausableTimer
from prorl_server.protocol import (
    TERMINAL_STATUSES,
    ActionKindStatus,
    ActionsStatus,
    ErrorInfo,
    ErrorKind,
    JobResult,
    JobStatus,
    ProcessRequest,
    SchedulingStatus,
    StageTiming,
    StatusResponse,
    Trajectory,
)
from prorl_server.protocol.stages import STAGES, ErrorStage, Stage
from prorl_server.sandbox.manager import SandboxManager
from prorl_server.scheduling.dispatch import DispatchPolicy
from prorl_server.scheduling.view import view_of

log = logging.getLogger(__name__)


class Orchestrator:
    """The pipeline: three independent stage pools and the bookkeeping of live and finished jobs."""

    def __init__(
        self,
        settings: ServerSettings,
        registry: HandlerRegistry,
        backends: BackendPool,
        sandboxes: SandboxManager | None = None,
        judge: JudgePool | None = None,
        *,
        dispatch: DispatchPolicy,
        gateway: SessionRegistry | None = None,
        services: QuotaRegistry | None = None,
        model_services: ModelServiceCache | None = None,
        results: ResultStore | None = None,
        journal: AdmissionLog | None = None,
    ) -> None:
        self.settings = settings
        self.dispatch = dispatch  # orders LLM calls waiting for admission; its predictor learns from completed jobs
        self.registry = registry
        self.backends = backends
        self.sandboxes = sandboxes
        self.judge = judge  # the LLM judge EVAL reaches as ctx.judge (None: --judge-server not given)
        # quotas of the external services handlers call (ctx.service), the judge's among them
        self.services = services or QuotaRegistry()
        if judge is not None:
            self.services.add(judge.quota)
        self.model_services = model_services  # handlers reach them as ctx.model_service (None: none configured)
        self.gateway = gateway  # the OpenAI gateway's sessions, which handlers open with ctx.gateway_session()
        self.results = results if results is not None else ResultStore(settings.result_retention_s)
        self.journal = journal  # told of every admitted job (the results journal)
        sizes = {Stage.INIT: settings.init_workers, Stage.RUN: settings.run_workers, Stage.EVAL: settings.eval_workers}
        self._handler_methods = HandlerMethodCache()
        self.pools = {
            stage: StagePool(
                stage,
                sizes[stage],
                self._stage_processor(stage),
                backends.client.aclose_current_loop,
                grace_s=settings.cancel_grace_s,
                on_loop_death=self._stage_loop_died,
            )
            for stage in STAGES
        }
        self._ready_limit = settings.max_ready_for_run or settings.run_workers
        self._ready_gate = CrossLoopSemaphore(self._ready_limit)
        self._live: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._lifecycle = threading.Lock()
        self.running = False

    # lifecycle ------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the stage pools (idempotent)."""
        with self._lifecycle:
            if self.running:
                return
            self._ready_gate = CrossLoopSemaphore(self._ready_limit)
            for pool in self.pools.values():
                pool.start()
            self.running = True
            log.info(
                "pipeline started: %d init, %d run, %d eval workers",
                *(self.pools[s].workers for s in STAGES),
            )

    def stop(self) -> int:
        """Refuse new jobs, cancel every live job, release their resources, drain and stop the pools.

        Returns how many jobs were cancelled. Idempotent.
        """
        with self._lifecycle:
            if not self.running:
                return 0
            self.running = False
            with self._lock:
                live = list(self._live.values())
            cancelled = sum(
                self._cancel_job(job, ErrorKind.SERVER_STOPPED, "the server was stopped (POST /stop or SIGTERM)")
                for job in live
            )
            for stage in STAGES:
                self.pools[stage].stop(self.settings.cancel_grace_s)
            if self.sandboxes is not None:
                leftover = asyncio.run(self.sandboxes.shutdown())  # backstop: jobs released theirs
                if leftover:
                    log.warning("closed %d sandboxes that outlived their jobs", leftover)
            log.info("pipeline stopped; %d live jobs cancelled", cancelled)
            return cancelled

    # admission ------------------------------------------------------------------------------------

    def submit(
        self, request: ProcessRequest, group_versions: tuple[str | int, ...] = (), fork: GroupFork | None = None
    ) -> Job | FinishedJob:
        """Admit a job and queue it for INIT. Raises a SubmissionError subclass when it cannot.

        The same request sent again under the same `job_id` gets the job that has it (live, or finished with
        its result still stored) instead of a second run; a different request under that id is DuplicateJob.
        `group_versions`: for a group's refill, the weight versions its bounded staleness also counts from.
        `fork`: the group's shared INIT, for a member of a group whose handler forks after INIT (fork.py).
        """
        digest = request_digest(request)
        if request.job_id is not None:
            existing = self._same_request(request.job_id, digest)
            if existing is not None:
                return existing
        if not self.running:
            raise NotAccepting("the server is stopped; POST /start to resume accepting jobs")
        data_source = request.instance.get("data_source")
        if not isinstance(data_source, str) or not data_source:
            raise InvalidInstance(
                "instance.data_source is required (a string naming the handler); known data sources: "
                + (", ".join(self.registry.names()) or "none")
            )
        methods = self._handler_methods.get(self.registry.get(data_source))
        registered, healthy = self.backends.counts()
        if registered == 0:
            raise NotAccepting(
                'no LLM backend is registered; POST /add_llm_server {"address": "http://host:port/v1"} '
                "or start the server with --llm-server URL"
            )
        if healthy == 0:  # open circuits alone do not refuse jobs: their calls wait within the retry budget
            raise NotAccepting(
                f"all {registered} LLM backends are unhealthy (they fail their health checks); see GET /llm_servers"
            )
        job = self._make_job(request, methods, digest, group_versions, fork)
        with self._lock:
            live = self._live.get(job.id)
            if live is not None:  # admitted meanwhile by a concurrent submission
                if live.request_digest == digest:
                    return live
                raise DuplicateJob(_different_request(job.id, "is in flight"))
            self._live[job.id] = job
            if self.journal is not None:  # under the lock: before anything can end the job
                self.journal.admitted(job.id, digest, request)
        self.pools[job.next_stage].put(job)
        return job

    def _same_request(self, job_id: str, digest: str) -> Job | FinishedJob | None:
        """The job already holding `job_id` if it was asked for with the same request; DuplicateJob if it
        was asked for with another; None if no live or stored job has that id."""
        with self._lock:
            live = self._live.get(job_id)
        if live is not None:
            if live.request_digest != digest:
                raise DuplicateJob(_different_request(job_id, "is in flight"))
            return live
        stored = self.results.get_with_digest(job_id)
        if stored is None:
            return None
        result, stored_digest = stored
        if stored_digest != digest:
            raise DuplicateJob(
                _different_request(job_id, "already ran and its result is stored")
                + " (or acknowledge that result first: POST /jobs/ack)"
            )
        return FinishedJob(result)

    def _make_job(
        self,
        request: ProcessRequest,
        methods: HandlerMethods,
        digest: str,
        group_versions: tuple[str | int, ...],
        fork: GroupFork | None,
    ) -> Job:
        job_id = request.job_id or uuid.uuid4().hex
        agent_keys = AGENT_CONFIG_KEYS | methods.handler.agent_config_keys
        sampling = {k: v for k, v in request.sampling_params.items() if k not in agent_keys}
        agent_config = {k: v for k, v in request.sampling_params.items() if k in agent_keys}
        agent_config.update(request.agent_config)
        trajectory = Trajectory()
        timeout = request.timeout if request.timeout is not None else self.settings.default_timeout_s
        timer = PausableTimer(timeout)
        session = LLMSession(
            job_id,
            self.backends,
            trajectory,
            sampling,
            max_failovers=self.settings.llm_max_failovers,
            max_staleness=request.max_staleness if request.max_staleness is not None else self.settings.max_staleness,
            stale_policy=request.stale_policy or self.settings.stale_policy,
            pause_clock=timer,
            client=self.backends.client,
            data_source=str(request.instance.get("data_source", "")),
            dispatch=self.dispatch,
            group_versions=group_versions,
        )
        ctx = JobContext(
            job_id=job_id,
            instance=request.instance,
            sampling_params=sampling,
            agent_config=agent_config,
            llm=session,
            trajectory=trajectory,
            _sandboxes=self.sandboxes,
            _judge=self.judge,
            _services=self.services,
            _model_services=self.model_services,
            _gateway=self.gateway,
            tool_call_format=self.settings.tool_call_format,
        )
        # a handler without an INIT of its own skips that stage's queue and thread hop
        first_stage = Stage.INIT if methods.stage(Stage.INIT).overridden else Stage.RUN
        return Job(job_id, methods, ctx, timer, digest, first_stage, fork)

    # queries --------------------------------------------------------------------------------------

    @property
    def ready_permits(self) -> tuple[int, int]:
        """(free, total) ready-for-RUN permits (INIT runs ahead of RUN by at most `total` jobs)."""
        return self._ready_gate.available, self._ready_limit

    def lookup(self, job_id: str) -> tuple[JobStatus, JobResult | None] | None:
        """(status, result or None) of a live or stored job, or None if unknown."""
        with self._lock:
            job = self._live.get(job_id)
        if job is not None:
            return job.visible()
        stored = self.results.get(job_id)
        return (stored.status, stored) if stored is not None else None

    def status(self) -> StatusResponse:
        """Queue depths, busy workers and job counts."""
        with self._lock:
            live = list(self._live.values())
        jobs: dict[str, int] = {}
        for job in live:
            jobs[job.status.value] = jobs.get(job.status.value, 0) + 1
        jobs["stored_results"] = len(self.results)
        registered, healthy = self.backends.counts()
        waiting, admitted = self.backends.admission_counts()
        problems = self.problems(live, registered, healthy)
        return StatusResponse(
            running=self.running,
            queues={s: p.depth for s, p in self.pools.items()},
            busy_workers={s: p.busy for s, p in self.pools.items()},
            workers={s: p.workers for s, p in self.pools.items()},
            jobs=jobs,
            llm_servers=registered,
            healthy_llm_servers=healthy,
            scheduling=SchedulingStatus(
                dispatch_policy=self.dispatch.name,
                predictor=self.dispatch.predictor.name,
                placement=self.backends.policy.name,
                max_inflight_per_backend=self.backends.max_inflight_per_backend,
                vllm_priority=self.dispatch.vllm_priority,
                waiting_calls=waiting,
                admitted_calls=admitted,
            ),
            health="degraded" if problems else "ok",
            problems=problems,
            stuck_calls={s: p.stuck for s, p in self.pools.items()},
            loop_restarts={s: p.restarts for s, p in self.pools.items()},
            actions=self._actions_status(),
        )

    def _actions_status(self) -> ActionsStatus | None:
        """The action scheduler's pool and kinds (None without one)."""
        scheduler = self.sandboxes.actions if self.sandboxes is not None else None
        if scheduler is None:
            return None
        books = scheduler.books()
        kinds = {
            kind: ActionKindStatus(
                granted=stats.granted,
                completed=stats.completion_s.count,
                refused=stats.refused,
                mean_act_s=stats.completion_s.mean,
                mean_queue_s=stats.queue_s.mean,
                mean_cores=stats.cores.mean,
            )
            for kind, stats in sorted(scheduler.kind_stats().items())
        }
        return ActionsStatus(
            cores=books.cpus,
            busy_cores=books.cpus - books.free_cpu,
            running=books.running,
            waiting=books.waiting,
            busy_core_seconds=books.busy_core_s,
            kinds=kinds,
        )

    def problems(self, live: list[Job] | None = None, registered: int = 0, healthy: int = 0) -> list[str]:
        """What makes the server degraded now (empty: healthy); see StatusResponse.problems."""
        if live is None:
            with self._lock:
                live = list(self._live.values())
            registered, healthy = self.backends.counts()
        problems = []
        if self.running:
            for stage, pool in self.pools.items():
                if not pool.running:
                    problems.append(f"the {stage} stage's event loop is not running")
                elif pool.stalled_s > STALL_S:
                    problems.append(
                        f"the {stage} stage's event loop has not turned for {pool.stalled_s:.0f}s: handler code "
                        "blocks it (a blocking call in an async def?)"
                    )
                if pool.stuck >= pool.workers:
                    problems.append(
                        f"the {stage} stage has {pool.stuck} handler calls still running after their jobs ended "
                        f"(as many as its {pool.workers} workers): blocked threads or tasks that ignore cancellation"
                    )
        grace = self.settings.cancel_grace_s
        overdue = sum(1 for job in live if job.timer.overdue_s() > grace + OVERDUE_SLACK_S)
        if overdue:
            problems.append(f"{overdue} jobs are past their budget and the cancel grace and have not ended")
        if registered and not healthy:
            problems.append(f"all {registered} LLM backends fail their health checks")
        return problems

    # cancellation ---------------------------------------------------------------------------------

    def cancel(self, job_id: str, reason: str = "cancelled by the client") -> JobStatus | None:
        """Cancel a live job (idempotent); returns its status afterwards, or None if unknown.

        `reason` becomes the message of the cancelled result's error (type `Cancelled`)."""
        with self._lock:
            job = self._live.get(job_id)
        if job is None:
            stored = self.results.get(job_id)
            return stored.status if stored is not None else None
        self._cancel_job(job, ErrorKind.CANCELLED, reason)
        return job.status

    def _cancel_job(self, job: Job, kind: ErrorKind, message: str) -> bool:
        if job.status == JobStatus.QUEUED:
            stage, message = job.next_stage, f"{message} (while queued for {job.next_stage})"
        else:
            stage = job.status.value
        result = self._result(job, JobStatus.CANCELLED, error=ErrorInfo(stage=stage, type=kind, message=message))
        job.ctx.finish()  # before the job is terminal: every release from then on comes after the mark
        if not job.finish(result):
            return False
        self._store(job)
        if not job.interrupt():
            # Not inside a stage (the stage releases it when interrupted): release what INIT may have
            # acquired, on the loop of the pool it waits for.
            self.pools[job.next_stage].spawn(self._release(job))
        return True

    # stage execution ------------------------------------------------------------------------------

    def _stage_processor(self, stage: Stage):
        async def process(job: Job) -> None:
            try:
                await self._run_stage(stage, job)
            except Exception as exc:  # a bug here must still end the job, never leave its caller waiting
                log.exception("internal error in %s stage of job %s", stage, job.id)
                message = (
                    f"prorl-server internal error ({type(exc).__name__}: {exception_message(exc)}); please report it"
                )
                await self._end_or_force(job, ErrorInfo(stage=stage, type=ErrorKind.INTERNAL_ERROR, message=message))

        return process

    async def _end_or_force(self, job: Job, error: ErrorInfo) -> None:
        """Fail the job with `error` through `_end`; if even that raises, store a bare failed result."""
        try:
            await self._end(job, JobStatus.FAILED, error=error)
        except Exception:
            log.exception("ending job %s failed; storing a bare failed result", job.id)
            if job.finish(self._bare_result(job, error)):
                self._store(job)

    def _stage_loop_died(self, jobs: list[Job], dead_loop: asyncio.AbstractEventLoop, why: str) -> None:
        """A stage's event loop died and was restarted: fail the jobs that were inside it (on the new loop)."""
        self._ready_gate.abandon_loop(dead_loop)
        self.services.abandon_loop(dead_loop)
        if self.model_services is not None:
            self.model_services.abandon_loop(dead_loop)
        if self.sandboxes is not None and self.sandboxes.runtime.cpu_pool is not None:
            self.sandboxes.runtime.cpu_pool.scheduler.abandon_loop(dead_loop)
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
            self.pools[stage].spawn(self._end_or_force(job, error))

    async def _run_stage(self, stage: Stage, job: Job) -> None:
        """One stage of a job: enter it, wait for the handler's method within the job's budget, leave it."""
        task = await self._enter_stage(stage, job)
        if task is None:  # the job ended while it was queued
            await self._release(job)
            return
        try:
            done = await _wait_within_budget(task, job.timer, job.interrupted)
        except asyncio.CancelledError:  # the pool is shutting down
            task.cancel()
            await self._settle(stage, job, task, None)
            job.timer.pause()
            job.leave_stage()
            await self._release(job)
            raise
        job.timer.pause()
        job.leave_stage()
        await self._leave_stage(stage, job, task, done)

    async def _enter_stage(self, stage: Stage, job: Job) -> asyncio.Task[Any] | None:
        """Start the handler's method for `stage` as the job's stage task; None if the job has ended."""
        if job.terminal:
            return None
        if stage is Stage.INIT:
            # Backpressure: INIT may run ahead of RUN by at most `max_ready_for_run` jobs.
            await self._ready_gate.acquire()
            if not job.hold_ready_permit():
                self._ready_gate.release()
                return None
        elif stage is Stage.RUN and job.drop_ready_permit():
            self._ready_gate.release()
        job.ctx._loop = asyncio.get_running_loop()
        method = job.methods.stage(stage)
        threads = self.pools[stage].threads
        if stage is Stage.INIT and job.fork is not None:  # INIT once for the group, each member in a fork
            task = asyncio.ensure_future(job.fork.init(job.ctx, lambda: method.call(job.ctx, threads=threads)))
        else:
            task = asyncio.ensure_future(method.call(job.ctx, threads=threads))
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

    async def _leave_stage(self, stage: Stage, job: Job, task: asyncio.Task[Any], done: bool) -> None:
        """Decide where the job goes after its stage task: ended (timeout, stale, failed, completed, or
        ended elsewhere meanwhile) or on to the next stage."""
        grace = self.settings.cancel_grace_s
        if not done:
            task.cancel()
            stuck = await self._settle(stage, job, task, _now() + grace)
            message = f"the job used up its {job.timer.budget_s:g}s budget during {stage}{stuck}"
            error = ErrorInfo(stage=stage, type=ErrorKind.TIMEOUT, message=message)
            await self._end(job, JobStatus.TIMEOUT, error=error, deadline=_now() + grace)
            return
        if job.terminal:  # cancelled or stopped meanwhile: its result is decided
            await self._settle(stage, job, task, _now() + grace)
            await self._release(job)
            return
        if task.cancelled():  # not by the server: the handler cancelled its own task
            error = ErrorInfo(
                stage=stage,
                type=ErrorKind.CANCELLED_ERROR,
                message=f"{stage}() was cancelled, not by the server (did the handler cancel its own task?)",
            )
            await self._end(job, JobStatus.FAILED, error=error)
            return
        exc = task.exception()
        if job.ctx.llm.stale is not None:  # bounded staleness ended it, whatever the handler made of that
            await self._end(
                job,
                JobStatus.STALE,
                error=ErrorInfo(stage=stage, type=ErrorKind.STALE_ROLLOUT, message=job.ctx.llm.stale),
            )
            return
        if exc is None:
            await self._complete_stage(stage, job, task.result())
            return
        if isinstance(exc, HandlerFault):  # SystemExit and the like: the hooks are for the handler's exceptions
            await self._end(job, JobStatus.FAILED, error=fault_error(stage, exc), exc=exc.original)
            return
        error = await self._stage_exception(job, stage, exc)
        if error is not None:
            await self._end(job, JobStatus.FAILED, error=_with_origin(error, exc), exc=exc)
        elif stage is Stage.EVAL:
            await self._end(job, JobStatus.COMPLETED, reward=0.0, details={})
        else:
            await self._advance(job, stage)

    async def _complete_stage(self, stage: Stage, job: Job, value: Any) -> None:
        """The stage returned `value`: EVAL's completes the job (or fails it if it is no reward)."""
        if stage is not Stage.EVAL:
            await self._advance(job, stage)
            return
        try:
            reward, details = parse_eval_outcome(value)
        except (TypeError, ValueError) as exc:
            await self._end(job, JobStatus.FAILED, error=default_error(Stage.EVAL, exc), exc=exc)
            return
        await self._end(job, JobStatus.COMPLETED, reward=reward, details=details)

    async def _advance(self, job: Job, stage: Stage) -> None:
        """Queue the job for the stage after `stage` (INIT or RUN)."""
        if stage is Stage.RUN:
            await self._release(job)  # sandboxes go before EVAL, so slow evals never hold them
        nxt = stage.next
        assert nxt is not None, "EVAL has no next stage"
        if not job.queue_for(nxt):  # it ended meanwhile
            await self._release(job)
            return
        self.pools[nxt].put(job)

    async def _stage_exception(self, job: Job, stage: Stage, exc: BaseException) -> ErrorInfo | None:
        """The handler's exception hook for `stage` decides what `exc` makes of the job (within the job's
        budget and the cancel grace; a hook that raises or overruns fails it with both messages)."""
        hook = job.methods.exception_hook(stage)
        done, outcome = await self._call_handler(job, stage, hook, exc, deadline=self._end_deadline(job))
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
            type=type(exc).__name__,
            message=f"{exception_message(exc)} (and {stage.exception_hook} {'raised ' if done else ''}{problem})",
        )

    async def _call_handler(
        self, job: Job, stage: Stage, method: HandlerMethod, *args: Any, deadline: float | None
    ) -> tuple[bool, Any]:
        """Call a handler method that is not a stage (an exception hook, `final_result`) until `deadline`:
        (True, its value or the Exception it raised), or (False, None) when it overran and was cancelled."""
        task = asyncio.ensure_future(method.call(job.ctx, *args, threads=self.pools[stage].threads))
        timeout = None if deadline is None else max(0.0, deadline - _now())
        await asyncio.wait({task}, timeout=timeout)
        if not task.done():
            task.cancel()
            await self._settle(stage, job, task, deadline)
            return False, None
        if task.cancelled():
            return True, HandlerFault(method.name, asyncio.CancelledError())
        exc = task.exception()
        return (True, exc) if exc is not None else (True, task.result())

    async def _settle(self, stage: Stage, job: Job, task: asyncio.Task[Any], deadline: float | None) -> str:
        """Give a cancelled handler task until `deadline` to unwind. Returns what the job's error should add
        when it did not (a task ignoring cancellation, a thread stuck in a plain-def method), else ""."""
        pool = self.pools[stage]
        if deadline is None:
            deadline = _now() + self.settings.cancel_grace_s
        if not task.done():
            await asyncio.wait({task}, timeout=max(0.0, deadline - _now()))
        thread = await pool.threads.settle(job.id, max(0.0, deadline - _now()))
        if thread is not None:
            return (
                f"; its plain-def method did not return within the {self.settings.cancel_grace_s:g}s cancel grace: "
                f"thread {thread} is left to it and replaced ({pool.threads.stuck} stuck in this stage)"
            )
        if not task.done():
            pool.keep_stuck(task)
            log.warning("a handler of job %s ignored cancellation for %.1fs", job.id, self.settings.cancel_grace_s)
            return (
                f"; the handler ignored cancellation for the {self.settings.cancel_grace_s:g}s cancel grace and goes "
                f"on running on the {stage} loop ({pool.stuck} such calls in this stage)"
            )
        return ""

    def _end_deadline(self, job: Job) -> float | None:
        """When the job must have ended: what is left of its budget plus the cancel grace (None: no budget)."""
        remaining = job.timer.remaining()
        return None if remaining is None else _now() + remaining + self.settings.cancel_grace_s

    # ending and releasing -------------------------------------------------------------------------

    async def _release(self, job: Job, deadline: float | None = None) -> None:
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
        limit = _now() + self.settings.cancel_grace_s
        timeout = max(0.0, min(limit, deadline if deadline is not None else limit) - _now())
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            log.warning("the release callbacks of job %s are still running after %.1fs; going on", job.id, timeout)
            self.pools[job.stage].keep_stuck(task)

    async def _end(
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
            deadline = self._end_deadline(job)
        job.ctx.finish()  # first: what a stage still running acquires after this release is released at once
        await self._release(job, deadline)
        result = self._result(job, status, error=error, reward=reward, details=details)
        if status is not JobStatus.CANCELLED and job.methods.final_result.overridden:
            result, final_exc = await self._final_result(job, result, deadline)
            exc = final_exc or exc
        if job.finish(result):
            self._store(job)
            if result.status in (JobStatus.FAILED, JobStatus.TIMEOUT):
                _log_failure(result, exc)
            elif result.status is JobStatus.COMPLETED and result.trajectory.turns:
                # only whole trajectories teach the predictor: a cut-off one would look shorter than it is
                self.dispatch.observe_finished(view_of(result.trajectory, result.data_source or "", finished=True))

    async def _final_result(
        self, job: Job, result: JobResult, deadline: float | None
    ) -> tuple[JobResult, BaseException | None]:
        """The handler's `final_result` of `result`, or a failed result saying why it could not be used."""
        stage = job.stage
        done, outcome = await self._call_handler(job, stage, job.methods.final_result, result, deadline=deadline)
        if not done:
            message = "final_result() did not return within the job's budget and the cancel grace"
            error = ErrorInfo(stage=ErrorStage.FINAL_RESULT, type=ErrorKind.TIMEOUT, message=message)
            return self._result(job, JobStatus.FAILED, error=error), None
        if isinstance(outcome, BaseException):
            if isinstance(outcome, HandlerFault):
                return self._result(
                    job, JobStatus.FAILED, error=fault_error(ErrorStage.FINAL_RESULT, outcome)
                ), outcome.original
            return self._result(job, JobStatus.FAILED, error=default_error(ErrorStage.FINAL_RESULT, outcome)), outcome
        problem = _bad_final_result(outcome, job.id)
        if problem is not None:
            error = ErrorInfo(stage=ErrorStage.FINAL_RESULT, type=ErrorKind.BAD_FINAL_RESULT, message=problem)
            return self._result(job, JobStatus.FAILED, error=error), None
        return outcome, None

    def _store(self, job: Job) -> None:
        """Store the result of a job that just finished, then let its waiters see it."""
        assert job.result is not None
        try:
            job.ctx.llm.finish()  # a stage that ignored cancellation can no longer pin a backend
            if job.drop_ready_permit():
                self._ready_gate.release()
            self.results.put(job.result, job.request_digest)
            with self._lock:
                if self._live.get(job.id) is job:
                    del self._live[job.id]
        finally:
            job.publish()

    def _result(
        self,
        job: Job,
        status: JobStatus,
        *,
        error: ErrorInfo | None = None,
        reward: float | None = None,
        details: dict[str, Any] | None = None,
    ) -> JobResult:
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
            return JobResult(
                status=status, eval=details or {}, artifacts=dict(job.ctx.artifacts), error=error, **fields
            )
        except (ValidationError, TypeError, ValueError) as exc:  # not JSON, or ctx.artifacts is no mapping
            fields["reward"] = None
            message = f"artifacts and eval details must be JSON values (str, number, bool, None, list, dict): {exc}"
            return JobResult(
                status=JobStatus.FAILED,
                error=ErrorInfo(stage=ErrorStage.RESULT, type=ErrorKind.INVALID_RESULT, message=message),
                **fields,
            )

    def _bare_result(self, job: Job, error: ErrorInfo) -> JobResult:
        """A failed result with `error` and nothing the handler could have spoilt (the last resort)."""
        return JobResult(job_id=job.id, status=JobStatus.FAILED, error=error, data_source=job.ctx.data_source)


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


def _bad_final_result(value: Any, job_id: str) -> str | None:
    """Why `final_result`'s return value cannot be the job's result, or None if it can."""
    if not isinstance(value, JobResult):
        return f"final_result() must return a JobResult, got {type(value).__name__}"
    if value.job_id != job_id:
        return f"final_result() returned the result of job {value.job_id!r}, not of {job_id!r}"
    if value.status not in TERMINAL_STATUSES:
        return f"final_result() returned status {value.status.value!r}; a result's status must be terminal"
    return None


def _now() -> float:
    return time.monotonic()


def _with_origin(error: ErrorInfo, exc: BaseException) -> ErrorInfo:
    """`error` with `exc`'s location and short traceback, unless it already has either."""
    if error.location is not None or error.traceback is not None:
        return error
    return error.model_copy(update={"location": exception_location(exc), "traceback": short_traceback(exc)})


def _log_failure(result: JobResult, exc: BaseException | None) -> None:
    error = result.error  # final_result may have dropped it
    outcome = "timed out" if result.status == JobStatus.TIMEOUT else "failed"
    if error is None:
        what = "(no error given)"
    else:
        where = f" at {error.location}" if error.location else ""
        what = f"in {error.stage}: {error.type}: {error.message}{where}"
    log.warning("job %s (data_source %r) %s %s", result.job_id, result.data_source, outcome, what, exc_info=exc)


def _different_request(job_id: str, state: str) -> str:
    return (
        f"job_id {job_id!r} {state} with a different request; the same request sent again gets that job, "
        "a new request needs another id"
    )


STALL_S = 10.0
"""Seconds a stage's event loop may be late to turn before /health calls the server degraded."""
OVERDUE_SLACK_S = 2.0
"""Seconds past its budget and the cancel grace a live job may take to end before /health reports it."""

_HELD_POLL_S = 0.5
"""How often a stage whose clock is held (its LLM call waits at a weight pause) looks at its budget again."""


async def _wait_within_budget(
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
