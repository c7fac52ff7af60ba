"""Orchestrator: the pipeline's composition and lifecycle, and what the API asks of it.

Following a job: `admission.py` admits it (`Orchestrator.admit`: validation, the same request's job, a new
job queued for its first stage), `stage_runner.py` moves it through the INIT, RUN and EVAL pools, and
`outcome.py` ends it (its result, the handler's `final_result`, storing and publishing, releasing its
resources, a cancel). `handler_waits.py` bounds every wait on handler code; `live_jobs.py` holds the jobs
not yet ended. The server's status and health report are observability's (`observability/health.py`).
"""

from __future__ import annotations

import asyncio
import logging
import threading

from prorl_server.actions import ModelServiceCache, QuotaRegistry
from prorl_server.config import ServerSettings
from prorl_server.gateway import SessionRegistry
from prorl_server.handlers import HandlerRegistry
from prorl_server.llm import BackendPool, JudgePool
from prorl_server.pipeline.admission import Admission, AdmissionLog, FinishedJob
from prorl_server.pipeline.cross_loop_semaphore import CrossLoopSemaphore
from prorl_server.pipeline.fork import GroupFork
from prorl_server.pipeline.handler_calls import HandlerMethodCache
from prorl_server.pipeline.handler_waits import HandlerWaits
from prorl_server.pipeline.job import Job
from prorl_server.pipeline.live_jobs import LiveJobs
from prorl_server.pipeline.outcome import Outcome, fault_error
from prorl_server.pipeline.result_store import ResultStore
from prorl_server.pipeline.stage_pool import StagePool
from prorl_server.pipeline.stage_runner import StageRunner
from prorl_server.protocol import STAGES, ErrorKind, JobResult, JobStatus, ProcessRequest, Stage
from prorl_server.sandbox import SandboxManager
from prorl_server.scheduling import DispatchPolicy

__all__ = ["Orchestrator", "fault_error"]  # fault_error: its old home, still importable from here

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
        self.handler_methods = HandlerMethodCache()
        self.live = LiveJobs()
        self.admission = Admission(self)
        self.outcome = Outcome(self)
        self.stages = StageRunner(self)
        sizes = {Stage.INIT: settings.init_workers, Stage.RUN: settings.run_workers, Stage.EVAL: settings.eval_workers}
        self.pools = {
            stage: StagePool(
                stage,
                sizes[stage],
                self.stages.processor(stage),
                backends.client.aclose_current_loop,
                grace_s=settings.cancel_grace_s,
                on_loop_death=self.stages.loop_died,
            )
            for stage in STAGES
        }
        self.waits = HandlerWaits(self.pools, settings.cancel_grace_s)
        self._ready_limit = settings.max_ready_for_run or settings.run_workers
        self._ready_gate = CrossLoopSemaphore(self._ready_limit)
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
            cancelled = sum(
                self.outcome.cancel(job, ErrorKind.SERVER_STOPPED, "the server was stopped (POST /stop or SIGTERM)")
                for job in self.live.snapshot()
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

    def admit(
        self,
        request: ProcessRequest,
        group_versions: tuple[str | int, ...] = (),
        fork: GroupFork | None = None,
        *,
        validate: bool = True,
    ) -> Job | FinishedJob:
        """Validate, find the job that already has this request, or admit a new one (see `Admission.admit`)."""
        return self.admission.admit(request, group_versions, fork, validate=validate)

    def submit(
        self, request: ProcessRequest, group_versions: tuple[str | int, ...] = (), fork: GroupFork | None = None
    ) -> Job | FinishedJob:
        """`admit` without the handler's `validate_instance` (for a request checked already)."""
        return self.admission.admit(request, group_versions, fork, validate=False)

    # queries --------------------------------------------------------------------------------------

    @property
    def ready_gate(self) -> CrossLoopSemaphore:
        """The ready-for-RUN permits (INIT runs ahead of RUN by at most `max_ready_for_run` jobs)."""
        return self._ready_gate

    @property
    def ready_permits(self) -> tuple[int, int]:
        """(free, total) ready-for-RUN permits (INIT runs ahead of RUN by at most `total` jobs)."""
        return self._ready_gate.available, self._ready_limit

    def live_jobs(self) -> list[Job]:
        """The jobs admitted and not yet ended."""
        return self.live.snapshot()

    def lookup(self, job_id: str) -> tuple[JobStatus, JobResult | None] | None:
        """(status, result or None) of a live or stored job, or None if unknown."""
        job = self.live.get(job_id)
        if job is not None:
            return job.visible()
        stored = self.results.get(job_id)
        return (stored.status, stored) if stored is not None else None

    # cancellation ---------------------------------------------------------------------------------

    def cancel(self, job_id: str, reason: str = "cancelled by the client") -> JobStatus | None:
        """Cancel a live job (idempotent); returns its status afterwards, or None if unknown.

        `reason` becomes the message of the cancelled result's error (type `Cancelled`)."""
        job = self.live.get(job_id)
        if job is None:
            stored = self.results.get(job_id)
            return stored.status if stored is not None else None
        self.outcome.cancel(job, ErrorKind.CANCELLED, reason)
        return job.status
