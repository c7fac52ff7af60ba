"""GatewaySession and SessionRegistry: the open sessions, their keys, their bounds, their end and their close
answer (the recorder's chains, the main chain, the chains the reward belongs to).

A session is opened by a trainer (`POST /sessions`) or by a handler for its job (`JobContext.gateway_session`)
and is reached at `/sessions/{id}/v1` with its own random key. The registry holds at most `max_sessions`;
a session idle (no call in flight) for `idle_timeout_s` is closed when the registry next looks (at every
open and every call), and its recording dropped. Closing a session cancels its calls in flight (the backend
request is closed, so the engine aborts it) and unpins it from its backend.

Thread-safe: a handler opens and closes its job's session from a stage loop while the API loop serves the
calls; a call in flight is cancelled on its own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from prorl_server.gateway.errors import GatewayError, invalid_key, session_not_found
from prorl_server.gateway.recorder import ConversationRecorder
from prorl_server.gateway.responses.store import ResponseStore
from prorl_server.llm import BackendPool, LLMError
from prorl_server.protocol import (
    MAX_HARNESS_MODELS,
    ChainRecord,
    OpenSessionRequest,
    RewardChains,
    SessionResult,
    SideCalls,
)
from prorl_server.scheduling import DispatchPolicy
from prorl_server.threadsafe import call_in_loop, running_loop
from prorl_server.tool_call_formats import ToolCallFormat

log = logging.getLogger(__name__)

KEY_PREFIX = "sk-prorl-"
_DUMMY_KEY = secrets.token_bytes(32)  # compared with when the session is unknown, so both cost the same


@dataclass(frozen=True)
class GatewayLimits:
    """Bounds of the gateway's state (from ServerSettings)."""

    max_sessions: int = 1024
    idle_timeout_s: float = 900.0
    max_segments: int = 256
    max_chains: int = 64
    max_messages: int = 4096
    max_body_bytes: int = 8 * 1024 * 1024
    max_failovers: int = 3
    open_timeout_s: float = 10.0


CallObserver = Callable[[str, float], None]
"""Told of each answered call: its API (`chat`, `responses`, `anthropic`) and its seconds."""


@dataclass(eq=False)
class GatewaySession:
    """One open session: its id, key, model names and recorder, what it does with side calls and which
    chains its reward belongs to, its remembered Responses, and its calls in flight."""

    id: str
    key: str
    model: str
    alias: str | None
    recorder: ConversationRecorder
    job_id: str | None = None
    accept_any_model: bool = False
    side_calls: SideCalls = "record"
    reward_chains: RewardChains = "main"
    harness_models: list[str] = field(default_factory=list)
    last_used: float = field(default_factory=time.monotonic)
    closed: bool = False
    responses: ResponseStore = field(default_factory=ResponseStore)  # for `previous_response_id`
    on_call: CallObserver | None = None  # told each answered call's API and seconds (the server's metrics)
    _inflight: set[asyncio.Task[object]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)  # `shut` may run on another thread

    def admit(self, model: str) -> bool:
        """Whether a call naming `model` is a side call (another name than the served name or the alias,
        which only `accept_any_model` lets through); a GatewayError (404) when it is not answered at all."""
        if model == self.model or (self.alias is not None and model == self.alias):
            return False
        if not self.accept_any_model:
            raise GatewayError(
                404,
                f"the model {model[:100]!r} does not exist in this session; it serves "
                + " or ".join(repr(n) for n in self.model_names),
                param="model",
                code="model_not_found",
            )
        if self.side_calls == "refuse":
            raise GatewayError(
                404,
                f"this session refuses side calls (calls naming another model than "
                f"{' or '.join(repr(n) for n in self.model_names)}, here {model[:100]!r}): it was opened with "
                "side_calls 'refuse'",
                param="model",
                code="side_call_refused",
            )
        return True

    def answered_as(self, model: str) -> None:
        """Note that a call naming `model` was answered (the first MAX_HARNESS_MODELS names are kept)."""
        if model not in self.harness_models and len(self.harness_models) < MAX_HARNESS_MODELS:
            self.harness_models.append(model)

    @property
    def model_names(self) -> list[str]:
        """The names `GET /v1/models` lists."""
        return [self.model] if self.alias is None or self.alias == self.model else [self.alias, self.model]

    @contextlib.asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        """Mark the current task as a call in flight of this session (closing the session cancels it)."""
        task = asyncio.current_task()
        assert task is not None
        with self._lock:
            if self.closed:
                raise session_closed()
            self._inflight.add(task)
            self.last_used = time.monotonic()
        try:
            yield
        except asyncio.CancelledError:
            if self.closed:
                raise session_closed() from None
            raise
        finally:
            with self._lock:
                self._inflight.discard(task)
                self.last_used = time.monotonic()

    def idle_for(self, now: float) -> float:
        """Seconds since the last call ended (0 while one is in flight)."""
        with self._lock:
            return 0.0 if self._inflight else now - self.last_used

    def shut(self) -> list[asyncio.Task[object]]:
        """Mark closed, cancel the calls in flight (each on its own loop) and unpin; returns those running on
        the current loop, to be awaited."""
        with self._lock:
            self.closed = True
            inflight = list(self._inflight)
        current = running_loop()
        here = []
        for task in inflight:
            loop = task.get_loop()
            if loop is current:
                task.cancel()
                here.append(task)
            elif not loop.is_closed():
                call_in_loop(loop, task.cancel)
        self.recorder.close()
        return here

    def result(self) -> SessionResult:
        """The recording so far."""
        r = self.recorder
        segments, chains = r.recording()
        main = main_chain(chains)
        return SessionResult(
            session_id=self.id,
            segments=segments,
            chains=chains,
            main_chain=main,
            reward_chains=reward_chains(chains, main, self.reward_chains),
            rewrites=r.rewrites,
            calls=r.calls,
            side_calls=r.side_calls,
            harness_models=list(self.harness_models),
            failed_calls=r.failed_calls,
        )


