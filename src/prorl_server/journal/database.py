"""The SQLite file of the results journal (WAL mode): its schema, its checks and its writes. Standard library
only: the journal's writer process (`commit_loop.py`) imports it outside the package.

Tables: `jobs` holds each admitted job that has no result yet (its request, to fail or re-queue it after a
crash); `results` each stored, unacknowledged result under its cursor `seq`; `meta` the next cursor as of
the last deletion of results, so cursors continue across restarts even after every result was
acknowledged (otherwise the highest stored `seq` says it).

Durability: WAL with `synchronous=NORMAL` (default) writes each commit to the WAL file without an fsync; a
killed process (kill -9, OOM, segfault) loses nothing committed, since the operating system still has the
pages; an OS crash or power loss may lose the last commits (the database stays consistent). `FULL` also
fsyncs every commit, which survives power loss too, at the cost of one fsync per batch of writes.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

if __package__:
    from prorl_server.errors import ProrlError
else:  # loaded by the writer process's script (commit_loop.py, `python -I`): standard library only

    class ProrlError(Exception):  # type: ignore[no-redef]
        """prorl_server.errors.ProrlError's stand-in in the writer process, which logs its errors and sends none out."""


APPLICATION_ID = 0x70726C6A  # "prlj": marks the file as a prorl-server journal
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY, digest TEXT NOT NULL, request TEXT NOT NULL, submitted_at REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS results (
    seq INTEGER PRIMARY KEY, job_id TEXT NOT NULL, digest TEXT NOT NULL, result TEXT NOT NULL, stored_at REAL NOT NULL
);
"""
# No secondary index: each would cost every write a page; the few full scans (recovery, compaction) are cheap.

KEEP_NEXT_SEQ = (
    "UPDATE meta SET value = max(value, (SELECT coalesce(max(seq), 0) + 1 FROM results)) WHERE key = 'next_seq'"
)
"""Run before results are deleted: the next cursor is one past the highest stored, which may be deleted next."""


class JournalError(ProrlError, RuntimeError):
    """The journal cannot be opened: in use by another server, not a journal, corrupt, or not writable."""


@dataclass
class Batch:
    """Changes to commit together: in-flight rows deleted, then added; results added, then deleted."""

    jobs_done: list[str] = field(default_factory=list)
    jobs_added: list[tuple[str, str, str, float]] = field(default_factory=list)  # id, digest, request, t
    results_added: list[tuple[int, str, str, str, float]] = field(default_factory=list)  # seq, id, digest, result, t
    results_removed: list[int] = field(default_factory=list)


def open_database(path: Path, sync: str = "normal") -> sqlite3.Connection:
    """Open (or create, owner-only) the journal at `path`, check it is one, set WAL mode and `synchronous`,
    and write to it once; JournalError with what to do when any of that fails."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # owner-only: it holds prompts and trajectories (SQLite gives its -wal and -shm files the same mode)
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except (OSError, sqlite3.Error) as exc:
        raise JournalError(f"cannot open the journal {path}: {_reason(exc)}") from exc
    try:
        _setup(db, path, sync)
    except sqlite3.Error as exc:
        db.close()
        raise JournalError(
            f"cannot use the journal {path}: {_reason(exc)}. If the file is corrupt or not a journal, move it "
            "(and its -wal and -shm files) aside to start a new one, or give another --journal"
        ) from exc
    except JournalError:
        db.close()
        raise
    return db


def _setup(db: sqlite3.Connection, path: Path, sync: str) -> None:
    app_id = db.execute("PRAGMA application_id").fetchone()[0]
    tables = db.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0]
    if tables and app_id != APPLICATION_ID:
        raise JournalError(f"{path} is an SQLite database but not a prorl-server journal; give --journal another path")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise JournalError(
            f"the journal {path} was written by a newer prorl-server (schema {version}, this one reads "
            f"{SCHEMA_VERSION}); upgrade, or give another --journal"
        )
    if not tables:
        db.execute("PRAGMA auto_vacuum = INCREMENTAL")  # before the first table: lets compaction shrink the file
    mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if mode != "wal":
        raise JournalError(f"the journal {path} cannot use WAL mode (got {mode!r}); use a local file system")
    db.execute(f"PRAGMA synchronous = {'FULL' if sync == 'full' else 'NORMAL'}")
    db.execute("BEGIN IMMEDIATE")  # a write: an unwritable journal fails here, at start
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    db.execute("INSERT OR IGNORE INTO meta VALUES ('next_seq', 1)")
    db.execute("COMMIT")


def write(db: sqlite3.Connection, batch: Batch) -> None:
    """Apply a batch in one transaction, a few multi-row statements."""
    db.execute("BEGIN")
    try:
        _chunked(db, "DELETE FROM jobs WHERE job_id IN ({})", [(job_id,) for job_id in batch.jobs_done])
        _chunked(db, "INSERT OR REPLACE INTO jobs VALUES {}", batch.jobs_added)
        _chunked(db, "INSERT OR REPLACE INTO results VALUES {}", batch.results_added)
        if batch.results_removed:
            db.execute(KEEP_NEXT_SEQ)
            _chunked(db, "DELETE FROM results WHERE seq IN ({})", [(seq,) for seq in batch.results_removed])
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def compact(db: sqlite3.Connection, retention_s: float) -> int:
    """Delete results past retention, give free pages back to the file system, truncate the WAL; returns how
    many results were deleted."""
    db.execute(KEEP_NEXT_SEQ)
    deleted = db.execute("DELETE FROM results WHERE stored_at <= ?", (time.time() - retention_s,)).rowcount
    db.executescript("PRAGMA incremental_vacuum;")  # run to the end (execute() frees one page per step)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return deleted


_ROWS_PER_STATEMENT = 150
"""Rows of one multi-row statement, at most: 5 values a row stay under SQLite's oldest limit of 999 values."""
_CHARS_PER_STATEMENT = 8_000_000
"""Text in one statement, about at most (one row may hold more): SQLite copies what it is given."""


def _chunked(db: sqlite3.Connection, sql: str, rows: Sequence[tuple[object, ...]]) -> None:
    """Run `sql` over `rows`, many rows per statement: `{}` becomes `?, ?` (one value a row) or `(?, ?), (?, ?)`."""
    start = 0
    while start < len(rows):
        end, chars = start, 0
        while end < len(rows) and end - start < _ROWS_PER_STATEMENT and chars < _CHARS_PER_STATEMENT:
            chars += sum(len(value) for value in rows[end] if isinstance(value, str))
            end += 1
        width = len(rows[start])
        marks = "?" if width == 1 else "(" + ", ".join("?" * width) + ")"
        db.execute(sql.format(", ".join([marks] * (end - start))), [v for row in rows[start:end] for v in row])
        start = end


def _reason(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
