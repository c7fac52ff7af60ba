"""The server's status and health report: `status_report` (GET /status, the dashboard, the metrics) and
`problems` (what makes GET /health say degraded), read from the pipeline at each request."""

from __future__ import annotations

from prorl_server.pipeline import Job, Orchestrator
from prorl_server.protocol import ActionKindStatus, ActionsStatus, SchedulingStatus, StatusResponse
from prorl_server.sandbox import SandboxManager

STALL_S = 10.0
"""Seconds a stage's event loop may be late to turn before /health calls the server degraded."""
OVERDUE_SLACK_S = 2.0
"""Seconds past its budget and the cancel grace a live job may take to end before /health reports it."""


def status_report(pipeline: Orchestrator) -> StatusResponse:
    """Queue depths, busy workers and job counts."""
    live = pipeline.live_jobs()
    jobs: dict[str, int] = {}
    for job in live:
        jobs[job.status.value] = jobs.get(job.status.value, 0) + 1
    jobs["stored_results"] = len(pipeline.results)
    registered, healthy = pipeline.backends.counts()
    waiting, admitted = pipeline.backends.admission_counts()
    found = problems(pipeline, live, registered, healthy)
    pools = pipeline.pools
    return StatusResponse(
        running=pipeline.running,
        queues={s: p.depth for s, p in pools.items()},
        busy_workers={s: p.busy for s, p in pools.items()},
        workers={s: p.workers for s, p in pools.items()},
        jobs=jobs,
        llm_servers=registered,
        healthy_llm_servers=healthy,
        scheduling=SchedulingStatus(
            dispatch_policy=pipeline.dispatch.name,
            predictor=pipeline.dispatch.predictor.name,
            placement=pipeline.backends.policy.name,
            max_inflight_per_backend=pipeline.backends.max_inflight_per_backend,
            vllm_priority=pipeline.dispatch.vllm_priority,
            waiting_calls=waiting,
            admitted_calls=admitted,
        ),
        health="degraded" if found else "ok",
        problems=found,
        stuck_calls={s: p.stuck for s, p in pools.items()},
        loop_restarts={s: p.restarts for s, p in pools.items()},
        actions=actions_status(pipeline.sandboxes),
    )


def actions_status(sandboxes: SandboxManager | None) -> ActionsStatus | None:
    """The action scheduler's pool and kinds (None without one)."""
    scheduler = sandboxes.actions if sandboxes is not None else None
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


def problems(pipeline: Orchestrator, live: list[Job] | None = None, registered: int = 0, healthy: int = 0) -> list[str]:
    """What makes the server degraded now (empty: healthy); see StatusResponse.problems."""
    if live is None:
        live = pipeline.live_jobs()
        registered, healthy = pipeline.backends.counts()
    found = []
    if pipeline.running:
        for stage, pool in pipeline.pools.items():
            if not pool.running:
                found.append(f"the {stage} stage's event loop is not running")
            elif pool.stalled_s > STALL_S:
                found.append(
                    f"the {stage} stage's event loop has not turned for {pool.stalled_s:.0f}s: handler code "
                    "blocks it (a blocking call in an async def?)"
                )
            if pool.stuck >= pool.workers:
                found.append(
                    f"the {stage} stage has {pool.stuck} handler calls still running after their jobs ended "
                    f"(as many as its {pool.workers} workers): blocked threads or tasks that ignore cancellation"
                )
    grace = pipeline.settings.cancel_grace_s
    overdue = sum(1 for job in live if job.timer.overdue_s() > grace + OVERDUE_SLACK_S)
    if overdue:
        found.append(f"{overdue} jobs are past their budget and the cancel grace and have not ended")
    if registered and not healthy:
        found.append(f"all {registered} LLM backends fail their health checks")
    return found
