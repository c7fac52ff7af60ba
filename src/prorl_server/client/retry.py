"""When and how long to wait before retrying a request: exponential backoff with jitter, within a budget."""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

RETRY_STATUSES = frozenset({502, 503, 504})
"""Answers that say "try again later": a proxy that failed or timed out, a server that cannot take jobs now."""


@dataclass(frozen=True)
class RetryPolicy:
    """Retry connection errors, timeouts and RETRY_STATUSES, at most `attempts` tries within `budget_s` seconds.

    The n-th retry waits a random time between half and all of `min(max_delay_s, base_delay_s * 2**n)`.
    Every request the client retries is idempotent (a submit carries its job id), so a retry never runs a
    job twice. `RetryPolicy(attempts=1)` turns retries off.
    """

    attempts: int = 5
    budget_s: float = 30.0
    base_delay_s: float = 0.2
    max_delay_s: float = 5.0
    statuses: frozenset[int] = RETRY_STATUSES

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (0 for the first retry)."""
        ceiling = min(self.max_delay_s, self.base_delay_s * 2**retry)
        return ceiling * random.uniform(0.5, 1.0)

    def retryable_status(self, status_code: int) -> bool:
        """True for an answer worth another try."""
        return status_code in self.statuses

    @staticmethod
    def retryable_error(exc: Exception) -> bool:
        """True for a request that got no answer: connection refused or reset, a timeout, a broken protocol."""
        return isinstance(exc, httpx.TransportError)
