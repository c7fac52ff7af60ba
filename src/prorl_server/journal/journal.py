"""Journal: the results journal of one server, from opening (lock, recovery) to closing."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from prorl_server.config import JournalSync
from prorl_server.handlers import HandlerLoadError, UnknownDataSource
from prorl_server.journal.database import open_database
from prorl_server.journal.lock import JournalLock
from prorl_server.journal.process import WriterProcess
from prorl_server.journal.recovery import InFlightJob, Recovered, recover
from prorl_server.journal.writer import JournalWriter
from prorl_server.pipeline import SubmissionError
from prorl_server.protocol import ErrorInfo, ErrorKind, ErrorStage, JobResult, JobStatus

if TYPE_CHECKING:
    from prorl_server.pipeline import Orchestrator

log = logging.getLogger(__name__)

RESTART_ERROR_TYPE = ErrorKind.SERVER_RESTARTED
"""`error.type` of a job that was in flight when the server died."""


class Journal:
    """Jobs and results on disk (SQLite, WAL mode), so a restarted server serves what a crashed one held.

    Opening takes the journal's lock (a second server on the same file is refused) and checks the file;
    `recover` reads it back and gives the writer, which the server passes to its result store and
    orchestrator (their log of every admission, stored result and acknowledgement, sent as they happen to
    the writer process, which commits them in batches); `restore` then puts the recovered state into the
    orchestrator: unacknowledged results come back under their cursors, cursors continue, and jobs that were
    in flight get a failed result (`error.type` "ServerRestarted"), or are kept for `requeue` when their
    request said `requeue_on_restart`; `attach` hands the writer the API's event loop once it runs. Raises
    JournalError when the journal cannot be used."""

    def __init__(
        self, path: str | Path, *, retention_s: float, sync: JournalSync = "normal", compact_interval_s: float = 300.0
    ) -> None:
        self.path = Path(path).expanduser().absolute()
        self._retention_s = retention_s
        self._sync = sync
        self._compact_interval_s = compact_interval_s
        self._lock = JournalLock(self.path)
        try:
            self._db = open_database(self.path, sync)  # checked here, so that a bad journal fails the start
        except BaseException:
            self._lock.release()
            raise
        self._writer: JournalWriter | None = None
        self._recovered: Recovered | None = None
        self._to_requeue: list[InFlightJob] = []
        self._closed = False

    def recover(self) -> JournalWriter:
        """Read the journal back (for `restore`) and make the writer that records every change from now on:
        the log of the server's result store and its orchestrator's admissions."""
        try:
            self._recovered = recover(self._db, self.path, self._retention_s)
        except BaseException:
            self.close()
            raise
        finally:
            self._db.close()  # the writer process writes from now on
        assert self._lock.fd is not None
        process = WriterProcess(
            self.path,
            self._sync,
            self._lock.fd,
            retention_s=self._retention_s,
            compact_interval_s=self._compact_interval_s,
        )
        self._writer = JournalWriter(process, self.path)
        return self._writer

    def restore(self, orchestrator: Orchestrator) -> None:
        """Put what `recover` read into `orchestrator` (built with the writer as its logs)."""
        recovered, self._recovered = self._recovered, None
        assert recovered is not None and self._writer is not None, "call recover() first"
        results = orchestrator.results
        assert results.log is self._writer and orchestrator.journal is self._writer, "built without the writer"
        results.restore(((r.seq, r.result, r.digest, r.age_s) for r in recovered.results), recovered.next_seq)
        failed = 0
        for job in recovered.in_flight:
            if job.request.requeue_on_restart:
                self._to_requeue.append(job)
            else:
                results.put(restart_failure(job, _NOT_REQUEUED), job.digest)
                failed += 1
        log.info(
            "journal %s: %d results kept, next cursor %d; %d in-flight jobs failed, %d to re-queue",
            self.path,
            len(recovered.results),
            recovered.next_seq,
            failed,
            len(self._to_requeue),
        )

    def requeue(self, orchestrator: Orchestrator) -> int:
        """Submit again the in-flight jobs that asked for it (once the pipeline runs); one that is refused
        gets a failed result saying why. Returns how many were re-queued."""
        jobs, self._to_requeue = self._to_requeue, []
        requeued = 0
        for job in jobs:
            try:
                orchestrator.submit(job.request)
            except (SubmissionError, UnknownDataSource, HandlerLoadError) as exc:
                why = f"it asked to be re-queued, but the restarted server refused it: {exc}"
                orchestrator.results.put(restart_failure(job, why), job.digest)
            else:
                requeued += 1
        if jobs:
            log.info("journal: %d of %d in-flight jobs re-queued after the restart", requeued, len(jobs))
        return requeued

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have `loop` (the API's, running: call this on it) send the changes and read their commits."""
        if self._writer is not None:
            self._writer.attach(loop)

    async def durable(self, *, admissions: bool = True) -> None:
        """Return once every change made so far is committed (without blocking the event loop); with
        `admissions=False`, every result stored or acknowledged so far."""
        if self._writer is not None:
            await self._writer.durable(admissions=admissions)

    def close(self) -> None:
        """Write what is queued, stop the writer process and release the lock (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._writer is not None:
            self._writer.close()
        else:
            self._db.close()
        self._lock.release()


_NOT_REQUEUED = (
    'its progress is lost; a job submitted with "requeue_on_restart": true is run again after a restart instead'
)


def restart_failure(job: InFlightJob, why: str) -> JobResult:
    """The failed result of a job that was in flight when the server died."""
    data_source = job.request.instance.get("data_source")
    submitted = datetime.fromtimestamp(job.submitted_at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert job.request.job_id is not None
    return JobResult(
        job_id=job.request.job_id,
        status=JobStatus.FAILED,
        data_source=data_source if isinstance(data_source, str) else None,
        error=ErrorInfo(
            stage=ErrorStage.RESTART,
            type=RESTART_ERROR_TYPE,
            message=f"the server stopped (crashed or was killed) while this job was in flight (submitted "
            f"{submitted}) and was restarted on its journal; {why}",
        ),
    )
