"""The jobs admitted and not yet ended, by id: what admission, cancellation and the health report look up."""

from __future__ import annotations

import threading
from collections.abc import Callable

from prorl_server.pipeline.job import Job


class LiveJobs:
    """The live jobs by id (thread-safe). A job is added at admission and removed once its result is stored."""

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def get(self, job_id: str) -> Job | None:
        """The live job with that id, or None."""
        with self._lock:
            return self._jobs.get(job_id)

    def snapshot(self) -> list[Job]:
        """The live jobs now."""
        with self._lock:
            return list(self._jobs.values())

    def add(self, job: Job, on_added: Callable[[], None]) -> Job:
        """Add `job` unless a live job has its id, and call `on_added` under the lock (before anything can end
        the job). Returns the live job holding the id: `job`, or the one admitted meanwhile."""
        with self._lock:
            live = self._jobs.get(job.id)
            if live is not None:
                return live
            self._jobs[job.id] = job
            on_added()
            return job

    def remove(self, job: Job) -> None:
        """Forget `job` (if its id still names it)."""
        with self._lock:
            if self._jobs.get(job.id) is job:
                del self._jobs[job.id]

    def __len__(self) -> int:
        with self._lock:
            return len(self._jobs)
