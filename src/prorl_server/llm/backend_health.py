"""Health checks of the pool's backends: each round probes them all, and an open circuit is probed as
soon as its cooldown ends (a pass lets it take a trial request)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING

from prorl_server.llm.backend import Backend
from prorl_server.llm.circuit import CircuitState
from prorl_server.llm.errors import LLMError

if TYPE_CHECKING:
    from prorl_server.llm.backend_pool import BackendPool

log = logging.getLogger("prorl_server.llm.backend_pool")  # the pool's log, as before the split

_HEALTH_TICK_S = 0.2  # how often the health loop looks for an open circuit whose cooldown just ended


class HealthChecks:
    """The health checks of `pool`'s backends; their verdicts are set under `lock` (the pool's)."""

    def __init__(self, pool: BackendPool, lock: threading.Lock) -> None:
        self.pool = pool
        self._lock = lock
        self._probed_at: dict[str, float] = {}  # per address: when its last probe started

    def forget(self, address: str | None = None) -> None:
        """Forget when `address` (every address: None) was last probed; call under the pool's lock."""
        if address is None:
            self._probed_at.clear()
        else:
            self._probed_at.pop(address, None)

    async def check(self, backends: list[Backend] | None = None) -> None:
        """Probe backends (all by default) once; a pass lets an open circuit whose cooldown is over
        take a trial request."""
        backends = self.pool.backends() if backends is None else backends
        started = time.monotonic()
        results = await asyncio.gather(*(self.pool.client.healthy(b.address) for b in backends))
        undecided: list[Backend] = []
        for backend, (ok, error) in zip(backends, results, strict=True):
            with self._lock:
                self._probed_at[backend.address] = started
                was = backend.healthy
                backend.healthy = ok
                half_open = ok and backend.breaker.health_passed()
                if not ok:
                    backend.last_error = error
                elif backend.breaker.state is CircuitState.CLOSED and not backend.breaker.consecutive_failures:
                    backend.last_error = None
            if ok and self.pool.tokenizer_cache is not None and backend.tokenization is None:
                undecided.append(backend)
            if half_open:
                log.info("LLM backend %s passed a health check; one trial request may go to it", backend.address)
            if ok and not was:
                log.info("LLM backend %s is healthy again", backend.address)
            elif was and not ok:
                log.warning("LLM backend %s failed its health check: %s", backend.address, error)
        await asyncio.gather(*(self._resolve_quietly(b) for b in undecided))

    async def _resolve_quietly(self, backend: Backend) -> None:
        """Resolve a newly healthy backend's model and tokenization now rather than at its first call."""
        try:
            await self.pool.resolve_model(backend)
        except LLMError as exc:
            log.info("LLM backend %s: model not resolved yet: %s", backend.address, exc)

    def _trials_due(self) -> list[Backend]:
        """Open circuits whose cooldown ended after their last probe: probing them now starts a trial."""
        now = time.monotonic()
        backends = self.pool.backends()
        with self._lock:
            return [
                b
                for b in backends
                if b.breaker.state is CircuitState.OPEN
                and self._probed_at.get(b.address, 0.0) < b.breaker.opened_at + b.breaker.cooldown_s <= now
            ]

    async def loop(self, interval_s: float) -> None:
        """Check every backend each `interval_s` seconds, and an open circuit as soon as its cooldown
        ends, until cancelled."""
        next_round = 0.0
        while True:
            try:
                if time.monotonic() >= next_round:
                    next_round = time.monotonic() + interval_s
                    await self.pool.check_health()
                elif due := self._trials_due():
                    await self.pool.check_health(due)
            except Exception:  # a bug in one probe round must not end health checking
                log.exception("health check round failed")
            await asyncio.sleep(max(0.0, min(_HEALTH_TICK_S, next_round - time.monotonic())))
