"""ServerState: the objects one server instance is made of, shared by the routers."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
from collections.abc import Awaitable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request

from prorl_server.actions import (
    DevEngineLauncher,
    DevEngineService,
    ModelServiceCache,
    ModelServiceRefused,
    QuotaRegistry,
    parse_model_service,
    parse_service_quota,
)
from prorl_server.config import ServerSettings
from prorl_server.gateway import CallObserver, GatewayLimits, SessionRegistry
from prorl_server.handlers import HandlerRegistry
from prorl_server.journal import Journal
from prorl_server.llm import (
    JUDGE_API_KEY_ENV,
    BackendPool,
    EngineFreeze,
    JudgePool,
    PauseLease,
    PlacementPolicy,
    RetryPolicy,
    TokenizerCache,
    VLLMClient,
    WeightUpdate,
    backend_profiles,
    interference_profile,
    make_policy,
)
from prorl_server.observability import ServerMetrics
from prorl_server.pipeline import GroupRunner, LoopThread, Orchestrator, ResultStore
from prorl_server.sandbox import (
    CpuPool,
    NetworkGuard,
    SandboxError,
    SandboxManager,
    SandboxSpec,
    ensure_private_dir,
    make_runtime,
    new_owner_id,
    url_port,
    user_dir,
)
from prorl_server.scheduling import DispatchPolicy, SharedPredictor, make_predictor
from prorl_server.threadsafe import call_in_loop
from prorl_server.tool_call_formats import tool_format

log = logging.getLogger(__name__)
T = TypeVar("T")


class ResultSignal:
    """Wakes long-polling `GET /jobs` requests when a result is stored (from any thread)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None
        self._waiting = 0  # long-polls in progress; without any, notify costs nothing

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Attach to the API's event loop."""
        self._loop = loop
        self._event = asyncio.Event()

    def notify(self) -> None:
        """Called by the result store after each put."""
        if self._waiting and self._loop is not None and not self._loop.is_closed():
            call_in_loop(self._loop, self._fire)

    def _fire(self) -> None:
        assert self._event is not None
        self._event.set()
        self._event = asyncio.Event()

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Enter before looking at the store, so a result stored meanwhile still wakes `wait`."""
        self._waiting += 1
        try:
            yield
        finally:
            self._waiting -= 1

    async def wait(self, timeout: float) -> None:
        """Inside `watching()`: return after the next stored result or after `timeout` seconds."""
        assert self._event is not None and self._waiting, "call wait() inside watching()"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)


@dataclass
class ServerState:
    """Settings, handler registry, backend pool, orchestrator, gateway sessions, the metrics, the group runner,
    the long-poll signal, the journal, the health-check thread and the weight update's parts. `build` makes
    every collaborator and passes each one in: nothing is hooked to another by assignment afterwards."""

    settings: ServerSettings
    registry: HandlerRegistry
    backends: BackendPool
    orchestrator: Orchestrator
    gateway: SessionRegistry
    metrics: ServerMetrics  # GET /metrics and the dashboard's numbers
    groups: GroupRunner  # the /groups routes' groups
    signal: ResultSignal  # wakes long polls when a result is stored
    journal: Journal | None = None
    health: LoopThread = field(default_factory=lambda: LoopThread("prorl-health"))
    pause_lease: PauseLease = field(init=False)  # ends a weight-update pause nobody ended
    engine_freeze: EngineFreeze = field(init=False)  # the engines a keep pause froze
    weight_update: WeightUpdate = field(init=False)  # reload, set the version, roll back (api/weights.py)

    def __post_init__(self) -> None:
        self.engine_freeze = EngineFreeze(self.backends.client, self._on_health_loop)
        self.pause_lease = PauseLease(
            self.backends.gate,
            self.settings.weight_pause_lease_s,
            thaw=lambda: self.engine_freeze.thaw(self.backends.current_version),
        )
        self.weight_update = WeightUpdate(
            self.backends,
            self.engine_freeze,
            self._on_health_loop,
            self.pause_lease.updating,
            servers_changed=self.probe_soon,
        )

    def _on_health_loop(self, call: Coroutine[Any, Any, T]) -> Awaitable[T]:
        """Run an engine call on the health-check loop, whose HTTP connections the server closes when it stops."""
        return asyncio.wrap_future(self.health.submit(call))

    @classmethod
    def build(
        cls,
        settings: ServerSettings,
        registry: HandlerRegistry | None = None,
        client: VLLMClient | None = None,
    ) -> ServerState:
        """Assemble a server from settings; tests may pass their own registry or client."""
        if registry is None:
            registry = HandlerRegistry()
            if settings.entry_point_handlers:
                registry.load_entry_points()
            for target in settings.handlers:
                registry.add_target(target)
        client = client or VLLMClient(request_timeout_s=settings.llm_request_timeout_s)
        dispatch = build_dispatch(settings)
        metrics = ServerMetrics()
        signal = ResultSignal()
        backends = BackendPool(
            client,
            build_placement(settings, dispatch),
            failure_threshold=settings.llm_failure_threshold,
            breaker_cooldown_s=settings.llm_breaker_cooldown_s,
            retry=RetryPolicy(budget_s=settings.llm_retry_budget_s),
            stall_timeout_s=settings.llm_stall_timeout_s,
            max_inflight_per_backend=settings.max_inflight_per_backend,
            tokenizer_cache=TokenizerCache(),
            tokenizer_path=settings.tokenizer,
            on_completion=metrics.completion,
            on_failure=metrics.llm_failure,
            on_tokenization=metrics.tokenization,
        )
        for address in settings.llm_servers:
            backends.add(address)
        gateway = build_gateway(settings, backends, dispatch, metrics.gateway_call)
        model_services, model_ports = build_model_services(settings)
        journal = open_journal(settings)
        writer = journal.recover() if journal is not None else None
        try:
            results = ResultStore(
                settings.result_retention_s,
                on_put=signal.notify,
                on_stored=metrics.result_stored,
                on_acknowledged=metrics.results_acknowledged.inc,
                log=writer,
            )
            orchestrator = Orchestrator(
                settings,
                registry,
                backends,
                build_sandboxes(settings, backends, model_ports, metrics),
                judge=build_judge(settings),
                dispatch=dispatch,
                gateway=gateway,
                services=build_services(settings),
                model_services=model_services,
                results=results,
                journal=writer,
            )
        except BaseException:
            if journal is not None:
                journal.close()
            raise
        metrics.collect(orchestrator)
        groups = GroupRunner(orchestrator, on_refill=metrics.group_refilled)
        if journal is not None:
            journal.restore(orchestrator)
        return cls(settings, registry, backends, orchestrator, gateway, metrics, groups, signal, journal)

    async def open(self) -> None:
        """Give the journal (if any) this event loop, reap orphaned sandboxes, start health checks and (with
        autostart) the pipeline."""
        self.signal.bind(asyncio.get_running_loop())
        if self.journal is not None:
            self.journal.attach(asyncio.get_running_loop())
        if self.orchestrator.sandboxes is not None:
            await asyncio.to_thread(self.orchestrator.sandboxes.reap_orphans)
        self.health.start()
        self.health.submit(self.backends.health_loop(self.settings.health_check_interval_s))
        if self.settings.autostart:
            await asyncio.to_thread(self.orchestrator.start)
        if self.journal is not None:
            self.journal.requeue(self.orchestrator)

    async def close(self) -> None:
        """Close the gateway sessions, stop the pipeline (cancelling live jobs) and the health checks."""
        self.pause_lease.end()
        await self.gateway.close_all()
        await self.backends.client.aclose_current_loop()  # the gateway's connections, on this loop
        await asyncio.to_thread(self.orchestrator.stop)
        if self.orchestrator.model_services is not None:
            await asyncio.to_thread(self.orchestrator.model_services.close)  # stops their processes
        if self.journal is not None:
            await asyncio.to_thread(self.journal.close)  # after stop: the results of cancelled jobs are written
        self.health.submit(self.backends.client.aclose_current_loop()).result(5)
        self.health.stop()

    async def durable(self, *, admissions: bool = True) -> None:
        """With a journal: return once every change so far is on disk (a no-op without one); with
        `admissions=False`, every result stored or acknowledged so far (what an answer that hands out results
        or confirms an acknowledgement needs)."""
        if self.journal is not None:
            await self.journal.durable(admissions=admissions)

    def probe_soon(self) -> None:
        """Run one health-check round now (after a registration)."""
        if self.health.alive:
            self.health.submit(self.backends.check_health())


def open_journal(settings: ServerSettings) -> Journal | None:
    """The results journal of `--journal` (None without one), opened (its lock taken, its file checked; then
    `recover` and `restore`); raises JournalError when it cannot be used."""
    if settings.journal is None:
        return None
    journal = Journal(
        settings.journal,
        retention_s=settings.result_retention_s,
        sync=settings.journal_sync,
        compact_interval_s=settings.journal_compact_interval_s,
    )
    return journal


def build_dispatch(settings: ServerSettings) -> DispatchPolicy:
    """The dispatch policy of `--dispatch-policy`, with the length predictor of `--predictor` (behind a lock,
    since the placement policy shares it)."""
    predictor = SharedPredictor(make_predictor(settings.predictor))
    return DispatchPolicy(settings.dispatch_policy, predictor, vllm_priority=settings.vllm_priority)


def build_placement(settings: ServerSettings, dispatch: DispatchPolicy) -> PlacementPolicy:
    """The placement policy of `--placement`; `presorted_dp` shares the dispatch policy's predictor, weighs
    each backend with its `--backend-profile` (else `--interference-profile`) and a group past
    `--max-inflight-per-backend` as waiting for slots."""
    limit = settings.max_inflight_per_backend
    profile = interference_profile(settings.interference_profile)
    own = {address: p.with_batch_limit(limit) for address, p in backend_profiles(settings.backend_profiles).items()}
    return make_policy(
        settings.placement,
        predictor=dispatch.predictor,
        profile=profile.with_batch_limit(limit),
        prefill_s_per_token=settings.migration_prefill_s_per_token,
        backend_profiles=own,
    )


def build_gateway(
    settings: ServerSettings, backends: BackendPool, dispatch: DispatchPolicy, on_call: CallObserver | None = None
) -> SessionRegistry:
    """The gateway's session registry, bounded by the `--gateway-*` settings; the server's `--api-key` opens
    every session."""
    limits = GatewayLimits(
        max_sessions=settings.gateway_max_sessions,
        idle_timeout_s=settings.gateway_idle_timeout_s,
        max_segments=settings.gateway_max_segments,
        max_chains=settings.gateway_max_chains,
        max_messages=settings.gateway_max_messages,
        max_body_bytes=settings.gateway_max_body_bytes,
        max_failovers=settings.llm_max_failovers,
    )
    return SessionRegistry(
        backends,
        limits,
        operator_key=settings.api_key,
        dispatch=dispatch,
        public_url=settings.gateway_public_url(),
        tool_format=None if settings.tool_call_format == "auto" else tool_format(settings.tool_call_format),
        on_call=on_call,
    )


def build_services(settings: ServerSettings) -> QuotaRegistry:
    """The quotas of the external services handlers call (`--service-quota`; others get the defaults)."""
    services = QuotaRegistry()
    for text in settings.service_quotas:
        services.configure(*parse_service_quota(text))
    return services


def build_model_services(settings: ServerSettings) -> tuple[ModelServiceCache | None, list[int]]:
    """The model services of `--model-service` (None without any) and the ports they serve on (each keeps its
    port across restores, so sandboxes are denied it from the start). ModelServiceRefused when the dev engine
    that serves them is not installed."""
    if not settings.model_services:
        return None, []
    if importlib.util.find_spec("llama_cpp") is None:
        raise ModelServiceRefused(
            "--model-service: model services are served by the dev engine, which needs llama-cpp-python: "
            "pip install 'prorl-server[devllm]'"
        )
    cache = ModelServiceCache(settings.model_service_budget_mb)
    logs = ensure_private_dir(user_dir(str(settings.sandbox_dir / "prorl-model-services")))
    ports = []
    for text in settings.model_services:
        name, memory_mb = parse_model_service(text)
        launcher = DevEngineLauncher(DevEngineService(name, log=logs / f"{name}-{os.getpid()}.log"))
        cache.register(name, memory_mb, launcher)
        ports.append(launcher.port)
    log.info(
        "model services: %s in %d MiB (logs in %s)",
        ", ".join(settings.model_services),
        settings.model_service_budget_mb,
        logs,
    )
    return cache, ports


def build_judge(settings: ServerSettings) -> JudgePool | None:
    """The LLM judge of `--judge-server` (None without one); its API key is read from $PRORL_JUDGE_API_KEY."""
    if not settings.judge_servers:
        return None
    return JudgePool(
        settings.judge_servers,
        model=settings.judge_model,
        timeout_s=settings.judge_timeout_s,
        retry=RetryPolicy(budget_s=settings.judge_retry_budget_s),
        api_key=os.environ.get(JUDGE_API_KEY_ENV) or None,
        max_concurrency=settings.judge_max_concurrency,
        rate_per_s=settings.judge_rate,
    )


def build_sandboxes(
    settings: ServerSettings, backends: BackendPool, model_ports: list[int], metrics: ServerMetrics | None = None
) -> SandboxManager:
    """The sandbox runtime for this server instance; `auto` skips Apptainer when no image is configured.

    Sandboxes that share the host network may not connect to this server's port, the backends' ports, the
    LLM judge's or the model services' (`model_ports`; network_guard.py)."""
    owner = new_owner_id()
    exclude = ("apptainer",) if settings.sandbox_image is None else ()

    def backend_ports() -> set[int]:
        return {port for b in backends.backends() if (port := url_port(b.address)) is not None}

    judge_ports = [port for address in settings.judge_servers if (port := url_port(address)) is not None]
    judge_ports += model_ports  # scoring services, like the judge: never the policy's to ask
    guard = NetworkGuard(
        api_ports=[settings.port] if settings.port else [], backend_ports=backend_ports, judge_ports=judge_ports
    )
    base_dir = user_dir(str(settings.sandbox_dir / "prorl-sandboxes"))
    runtime = make_runtime(
        settings.runtime,
        owner,
        exclude=exclude,
        network_guard=guard,
        base_dir=base_dir,
        cpu_pool=build_cpu_pool(settings),
    )
    return SandboxManager(
        runtime,
        owner,
        SandboxSpec(image=settings.sandbox_image),
        base_dir=base_dir,
        on_start=metrics.sandbox_started if metrics is not None else None,
        on_tool_request=metrics.tool_request if metrics is not None else None,
    )


def build_cpu_pool(settings: ServerSettings) -> CpuPool | None:
    """The node's CPU pool sandbox actions are granted cores from (`--action-scheduler`; None when off): the
    cores this process may use but `--action-cpu-reserve`. SandboxError if the reserve leaves none."""
    if not settings.action_scheduler:
        return None
    try:
        pool = CpuPool.for_node(settings.action_cpu_reserve, settings.action_idle_cpus, settings.action_cpus)
    except ValueError as exc:
        raise SandboxError(str(exc)) from None
    log.info("action scheduler: %d cores (CPUs %s) granted per sandbox action", len(pool.cpu_ids), pool.cpu_ids)
    return pool


async def get_state(request: Request) -> ServerState:
    """FastAPI dependency: the ServerState of the app serving this request (async: no thread hop)."""
    return request.app.state.server
