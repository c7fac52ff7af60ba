"""StagePool: one stage's queue and workers, on a thread and event loop of their own."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from prorl_server.pipeline.job import Job
from prorl_server.pipeline.loop_thread import LoopThread
from prorl_server.pipeline.stages import Stage

log = logging.getLogger(__name__)


class StagePool:
    """`workers` coroutines pull jobs from this stage's queue and run `process(job)` on each.

    Synchronous handler methods run on `executor`, a thread pool of the same size, so a blocking
    handler holds one of this stage's slots and nothing else.
    """

    def __init__(
        self,
        stage: Stage,
        workers: int,
        process: Callable[[Job], Awaitable[None]],
        on_loop_stop: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.stage = stage
        self.workers = workers
        self._process = process
        self._on_loop_stop = on_loop_stop
        self._thread = LoopThread(f"prorl-{stage}")
        self._queue: asyncio.Queue[Job] | None = None
        self._worker_tasks: list[asyncio.Task[None]] = []
        self._side_tasks: set[asyncio.Task[Any]] = set()
        self.busy = 0
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None

    @property
    def running(self) -> bool:
        """True between start() and stop()."""
        return self._thread.alive

    @property
    def depth(self) -> int:
        """Jobs waiting in this stage's queue."""
        return self._queue.qsize() if self._queue is not None else 0

    def start(self) -> None:
        """Start the loop thread and its workers."""
        self.executor = concurrent.futures.ThreadPoolExecutor(
            self.workers, thread_name_prefix=f"prorl-{self.stage}-sync"
        )
        self._thread.start()
        self._thread.submit(self._spawn_workers()).result()

    async def _spawn_workers(self) -> None:
        self._queue = asyncio.Queue()
        self._worker_tasks = [
            asyncio.create_task(self._worker(), name=f"{self.stage}-worker-{i}") for i in range(self.workers)
        ]

    async def _worker(self) -> None:
        assert self._queue is not None
        while True:
            job = await self._queue.get()
            self.busy += 1
            try:
                await self._process(job)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s worker crashed on job %s (this is a bug in prorl-server)", self.stage, job.id)
            finally:
                self.busy -= 1

    def put(self, job: Job) -> None:
        """Enqueue a job from any thread."""
        assert self._queue is not None, f"{self.stage} pool is not running"
        self._thread.call_soon(self._queue.put_nowait, job)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a side coroutine (for example a cancelled job's resource release) on this pool's loop."""
        if not self.running:
            coro.close()
            return

        def create() -> None:
            task = asyncio.ensure_future(coro)
            self._side_tasks.add(task)
            task.add_done_callback(self._side_tasks.discard)

        try:
            self._thread.call_soon(create)
        except RuntimeError:  # loop closing
            coro.close()

    def stop(self, grace_s: float) -> None:
        """Let busy workers and side tasks finish (up to `grace_s`), then cancel everything and join."""
        if not self.running:
            return
        try:
            self._thread.submit(self._drain(grace_s)).result(grace_s + 5)
        except concurrent.futures.TimeoutError:
            log.warning("%s pool did not drain within %.1fs", self.stage, grace_s)
        self._thread.stop()
        self._queue = None
        self._worker_tasks = []
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.executor = None

    async def _drain(self, grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        while (self.busy or self._side_tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        for task in self._worker_tasks:
            task.cancel()
        await asyncio.gather(*self._worker_tasks, return_exceptions=True)
        if self._on_loop_stop is not None:
            await self._on_loop_stop()
