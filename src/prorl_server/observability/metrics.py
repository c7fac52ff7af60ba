"""The server's Prometheus metrics (`GET /metrics`), in a registry of their own per server instance.

Values the server already keeps (queue depths, busy workers, backends' load and health, live sandboxes, held
results, the action scheduler's pool and per-kind statistics) are read when scraped (`_StateCollector`);
events (a job finished, an LLM request answered, a tool request, a sandbox start, results stored or
acknowledged, a group member refilled) are counted as they happen: ServerState.build passes the methods
below as the `on_*` hooks of the result store, the backend pool, the sandbox manager and the group runner.
Every metric is listed in docs/metrics.md.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from prorl_server.actions import ModelServiceSnapshot, ServiceState
from prorl_server.observability.activity import RecentActivity, trajectory_tokens
from prorl_server.observability.health import status_report
from prorl_server.pipeline import PROBE_S, LoopLag
from prorl_server.protocol import STAGES, JobResult
from prorl_server.tool_server.responses import RESPONSES

if TYPE_CHECKING:
    from prorl_server.actions import ActionScheduler, Distribution, QuotaSnapshot
    from prorl_server.pipeline import Orchestrator

MAX_DATA_SOURCE_LABELS = 32
"""Distinct `data_source` label values kept; the others are counted under `other`."""
MAX_LABEL_CHARS = 64
"""A `data_source` label value is cut to this many characters."""
OTHER = "other"
LIVE_STATUSES = ("queued", "init", "run", "eval")

STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
LLM_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TOOL_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)
SANDBOX_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_BUCKETS = tuple(float(2**k) for k in range(6, 18))  # 64 .. 131072: the long tail stays visible


class BoundedLabels:
    """Maps user-given label values to at most `limit` distinct ones; later newcomers become `other`."""

    def __init__(self, limit: int = MAX_DATA_SOURCE_LABELS, max_chars: int = MAX_LABEL_CHARS) -> None:
        self.limit = limit
        self.max_chars = max_chars
        self._kept: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        value = value[: self.max_chars]
        with self._lock:
            if value in self._kept:
                return value
            if len(self._kept) < self.limit:
                self._kept.add(value)
                return value
        return OTHER


class ServerMetrics:
    """One server instance's metrics, and the recent activity its dashboard shows (`activity`).

    Its event methods are the hooks ServerState.build gives the result store, backend pool, sandbox manager
    and group runner; `collect` reads the rest from the orchestrator at each scrape.
    """

    def __init__(self, data_source_limit: int = MAX_DATA_SOURCE_LABELS) -> None:
        self.registry = CollectorRegistry()
        self.activity = RecentActivity()
        self._data_source = BoundedLabels(data_source_limit)
        self._tool_actions = frozenset(RESPONSES)
        r = self.registry
        self.jobs_finished = Counter(
            "prorl_jobs_finished", "Jobs that ended, by status and data_source.", ["status", "data_source"], registry=r
        )
        self.stage_duration = Histogram(
            "prorl_stage_duration_seconds",
            "Seconds a job spent inside a stage, observed when it ends, for each stage it entered.",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self._stage_duration: dict[object, Histogram] = {}  # its children, made at a stage's first observation
        self.job_duration = Histogram(
            "prorl_job_duration_seconds",
            "Seconds from a job's admission to its end.",
            buckets=STAGE_BUCKETS,
            registry=r,
        )
        self.trajectory_tokens = Histogram(
            "prorl_trajectory_tokens",
            "Tokens of a finished job's trajectory (prompt and response).",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.llm_duration = Histogram(
            "prorl_llm_request_duration_seconds",
            "Seconds of an answered completion request at a backend.",
            ["backend"],
            buckets=LLM_BUCKETS,
            registry=r,
        )
        self.gateway_call_duration = Histogram(
            "prorl_gateway_call_duration_seconds",
            "Seconds of an answered gateway call, from its request read to its completion recorded (its backend "
            "requests included), by API: chat, responses, anthropic.",
            ["api"],
            buckets=LLM_BUCKETS,
            registry=r,
        )
        self.llm_failures = Counter(
            "prorl_llm_request_failures",
            "Requests (completions and tokenizations) that failed at a backend.",
            ["backend"],
            registry=r,
        )
        self.tokenizer_fallbacks = Counter(
            "prorl_tokenizer_fallbacks",
            "Backends whose chats are tokenized by their /tokenize rather than in the server, by reason: "
            "not_found (no tokenizer for the model), unloadable (its files are missing or malformed), differs "
            "(its ids differ from the backend's on a probe).",
            ["reason"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "prorl_llm_prompt_tokens", "Prompt tokens sent in answered completion requests.", ["backend"], registry=r
        )
        self.generation_tokens = Counter(
            "prorl_llm_generation_tokens", "Tokens generated by answered completion requests.", ["backend"], registry=r
        )
        self.tool_duration = Histogram(
            "prorl_tool_action_duration_seconds",
            "Seconds of a request to a sandbox's execution server, by action.",
            ["action"],
            buckets=TOOL_BUCKETS,
            registry=r,
        )
        self.tool_failures = Counter(
            "prorl_tool_action_failures", "Tool requests that raised, by action.", ["action"], registry=r
        )
        self.sandbox_starts = Counter("prorl_sandbox_starts", "Sandboxes started.", registry=r)
        self.sandbox_start_failures = Counter("prorl_sandbox_start_failures", "Sandbox starts that failed.", registry=r)
        self.sandbox_start_duration = Histogram(
            "prorl_sandbox_start_duration_seconds",
            "Seconds a successful sandbox start took.",
            buckets=SANDBOX_BUCKETS,
            registry=r,
        )
        self.group_refills = Counter(
            "prorl_group_refills",
            "Group members launched to replace a member that failed for an infrastructure reason, by that "
            "member's error type.",
            ["reason"],
            registry=r,
        )
        self.results_stored = Counter("prorl_results_stored", "Finished results stored.", registry=r)
        self.results_acknowledged = Counter(
            "prorl_results_acknowledged", "Stored results removed by an acknowledgement.", registry=r
        )
        self.api_lag = LoopLag()  # sampled by the app's lifespan (api/app.py)

    def collect(self, orchestrator: Orchestrator) -> None:
        """Read the gauges from `orchestrator` (its pipeline, backend pool and sandboxes) at each scrape."""
        self.registry.register(_StateCollector(orchestrator, self.api_lag))

    # events --------------------------------------------------------------------------------------

    def result_stored(self, result: JobResult) -> None:
        """A job ended and its result was stored."""
        self.results_stored.inc()
        self.jobs_finished.labels(result.status.value, self._data_source(result.data_source or "")).inc()
        timing = result.timing
        for stage, seconds in zip(STAGES, (timing.init_s, timing.run_s, timing.eval_s), strict=True):
            if seconds > 0:
                child = self._stage_duration.get(stage)
                if child is None:
                    child = self._stage_duration[stage] = self.stage_duration.labels(stage.value)
                child.observe(seconds)
        self.job_duration.observe(timing.total_s)
        self.trajectory_tokens.observe(trajectory_tokens(result.trajectory))
        self.activity.record(result)

    def group_refilled(self, reason: str) -> None:
        """A group launched a refill for a member that failed with error type `reason`."""
        self.group_refills.labels(reason).inc()

    def gateway_call(self, api: str, seconds: float) -> None:
        """The gateway answered a call of `api` (chat, responses, anthropic)."""
        self.gateway_call_duration.labels(api).observe(seconds)

    def completion(self, backend: str, prompt_tokens: int, output_tokens: int, seconds: float) -> None:
        """A backend answered a completion request."""
        self.llm_duration.labels(backend).observe(seconds)
        self.prompt_tokens.labels(backend).inc(prompt_tokens)
        self.generation_tokens.labels(backend).inc(output_tokens)
        self.activity.generated(output_tokens)

    def llm_failure(self, backend: str) -> None:
        """A completion request failed at a backend."""
        self.llm_failures.labels(backend).inc()

    def tokenization(self, backend: str, reason: str) -> None:
        """A backend's tokenization was decided: "local", or why its /tokenize is used."""
        if reason != "local":
            self.tokenizer_fallbacks.labels(reason).inc()

    def tool_request(self, action: str, seconds: float, ok: bool) -> None:
        """A sandbox's execution server answered (or failed) a request."""
        action = action if action in self._tool_actions else OTHER
        self.tool_duration.labels(action).observe(seconds)
        if not ok:
            self.tool_failures.labels(action).inc()

    def sandbox_started(self, seconds: float | None) -> None:
        """A sandbox start ended: after `seconds`, or failed (None)."""
        if seconds is None:
            self.sandbox_start_failures.inc()
            return
        self.sandbox_starts.inc()
        self.sandbox_start_duration.observe(seconds)


