"""One registered LLM backend and its counters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
    assigned: int = 0
    in_flight: int = 0
    healthy: bool = True
    last_error: str | None = None

    def info(self) -> LLMServerInfo:
        """Snapshot for `GET /llm_servers`."""
        return LLMServerInfo(
            address=self.address,
            weight_version=self.weight_version,
            tags=dict(self.tags),
            model=self.model,
            assigned=self.assigned,
            in_flight=self.in_flight,
            healthy=self.healthy,
            last_error=self.last_error,
        )
