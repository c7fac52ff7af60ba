"""The journal's writer process: it reads the server's changes from a socket, commits them in batches and
counts what it committed on an eventfd. Standard library only: `WriterProcess` runs this file as a script.

The server sends one frame per change, in the order the changes happen: a 4-byte little-endian length, then
a pickled tuple (`ADMIT`, `STORE`, `REMOVE`, or `FLUSH`, which carries no change and only asks for a commit
now). The loop keeps what it has read in one pending batch and commits it

- at once when the server asks for it: it sends an urgent `STORE` (its last job in flight ended) or a
  `FLUSH` (someone waits and no result is coming that could share the commit), then adds to the wake
  eventfd, which is all the loop listens to while a batch is pending;
- otherwise no sooner than `COMMIT_INTERVAL_S` after the previous commit (under load, what arrives meanwhile
  shares one commit), and a batch of admissions alone waits that long after its first frame (a job that
  ends within it is written once, with its result, and no in-flight row).

After each commit it adds the number of frames the commit covered to the committed eventfd; the server's
event loop reads that as its count of frames on disk. A batch that cannot be written is logged (once per outage) and
counted all the same: the server keeps those changes in memory, as it would without a journal. Every
`compact_interval_s` it deletes results past retention and gives free pages back. It ends, after committing
what it read, when the server closes its end of the socket or dies.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import select
import signal
import socket
import sqlite3
import sys
import time
from pathlib import Path

if __package__:
    from prorl_server.journal.database import Batch, JournalError, compact, open_database, write
else:  # run as the writer process's script, next to database.py
    sys.path.insert(0, str(Path(__file__).parent))
    from database import Batch, JournalError, compact, open_database, write  # type: ignore[no-redef]

ADMIT, STORE, REMOVE, FLUSH = "admit", "store", "remove", "flush"
"""Frame kinds: (ADMIT, job_id, digest, request_json, t), (STORE, seq, job_id, digest, result_json, t,
urgent), (REMOVE, [seq, ...]), (FLUSH,)."""

COMMIT_INTERVAL_S = 0.002
"""Commits start at least this far apart, unless a frame asks for one now. A commit (its wake-ups on both
sides and SQLite's own work) costs several times what one more row in it costs."""

_HEADER = 4
_READ_SIZE = 1 << 20

log = logging.getLogger("prorl_server.journal.writer")


def encode_frame(change: tuple[object, ...]) -> bytes:
    """One frame: the change's length, then the change."""
    body = pickle.dumps(change, protocol=pickle.HIGHEST_PROTOCOL)
    return len(body).to_bytes(_HEADER, "little") + body


class _Pending:
    """The frames read and not yet committed, and when they must be."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.changes: list[tuple] = []
        self.frames = 0
        self.urgent = False
        self.first_at = 0.0
        self.admissions_only = True

    def add(self, change: tuple) -> None:
        if not self.frames:
            self.first_at = time.monotonic()
        self.frames += 1
        kind = change[0]
        if kind == FLUSH:
            self.urgent = True
            return
        self.changes.append(change)
        if kind != ADMIT:
            self.admissions_only = False
        if kind == STORE and change[6]:
            self.urgent = True

    def due(self, last_commit: float) -> float:
        """When to commit (monotonic time)."""
        if self.urgent:
            return 0.0
        if self.admissions_only:
            return self.first_at + self.interval_s
        return max(self.first_at, last_commit + self.interval_s)


def to_batch(changes: list[tuple]) -> Batch:
    """The rows to write for `changes`, in order. A job admitted and finished within the batch gets no
    in-flight row (it would be written and deleted in one transaction)."""
    batch = Batch()
    admitted: dict[str, tuple] = {}
    for change in changes:
        kind = change[0]
        if kind == ADMIT:
            admitted[change[1]] = change
        elif kind == STORE:
            _, seq, job_id, digest, result_json, stored_at, _urgent = change
            if admitted.pop(job_id, None) is None:
                batch.jobs_done.append(job_id)
            batch.results_added.append((seq, job_id, digest, result_json, stored_at))
        elif kind == REMOVE:
            batch.results_removed.extend(change[1])
    batch.jobs_added = [(job_id, digest, request, t) for _, job_id, digest, request, t in admitted.values()]
    return batch


class CommitLoop:
    """Reads frames from `sock`, commits them to `db` as the module docstring says, counts them on
    `committed_fd`; `wake_fd` asks for a commit now."""

    def __init__(
        self,
        db: sqlite3.Connection,
        sock: socket.socket,
        committed_fd: int,
        wake_fd: int,
        path: Path,
        *,
        retention_s: float,
        compact_interval_s: float,
        commit_interval_s: float = COMMIT_INTERVAL_S,
    ) -> None:
        self._db = db
        self._commit_interval_s = commit_interval_s
        self._sock = sock
        self._committed_fd = committed_fd
        self._wake_fd = wake_fd
        self._path = path
        self._retention_s = retention_s
        self._compact_interval_s = compact_interval_s
        self._buffer = bytearray()
        self._failing = False

    def run(self) -> None:
        """Serve until the server closes the socket or dies.

        With nothing pending the loop waits for the socket; with a batch pending it waits only for the wake
        eventfd (or the batch's time), so frames sent meanwhile do not wake it: under load it wakes about
        once per commit, not once per change."""
        pending = _Pending(self._commit_interval_s)
        last_commit = 0.0
        next_compaction = time.monotonic() + self._compact_interval_s
        open_ = True
        while open_:
            due = pending.due(last_commit) if pending.frames else next_compaction
            watched = [self._wake_fd] if pending.frames else [self._wake_fd, self._sock]
            ready, _, _ = select.select(watched, [], [], max(0.0, min(due, next_compaction) - time.monotonic()))
            if self._wake_fd in ready:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(self._wake_fd)
                pending.urgent = True
            now = time.monotonic()
            if ready or (pending.frames and now >= pending.due(last_commit)):
                open_ = self._drain(pending)
            if pending.frames and (not open_ or now >= pending.due(last_commit)):
                self._commit(pending)
                pending = _Pending(self._commit_interval_s)
                last_commit = now
            if now >= next_compaction:
                self._compact()
                next_compaction = time.monotonic() + self._compact_interval_s

    def _drain(self, pending: _Pending) -> bool:
        """Read everything the socket holds into `pending`; False once the server has closed it (or died)."""
        buffer = self._buffer
        open_ = True
        while open_:
            try:
                data = self._sock.recv(_READ_SIZE)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            open_ = bool(data)
            buffer += data
        start = 0
        while len(buffer) - start >= _HEADER:
            size = int.from_bytes(buffer[start : start + _HEADER], "little")
            end = start + _HEADER + size
            if end > len(buffer):
                break
            pending.add(pickle.loads(memoryview(buffer)[start + _HEADER : end]))
            start = end
        del buffer[:start]
        return open_

    def _commit(self, pending: _Pending) -> None:
        if pending.changes:
            try:
                write(self._db, to_batch(pending.changes))
                if self._failing:
                    log.warning("the journal %s is written again", self._path)
                    self._failing = False
            except Exception as exc:
                if not self._failing:  # once per outage, not once per batch
                    log.error(
                        "cannot write the journal %s: %s; %d changes are kept in memory only (a crash now loses them)",
                        self._path,
                        exc,
                        len(pending.changes),
                    )
                    self._failing = True
        os.eventfd_write(self._committed_fd, pending.frames)

    def _compact(self) -> None:
        try:
            compact(self._db, self._retention_s)
        except Exception as exc:
            log.error("compacting the journal %s failed (%s); trying again later", self._path, exc)


def main(argv: list[str]) -> None:
    """`commit_loop.py PATH SYNC SOCKET_FD COMMITTED_FD WAKE_FD RETENTION_S COMPACT_INTERVAL_S COMMIT_INTERVAL_S`"""
    # SIGINT and SIGTERM go to the server, which closes the journal when it has sent everything; the process
    # ends when the server closes its end of the socket or dies.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    path, sync, sock_fd, committed_fd, wake_fd, retention_s, compact_interval_s, commit_interval_s = argv
    sock = socket.socket(fileno=int(sock_fd))
    sock.setblocking(False)
    try:
        db = open_database(Path(path), sync)
    except JournalError as exc:
        log.error("%s; nothing is written to the journal from now on", exc)
        return
    try:
        CommitLoop(
            db,
            sock,
            int(committed_fd),
            int(wake_fd),
            Path(path),
            retention_s=float(retention_s),
            compact_interval_s=float(compact_interval_s),
            commit_interval_s=float(commit_interval_s),
        ).run()
    finally:
        db.close()


if __name__ == "__main__":
    main(sys.argv[1:])