class _StateCollector(Collector):
    """Gauges read from the pipeline, the backend pool and the sandbox manager at each scrape."""

    def __init__(self, orchestrator: Orchestrator, api_lag: LoopLag) -> None:
        self._orchestrator = orchestrator
        self._api_lag = api_lag

    def _loop_lag(self) -> Metric:
        """How late each event loop runs what is due on it: the API's and each stage's."""
        lag = HistogramMetricFamily(
            "prorl_event_loop_lag_seconds",
            f"How late an event loop ran a callback due on it, sampled every {PROBE_S:g} s, by loop (api, or a "
            "stage); a loop late by tens of milliseconds delays everything on it.",
            labels=["loop"],
        )
        loops = {"api": self._api_lag} | {stage.value: self._orchestrator.pools[stage].lag for stage in STAGES}
        for name, recorded in loops.items():
            if recorded is not None:
                lag.add_metric([name], _buckets(recorded), recorded.sum)
        return lag

    def collect(self) -> Iterator[Metric]:
        orchestrator = self._orchestrator
        status = status_report(orchestrator)
        yield _gauge("prorl_pipeline_running", "1 while the pipeline accepts and runs jobs.", status.running)
        depth = GaugeMetricFamily("prorl_stage_queue_depth", "Jobs waiting in a stage's queue.", labels=["stage"])
        busy = GaugeMetricFamily("prorl_stage_busy_workers", "A stage's workers busy with a job.", labels=["stage"])
        workers = GaugeMetricFamily("prorl_stage_workers", "A stage's workers.", labels=["stage"])
        stuck = GaugeMetricFamily(
            "prorl_stage_stuck_handler_calls",
            "Handler calls still running after their job ended (blocked threads, tasks ignoring cancellation).",
            labels=["stage"],
        )
        stuck_threads = CounterMetricFamily(
            "prorl_stage_stuck_threads",
            "Threads left to a plain-def handler method that outlived its job's cancel grace (each replaced).",
            labels=["stage"],
        )
        restarts = CounterMetricFamily(
            "prorl_stage_loop_restarts", "Times a stage's event loop died and was restarted.", labels=["stage"]
        )
        for stage in STAGES:
            pool = orchestrator.pools[stage]
            depth.add_metric([stage.value], status.queues[stage])
            busy.add_metric([stage.value], status.busy_workers[stage])
            workers.add_metric([stage.value], status.workers[stage])
            stuck.add_metric([stage.value], status.stuck_calls[stage])
            stuck_threads.add_metric([stage.value], pool.stuck_total)
            restarts.add_metric([stage.value], status.loop_restarts[stage])
        yield from (depth, busy, workers, stuck, stuck_threads, restarts)
        yield self._loop_lag()
        yield _gauge(
            "prorl_degraded", "1 while GET /health answers 503 degraded (see GET /status).", bool(status.problems)
        )
        live = GaugeMetricFamily("prorl_jobs_live", "Jobs admitted and not yet ended, by status.", labels=["status"])
        for state in LIVE_STATUSES:
            live.add_metric([state], status.jobs.get(state, 0))
        yield live
        held = status.jobs.get("stored_results", 0)
        yield _gauge("prorl_results_held", "Finished results stored and not yet acknowledged.", held)
        yield from _backend_gauges(orchestrator)
        sandboxes = orchestrator.sandboxes
        yield _gauge("prorl_sandboxes_live", "Sandboxes open now.", sandboxes.live if sandboxes is not None else 0)
        services = list(orchestrator.services.snapshot().values())
        if services:  # no series (not even HELP lines) before a service exists
            yield from _quota_metrics(services)
        actions = sandboxes.actions if sandboxes is not None else None
        if actions is not None:
            yield from _action_metrics(actions)
        if orchestrator.model_services is not None:
            yield from _model_service_metrics(orchestrator.model_services.snapshot())


