"""JournalLock: one server per journal file, enforced with an exclusive `flock` on `<journal>.lock`."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from prorl_server.journal.database import JournalError

DEAD_HOLDER_WAIT_S = 5.0
"""How long to wait for a lock whose server is dead: its writer process may be finishing its last batch."""


class JournalLock:
    """Held while a server uses a journal; the kernel drops it when the last process holding it ends (the
    server and its writer process share it), even by kill -9.

    The lock is on a file of its own (not the database, whose byte-range locks belong to SQLite); it holds
    the server's pid, for the message a second server gets."""

    def __init__(self, journal: Path) -> None:
        self.path = journal.with_name(journal.name + ".lock")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise JournalError(f"cannot create the journal's lock file {self.path}: {exc.strerror}") from exc
        deadline = time.monotonic() + DEAD_HOLDER_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                if _alive(holder) or time.monotonic() > deadline:
                    os.close(fd)
                    raise JournalError(
                        f"the journal {journal} is in use by another prorl-server (pid {holder}, holding "
                        f"{self.path}); a journal serves one server at a time: stop that server or give this one "
                        "another --journal"
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd: int | None = fd

    def release(self) -> None:
        """Let another server open the journal (idempotent; a writer process still running holds it until it
        ends); the lock file stays."""
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _alive(pid: str) -> bool:
    """Whether the process `pid` (text from the lock file) exists; True when it cannot be told."""
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
