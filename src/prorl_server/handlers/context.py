"""JobContext: everything a handler sees of one job."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from prorl_server.actions import ModelServiceCache, ModelServiceRefused, QuotaRegistry, Slot
from prorl_server.errors import HandlerApiError
from prorl_server.gateway import SessionBridge, SessionRegistry, check_spec, sandbox_spec, start_relay
from prorl_server.handlers.failure import cancel_requested
from prorl_server.llm import HOW_TO_CONFIGURE, JudgePool, JudgeUnavailable, LLMError, LLMSession
from prorl_server.protocol import OpenSessionRequest, RewardChains, SessionResult, SideCalls, Stage, Trajectory
from prorl_server.sandbox import Sandbox, SandboxManager, SandboxSpec, ensure_private_dir
from prorl_server.threadsafe import run_in_loop, running_loop

if TYPE_CHECKING:
    from prorl_server.sandbox import Snapshot

log = logging.getLogger(__name__)
T = TypeVar("T")

ReleaseCallback = Callable[[], Awaitable[None] | None]
LATE_RELEASE_WAIT_S = 30.0  # a worker thread waits this long for a cleanup it runs on the stage loop


@dataclass(frozen=True)
class GatewayAccess:
    """How an OpenAI-client agent reaches its job's gateway session: give it `base_url` and `api_key` (as
    `OPENAI_BASE_URL` and `OPENAI_API_KEY`; an Anthropic client `base_url` without `/v1`) and have it ask
    for `model`; for an agent in a sandbox without network, pass it to `start_sandbox(spec, gateway=...)`
    instead."""

    session_id: str
    base_url: str
    api_key: str
    model: str
    context_tokens: int | None = None
    """The context length of the job's backend (its `max_model_len`), None where it does not say: a harness
    told it compacts its history before the gateway must refuse a call as too long."""


class JobFinished(HandlerApiError, RuntimeError):
    """The job has ended (finished, timed out or cancelled): it starts no more sandboxes, and a `ctx.wait`
    still running when it ended was cancelled."""


@dataclass
class JobContext:
    """One job as a handler sees it.

    - `instance`: the task instance as posted (with `data_source`).
    - `sampling_params`: what goes to vLLM (already in `llm`'s defaults).
    - `agent_config`: agent settings such as `max_turns`.
    - `llm`: the job's token-in/token-out session; it fills `trajectory`.
    - `judge`: the LLM judge, in EVAL only (a separate pool; its tokens never enter `trajectory`).
    - `service(name)`: a slot of an external service's quota, held around a call to that service.
    - `model_service(name)`: a model service (a judge or reward model), resident for the block.
    - `artifacts`: anything RUN produces for EVAL and for the trainer (a diff, an answer); returned.
    - `state`: private scratch space shared by the job's stages; not returned.
    - `tool_call_format`: how the model writes tool calls (the server's `--tool-call-format`; the shared
      agent loop's default; `auto`: the family of the job's backend's chat template).
    """

    job_id: str
    instance: dict[str, Any]
    sampling_params: dict[str, Any]
    agent_config: dict[str, Any]
    llm: LLMSession
    trajectory: Trajectory
    artifacts: dict[str, Any] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)
    stage: Stage | Literal["queued"] = "queued"
    tool_call_format: str = "auto"
    sandbox: Sandbox | None = None
    _sandboxes: SandboxManager | None = field(default=None, repr=False)
    _judge: JudgePool | None = field(default=None, repr=False)
    _services: QuotaRegistry | None = field(default=None, repr=False)
    _model_services: ModelServiceCache | None = field(default=None, repr=False)
    _gateway: SessionRegistry | None = field(default=None, repr=False)
    _release_callbacks: list[ReleaseCallback] = field(default_factory=list, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _finished: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _waits: set[concurrent.futures.Future[Any]] = field(default_factory=set, repr=False)  # ctx.wait in progress
    _after_end: threading.local = field(default_factory=threading.local, repr=False)  # see `waits_after_end`
    _late_releases: set[asyncio.Task[None]] = field(default_factory=set, repr=False)
    _started: list[Sandbox] = field(default_factory=list, repr=False)  # every sandbox the job started, in order
    _gateway_started: bool = field(default=False, repr=False)  # one of them with gateway=

    @property
    def data_source(self) -> str:
        """The instance's `data_source` (the handler's name)."""
        return str(self.instance["data_source"])

    @property
    def judge(self) -> JudgePool:
        """The server's LLM judge (`--judge-server`), for scoring: in EVAL only, else JudgeUnavailable."""
        if self._judge is None:
            raise JudgeUnavailable(f"this server has no LLM judge: {HOW_TO_CONFIGURE}")
        if self.stage != Stage.EVAL:
            raise JudgeUnavailable(
                f"ctx.judge is for scoring, in EVAL only (this is {self.stage.upper()}); the policy's turns go "
                "through ctx.llm"
            )
        return self._judge

    def service(self, name: str) -> Slot:
        """A slot of external service `name`'s quota (`--service-quota`), to hold around one call to it with
        `async with ctx.service("search") as slot:`; report a 429, a 503 or a timeout with
        `slot.overloaded(retry_after_s)` (a block that raises TimeoutError counts as one). Calls beyond the
        limit wait their turn. ValueError for a name that is not 1 to 64 of A-Z a-z 0-9 _ . - or past the
        server's 64th service."""
        if self._services is None:
            raise RuntimeError("this server keeps no service quotas (JobContext built without them)")
        return self._services.get(name).slot()

    def model_service(self, name: str) -> AbstractAsyncContextManager[str]:
        """`async with ctx.model_service("judge-a") as base_url:` the OpenAI-compatible `/v1` URL of model
        service `name` (`--model-service`), kept resident for the block: started first if it is not (other idle
        services stopped, least recently used first, when it would not fit), waiting while the budget is held by
        services in use. ModelServiceRefused for a name the server does not have; ModelServiceUnavailable when
        the service fails to start."""
        if self._model_services is None:
            raise ModelServiceRefused(
                f"model service {name!r}: this server has none (prorl-server serve --model-service NAME=MEMORY_MB)"
            )
        return self._model_services.use(name)

    @property
    def default_sandbox_spec(self) -> SandboxSpec:
        """The server's default sandbox spec (`--image`, limits): start from it to add binds or variables, e.g.
        `ctx.default_sandbox_spec.model_copy(update={"binds": [...]})`."""
        return self._sandboxes.default_spec if self._sandboxes is not None else SandboxSpec()

    async def start_sandbox(self, spec: SandboxSpec | None = None, *, gateway: GatewayAccess | None = None) -> Sandbox:
        """Start a sandbox for this job (the server's default spec unless given).

        It is closed on release: right after RUN for one started in INIT or RUN, when the job ends for
        one started in EVAL (so EVAL can test in a fresh sandbox the agent never touched). The first
        sandbox started becomes `ctx.sandbox` until it is closed. Once the job has ended it raises
        JobFinished; a sandbox whose start completes after the job ended is closed at once (JobFinished).

        With `gateway` (from `gateway_session()`), every process of the sandbox has `OPENAI_BASE_URL`,
        `OPENAI_API_KEY` (a placeholder; the host adds the session's key) and `OPENAI_MODEL` set, and the
        same as `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`, `ANTHROPIC_MODEL`, and reaches that session, and
        nothing else of the host, through a socket bound in (docs/gateway.md, "From inside a sandbox"); the
        spec's network must be `none`.
        """
        if self._sandboxes is None:
            raise RuntimeError("this server runs without a sandbox runtime (see --runtime)")
        if self._finished:
            raise JobFinished(f"job {self.job_id} has already ended; it cannot start a sandbox")
        manager = self._sandboxes
        if gateway is not None:
            spec = await self._with_gateway(spec or manager.default_spec, gateway)
        sandbox = await self._adopt(await manager.start(spec), manager)
        if gateway is not None:
            self._gateway_started = True
            await start_relay(sandbox)
        return sandbox

    async def _start_fork(self, snapshot: Snapshot) -> Sandbox:
        """The server's (pipeline/fork.py): start a fork of `snapshot` as the job's sandbox (`ctx.sandbox`),
        closed on release like one from `start_sandbox`."""
        if self._sandboxes is None:
            raise RuntimeError("this server runs without a sandbox runtime (see --runtime)")
        if self._finished:
            raise JobFinished(f"job {self.job_id} has already ended; it cannot start a sandbox")
        self.sandbox = None
        return await self._adopt(await self._sandboxes.fork(snapshot), self._sandboxes)

    async def _adopt(self, sandbox: Sandbox, manager: SandboxManager) -> Sandbox:
        """Make a started sandbox the job's: closed on release, `ctx.sandbox` if it is the first (closed at
        once, JobFinished, if the job ended meanwhile)."""

        def close() -> Awaitable[None]:
            return manager.close(sandbox)

        if not self._keep(close):
            await asyncio.shield(self._release_late(close()))  # the close goes on if this call is cancelled
            raise JobFinished(f"job {self.job_id} ended while its sandbox was starting; the sandbox was closed")
        self._started.append(sandbox)
        if self.sandbox is None:
            self.sandbox = sandbox
        return sandbox

    def _take_cleanups(self) -> list[ReleaseCallback]:
        """The server's (pipeline/fork.py): the cleanups registered so far, which the job no longer runs."""
        with self._lock:
            taken, self._release_callbacks = self._release_callbacks, []
        return taken

    async def _with_gateway(self, spec: SandboxSpec, gateway: GatewayAccess) -> SandboxSpec:
        """`spec` with a bridge to `gateway`'s session bound in; the bridge is closed on release."""
        if self._gateway is None or self._sandboxes is None:
            raise RuntimeError("this server has no gateway (JobContext built without one)")
        check_spec(spec)  # before the bridge is opened
        manager = self._sandboxes
        ensure_private_dir(manager.base_dir)
        parent = manager.base_dir / manager.owner
        limit = self._gateway.limits.max_body_bytes
        bridge = await SessionBridge.open(gateway.base_url, gateway.api_key, limit, parent)
        if not self._keep(bridge.close):
            await bridge.close()
            raise JobFinished(f"job {self.job_id} ended while its sandbox was starting")
        return sandbox_spec(spec, bridge, gateway.model)

    async def gateway_session(
        self,
        *,
        harness_params: tuple[str, ...] = ("max_tokens",),
        model: str | None = None,
        accept_any_model: bool = False,
        side_calls: SideCalls = "record",
        reward_chains: RewardChains = "main",
    ) -> GatewayAccess:
        """Open an OpenAI gateway session for this job (docs/gateway.md): on the job's backend, with the job's
        sampling params, of which the agent may set only `harness_params`; `model` is a name it may use
        (with `accept_any_model`, it may use any: calls naming neither it nor the served name are side calls,
        recorded as chains of their own or refused, per `side_calls`).

        The session is closed on release (right after RUN, or when the job ends), which aborts a completion
        in flight; its recording (`SessionResult`: the chains and their segments, the counts, and the
        `reward_chains` the reward belongs to: the main chain, every agent chain, or all) is then appended to
        `ctx.artifacts["gateway"]`; when the reward chains are one chain of one segment, that segment is also
        the job's `trajectory` (if `ctx.llm` wrote nothing). Raises JobFinished once the job has ended.
        """
        registry = self._gateway
        if registry is None:
            raise RuntimeError("this server has no gateway (JobContext built without one)")
        if self._finished:
            raise JobFinished(f"job {self.job_id} has already ended; it cannot open a gateway session")
        request = OpenSessionRequest(
            sampling_params=self.sampling_params,
            harness_params=list(harness_params),  # type: ignore[arg-type]  # checked by the model
            model=model,
            accept_any_model=accept_any_model,
            data_source=self.data_source,
            side_calls=side_calls,
            reward_chains=reward_chains,
        )
        session = await registry.open(request, job_id=self.job_id)

        async def close() -> None:
            result = await registry.close(session.id)
            if result is not None:
                self.artifacts.setdefault("gateway", []).append(result.model_dump(mode="json"))
                rewarded = _rewarded_segments(result)
                if len(rewarded) == 1:  # one conversation, token-exact: the job's trajectory
                    self.llm.tokens.adopt(rewarded[0])

        if not self._keep(close):
            await close()
            raise JobFinished(f"job {self.job_id} ended while its gateway session was opening; it was closed")
        try:
            context = await self.llm.context_limit()
        except LLMError:  # no backend to ask now: the session's first call says why, in the dialect's words
            context = None
        return GatewayAccess(
            session.id, registry.base_url(session), session.key, session.alias or session.model, context
        )

    @property
    def finished(self) -> bool:
        """True once the job has ended (finished, timed out or cancelled)."""
        return self._finished

    @property
    def has_cleanups(self) -> bool:
        """Whether cleanups are registered for the next release."""
        return bool(self._release_callbacks)

    def on_release(self, callback: ReleaseCallback) -> None:
        """Register a resource cleanup (sync or async), run right after RUN, or on failure/cancel.

        Callbacks run once, most recent first, on whatever stage thread releases the job. Once the job has
        ended the cleanup runs at once instead (an async one is scheduled on the running event loop, or,
        from a worker thread, run on the stage's loop and waited for).
        """
        if self._keep(callback):
            return
        try:
            outcome = callback()
        except BaseException:  # whatever a cleanup raises (SystemExit too) is logged, never raised
            log.exception("release callback of job %s failed", self.job_id)
            return
        if not inspect.isawaitable(outcome):
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a worker thread
            self._await_from_thread(outcome)
        else:
            self._release_late(outcome)

    def finish(self) -> None:
        """The job has ended (the server's, before its last release): cancel the `ctx.wait` calls in
        progress; from now on `start_sandbox` raises JobFinished and `on_release` releases at once."""
        with self._lock:
            self._finished = True
            waits, self._waits = self._waits, set()
        for future in waits:
            future.cancel()  # cancels the coroutine on its loop; the waiting thread gets JobFinished

    async def release(self) -> None:
        """Run and forget the registered cleanups (idempotent); errors are logged, never raised."""
        while self._release_callbacks:
            callback = self._release_callbacks.pop()
            try:
                outcome = callback()
                if inspect.isawaitable(outcome):
                    await outcome
            except BaseException as exc:  # whatever a cleanup raises (SystemExit too) is logged, never raised
                if isinstance(exc, asyncio.CancelledError) and cancel_requested():
                    raise
                log.exception("release callback of job %s failed", self.job_id)
        self.sandbox = None
        self.llm.close()

    def wait(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """From a synchronous handler method (it runs in a worker thread), run an async call such as
        `ctx.llm.generate()` on the stage's event loop and return its result."""
        if self._loop is None:
            raise RuntimeError("JobContext.wait() is only available while a stage runs")
        if running_loop() is self._loop:
            coro.close()
            raise RuntimeError("JobContext.wait() is for synchronous methods; in async methods use await")
        with self._lock:  # so that the end, marked in between, cannot miss it
            if self._finished and not getattr(self._after_end, "allowed", False):
                coro.close()  # a stage method still running after its job ended does no more work
                raise JobFinished(f"job {self.job_id} has already ended; ctx.wait() was not run")
            future = run_in_loop(self._loop, coro)
            if not self._finished:  # a call made after the end (final_result) is not cancelled
                self._waits.add(future)
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError:
            if self._finished:
                raise JobFinished(
                    f"job {self.job_id} ended while ctx.wait() was running; the call was cancelled"
                ) from None
            raise
        finally:
            with self._lock:
                self._waits.discard(future)

    @contextmanager
    def waits_after_end(self) -> Iterator[None]:
        """The server's, around `final_result` in its worker thread: `ctx.wait` runs there although the job
        has ended (anywhere else it then raises JobFinished)."""
        self._after_end.allowed = True
        try:
            yield
        finally:
            self._after_end.allowed = False

    def _keep(self, callback: ReleaseCallback) -> bool:
        """Register `callback` for the next release; False (not registered) once the job has ended."""
        with self._lock:
            if self._finished:
                return False
            self._release_callbacks.append(callback)
            return True

    def _release_late(self, outcome: Awaitable[None]) -> asyncio.Task[None]:
        """Run a cleanup's awaitable as a task of the running loop, kept referenced until it is done."""
        task = asyncio.ensure_future(_logged(outcome, self.job_id))
        self._late_releases.add(task)
        task.add_done_callback(self._late_releases.discard)
        return task

    def _await_from_thread(self, outcome: Awaitable[None]) -> None:
        """Run a cleanup's awaitable to its end from a thread without event loop (on the stage's if it runs)."""
        loop = self._loop
        if loop is None or not loop.is_running():
            asyncio.run(_logged(outcome, self.job_id))
            return
        future = run_in_loop(loop, _logged(outcome, self.job_id))
        try:
            future.result(LATE_RELEASE_WAIT_S)
        except (concurrent.futures.CancelledError, concurrent.futures.TimeoutError):  # the stage loop stopped
            log.warning("a late release callback of job %s did not complete", self.job_id)


async def _logged(outcome: Awaitable[None], job_id: str) -> None:
    """Await a cleanup; its error is logged, never raised."""
    try:
        await outcome
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError) and cancel_requested():
            raise
        log.exception("release callback of job %s failed", job_id)


def _rewarded_segments(result: SessionResult) -> list[Trajectory]:
    """The segments of a session's reward chains."""
    chosen = set(result.reward_chains)
    return [segment for chain in result.chains if chain.id in chosen for segment in chain.segments]
