"""StagePool: one stage's queue and workers, on a thread and event loop of their own, restarted if that loop
dies."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from prorl_server.handlers import exception_message
from prorl_server.pipeline.handler_threads import HandlerThreads
from prorl_server.pipeline.job import Job
from prorl_server.pipeline.loop_lag import LoopLag
from prorl_server.pipeline.loop_thread import LoopThread
from prorl_server.protocol import Stage

log = logging.getLogger(__name__)

LoopDeathCallback = Callable[[list[Job], asyncio.AbstractEventLoop, str], None]
"""Told, after a stage's loop died and a new one started, of the jobs that were inside the stage, the dead
loop and why it died."""


class StagePool:
    """`workers` coroutines pull jobs from this stage's queue and run `process(job)` on each.

    Synchronous handler methods run on `threads`, as many as there are workers, so a blocking handler holds
    one of this stage's slots and nothing else (see HandlerThreads for one that blocks for good).

    Supervised: if the loop dies (see LoopThread), the pool starts a new loop with fresh workers, queues
    again the jobs that were waiting, hands those that were inside the stage to `on_loop_death` and counts
    the restart in `restarts`.
    """

    def __init__(
        self,
        stage: Stage,
        workers: int,
        process: Callable[[Job], Awaitable[None]],
        on_loop_stop: Callable[[], Awaitable[None]] | None = None,
        *,
        grace_s: float = 5.0,
        on_loop_death: LoopDeathCallback | None = None,
    ) -> None:
        self.stage = stage
        self.workers = workers
        self.grace_s = grace_s
        self.restarts = 0
        self._stuck_before = 0  # stuck calls of the handler threads of earlier starts
        self.threads = HandlerThreads(workers, f"prorl-{stage}-sync")
        self._process = process
        self._on_loop_stop = on_loop_stop
        self._on_loop_death = on_loop_death
        self._lifecycle = threading.RLock()
        self._thread: LoopThread | None = None
        self._queue: asyncio.Queue[Job] | None = None
        self._queued: set[Job] = set()  # put and not yet taken by a worker (survives a dead loop)
        self._processing: set[Job] = set()  # taken by a worker and not done
        self._orphans: list[Coroutine[Any, Any, Any]] = []  # side coroutines its dead loop never ran
        self._worker_tasks: list[asyncio.Task[None]] = []
        self._side_tasks: set[asyncio.Task[Any]] = set()
        self._stuck_tasks: set[asyncio.Task[Any]] = set()
        self._stopped = True

    @property
    def running(self) -> bool:
        """True between start() and stop()."""
        thread = self._thread
        return thread is not None and thread.alive

    @property
    def busy(self) -> int:
        """Workers processing a job now."""
        return len(self._processing)

    @property
    def depth(self) -> int:
        """Jobs waiting in this stage's queue."""
        return len(self._queued)

    @property
    def stalled_s(self) -> float:
        """Seconds the stage's loop is late to turn (a handler blocks it); 0 when it turns."""
        thread = self._thread
        return thread.stalled_s if thread is not None else 0.0

    @property
    def lag(self) -> LoopLag | None:
        """How late the stage's loop runs what is due on it (None while the pool is stopped)."""
        thread = self._thread
        return thread.lag if thread is not None else None

    @property
    def stuck(self) -> int:
        """Handler calls still running after their job ended: blocked threads and tasks that ignored
        cancellation."""
        return self.threads.stuck + len(self._stuck_tasks)

    @property
    def stuck_total(self) -> int:
        """Plain-def handler calls that outlived their job's cancel grace, since the server started."""
        return self._stuck_before + self.threads.stuck_total

    def start(self) -> None:
        """Start the loop thread and its workers (handler threads start when a plain-def call needs one)."""
        with self._lifecycle:
            self._stopped = False
            self._stuck_before = self.stuck_total
            self.threads = HandlerThreads(self.workers, f"prorl-{self.stage}-sync")
            self._start_loop_locked()

    def _start_loop_locked(self) -> None:
        thread = LoopThread(f"prorl-{self.stage}", on_death=lambda error: self._loop_died(thread, error))
        self._thread = thread
        thread.start()
        thread.submit(self._spawn_workers()).result()

    async def _spawn_workers(self) -> None:
        self._queue = asyncio.Queue()
        self._worker_tasks = [
            asyncio.create_task(self._worker(self._queue), name=f"{self.stage}-worker-{i}") for i in range(self.workers)
        ]

    async def _worker(self, queue: asyncio.Queue[Job]) -> None:
        while True:
            job = await queue.get()
            with self._lifecycle:
                if job not in self._queued:  # queued again on a new loop already
                    continue
                self._queued.discard(job)
                self._processing.add(job)
            try:
                await self._process(job)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s worker crashed on job %s (this is a bug in prorl-server)", self.stage, job.id)
            finally:
                self._processing.discard(job)

    def put(self, job: Job) -> None:
        """Enqueue a job from any thread."""
        with self._lifecycle:
            assert self._thread is not None and self._queue is not None, f"{self.stage} pool is not running"
            self._queued.add(job)
            with contextlib.suppress(RuntimeError):  # the loop died: the restart queues it again
                self._thread.call_soon(self._queue.put_nowait, job)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a side coroutine (for example a cancelled job's resource release) on this pool's loop."""
        with self._lifecycle:
            if self._stopped or self._thread is None:
                coro.close()
                return
            try:
                self._thread.call_soon(self._add_side_task, coro)
            except RuntimeError:  # the loop died: the restart runs it
                self._orphans.append(coro)

    def _add_side_task(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    def keep_stuck(self, task: asyncio.Task[Any]) -> None:
        """Count `task` (a handler call that ignored cancellation past the grace) as stuck until it ends."""
        self._stuck_tasks.add(task)
        task.add_done_callback(self._stuck_tasks.discard)

    def _loop_died(self, thread: LoopThread, error: BaseException | None) -> None:
        """On the dead loop's thread: start a new loop, queue the waiting jobs on it again, report the rest."""
        with self._lifecycle:
            if thread is not self._thread or self._stopped:
                return
            dead_loop = thread.loop
            self.restarts += 1
            inside = list(self._processing)
            self._processing.clear()
            self._stuck_tasks.clear()  # they died with their loop
            self._side_tasks.clear()
            orphans, self._orphans = self._orphans, []
            waiting = list(self._queued)
            self._start_loop_locked()
            assert self._thread is not None and self._queue is not None
            for job in waiting:
                self._thread.call_soon(self._queue.put_nowait, job)
            for coro in orphans:
                self._thread.call_soon(self._add_side_task, coro)
        why = (
            f"{type(error).__name__}: {exception_message(error)}"
            if error is not None
            else "loop.stop() was called on it"
        )
        log.error(
            "the %s stage's event loop died (%s), probably in handler code; restarted it (restart %d): %d jobs "
            "inside the stage fail, %d queued go on",
            self.stage,
            why,
            self.restarts,
            len(inside),
            len(waiting),
        )
        if self._on_loop_death is not None and dead_loop is not None:
            self._on_loop_death(inside, dead_loop, why)

    def stop(self, grace_s: float) -> None:
        """Let busy workers and side tasks finish (up to `grace_s`), then cancel everything and join."""
        with self._lifecycle:
            self._stopped = True
            thread = self._thread
        if thread is not None and thread.alive:
            try:
                thread.submit(self._drain(grace_s)).result(grace_s + 5)
            except (concurrent.futures.TimeoutError, RuntimeError):
                log.warning("%s pool did not drain within %.1fs", self.stage, grace_s)
        if thread is not None:
            thread.stop(timeout=grace_s + 1)
        with self._lifecycle:
            self._thread = None
            self._queue = None
            self._worker_tasks = []
            self._queued.clear()
            self._processing.clear()
            for coro in self._orphans:
                coro.close()
            self._orphans = []
        self.threads.shutdown()

    async def _drain(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        while (self._processing or self._side_tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        for task in self._worker_tasks:
            task.cancel()
        await asyncio.gather(*self._worker_tasks, return_exceptions=True)
        if self._on_loop_stop is not None:
            await self._on_loop_stop()
