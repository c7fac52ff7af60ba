"""ResultStore: finished results, in completion order, kept until acknowledged or expired."""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from prorl_server.protocol import JobResult, JobStatus


class ResultLog(Protocol):
    """Where the store reports its changes (the results journal), in the order they happen."""

    def stored(self, seq: int, result: JobResult, request_digest: str) -> None:
        """A result was stored under cursor `seq`."""

    def removed(self, seqs: list[int]) -> None:
        """Results were acknowledged, or replaced by a newer result of the same job."""


class ResultStore:
    """Thread-safe store of terminal results with a monotonically increasing cursor.

    Each stored result gets a sequence number; `page(after=cursor)` returns results stored after the
    cursor, so a trainer can stream them and resume after reconnecting. A result leaves the store when
    acknowledged or when `retention_s` has passed since it was stored.
    """

    def __init__(
        self,
        retention_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        on_put: Callable[[], None] | None = None,
        on_stored: Callable[[JobResult], None] | None = None,
        on_acknowledged: Callable[[int], None] | None = None,
        log: ResultLog | None = None,
    ) -> None:
        self.retention_s = retention_s
        self._clock = clock
        self._lock = threading.Lock()
        self._next_seq = 1
        self._seqs: list[int] = []  # ascending; may hold seqs of removed entries until compaction
        self._entries: dict[int, tuple[JobResult, float]] = {}
        self._digests: dict[str, str] = {}  # job id -> digest of the request that produced the stored result
        self._by_job: dict[str, int] = {}
        self.on_put = on_put  # each result stored (wakes long polls)
        self.on_stored = on_stored  # metrics: each result stored
        self.on_acknowledged = on_acknowledged  # metrics: how many results an ack removed
        self.log = log  # told of every put and ack under the store's lock (their order): the journal

    def put(self, result: JobResult, request_digest: str = "") -> int:
        """Store a result (replacing an older one of the same job id) with the digest of the request that
        produced it; returns its cursor value."""
        with self._lock:
            self._purge_locked()
            old = self._by_job.pop(result.job_id, None)
            if old is not None and self._entries.pop(old, None) is not None and self.log is not None:
                self.log.removed([old])
            seq = self._next_seq
            self._next_seq += 1
            self._seqs.append(seq)
            self._entries[seq] = (result, self._clock())
            self._by_job[result.job_id] = seq
            self._digests[result.job_id] = request_digest
            if self.log is not None:
                self.log.stored(seq, result, request_digest)
        if self.on_put is not None:
            self.on_put()
        if self.on_stored is not None:
            self.on_stored(result)
        return seq

    def restore(self, entries: Iterable[tuple[int, JobResult, str, float]], next_seq: int) -> None:
        """Put back results kept across a restart, as (seq, result, request digest, age in seconds), in seq
        order; cursors continue from `next_seq`. Their retention counts from when they were first stored."""
        with self._lock:
            now = self._clock()
            for seq, result, digest, age_s in entries:
                self._seqs.append(seq)
                self._entries[seq] = (result, now - age_s)
                self._by_job[result.job_id] = seq
                self._digests[result.job_id] = digest
            self._next_seq = max(self._next_seq, next_seq)

    def get(self, job_id: str) -> JobResult | None:
        """The stored result of a job, if still held."""
        with self._lock:
            self._purge_locked()
            seq = self._by_job.get(job_id)
            return None if seq is None else self._entries[seq][0]

    def get_with_digest(self, job_id: str) -> tuple[JobResult, str] | None:
        """The stored result of a job and the digest of its request, if still held."""
        with self._lock:
            self._purge_locked()
            seq = self._by_job.get(job_id)
            return None if seq is None else (self._entries[seq][0], self._digests[job_id])

    def page(self, statuses: Iterable[JobStatus] | None, after: int, limit: int) -> tuple[list[JobResult], int]:
        """Up to `limit` results stored after cursor `after` (optionally of some statuses), and the
        cursor to pass next time."""
        wanted = set(statuses) if statuses else None
        out: list[JobResult] = []
        cursor = after
        with self._lock:
            self._purge_locked()
            start = bisect.bisect_right(self._seqs, after)
            for seq in self._seqs[start:]:
                entry = self._entries.get(seq)
                if entry is None:
                    continue
                cursor = seq
                if wanted is None or entry[0].status in wanted:
                    out.append(entry[0])
                    if len(out) >= limit:
                        break
        return out, cursor

    def ack(self, job_ids: Iterable[str] = (), through: int | None = None) -> int:
        """Drop results by job id and/or every result up to cursor `through`; returns how many."""
        removed: list[int] = []
        with self._lock:
            for job_id in job_ids:
                seq = self._by_job.pop(job_id, None)
                self._digests.pop(job_id, None)
                if seq is not None and self._entries.pop(seq, None) is not None:
                    removed.append(seq)
            if through is not None:
                for seq in self._seqs[: bisect.bisect_right(self._seqs, through)]:
                    entry = self._entries.pop(seq, None)
                    if entry is not None:
                        self._by_job.pop(entry[0].job_id, None)
                        self._digests.pop(entry[0].job_id, None)
                        removed.append(seq)
            self._compact_locked()
            if removed and self.log is not None:
                self.log.removed(removed)
        if removed and self.on_acknowledged is not None:
            self.on_acknowledged(len(removed))
        return len(removed)

    def __len__(self) -> int:
        with self._lock:
            self._purge_locked()
            return len(self._entries)

    def counts(self) -> dict[str, int]:
        """Stored results per status."""
        with self._lock:
            counts: dict[str, int] = {}
            for result, _ in self._entries.values():
                counts[result.status.value] = counts.get(result.status.value, 0) + 1
            return counts

    def _purge_locked(self) -> None:
        horizon = self._clock() - self.retention_s
        expired = 0
        for seq in self._seqs:
            entry = self._entries.get(seq)
            if entry is None:
                continue
            if entry[1] > horizon:
                break
            del self._entries[seq]
            self._by_job.pop(entry[0].job_id, None)
            self._digests.pop(entry[0].job_id, None)
            expired += 1
        if expired:
            self._compact_locked()

    def _compact_locked(self) -> None:
        if len(self._seqs) > 2 * len(self._entries) + 64:
            self._seqs = [s for s in self._seqs if s in self._entries]
