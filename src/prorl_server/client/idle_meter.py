"""IdleWorkerMeter: how long the servers' workers of one stage sat idle, sampled from `GET /status`."""

from __future__ import annotations

import asyncio
import contextlib
import time

from prorl_server.client.rollout_client import RolloutClient


class IdleWorkerMeter:
    """Idle worker-seconds of one stage's pool (`workers - busy_workers` from `GET /status`), summed over the
    client's servers, sampled every `interval_s` while running (`async with`, or `start()` / `stop()`).
    Each sample holds until the next one. A server whose status cannot be read is skipped in that sample."""

    def __init__(self, client: RolloutClient, *, stage: str = "run", interval_s: float = 0.1) -> None:
        self.client = client
        self.stage = stage
        self.interval_s = interval_s
        self.idle_worker_s = 0.0
        self.worker_s = 0.0
        self._task: asyncio.Task[None] | None = None
        self._last: tuple[float, int, int] | None = None  # (time, idle, workers) of the last sample

    async def __aenter__(self) -> IdleWorkerMeter:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def start(self) -> None:
        """Start sampling (on the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self._sample(), name="prorl-idle-meter")

    async def stop(self) -> tuple[float, float]:
        """Stop sampling; returns (idle worker-seconds, worker-seconds) since start."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._hold(time.monotonic())
        self._last = None
        return self.idle_worker_s, self.worker_s

    def _hold(self, now: float) -> None:
        if self._last is not None:
            at, idle, workers = self._last
            self.idle_worker_s += idle * (now - at)
            self.worker_s += workers * (now - at)

    async def _sample(self) -> None:
        while True:
            answers = await asyncio.gather(
                *(self.client.status(server=s) for s in self.client.servers), return_exceptions=True
            )
            idle = workers = 0
            for answer in answers:
                if isinstance(answer, BaseException):
                    if not isinstance(answer, Exception):
                        raise answer
                    continue
                pool = answer.workers.get(self.stage, 0)
                workers += pool
                idle += max(0, pool - answer.busy_workers.get(self.stage, 0))
            now = time.monotonic()
            self._hold(now)
            self._last = (now, idle, workers)
            await asyncio.sleep(self.interval_s)
