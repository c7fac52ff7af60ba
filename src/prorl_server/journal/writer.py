"""JournalWriter: the server's side of the journal's writer process. Changes go to it as they happen, and
`durable()` waits, without blocking its event loop, until every change made before it is committed.

Each change (a job admitted, a result stored, results acknowledged) is serialized by the thread that makes
it and queued, in order, for the writer process (`WriterProcess.send` never blocks; the attached event loop
sends what queued up once per commit interval). The process commits in batches (`commit_loop.py` says when)
and counts what it committed on an eventfd that the attached loop reads: no thread of the server's own sits
between a change and its commit, so a request that waits for its result to be on disk pays one wake-up of
the writer process and one of its own loop. Two hints make the batches: a stored result that leaves no job
in flight is sent and committed at once (one request at a time pays the commit, not the interval), and so
is a waiter when no result is coming that could share the commit.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prorl_server.journal.commit_loop import ADMIT, FLUSH, REMOVE, STORE, encode_frame
from prorl_server.journal.process import WriterGone, WriterProcess
from prorl_server.protocol import JobResult, ProcessRequest
from prorl_server.threadsafe import run_in_loop, running_loop, try_call_in_loop

log = logging.getLogger(__name__)

_Waiter = tuple[int, int, asyncio.AbstractEventLoop, "asyncio.Future[None]"]  # target, ticket, loop, future


class JournalWriter:
    """Sends every change to the writer process and tells waiters when it is committed."""

    def __init__(self, process: WriterProcess, path: Path) -> None:
        self._process = process
        self._path = path
        self._lock = threading.Lock()  # frame order, counts, waiters
        self._open: set[str] = set()  # jobs admitted and not yet stored
        self._sent = 0  # frames sent so far
        self._last_result = 0  # number of the last frame that stored or removed results
        self._flushed = 0  # number of the last frame that asked for a commit now (urgent STORE, FLUSH)
        self._committed = 0  # frames the writer process has counted (read on the home loop)
        self._waiters: list[_Waiter] = []  # a heap: the lowest target first
        self._tickets = itertools.count()  # ties between targets: first come, first released
        self._home: asyncio.AbstractEventLoop | None = None  # the loop that reads the commit count
        self._closed = False
        self._gone_reported = False

    # changes (any thread) -------------------------------------------------------------------------

    def admitted(self, job_id: str, digest: str, request: ProcessRequest) -> None:
        """A job was admitted: keep its request until it has a result."""
        frame = (ADMIT, job_id, digest, request.model_dump_json(), time.time())
        with self._lock:
            self._open.add(job_id)
            self._send(frame)

    def stored(self, seq: int, result: JobResult, request_digest: str) -> None:
        """A result was stored under cursor `seq` (it replaces the job's in-flight entry)."""
        text = result.model_dump_json()
        with self._lock:
            self._open.discard(result.job_id)
            urgent = not self._open
            self._send((STORE, seq, result.job_id, request_digest, text, time.time(), urgent), now=urgent)
            self._last_result = self._sent
            if urgent:
                self._flushed = self._sent

    def removed(self, seqs: list[int]) -> None:
        """Results were acknowledged, or replaced by a newer result of the same job."""
        with self._lock:
            self._send((REMOVE, seqs))
            self._last_result = self._sent

    def _send(self, change: tuple[object, ...], *, now: bool = False) -> None:
        """Send one frame (the lock held, so frames go in the order their changes happened); `now`: it asks
        for a commit now."""
        if self._closed or self._process.gone is not None:
            return
        try:
            self._process.send(encode_frame(change), now=now)
        except WriterGone as exc:
            self._writer_gone(str(exc))
            return
        self._sent += 1

    # waiting (event loops) ------------------------------------------------------------------------

    async def durable(self, *, admissions: bool = True) -> None:
        """Return once every change made before this call is committed (at once if there is none); with
        `admissions=False`, every result stored or acknowledged before it (what a reader of results needs:
        jobs admitted meanwhile do not hold it back)."""
        target = self._sent if admissions else self._last_result
        if self._committed >= target:
            return
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._closed or self._process.gone is not None or self._committed >= target:
                return  # close() commits everything sent before it returns
            heapq.heappush(self._waiters, (target, next(self._tickets), loop, future))
            if self._flushed < target and (not self._open or self._last_result <= self._committed):
                self._send((FLUSH,), now=True)  # no result is coming that could share the commit
                self._flushed = self._sent
            if self._home is None or self._home.is_closed():
                self._attach_locked(loop)
        await future

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make `loop` (the running loop: call this on it) the one that reads the commit count and sends the
        changes that queue up; otherwise the first loop that waits in `durable()` is."""
        with self._lock:
            if not self._closed and self._process.gone is None:
                self._attach_locked(loop)

    def _attach_locked(self, loop: asyncio.AbstractEventLoop) -> None:
        self._home = loop
        loop.add_reader(self._process.committed_fd, self._on_commit)
        loop.add_reader(self._process.socket.fileno(), self._on_socket)
        self._process.attach(loop)

    def _on_commit(self) -> None:
        """The home loop: the writer process counted more frames as committed."""
        try:
            count = os.eventfd_read(self._process.committed_fd)
        except BlockingIOError:
            return
        with self._lock:
            self._committed += count
            released = []
            while self._waiters and self._waiters[0][0] <= self._committed:
                released.append(heapq.heappop(self._waiters))
        _resolve(released)

    def _on_socket(self) -> None:
        """The home loop: the writer process never writes to the socket, so it ended (or was killed)."""
        try:
            if self._process.socket.recv(1):
                return
        except BlockingIOError:
            return
        except OSError:
            pass
        self._process.mark_gone(f"the journal's writer process (pid {self._process.pid}) ended")
        with self._lock:
            self._writer_gone(str(self._process.gone))

    def _writer_gone(self, why: str) -> None:
        """Log it once, stop reading the count, and release every waiter (the lock held)."""
        if self._gone_reported:
            return
        self._gone_reported = True
        log.error(
            "cannot write the journal %s: %s; results are kept in memory only (a crash loses them)", self._path, why
        )
        home, self._home = self._home, None
        if home is not None:
            try_call_in_loop(home, self._remove_readers, home)
        released, self._waiters = self._waiters, []
        _resolve(released)

    def _remove_readers(self, home: asyncio.AbstractEventLoop) -> None:
        """On `home`: stop watching the writer process's eventfd and socket."""
        home.remove_reader(self._process.committed_fd)
        home.remove_reader(self._process.socket.fileno())

    # closing --------------------------------------------------------------------------------------

    def close(self) -> None:
        """Commit everything sent, then stop the writer process and release every waiter (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            home, self._home = self._home, None
        if home is not None and not home.is_closed():  # before their file descriptors close
            if running_loop() is home:
                self._remove_readers(home)
            else:
                with contextlib.suppress(RuntimeError, TimeoutError):
                    run_in_loop(home, _call(self._remove_readers, home)).result(5)
        self._process.close()
        with self._lock:
            released, self._waiters = self._waiters, []
        _resolve(released)


async def _call(fn: Callable[..., object], *args: object) -> None:
    fn(*args)


def _resolve(waiters: list[_Waiter]) -> None:
    """Wake `waiters`: one hop per event loop other than the running one, however many wait on it."""
    by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = collections.defaultdict(list)
    for _, _, loop, future in waiters:
        by_loop[loop].append(future)
    running = running_loop()
    for loop, futures in by_loop.items():
        if loop is running:
            _resolve_all(futures)
        else:
            try_call_in_loop(loop, _resolve_all, futures)  # False: that loop is closed, nobody waits any more


def _resolve_all(futures: list[asyncio.Future[None]]) -> None:
    for future in futures:
        if not future.done():
            future.set_result(None)
