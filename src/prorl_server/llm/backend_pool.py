"""The pool of LLM backends: registration, sticky per-job placement, circuit breakers, health, speed."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, replace
from typing import Any

from prorl_server.llm.admission import AdmissionGate
from prorl_server.llm.backend import Backend, why_none_placeable
from prorl_server.llm.backend_health import HealthChecks
from prorl_server.llm.backend_models import BackendModels
from prorl_server.llm.circuit import CircuitBreaker, CircuitState
from prorl_server.llm.errors import NoBackendAvailable
from prorl_server.llm.local_tokenizer import ChatTokenizer, TokenizerCache
from prorl_server.llm.placement import PlacementPolicy, TrajectoryAwarePolicy, make_policy
from prorl_server.llm.retry import RetryPolicy
from prorl_server.llm.stall import STALL_FLOOR_S, derived_stall_timeout_s, updated_speed
from prorl_server.llm.template_shape import TemplateShape
from prorl_server.llm.vllm_client import VLLMClient
from prorl_server.llm.weight_pause_gate import Ticket, WeightPauseGate
from prorl_server.llm.weight_update import WeightVersions
from prorl_server.scheduling import TrajectoryView

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Lease:
    """The backend one request goes to; `trial` when it is the trial request of a half-open circuit."""

    backend: Backend
    trial: bool


@dataclass(slots=True)
class BackendNotes:
    """What the server learned about one backend address, kept until it leaves the pool."""

    template_shape: TemplateShape | None = None  # its chat template around an assistant message
    weights_path: str | None = None  # the checkpoint it last reloaded, loaded back on a failure (weight_update.py)


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """The weight version and the backend set at one moment, to go back to (a weight update's rollback)."""

    version: str | int | None
    backends: tuple[tuple[Backend, str | int | None, dict[str, Any]], ...]  # each with its version and tags then
    notes: dict[str, BackendNotes]  # copies, per address


class BackendPool:
    """Thread-safe set of backends. Jobs are pinned to one backend for all their turns (with a sticky
    placement policy; `least_loaded` chooses anew at every call, and `presorted_dp` may move a job at a
    tool-call boundary: `before_completion`).

    Each backend has a circuit breaker (`circuit.py`): `failure_threshold` failed requests in a row take
    it out of placement until its cooldown is over and a health check passes; then one trial request
    decides whether it returns. Health checks are a separate verdict: a backend failing them is out of
    placement until one passes, and only when every registered backend fails them does the server
    refuse new jobs. Jobs pinned to a backend that left placement are re-placed on their next call.

    With a `tokenizer_cache`, each backend's chat tokenization is decided once, with its model (at its
    first health check or call): in the server when a local tokenizer (`tokenizer_path`, else found from
    the model, `local_tokenizer.find_tokenizer_dir`) gives the backend's own ids on every probe
    (`tokenizer_check`), else by the backend's `/tokenize`; each decision is logged and told to
    `on_tokenization`. Without one, every backend tokenizes.
    """

    def __init__(
        self,
        client: VLLMClient,
        policy: str | PlacementPolicy = "sticky_least_loaded",
        *,
        failure_threshold: int = 3,
        breaker_cooldown_s: float = 5.0,
        retry: RetryPolicy | None = None,
        stall_timeout_s: float | None = None,
        max_inflight_per_backend: int | None = None,
        tokenizer_cache: TokenizerCache | None = None,
        tokenizer_path: str | None = None,
        on_completion: Callable[[str, int, int, float], None] | None = None,
        on_failure: Callable[[str], None] | None = None,
        on_tokenization: Callable[[str, str], None] | None = None,
    ) -> None:
        self.client = client
        self.tokenizer_cache = tokenizer_cache
        self.tokenizer_path = tokenizer_path
        self.max_inflight_per_backend = max_inflight_per_backend
        self.policy: PlacementPolicy = make_policy(policy) if isinstance(policy, str) else policy
        # checked once: isinstance against a runtime-checkable Protocol costs microseconds per call
        self._trajectory_aware = self.policy if isinstance(self.policy, TrajectoryAwarePolicy) else None
        self.retry = retry or RetryPolicy()
        self.stall_timeout_s = stall_timeout_s
        self._failure_threshold = failure_threshold
        self._breaker_cooldown_s = breaker_cooldown_s
        self._lock = threading.Lock()
        self._models = BackendModels(self, self._lock)
        self._health = HealthChecks(self, self._lock)
        self._backends: dict[str, Backend] = {}
        self._pins: dict[str, Backend] = {}
        self._order = itertools.count()
        self._notes: dict[str, BackendNotes] = {}  # per backend address
        self.gate = WeightPauseGate()  # held closed by the trainer during weight updates (api/weights.py)
        self.versions = WeightVersions()  # every weight version set so far, and the current one
        self._calls: dict[Ticket, Backend] = {}  # calls admitted by the gate -> the backend they went to
        self._admission: dict[str, AdmissionGate] = {}  # per backend address, with max_inflight_per_backend
        # metrics: each answered completion (address, prompt tokens, output tokens, seconds), each failed request
        self.on_completion = on_completion
        self.on_failure = on_failure
        # each backend's tokenization decision: (address, "local" or why not: not_found, unloadable, differs)
        self.on_tokenization = on_tokenization

    # registration -----------------------------------------------------------------------------

    def add(self, address: str, weight_version: str | int | None = None, tags: dict | None = None) -> Backend:
        """Register a backend; registering a known address updates its weight version and tags."""
        address = address.rstrip("/")
        with self._lock:
            backend = self._registered(address)
            backend.weight_version = weight_version
            backend.tags = dict(tags or {})
            backend.healthy = True
            backend.last_error = None
            self.versions.registered(weight_version)
            return backend

    def _registered(self, address: str) -> Backend:
        """The backend at `address`, registered now if new (the lock held)."""
        backend = self._backends.get(address)
        if backend is None:
            breaker = CircuitBreaker(self._failure_threshold, self._breaker_cooldown_s)
            backend = self._backends[address] = Backend(address=address, order=next(self._order), breaker=breaker)
        return backend

    def _forget_all_but(self, kept: Collection[str]) -> None:
        """Remove every backend whose address is not in `kept`, with its health record and notes (the lock held)."""
        for address in [a for a in self._backends if a not in kept]:
            del self._backends[address]
            self._health.forget(address)
            self._notes.pop(address, None)

    # weight versions ----------------------------------------------------------------------------

    @property
    def current_version(self) -> str | int | None:
        """The version last set by `set_weight_version`."""
        return self.versions.current

    def set_weight_version(
        self, version: str | int, servers: list[tuple[str, dict | None]] | None = None
    ) -> list[Backend]:
        """Set `version` on every backend; with `servers` ((address, tags) pairs), make them the backend set
        instead (each at `version`; the others are removed, and jobs pinned to them are re-placed on their
        next call, which sends the whole token context again). Returns the backends, oldest first."""
        with self._lock:
            self.versions.set(version)
            if servers is None:
                for backend in self._backends.values():
                    backend.weight_version = version
                return sorted(self._backends.values(), key=lambda b: b.order)
            wanted = {address.rstrip("/"): tags for address, tags in servers}
            self._forget_all_but(wanted)
            for address, tags in wanted.items():
                backend = self._registered(address)
                if tags is not None:  # a kept backend keeps its tags unless new ones are given
                    backend.tags = dict(tags)
            for backend in self._backends.values():
                backend.weight_version = version
            return sorted(self._backends.values(), key=lambda b: b.order)

    def snapshot(self) -> PoolSnapshot:
        """The current version, the backends (with their versions and tags) and their notes, for `restore`."""
        with self._lock:
            backends = sorted(self._backends.values(), key=lambda b: b.order)
            return PoolSnapshot(
                self.versions.current,
                tuple((b, b.weight_version, dict(b.tags)) for b in backends),
                {address: replace(notes) for address, notes in self._notes.items()},
            )

    def restore(self, snapshot: PoolSnapshot, undone: str | int) -> bool:
        """Go back to `snapshot` after the update that set version `undone` (which may then be set again): the
        backend set (the removed backends come back as they were, the added ones leave, and jobs pinned to
        those move on their next call), each backend's version, tags and last checkpoint, and the current
        version. True when the backend set changed."""
        with self._lock:
            self.versions.unset(undone, snapshot.version)
            wanted = {backend.address: (backend, version, tags) for backend, version, tags in snapshot.backends}
            changed = wanted.keys() != self._backends.keys()
            self._forget_all_but(wanted)
            for address, (backend, version, tags) in wanted.items():
                backend.weight_version, backend.tags = version, dict(tags)
                self._backends[address] = backend
                before = snapshot.notes.get(address)
                notes = self._notes.get(address)
                if notes is None and before is not None:
                    self._notes[address] = replace(before)
                elif notes is not None:
                    notes.weights_path = before.weights_path if before is not None else None
            return changed

    def remove(self, address: str, abort: bool = False) -> tuple[Backend, int, int] | None:
        """Drain one backend: it leaves the pool at once (no new job or call goes to it), jobs pinned to it
        move to another backend on their next call (resending their whole token context there), and its
        calls in flight finish, or with `abort` are closed now and sent again elsewhere (nothing of them is
        kept; no backend failure is counted). With no backend left, calls wait within their retry budget
        for one to be added. Returns (the backend, jobs pinned to it, calls aborted), None if unknown."""
        address = address.rstrip("/")
        with self._lock:
            backend = self._backends.pop(address, None)
            if backend is None:
                return None
            self._health.forget(address)
            self._notes.pop(address, None)
            pinned = sum(b is backend for b in self._pins.values())
            aborted = 0
            if abort:
                for ticket in [t for t, b in self._calls.items() if b is backend]:
                    aborted += self.gate.abort(ticket)
        return backend, pinned, aborted

    def calls_on(self, backend: Backend) -> int:
        """Calls in flight on `backend` (also after it was removed)."""
        with self._lock:
            return sum(b is backend for b in self._calls.values())

    def clear(self) -> int:
        """Forget every backend (jobs in flight finish their current call; next calls re-place)."""
        with self._lock:
            count = len(self._backends)
            self._backends.clear()
            self._notes.clear()
            self._health.forget()
            return count

    def backends(self) -> list[Backend]:
        """A snapshot list of registered backends, oldest first."""
        with self._lock:
            return sorted(self._backends.values(), key=lambda b: b.order)

    def counts(self) -> tuple[int, int]:
        """(registered, passing their health checks)."""
        with self._lock:
            return len(self._backends), sum(b.healthy for b in self._backends.values())

    # placement --------------------------------------------------------------------------------

    def acquire(self, job_id: str, avoid: Collection[str] = (), ticket: Ticket | None = None) -> Lease:
        """The backend for the job's next request: its pinned one while that is placeable and not in
        `avoid` (addresses this call already failed on), else one chosen by policy, preferring backends
        outside `avoid`. Raises NoBackendAvailable when no backend is placeable now.

        With the call's gate `ticket`, the call counts as in flight on the backend until `done(ticket)`
        (so that `remove(abort=True)` can abort it)."""
        with self._lock:
            lease = self._acquire_locked(job_id, avoid)
            if ticket is not None:
                self._calls[ticket] = lease.backend
                lease.backend.calls_in_flight += 1
            return lease

    def done(self, ticket: Ticket) -> None:
        """The call of `ticket` is over (idempotent)."""
        with self._lock:
            backend = self._calls.pop(ticket, None)
            if backend is not None:
                backend.calls_in_flight -= 1

    def before_completion(self, job_id: str, view: Callable[[], TrajectoryView]) -> None:
        """A job's completion is about to be sent (`view`: its trajectory so far). A trajectory-aware policy
        places the job here at its first completion, and at a later one (a tool-call boundary: nothing runs
        for the job) may move it to another backend, to which the completion then resends the whole token
        context, as after a drain. Other policies ignore it."""
        policy = self._trajectory_aware
        if policy is None:
            return
        snapshot = view()
        with self._lock:
            placeable = sorted((b for b in self._backends.values() if b.placeable), key=lambda b: b.order)
            if not placeable:
                return  # the call itself waits for a backend and is placed by `choose`
            pinned = self._pins.get(job_id)
            current = pinned if pinned in placeable else None
            target = policy.before_completion(job_id, snapshot, current, placeable)
            if target is None or target is pinned:
                return
            if pinned is not None:
                pinned.in_flight -= 1
            target.in_flight += 1
            self._pins[job_id] = target

    def _acquire_locked(self, job_id: str, avoid: Collection[str]) -> Lease:
        pinned = self._pins.get(job_id)
        live = pinned is not None and self._backends.get(pinned.address) is pinned and pinned.placeable
        if live and pinned.address not in avoid and self.policy.sticky:
            return Lease(pinned, pinned.breaker.start_request())
        placeable = [b for b in self._backends.values() if b.placeable]
        fresh = [b for b in placeable if b.address not in avoid]
        if live and not fresh:  # nowhere else to go: stay on the pinned backend
            return Lease(pinned, pinned.breaker.start_request())
        if not placeable:
            raise NoBackendAvailable(why_none_placeable(sorted(self._backends.values(), key=lambda b: b.order)))
        if pinned is not None:
            pinned.in_flight -= 1
            del self._pins[job_id]
        chosen = self.policy.choose(sorted(fresh or placeable, key=lambda b: b.order))
        chosen.in_flight += 1
        self._pins[job_id] = chosen
        return Lease(chosen, chosen.breaker.start_request())

    def local_tokenizer(self, job_id: str) -> ChatTokenizer | None:
        """The tokenizer the job's chats are tokenized with in the server: its pinned backend's, while that
        is placeable; unpinned, the one every placeable backend shares. None when the backend's /tokenize
        is to be used."""
        with self._lock:
            pinned = self._pins.get(job_id)
            if pinned is not None and self._backends.get(pinned.address) is pinned and pinned.placeable:
                return pinned.chat_tokenizer
            shared = {id(b.chat_tokenizer): b.chat_tokenizer for b in self._backends.values() if b.placeable}
            return next(iter(shared.values())) if len(shared) == 1 else None

    def release(self, job_id: str) -> None:
        """Unpin a job (idempotent)."""
        with self._lock:
            pinned = self._pins.pop(job_id, None)
            if pinned is not None:
                pinned.in_flight -= 1
            if self._trajectory_aware is not None:
                self._trajectory_aware.forget(job_id)

    def succeeded(self, lease: Lease) -> None:
        """The backend answered the request (a rejection counts: it works)."""
        backend = lease.backend
        with self._lock:
            before = backend.breaker.record_success(lease.trial)
            if backend.breaker.state is CircuitState.CLOSED:
                backend.last_error = None
        if before is not CircuitState.CLOSED and lease.trial:
            log.info("LLM backend %s answered its trial request; circuit closed", backend.address)

    def failed(self, lease: Lease, error: str) -> None:
        """The request failed on the backend: count it, and open its circuit past the threshold."""
        backend = lease.backend
        with self._lock:
            opened = backend.breaker.record_failure(lease.trial)
            backend.last_error = error
            failures, cooldown = backend.breaker.consecutive_failures, backend.breaker.cooldown_s
        if self.on_failure is not None:
            self.on_failure(backend.address)
        if opened:
            log.warning(
                "LLM backend %s out of placement for at least %gs after %d failed request(s): %s",
                backend.address,
                cooldown,
                failures,
                error,
            )

    def abandoned(self, lease: Lease) -> None:
        """The request ended without a verdict (cancelled); a trial request may be tried again."""
        if lease.trial:
            with self._lock:
                lease.backend.breaker.abandon_trial()

    # admission ----------------------------------------------------------------------------------

    def admission(self, backend: Backend) -> AdmissionGate | None:
        """The admission gate of `backend`'s completions (None: unlimited, `max_inflight_per_backend` unset).
        A backend's gate outlives its removal, so its calls still in flight release their slots."""
        if self.max_inflight_per_backend is None:
            return None
        with self._lock:
            gate = self._admission.get(backend.address)
            if gate is None:
                gate = self._admission[backend.address] = AdmissionGate(self.max_inflight_per_backend)
            return gate

    def admission_counts(self) -> tuple[int, int]:
        """(completions waiting for an admission slot, completions holding one), over every backend."""
        with self._lock:
            gates = list(self._admission.values())
        return sum(g.waiting for g in gates), sum(g.admitted for g in gates)

    # speed and stall timeouts -------------------------------------------------------------------

    def observe_completion(self, backend: Backend, prompt_tokens: int, output_tokens: int, seconds: float) -> None:
        """One completion answered: fold its output speed into the backend's moving average (and tell
        `on_completion`)."""
        with self._lock:
            backend.tokens_per_s = updated_speed(backend.tokens_per_s, output_tokens, seconds)
        if self.on_completion is not None:
            self.on_completion(backend.address, prompt_tokens, output_tokens, seconds)

    def completion_timeout(self, backend: Backend, max_new_tokens: int | None) -> float | None:
        """Stall timeout of a completion: the configured one, else derived from `max_new_tokens` and the
        backend's speed (None when the length is unknown: only the request timeout applies)."""
        if self.stall_timeout_s is not None:
            return self.stall_timeout_s
        if max_new_tokens is None:
            return None
        return derived_stall_timeout_s(max_new_tokens, backend.tokens_per_s)

    @property
    def short_call_timeout(self) -> float:
        """Stall timeout of tokenize, detokenize and model queries."""
        return self.stall_timeout_s if self.stall_timeout_s is not None else STALL_FLOOR_S

    # per-backend notes -------------------------------------------------------------------------

    def notes(self, backend: Backend) -> BackendNotes:
        """What is kept about `backend`'s address (its chat template's shape, its last checkpoint) until it
        leaves the pool."""
        with self._lock:
            notes = self._notes.get(backend.address)
            if notes is None:
                notes = self._notes[backend.address] = BackendNotes()
            return notes

    # models and tokenization (backend_models.py) ---------------------------------------------------

    async def resolve_model(self, backend: Backend) -> str | None:
        """The served model name (and context length, vocabulary size, root), asked once per backend; then,
        with a tokenizer cache, its tokenization decided once (a call that comes meanwhile waits for it)."""
        return await self._models.resolve(backend)

    def tokenize_chat(
        self,
        backend: Backend,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        client: VLLMClient | None = None,
    ) -> Awaitable[list[int]]:
        """`backend`'s `/tokenize` of the chat template of `messages`, as ids checked against its vocabulary
        (sent by `client`, default the pool's)."""
        return self._models.tokenize_chat(backend, messages, add_generation_prompt, tools, client)

    # health (backend_health.py) -----------------------------------------------------------------------

    async def check_health(self, backends: list[Backend] | None = None) -> None:
        """Probe backends (all by default) once; a pass lets an open circuit whose cooldown is over
        take a trial request."""
        await self._health.check(backends)

    async def health_loop(self, interval_s: float) -> None:
        """Check every backend each `interval_s` seconds, and an open circuit as soon as its cooldown
        ends, until cancelled."""
        await self._health.loop(interval_s)