def _model_service_metrics(figures: ModelServiceSnapshot) -> Iterator[Metric]:
    """The model services' memory budget, what is resident, their users, hits, restores and evictions."""
    yield _gauge("prorl_model_service_budget_mb", "MiB the model services may hold at once.", figures.budget_mb)
    yield _gauge("prorl_model_service_resident_mb", "MiB held by the model services running now.", figures.resident_mb)
    yield _gauge("prorl_model_service_executing", "Calls holding a model service resident.", figures.executing)
    yield _gauge("prorl_model_service_waiting", "Calls waiting for room in the budget.", figures.waiting)
    for name, documentation, value in (
        ("prorl_model_service_hits", "Calls that found their model service running.", figures.hits),
        ("prorl_model_service_misses", "Calls that waited for their model service to start.", figures.misses),
        ("prorl_model_service_evictions", "Model services stopped to make room.", figures.evictions),
        ("prorl_model_service_start_failures", "Model service starts that failed.", figures.start_failures),
        ("prorl_model_service_restore_seconds", "Seconds spent starting model services.", figures.restore_s_total),
    ):
        yield CounterMetricFamily(name, documentation, value=value)
    resident = GaugeMetricFamily(
        "prorl_model_service_resident", "1 while the model service runs, else 0.", labels=["service"]
    )
    restores = CounterMetricFamily("prorl_model_service_restores", "Starts of the model service.", labels=["service"])
    for service in figures.services:
        resident.add_metric([service.name], float(service.state is ServiceState.RESIDENT))
        restores.add_metric([service.name], service.restores)
    yield resident
    yield restores


