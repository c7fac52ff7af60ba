"""How long and how often an LLM call retries while its backends fail or none can take it."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """A call retries for at most `budget_s`; waits grow exponentially from `base_delay_s` to `max_delay_s`."""

    budget_s: float = 120.0
    base_delay_s: float = 0.1
    max_delay_s: float = 2.0

    def delay_s(self, attempt: int) -> float:
        """The wait before retry number `attempt` (from 0): half fixed, half random, so the retries of
        many jobs that failed together spread out."""
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** min(attempt, 30))
        return ceiling / 2 + random.uniform(0, ceiling / 2)
