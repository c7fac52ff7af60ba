"""WriterProcess: the child process that owns the journal's SQLite connection for writing, and the socket
the server sends it its changes on.

SQLite's work (binding values, B-tree inserts, WAL writes, checkpoints) then runs outside the server's GIL.
The child runs `commit_loop.py` as a script (standard library only, so it starts in a few tens of
milliseconds), inherits the journal's lock, ignores SIGINT and SIGTERM, and ends when the server closes the
socket or dies: it never outlives the server by more than the batch it is writing. What the kernel holds of
the socket when the server is killed is still read and committed.

`send` never blocks its caller (an event loop or a stage thread): frames queue in memory and the attached
event loop sends what queued up once per commit interval (one system call for many changes); a frame that
asks for a commit now is sent by its caller at once. A thread of its own sends only while the socket is
full, or before a loop is attached.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path

from prorl_server.journal import commit_loop
from prorl_server.journal.database import JournalError
from prorl_server.threadsafe import running_loop, try_call_in_loop

log = logging.getLogger(__name__)

SEND_BUFFER_BYTES = 4 << 20
"""What the kernel may hold of the socket for the child (it caps this at its own limit)."""


class WriterGone(JournalError):
    """The writer process has ended (it was killed, or it could not open the journal)."""


class WriterProcess:
    """Parent-side handle of the writer process: `send` frames to it (`now=True` also asks for a commit now),
    read its count of committed frames on `committed_fd`."""

    def __init__(
        self,
        path: Path,
        sync: str,
        lock_fd: int,
        *,
        retention_s: float,
        compact_interval_s: float,
        commit_interval_s: float = commit_loop.COMMIT_INTERVAL_S,
    ) -> None:
        ours, theirs = socket.socketpair()
        self.committed_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # the process counts commits on it
        self._wake_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)  # asks it for a commit now
        fds = (theirs.fileno(), self.committed_fd, self._wake_fd)
        argv = [path, sync, *fds, retention_s, compact_interval_s, commit_interval_s]
        try:
            with theirs:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", commit_loop.__file__, *map(str, argv)],
                    pass_fds=(*fds, lock_fd),
                    stdin=subprocess.DEVNULL,
                )
        except BaseException:
            ours.close()
            os.close(self.committed_fd)
            os.close(self._wake_fd)
            raise
        with contextlib.suppress(OSError):
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        ours.setblocking(False)
        self.socket = ours
        self._send_interval_s = commit_interval_s
        self._lock = threading.Lock()  # the outgoing bytes, in order
        self._out = bytearray()  # frames not yet taken by the socket
        self._out_ready = threading.Condition(self._lock)
        self._blocked = False  # the socket took less than it was given: wait until it is writable
        self._gone: str | None = None
        self._closing = False
        self._loop: asyncio.AbstractEventLoop | None = None  # sends what queued up, once per interval
        self._flush_armed = False
        self._sender = threading.Thread(target=self._send_out, name="prorl-journal-send", daemon=True)
        self._sender.start()

    @property
    def pid(self) -> int:
        """The writer process's id."""
        return self._proc.pid

    @property
    def gone(self) -> str | None:
        """Why the writer process can no longer be sent to (None while it can)."""
        return self._gone

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have `loop` (a running loop; call this on it) send what queues up, once per commit interval."""
        with self._lock:
            self._loop = loop

    def send(self, frame: bytes, *, now: bool = False) -> None:
        """Queue `frame` after every frame queued before it, without blocking; WriterGone once the process is
        gone. What queues up is sent in one system call a commit interval after the first of it, by the
        attached loop (a timer on it: no thread wakes for it), or by the sender thread before a loop is
        attached; `now=True` sends it all at once from the calling thread and wakes the process for a commit
        now. While the socket is full, the sender thread sends as the process reads."""
        with self._lock:
            if self._gone is not None:
                raise WriterGone(self._gone)
            was_empty = not self._out
            self._out += frame
            if now and not self._blocked:
                self._send_locked()
                if self._gone is not None:
                    raise WriterGone(self._gone)
            if now:
                os.eventfd_write(self._wake_fd, 1)
            if self._blocked:
                self._out_ready.notify()
            elif was_empty and self._out and not self._flush_armed:
                self._arm_flush()

    def _arm_flush(self) -> None:
        """Send what is queued one interval from now (the lock held)."""
        self._flush_armed = True
        loop = self._loop
        if loop is not None and running_loop() is loop:
            loop.call_later(self._send_interval_s, self._flush)
        elif loop is None or not try_call_in_loop(loop, loop.call_later, self._send_interval_s, self._flush):
            self._loop = None  # closed: the sender thread takes over
            self._out_ready.notify()

    def _flush(self) -> None:
        """The loop's timer, or the sender thread: send what is queued."""
        with self._lock:
            self._flush_armed = False
            if self._closing:  # close() sends the rest
                return
            if self._out and not self._blocked:
                self._send_locked()
            if self._blocked:
                self._out_ready.notify()

    def _send_locked(self) -> None:
        """Give the socket what it takes of the queued bytes now (the lock held)."""
        try:
            sent = self.socket.send(self._out)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._mark_gone(exc)
            return
        del self._out[:sent]
        self._blocked = bool(self._out)

    def _send_out(self) -> None:
        """The sender thread: while the socket is full, wait until it is writable (lock released) and send;
        with no loop attached, send what queued up one interval after it was woken for it; at close, send
        everything."""
        with self._lock:
            while True:
                while (
                    not self._closing
                    and not self._blocked
                    and self._gone is None
                    and not (self._flush_armed and self._loop is None)
                ):
                    self._out_ready.wait()
                if (self._closing and not self._out) or self._gone is not None:
                    return
                if self._blocked:
                    self._lock.release()  # wait until the socket is writable
                    try:
                        select.select([], [self.socket], [], 1.0)
                    except (OSError, ValueError) as exc:  # the socket was closed: close() gave up waiting
                        self._lock.acquire()
                        self._mark_gone(exc)
                        return
                    self._lock.acquire()
                elif not self._closing:
                    self._out_ready.wait(self._send_interval_s)  # close() ends it early
                    self._flush_armed = False
                if self._out:
                    self._send_locked()

    def _mark_gone(self, exc: BaseException) -> None:
        self._stop_sending(f"the journal's writer process (pid {self.pid}) is gone: {exc!r}")

    def mark_gone(self, why: str) -> None:
        """Stop sending: the process has ended (the server saw its end of the socket close)."""
        with self._lock:
            self._stop_sending(why)

    def _stop_sending(self, why: str) -> None:
        """Drop what is queued and send nothing more (the lock held)."""
        if self._gone is None:
            self._gone = why
        self._out.clear()
        self._blocked = False
        self._out_ready.notify()

    def close(self, timeout_s: float = 30.0) -> None:
        """Send the backlog, close the socket (the process commits what it read, then ends) and wait for it;
        kill it (by its pid) if it does not end within `timeout_s`."""
        with self._lock:
            self._closing = True
            self._out_ready.notify()
        self._sender.join(timeout_s)
        if self._sender.is_alive():
            log.error("the journal's writer process (pid %d) read nothing for %.0f s; closing it", self.pid, timeout_s)
            with self._lock:
                self._stop_sending(f"the journal's writer process (pid {self.pid}) stopped reading")
        self.socket.close()
        os.eventfd_write(self._wake_fd, 1)  # a batch in hand waits for nothing more: commit it, then see the end
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.error("the journal's writer process (pid %d) did not end; killing it", self.pid)
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            self._proc.wait(5)
        os.close(self.committed_fd)
        os.close(self._wake_fd)