def _action_metrics(scheduler: ActionScheduler) -> Iterator[Metric]:
    """The action scheduler's CPU pool, and per action kind its grants' queueing and cores, its actions'
    completion time (ACT) and its refusals."""
    books = scheduler.books()
    yield _gauge("prorl_action_pool_cores", "Cores of the action scheduler's pool.", books.cpus)
    yield _gauge(
        "prorl_action_pool_busy_cores", "Cores of the pool granted to running actions.", books.cpus - books.free_cpu
    )
    yield _gauge("prorl_action_pool_running", "Actions holding a grant.", books.running)
    yield _gauge("prorl_action_pool_waiting", "Actions queued for cores.", books.waiting)
    yield CounterMetricFamily(
        "prorl_action_pool_busy_core_seconds",
        "Busy cores of the pool integrated over time (its rate over the pool's cores: utilisation).",
        value=books.busy_core_s,
    )
    label = ["kind"]
    completion = HistogramMetricFamily(
        "prorl_action_completion_seconds", "Completion time of an action (queued + run), by kind.", labels=label
    )
    queue = HistogramMetricFamily("prorl_action_queue_seconds", "Seconds an action queued for cores.", labels=label)
    cores = HistogramMetricFamily("prorl_action_granted_cores", "Cores granted to an action (its DoP).", labels=label)
    refused = CounterMetricFamily(
        "prorl_action_refused", "Actions refused at once (they could never fit the pool).", labels=label
    )
    for kind, stats in sorted(scheduler.kind_stats().items()):
        completion.add_metric([kind], _buckets(stats.completion_s), stats.completion_s.sum)
        queue.add_metric([kind], _buckets(stats.queue_s), stats.queue_s.sum)
        cores.add_metric([kind], _buckets(stats.cores), stats.cores.sum)
        refused.add_metric([kind], stats.refused)
    yield from (completion, queue, cores, refused)


