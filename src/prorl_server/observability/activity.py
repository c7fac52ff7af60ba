"""Recent activity for the dashboard: the last finished jobs, and jobs and tokens per time bucket."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from pydantic import BaseModel

from prorl_server.protocol import JobResult, Trajectory

RECENT_JOBS = 50
"""Finished jobs the dashboard lists."""
BUCKET_S = 5
"""Width of a throughput bucket, in seconds."""
BUCKETS = 120
"""Throughput buckets kept (ten minutes)."""
MAX_MESSAGE_CHARS = 300
"""An error message is cut to this many characters in the list of recent jobs."""


def trajectory_tokens(trajectory: Trajectory) -> int:
    """A trajectory's length: its prompt and response tokens."""
    return len(trajectory.prompt_ids) + len(trajectory.response_ids)


class JobSummary(BaseModel):
    """One finished job as the dashboard lists it."""

    job_id: str
    status: str
    data_source: str | None
    reward: float | None
    tokens: int
    turns: int
    total_s: float
    error: str | None
    finished_at: float


class ThroughputPoint(BaseModel):
    """Jobs that ended and tokens generated in one bucket starting at `t` (Unix seconds)."""

    t: float
    jobs: int
    tokens: int


class RecentActivity:
    """Thread-safe ring buffers of the last finished jobs and of per-bucket throughput."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: deque[JobSummary] = deque(maxlen=RECENT_JOBS)
        self._buckets: deque[list[int]] = deque(maxlen=BUCKETS)  # [bucket index, jobs, tokens], oldest first

    def record(self, result: JobResult) -> None:
        """A job ended with `result`."""
        now = self._clock()
        error = None
        if result.error is not None:
            error = f"{result.error.type}: {result.error.message}"[:MAX_MESSAGE_CHARS]
        summary = JobSummary(
            job_id=result.job_id,
            status=result.status.value,
            data_source=result.data_source,
            reward=result.reward,
            tokens=trajectory_tokens(result.trajectory),
            turns=result.timing.turns,
            total_s=result.timing.total_s,
            error=error,
            finished_at=now,
        )
        with self._lock:
            self._jobs.append(summary)
            self._bucket_locked(now)[1] += 1

    def generated(self, tokens: int) -> None:
        """A completion generated `tokens` tokens."""
        with self._lock:
            self._bucket_locked(self._clock())[2] += tokens

    def recent_jobs(self) -> list[JobSummary]:
        """The last finished jobs, newest first."""
        with self._lock:
            return list(reversed(self._jobs))

    def throughput(self) -> list[ThroughputPoint]:
        """Every bucket of the last `BUCKETS * BUCKET_S` seconds, oldest first (empty buckets as zeros)."""
        now_index = int(self._clock() // BUCKET_S)
        with self._lock:
            counts = {index: (jobs, tokens) for index, jobs, tokens in self._buckets}
        return [
            ThroughputPoint(t=index * BUCKET_S, jobs=counts.get(index, (0, 0))[0], tokens=counts.get(index, (0, 0))[1])
            for index in range(now_index - BUCKETS + 1, now_index + 1)
        ]

    def _bucket_locked(self, now: float) -> list[int]:
        index = int(now // BUCKET_S)
        if not self._buckets or self._buckets[-1][0] < index:
            self._buckets.append([index, 0, 0])
        return self._buckets[-1]
