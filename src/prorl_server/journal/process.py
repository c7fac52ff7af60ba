"""WriterProcess: the child process that owns the journal's SQLite connection for writing.

SQLite's work (binding values, B-tree inserts, WAL writes, checkpoints) then runs outside the server's GIL;
the server only serializes each batch and waits, the GIL released, for the answer. The child runs
`database.py` as a script (standard library only, so it starts in a few tens of milliseconds), inherits the
journal's lock, ignores SIGINT and SIGTERM, and ends when the server closes the connection or dies: it
never outlives the server by more than the batch it is writing.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path

from prorl_server.journal import database
from prorl_server.journal.database import Batch

log = logging.getLogger(__name__)


class WriterFailed(RuntimeError):
    """The writer process could not apply a request (its message says why), or is gone."""


class WriterProcess:
    """Parent-side handle of the writer process; used from one thread at a time (the writer thread)."""

    def __init__(self, path: Path, sync: str, lock_fd: int) -> None:
        ours, theirs = socket.socketpair()
        with ours, theirs:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", database.__file__, str(path), sync, str(theirs.fileno())],
                pass_fds=(theirs.fileno(), lock_fd),
                stdin=subprocess.DEVNULL,
            )
            self._conn = Connection(ours.detach())
        self._started = False

    @property
    def pid(self) -> int:
        """The writer process's id."""
        return self._proc.pid

    def write(self, batch: Batch) -> None:
        """Commit `batch`; returns once it is committed. Raises WriterFailed."""
        self._call("write", batch.to_wire())

    def compact(self, retention_s: float) -> int:
        """Delete results past retention and shrink the file; returns how many were deleted."""
        deleted = self._call("compact", retention_s)
        assert isinstance(deleted, int)
        return deleted

    def _call(self, op: str, argument: object) -> object:
        try:
            if not self._started:  # its first answer says whether it opened the journal
                self._answer()
                self._started = True
            self._conn.send((op, argument))
            return self._answer()
        except (OSError, EOFError) as exc:
            raise WriterFailed(f"the journal's writer process (pid {self.pid}) is gone: {exc!r}") from exc

    def _answer(self) -> object:
        status, value = self._conn.recv()
        if status != "ok":
            raise WriterFailed(str(value))
        return value

    def close(self, timeout_s: float = 30.0) -> None:
        """Close the connection (the process ends after its current batch) and wait for it; kill it (by its
        pid) if it does not end within `timeout_s`."""
        self._conn.close()
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.error("the journal's writer process (pid %d) did not end; killing it", self.pid)
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            self._proc.wait(5)