def main_chain(chains: list[ChainRecord]) -> int | None:
    """The main chain's id: the chain of the first call under the session's own model name (a main agent
    starts its sub-agents, so they come later), else the chain with the most sampled tokens."""
    own = [c for c in chains if not c.side_call]
    if own:
        return own[0].id
    return max(chains, key=lambda c: c.sampled_tokens).id if chains else None


def reward_chains(chains: list[ChainRecord], main: int | None, which: RewardChains) -> list[int]:
    """The ids of the chains `which` names."""
    if which == "all":
        return [c.id for c in chains]
    if which == "agents":
        return [c.id for c in chains if not c.side_call]
    return [] if main is None else [main]


def session_closed() -> GatewayError:
    return GatewayError(404, "the session was closed while this call was in flight", code="session_closed")


class SessionRegistry:
    """The open gateway sessions of one server (their replies' tool calls in `tool_format`; None: each
    session's backend's, `--tool-call-format auto`)."""

    def __init__(
        self,
        pool: BackendPool,
        limits: GatewayLimits,
        *,
        operator_key: str | None = None,
        dispatch: DispatchPolicy | None = None,
        public_url: str | None = None,
        tool_format: ToolCallFormat | None = None,
        on_call: CallObserver | None = None,
    ) -> None:
        self.pool = pool
        self.on_call = on_call
        self.tool_format = tool_format
        self.limits = limits
        self.dispatch = dispatch
        self.public_url = public_url
        self._operator_key = operator_key.encode() if operator_key is not None else None
        self._sessions: dict[str, GatewaySession] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    async def open(self, request: OpenSessionRequest, *, job_id: str | None = None) -> GatewaySession:
        """Open a session (its backend is pinned at its first call, as a job's is); 429 at `max_sessions`,
        503 without a healthy backend or when none tells its model name within `open_timeout_s`."""
        await self._expire_idle()
        registered, healthy = self.pool.counts()
        if healthy == 0:
            raise GatewayError(
                503,
                f"no healthy LLM backend ({registered} registered): register one with POST /add_llm_server",
                type="server_error",
            )
        session_id = secrets.token_hex(16)
        recorder = ConversationRecorder(
            job_id or f"session-{session_id}",
            self.pool,
            request.sampling_params,
            frozenset(request.harness_params),
            max_segments=self.limits.max_segments,
            max_chains=self.limits.max_chains,
            max_failovers=self.limits.max_failovers,
            dispatch=self.dispatch,
            data_source=request.data_source,
            tool_format=self.tool_format,
        )
        with self._lock:
            if len(self._sessions) >= self.limits.max_sessions:
                raise GatewayError(
                    429,
                    f"{len(self._sessions)} sessions are open, the server's most (--gateway-max-sessions): close "
                    "one first (DELETE /sessions/{id})",
                    type="rate_limit_error",
                    code="too_many_sessions",
                )
            placeholder = GatewaySession(session_id, "", "", None, recorder, job_id, closed=True)
            self._sessions[session_id] = placeholder  # holds the place while the backend is asked
        try:
            async with asyncio.timeout(self.limits.open_timeout_s):
                model = await self._served_model()
        except BaseException as exc:
            with self._lock:
                self._sessions.pop(session_id, None)
            if isinstance(exc, TimeoutError | LLMError):
                why = str(exc) or f"no answer within {self.limits.open_timeout_s:g}s"
                raise GatewayError(503, f"no LLM backend told its model name: {why}", type="server_error") from None
            raise
        session = GatewaySession(
            session_id,
            KEY_PREFIX + secrets.token_urlsafe(32),
            model,
            request.model,
            recorder,
            job_id,
            accept_any_model=request.accept_any_model,
            side_calls=request.side_calls,
            reward_chains=request.reward_chains,
            on_call=self.on_call,
        )
        with self._lock:
            self._sessions[session_id] = session
        return session

    async def _served_model(self) -> str:
        """The model name the backends serve: known already, or asked of each healthy backend in turn."""
        healthy = [b for b in self.pool.backends() if b.healthy]
        for backend in healthy:
            if backend.model is not None:
                return backend.model
        errors = []
        for backend in healthy:
            try:
                model = await self.pool.resolve_model(backend)
            except LLMError as exc:
                errors.append(str(exc))
                continue
            if model is not None:
                return model
        raise LLMError("; ".join(errors) or "no healthy backend")

    def authorize(self, session_id: str, authorization: str | None) -> GatewaySession:
        """The open session `session_id` if `authorization` holds its key or the operator's; else 401 (the
        same whether or not the session exists), or 404 for the operator's key."""
        token = _bearer(authorization)
        with self._lock:
            session = self._sessions.get(session_id)
        if session is not None and session.key and session.idle_for(time.monotonic()) > self.limits.idle_timeout_s:
            self._expire(session)
            session = None
        if session is not None and session.closed:
            session = None
        if self._operator_key is not None and hmac.compare_digest(token, self._operator_key):
            if session is None:
                raise session_not_found(session_id)
            return session
        expected = session.key.encode() if session is not None else _DUMMY_KEY
        if not hmac.compare_digest(token, expected) or session is None:
            raise invalid_key()
        return session

    async def close(self, session_id: str) -> SessionResult | None:
        """Close the session, cancelling its calls in flight; its recording, or None if it is not open."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None or (session.closed and not session.key):  # unknown, or still opening
                return None
            del self._sessions[session_id]
        here = session.shut()
        if here:
            await asyncio.wait(here)
        return session.result()

    def base_url(self, session: GatewaySession, server_url: str | None = None) -> str:
        """The session's OpenAI base URL on `server_url` (default: the server's public URL)."""
        root = (server_url or self.public_url or "").rstrip("/")
        return f"{root}/sessions/{session.id}/v1"

    async def close_all(self) -> None:
        """Close every session (server shutdown)."""
        with self._lock:
            ids = list(self._sessions)
        for session_id in ids:
            await self.close(session_id)

    async def _expire_idle(self) -> None:
        now = time.monotonic()
        with self._lock:
            idle = [s for s in self._sessions.values() if s.key and s.idle_for(now) > self.limits.idle_timeout_s]
        for session in idle:
            self._expire(session)

    def _expire(self, session: GatewaySession) -> None:
        with self._lock:
            if self._sessions.get(session.id) is not session:
                return
            del self._sessions[session.id]
        session.shut()
        log.info(
            "gateway session %s expired after %.0fs idle; its recording is dropped",
            session.id,
            self.limits.idle_timeout_s,
        )


def _bearer(authorization: str | None) -> bytes:
    if authorization is None:
        return b""
    scheme, _, token = authorization.partition(" ")
    return token.strip().encode() if scheme.lower() == "bearer" else b""
