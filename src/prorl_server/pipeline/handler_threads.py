"""HandlerThreads: the threads a stage runs plain-`def` handler methods on, kept at their number when a
handler blocks one for good.

Threads start when a call needs one and none is idle, up to `size`, and stay for later calls: a stage of
10,000 workers whose handlers are all `async def` starts none (an idle thread still holds its stack).

A thread cannot be killed. When the job of a call ends (timeout, cancel), the call is abandoned; if it does not
return within the cancel grace (`settle`), it is *stuck*: its thread goes on with it, no longer counted, and a new thread takes
its place, so the stage keeps `size` threads for new calls. At most `max_stuck` stuck calls are replaced;
beyond that new calls wait for a thread (and their jobs time out), which `/health` reports.

A call's outcome reaches the event loop as a value, never as an exception raised into a future, so
whatever the method raises (SystemExit, StopIteration, ...) arrives intact.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prorl_server.threadsafe import try_call_in_loop

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Call:
    """One method call: what to run, for which job, and where its outcome goes."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    owner: str
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[tuple[bool, Any]]
    thread: str = ""
    started: bool = False
    done: bool = False
    abandoned: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class HandlerThreads:
    """Up to `size` threads for one stage's plain-`def` handler calls, started on demand; stuck ones are
    replaced (see the module)."""

    def __init__(self, size: int, name: str, max_stuck: int | None = None) -> None:
        self.size = size
        self.name = name
        self.max_stuck = max_stuck if max_stuck is not None else max(16, 4 * size)
        self.stuck_total = 0  # calls that outlived their job's cancel grace, ever
        self._work: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._abandoned: set[_Call] = set()  # running, their caller cancelled, not settled yet
        self._stuck: set[_Call] = set()
        self._serial = itertools.count()
        self._idle = 0  # threads waiting for a call that no queued call has claimed
        self._backlog = 0  # calls queued that no thread has been claimed for (all busy, none may start)
        self._closed = False

    @property
    def stuck(self) -> int:
        """Calls running now whose job has ended (their threads are not counted in `size`)."""
        with self._lock:
            return len(self._stuck)

    async def run(self, fn: Callable[..., Any], *args: Any, owner: str) -> tuple[bool, Any]:
        """Call `fn(*args)` on one of the threads for job `owner`: (True, value) or (False, the exception it
        raised). Cancelled, the call is abandoned at once (one not started never starts); `settle` decides
        whether its thread is stuck."""
        loop = asyncio.get_running_loop()
        call = _Call(fn, args, owner, loop, loop.create_future())
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self.size + min(len(self._stuck), self.max_stuck):
                self._spawn_locked()
            else:
                self._backlog += 1
        self._work.put(call)
        try:
            return await asyncio.shield(call.future)
        except asyncio.CancelledError:
            with call.lock, self._lock:
                call.abandoned = True
                if call.started and not call.done:
                    self._abandoned.add(call)
            raise

    async def settle(self, owner: str, timeout: float) -> str | None:
        """Wait up to `timeout` for the abandoned calls of job `owner` to return. Those that do not are stuck:
        returns the name of one's thread (None when none is stuck), and a new thread replaces each."""
        with self._lock:
            calls = [call for call in self._abandoned if call.owner == owner]
        if not calls:
            return None
        await asyncio.wait([call.future for call in calls], timeout=timeout)
        stuck = [call for call in calls if self._mark_stuck(call)]
        return stuck[0].thread if stuck else None

    def _mark_stuck(self, call: _Call) -> bool:
        with call.lock, self._lock:
            self._abandoned.discard(call)
            if call.done or self._closed:
                return False
            self._stuck.add(call)
            self.stuck_total += 1
            stuck = len(self._stuck)  # the next call that finds no idle thread starts one in its place
            if self._backlog and stuck <= self.max_stuck:  # or a call queued for a thread now
                self._backlog -= 1
                self._spawn_locked()
        log.warning(
            "thread %s is stuck in a plain-def handler method of job %s after its end (%d stuck in %s); %s",
            call.thread,
            call.owner,
            stuck,
            self.name,
            "a new thread replaces it" if stuck <= self.max_stuck else "too many stuck: not replaced",
        )
        return True

    def _spawn_locked(self) -> None:
        thread = threading.Thread(target=self._main, name=f"{self.name}-{next(self._serial)}", daemon=True)
        self._threads.add(thread)
        thread.start()

    def _main(self) -> None:
        me = threading.current_thread()
        while True:
            call = self._work.get()
            if call is None:
                break
            with call.lock:
                if call.abandoned:
                    with self._lock:
                        self._next_locked()
                    continue
                call.started, call.thread = True, me.name
            try:
                outcome: tuple[bool, Any] = (True, call.fn(*call.args))
            except BaseException as exc:  # whatever the handler raised goes to its caller, as a value
                outcome = (False, exc)
            with call.lock, self._lock:
                call.done = True
                was_stuck = call in self._stuck
                self._stuck.discard(call)
                self._abandoned.discard(call)
                surplus = was_stuck and len(self._threads) - len(self._stuck) > self.size
                if surplus or self._closed:
                    self._threads.discard(me)
                else:
                    self._next_locked()
            try_call_in_loop(call.loop, _deliver, call.future, outcome)  # False: its loop closed, nobody waits
            del call, outcome
            if surplus or self._closed:
                return
        with self._lock:
            self._threads.discard(me)

    def _next_locked(self) -> None:
        """This thread is free again: it takes a queued call no thread was claimed for, else waits idle."""
        if self._backlog:
            self._backlog -= 1
        else:
            self._idle += 1

    def shutdown(self) -> None:
        """Let idle threads exit; calls still running finish on their own (their threads are daemons)."""
        with self._lock:
            self._closed = True
            count = len(self._threads)
        for _ in range(count):
            self._work.put(None)


def _deliver(future: asyncio.Future[tuple[bool, Any]], outcome: tuple[bool, Any]) -> None:
    if not future.done():
        future.set_result(outcome)