def _buckets(distribution: Distribution | LoopLag) -> list[tuple[str, float]]:
    """A distribution's buckets as Prometheus has them: cumulative, `+Inf` last."""
    bounds = [*(str(float(b)) for b in distribution.bounds), "+Inf"]
    cumulative = itertools.accumulate(distribution.counts)
    return [(bound, float(count)) for bound, count in zip(bounds, cumulative, strict=True)]


def _quota_metrics(snapshots: list[QuotaSnapshot]) -> Iterator[Metric]:
    """The figures of external services' quotas (the judge's, those handlers call through ctx.service),
    labelled by service."""
    label = ["service"]
    limit = GaugeMetricFamily(
        "prorl_service_concurrency_limit",
        "A service's concurrency limit now (AIMD: cut on 429/503/timeouts).",
        labels=label,
    )
    in_use = GaugeMetricFamily("prorl_service_in_use", "Requests to the service holding a slot.", labels=label)
    waiting = GaugeMetricFamily("prorl_service_waiting", "Requests queued for a slot of the service.", labels=label)
    wait_p95 = GaugeMetricFamily(
        "prorl_service_queue_wait_p95_seconds", "95th percentile of the queue wait of its last grants.", labels=label
    )
    granted = CounterMetricFamily("prorl_service_granted", "Slots of the service granted.", labels=label)
    overloads = CounterMetricFamily(
        "prorl_service_overloads", "Requests the service answered 429 or 503 or let time out.", labels=label
    )
    for snapshot in snapshots:
        name = [snapshot.name]
        limit.add_metric(name, snapshot.limit)
        in_use.add_metric(name, snapshot.in_use)
        waiting.add_metric(name, snapshot.waiting)
        wait_p95.add_metric(name, snapshot.queue_wait_p95_s)
        granted.add_metric(name, snapshot.granted_total)
        overloads.add_metric(name, snapshot.overloads_total)
    yield from (limit, in_use, waiting, wait_p95, granted, overloads)


def _backend_gauges(orchestrator: Orchestrator) -> Iterator[Metric]:
    pool = orchestrator.backends
    healthy = GaugeMetricFamily(
        "prorl_backend_healthy", "1 when the backend's last health check passed.", labels=["backend"]
    )
    placeable = GaugeMetricFamily(
        "prorl_backend_placeable", "1 when the backend takes requests (healthy, circuit not open).", labels=["backend"]
    )
    calls = GaugeMetricFamily(
        "prorl_backend_calls_in_flight", "Completion calls sent to the backend and not yet over.", labels=["backend"]
    )
    pinned = GaugeMetricFamily("prorl_backend_jobs_pinned", "Jobs pinned to the backend.", labels=["backend"])
    local = GaugeMetricFamily(
        "prorl_backend_local_tokenizer",
        "1 when the backend's chats are tokenized in the server (0: by its /tokenize, or not decided yet).",
        labels=["backend"],
    )
    for backend in pool.backends():
        label = [backend.address]
        healthy.add_metric(label, backend.healthy)
        placeable.add_metric(label, backend.placeable)
        calls.add_metric(label, pool.calls_on(backend))
        pinned.add_metric(label, backend.in_flight)
        local.add_metric(label, backend.chat_tokenizer is not None)
    yield from (healthy, placeable, calls, pinned, local)
    waiting, admitted = pool.admission_counts()
    yield _gauge(
        "prorl_llm_calls_waiting_admission",
        "Completion calls waiting for a backend's admission slot (--max-inflight-per-backend).",
        waiting,
    )
    yield _gauge("prorl_llm_calls_admitted", "Completion calls holding an admission slot.", admitted)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=float(value))
