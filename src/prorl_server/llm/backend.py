"""One registered LLM backend: its counters, health, circuit breaker and measured speed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from prorl_server.llm.circuit import CircuitBreaker, CircuitState
from prorl_server.llm.local_tokenizer import ChatTokenizer
from prorl_server.protocol import LLMServerInfo


@dataclass(eq=False)
class Backend:
    """A vLLM-compatible server; mutated only under the pool's lock."""

    address: str
    order: int
    weight_version: str | int | None = None
    tags: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    max_model_len: int | None = None  # the served model's context length, when the backend says
    vocab_size: int | None = None  # its vocabulary size, when the backend says
    root: str | None = None  # where the backend loaded its model from (vLLM's `root` in /v1/models)
    tokenization: Literal["local", "backend"] | None = None  # once decided (BackendPool.resolve_model)
    chat_tokenizer: ChatTokenizer | None = None  # with "local": the tokenizer its chats are tokenized with
    assigned: int = 0
    in_flight: int = 0  # jobs pinned to it
    calls_in_flight: int = 0  # calls sent to it and not yet over
    migrations: int = 0  # jobs moved onto it by a trajectory-aware placement at a tool-call boundary
    healthy: bool = True  # the last health check passed (or none has run yet)
    last_error: str | None = None
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    tokens_per_s: float | None = None  # moving average of output speed, for stall timeouts

    @property
    def placeable(self) -> bool:
        """Healthy, and its circuit lets a request through now."""
        return self.healthy and self.breaker.admits_request()

    def info(self) -> LLMServerInfo:
        """Snapshot for `GET /llm_servers`."""
        return LLMServerInfo(
            address=self.address,
            weight_version=self.weight_version,
            tags=dict(self.tags),
            model=self.model,
            assigned=self.assigned,
            in_flight=self.in_flight,
            migrations=self.migrations,
            healthy=self.healthy,
            last_error=self.last_error,
            circuit=self.breaker.state.value,
            consecutive_failures=self.breaker.consecutive_failures,
            tokens_per_s=self.tokens_per_s,
            tokenization=self.tokenization,
        )


def why_none_placeable(backends: list[Backend]) -> str:
    """Why no backend of `backends` (the pool's, oldest first) takes a request now: the message of
    NoBackendAvailable, naming at most 8 of them with their reason and last error."""
    if not backends:
        return 'no LLM backend registered; POST /add_llm_server {"address": "http://host:port/v1"}'
    reasons = []
    for backend in backends[:8]:
        if not backend.healthy:
            why = "unhealthy (fails its health check)"
        elif backend.breaker.state is CircuitState.OPEN:
            why = f"circuit open after {backend.breaker.consecutive_failures} failed request(s)"
        else:
            why = "circuit half-open, its trial request under way"
        last = f"; last error: {backend.last_error[:300]}" if backend.last_error else ""
        reasons.append(f"{backend.address} {why}{last}")
    return f"all {len(backends)} registered LLM backends are out of placement: " + " | ".join(reasons)
