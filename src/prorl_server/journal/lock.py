"""JournalLock: one server per journal file, enforced with an exclusive `flock` on `<journal>.lock`."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from prorl_server.journal.errors import JournalError


class JournalLock:
    """Held while a server uses a journal; the kernel drops it when the process dies (even by kill -9).

    The lock is on a file of its own (not the database, whose byte-range locks belong to SQLite); it holds
    the holder's pid, for the message a second server gets."""

    def __init__(self, journal: Path) -> None:
        self.path = journal.with_name(journal.name + ".lock")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise JournalError(f"cannot create the journal's lock file {self.path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise JournalError(
                f"the journal {journal} is in use by another prorl-server (pid {holder}, holding {self.path}); "
                "a journal serves one server at a time: stop that server or give this one another --journal"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        """Let another server open the journal (idempotent); the lock file stays."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
