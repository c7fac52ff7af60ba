"""Idempotent submission: the same request under the same `job_id` is one job, however often it is sent.

A trainer (or its client's retry after a lost answer) may post a job again. The server compares a digest
of the request with the one of the job holding that id, live or finished and still stored: the same
request gets that job back (never a second run); a different one is refused (409).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from prorl_server.protocol import JobResult, ProcessRequest


def request_digest(request: ProcessRequest) -> str:
    """A digest of everything a request asks for (key order does not matter)."""
    canonical = json.dumps(request.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class FinishedJob:
    """A job that already ran, as a repeated submission sees it: its id and its stored result."""

    result: JobResult

    @property
    def id(self) -> str:
        return self.result.job_id

    async def wait(self) -> JobResult:
        """The result at once (the job is terminal)."""
        return self.result
