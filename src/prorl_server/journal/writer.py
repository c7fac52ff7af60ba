"""JournalWriter: the one thread that feeds the journal's writer process, so the event loop and the stage
threads never wait for the disk.

Callers enqueue changes (a job admitted, a result stored, results acknowledged) in the order they happen;
the thread takes whatever has queued up and has the writer process commit it in one transaction (group
commit: under load, one commit covers many changes). `durable()` lets a request wait, without blocking its event loop, until every
change made before it is committed."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from prorl_server.journal.database import Batch
from prorl_server.journal.process import WriterProcess
from prorl_server.protocol import JobResult, ProcessRequest
from prorl_server.threadsafe import try_call_in_loop

log = logging.getLogger(__name__)

MAX_BATCH = 2048
"""Changes per transaction, at most."""

COMMIT_INTERVAL_S = 0.002
"""Commits start at least this far apart: under load, what queues up meanwhile shares one commit (a commit,
with its round trip to the writer process and its thread wake-ups, costs several times what one more row
in it costs). A change that comes after a quiet spell is committed at once, and so is a batch that someone
waits for (`durable()`) while no job is in flight: then no result is coming that could share the commit (one
request at a time pays the commit, not the interval). A result is committed at most this much later than it
would be without."""


@dataclass(frozen=True)
class _Admitted:
    job_id: str
    digest: str
    request: ProcessRequest


@dataclass(frozen=True)
class _Stored:
    seq: int
    result: JobResult
    digest: str


@dataclass(frozen=True)
class _Removed:
    seqs: list[int]


@dataclass(frozen=True)
class _Barrier:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


_STOP = object()


class JournalWriter:
    """Sends queued changes, in batches, to the writer process from its own thread; has the journal compacted
    every `compact_interval_s` (results past `retention_s` deleted, free pages given back)."""

    def __init__(self, process: WriterProcess, path: Path, retention_s: float, compact_interval_s: float) -> None:
        self._process = process
        self._path = path
        self._retention_s = retention_s
        self._compact_interval_s = compact_interval_s
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._count_lock = threading.Lock()
        self._open: set[str] = set()  # jobs admitted and not yet stored
        self._waiting = 0  # durable() calls not yet released
        self._kick = threading.Event()  # ends the writer's wait between commits: a waiter, and no job in flight
        self._enqueued = 0  # changes queued so far
        self._written = 0  # changes committed (or given up on after a write error) so far
        self._failing = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="prorl-journal", daemon=True)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    # changes (any thread) -------------------------------------------------------------------------

    def admitted(self, job_id: str, digest: str, request: ProcessRequest) -> None:
        """A job was admitted: keep its request until it has a result."""
        self._put(_Admitted(job_id, digest, request))

    def stored(self, seq: int, result: JobResult, request_digest: str) -> None:
        """A result was stored under cursor `seq` (it replaces the job's in-flight entry)."""
        self._put(_Stored(seq, result, request_digest))

    def removed(self, seqs: list[int]) -> None:
        """Results were acknowledged, or replaced by a newer result of the same job."""
        self._put(_Removed(seqs))

    def _put(self, change: object) -> None:
        with self._count_lock:
            if self._closed:
                return
            if isinstance(change, _Admitted):
                self._open.add(change.job_id)
            elif isinstance(change, _Stored):
                self._open.discard(change.result.job_id)
            self._enqueued += 1
            self._queue.put(change)
            self._kick_if_nothing_in_flight()

    def _kick_if_nothing_in_flight(self) -> None:
        if self._waiting and not self._open:
            self._kick.set()

    async def durable(self) -> None:
        """Return once every change queued before this call is committed (at once if there is none)."""
        if self._written >= self._enqueued:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._count_lock:
            if self._closed:  # close() writes everything queued before it returns
                return
            self._waiting += 1
            self._queue.put(_Barrier(loop, future))
            self._kick_if_nothing_in_flight()
        await future

    # the writer thread ----------------------------------------------------------------------------

    def close(self) -> None:
        """Write everything queued, then stop the thread and the writer process (idempotent)."""
        with self._count_lock:
            if self._closed:
                return
            self._closed = True
            self._queue.put(_STOP)
            self._kick.set()
        if self._thread.is_alive():
            self._thread.join()
        self._process.close()

    def _run(self) -> None:
        next_compaction = time.monotonic() + self._compact_interval_s
        last_commit = 0.0
        stop = False
        while not stop:
            timeout = max(0.0, next_compaction - time.monotonic())
            try:
                batch = [self._queue.get(timeout=timeout)]
            except queue.Empty:
                batch = []
            wait = last_commit + COMMIT_INTERVAL_S - time.monotonic()
            if batch and wait > 0:
                self._kick.wait(wait)
            self._kick.clear()  # before taking the batch: a kick for a change taken later stays set
            while len(batch) < MAX_BATCH:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = any(change is _STOP for change in batch)
            changes = [c for c in batch if not isinstance(c, _Barrier) and c is not _STOP]
            if changes:
                last_commit = time.monotonic()
                self._write(changes)
            self._release([c for c in batch if isinstance(c, _Barrier)])
            if time.monotonic() >= next_compaction:
                self._compact()
                next_compaction = time.monotonic() + self._compact_interval_s

    def _write(self, changes: list[object]) -> None:
        try:
            self._process.write(_batch(changes))
            if self._failing:
                log.warning("the journal %s is written again", self._path)
                self._failing = False
        except Exception:
            if not self._failing:  # once per outage, not once per batch
                log.exception(
                    "cannot write the journal %s: %d changes are kept in memory only (a crash now loses them)",
                    self._path,
                    len(changes),
                )
                self._failing = True
        self._written += len(changes)

    def _release(self, barriers: list[_Barrier]) -> None:
        """Wake the waiters of `durable()`: one hop per event loop, however many wait on it."""
        if barriers:
            with self._count_lock:
                self._waiting -= len(barriers)
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = defaultdict(list)
        for barrier in barriers:
            by_loop[barrier.loop].append(barrier.future)
        for loop, futures in by_loop.items():
            try_call_in_loop(loop, _resolve_all, futures)  # False: that loop is closed, nobody waits any more

    def _compact(self) -> None:
        try:
            deleted = self._process.compact(self._retention_s)
        except Exception:
            log.exception("compacting the journal %s failed; trying again later", self._path)
            return
        if deleted:
            log.info("journal: %d results past retention deleted", deleted)


def _batch(changes: list[object]) -> Batch:
    """The rows to write for `changes`. A job admitted and finished within the batch gets no in-flight row
    (it would be written and deleted in one transaction)."""
    batch = Batch()
    admitted: dict[str, _Admitted] = {}
    now = time.time()
    for change in changes:
        if isinstance(change, _Admitted):
            admitted[change.job_id] = change
        elif isinstance(change, _Stored):
            result = change.result
            if admitted.pop(result.job_id, None) is None:
                batch.jobs_done.append(result.job_id)
            batch.results_added.append((change.seq, result.job_id, change.digest, result.model_dump_json(), now))
        elif isinstance(change, _Removed):
            batch.results_removed.extend(change.seqs)
    batch.jobs_added = [(a.job_id, a.digest, a.request.model_dump_json(), now) for a in admitted.values()]
    return batch


def _resolve_all(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
