"""The pool of LLM backends: registration, sticky per-job placement, health."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from typing import Any

from prorl_server.llm.backend import Backend
from prorl_server.llm.errors import NoBackendAvailable
from prorl_server.llm.placement import PlacementPolicy, make_policy
from prorl_server.llm.vllm_client import VLLMClient

log = logging.getLogger(__name__)


class BackendPool:
    """Thread-safe set of backends. Jobs are pinned to one backend for all their turns.

    A backend that fails a request or a health check is marked unhealthy and gets no new jobs;
    jobs pinned to it are re-placed on their next call. It comes back when a health check passes.
    """

    def __init__(self, client: VLLMClient, policy: str | PlacementPolicy = "sticky_least_loaded") -> None:
        self.client = client
        self.policy: PlacementPolicy = make_policy(policy) if isinstance(policy, str) else policy
        self._lock = threading.Lock()
        self._backends: dict[str, Backend] = {}
        self._pins: dict[str, Backend] = {}
        self._order = itertools.count()
        self._cache: dict[tuple[str, str], Any] = {}

    # registration -----------------------------------------------------------------------------

    def add(self, address: str, weight_version: str | int | None = None, tags: dict | None = None) -> Backend:
        """Register a backend; registering a known address updates its weight version and tags."""
        address = address.rstrip("/")
        with self._lock:
            backend = self._backends.get(address)
            if backend is None:
                backend = Backend(address=address, order=next(self._order))
                self._backends[address] = backend
            backend.weight_version = weight_version
            backend.tags = dict(tags or {})
            backend.healthy = True
            backend.last_error = None
            return backend

    def clear(self) -> int:
        """Forget every backend (jobs in flight finish their current call; next calls re-place)."""
        with self._lock:
            count = len(self._backends)
            self._backends.clear()
            self._cache.clear()
            return count

    def backends(self) -> list[Backend]:
        """A snapshot list of registered backends, oldest first."""
        with self._lock:
            return sorted(self._backends.values(), key=lambda b: b.order)

    def counts(self) -> tuple[int, int]:
        """(registered, healthy)."""
        with self._lock:
            return len(self._backends), sum(b.healthy for b in self._backends.values())

    # placement --------------------------------------------------------------------------------

    def acquire(self, job_id: str) -> Backend:
        """The backend pinned to `job_id`, pinning one by policy when there is none or it left."""
        with self._lock:
            pinned = self._pins.get(job_id)
            if pinned is not None and pinned.healthy and self._backends.get(pinned.address) is pinned:
                return pinned
            if pinned is not None:
                pinned.in_flight -= 1
                del self._pins[job_id]
            candidates = [b for b in self._backends.values() if b.healthy]
            if not candidates:
                total = len(self._backends)
                raise NoBackendAvailable(
                    'no LLM backend registered; POST /add_llm_server {"address": "http://host:port/v1"}'
                    if total == 0
                    else f"all {total} registered LLM backends are unhealthy (see GET /llm_servers)"
                )
            chosen = self.policy.choose(sorted(candidates, key=lambda b: b.order))
            chosen.in_flight += 1
            self._pins[job_id] = chosen
            return chosen

    def release(self, job_id: str) -> None:
        """Unpin a job (idempotent)."""
        with self._lock:
            pinned = self._pins.pop(job_id, None)
            if pinned is not None:
                pinned.in_flight -= 1

    def mark_unhealthy(self, backend: Backend, error: str) -> None:
        """Take a backend out of placement after a failure."""
        with self._lock:
            if backend.healthy:
                log.warning("LLM backend %s marked unhealthy: %s", backend.address, error)
            backend.healthy = False
            backend.last_error = error

    # per-backend cache -------------------------------------------------------------------------

    def cached(self, backend: Backend, key: str) -> Any:
        """A value cached for this backend (for example chat-template constants), or None."""
        with self._lock:
            return self._cache.get((backend.address, key))

    def cache(self, backend: Backend, key: str, value: Any) -> None:
        """Cache a value for this backend until it is cleared."""
        with self._lock:
            self._cache[(backend.address, key)] = value

    async def resolve_model(self, backend: Backend) -> str | None:
        """The served model name (and context length), asked once per backend."""
        if backend.model is None:
            served = await self.client.served_model(backend.address)
            backend.model, backend.max_model_len = served.id, served.max_model_len
        return backend.model

    # health -------------------------------------------------------------------------------------

    async def check_health(self) -> None:
        """Probe every backend once and update its health flag."""
        backends = self.backends()
        results = await asyncio.gather(*(self.client.healthy(b.address) for b in backends))
        for backend, (ok, error) in zip(backends, results, strict=True):
            with self._lock:
                was = backend.healthy
                backend.healthy = ok
                backend.last_error = None if ok else error
            if ok and not was:
                log.info("LLM backend %s is healthy again", backend.address)
            elif was and not ok:
                log.warning("LLM backend %s failed its health check: %s", backend.address, error)

    async def health_loop(self, interval_s: float) -> None:
        """Check health every `interval_s` seconds until cancelled."""
        while True:
            try:
                await self.check_health()
            except Exception:  # a bug in one probe round must not end health checking
                log.exception("health check round failed")
            await asyncio.sleep(interval_s)
