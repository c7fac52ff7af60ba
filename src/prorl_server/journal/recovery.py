"""Reading a journal back at start: the results to serve again, the next cursor, the jobs that were in flight."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from prorl_server.journal.database import KEEP_NEXT_SEQ, JournalError
from prorl_server.protocol import JobResult, ProcessRequest

ModelT = TypeVar("ModelT", bound=BaseModel)


@dataclass(frozen=True)
class KeptResult:
    """A result found in the journal: its cursor, the result, its request's digest and its age."""

    seq: int
    result: JobResult
    digest: str
    age_s: float


@dataclass(frozen=True)
class InFlightJob:
    """A job admitted before the restart that had no result: its request, with its job id."""

    request: ProcessRequest
    digest: str
    submitted_at: float  # Unix time


@dataclass(frozen=True)
class Recovered:
    """What a journal held at start: results to serve again, the next cursor, and jobs that were in flight."""

    results: list[KeptResult]
    next_seq: int
    in_flight: list[InFlightJob]


def recover(db: sqlite3.Connection, path: Path, retention_s: float) -> Recovered:
    """Drop results past retention, then read what is left and the jobs that were in flight."""
    now = time.time()
    try:
        db.execute(KEEP_NEXT_SEQ)
        db.execute("DELETE FROM results WHERE stored_at <= ?", (now - retention_s,))
        next_seq = db.execute("SELECT value FROM meta WHERE key = 'next_seq'").fetchone()[0]
        results = [
            KeptResult(seq, _parse(JobResult, text, f"result {seq}", path), digest, max(0.0, now - stored))
            for seq, text, digest, stored in db.execute(
                "SELECT seq, result, digest, stored_at FROM results ORDER BY seq"
            )
        ]
        in_flight = [
            InFlightJob(
                _parse(ProcessRequest, text, f"job {job_id!r}", path).model_copy(update={"job_id": job_id}),
                digest,
                submitted,
            )
            for job_id, text, digest, submitted in db.execute(
                "SELECT job_id, request, digest, submitted_at FROM jobs "
                "WHERE job_id NOT IN (SELECT job_id FROM results) ORDER BY submitted_at"
            )
        ]
    except sqlite3.Error as exc:
        raise JournalError(
            f"cannot read the journal {path}: {exc}. If it is corrupt, move it (and its -wal and -shm files) aside "
            "to start a new one, or give another --journal"
        ) from exc
    last = results[-1].seq if results else 0
    return Recovered(results, max(next_seq, last + 1), in_flight)


def _parse(model: type[ModelT], text: str, what: str, path: Path) -> ModelT:
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise JournalError(f"the journal {path} holds an unreadable {what}: {exc.errors()[0]['msg']}") from exc
