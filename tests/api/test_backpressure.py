"""INIT cannot run ahead of RUN without bound: live sandboxes stay bounded when RUN is the bottleneck."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

from prorl_server import AgentHandler, JobContext
from prorl_server.pipeline.cross_loop_semaphore import CrossLoopSemaphore


class CountingSandboxHandler(AgentHandler):
    """INIT 'starts a sandbox' (counted until released); RUN is slow; tracks the peak of live sandboxes."""

    name = "counting"

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self._lock = threading.Lock()

    async def init(self, ctx: JobContext) -> None:
        with self._lock:
            self.live += 1
            self.peak = max(self.peak, self.live)
        ctx.on_release(self._closed)

    def _closed(self) -> None:
        with self._lock:
            self.live -= 1

    async def run(self, ctx: JobContext) -> None:
        await asyncio.sleep(0.05)

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


def test_live_sandboxes_bounded_by_run_capacity(start_server, backend):
    handler = CountingSandboxHandler()
    server = start_server(
        [backend.address], handlers={"counting": handler}, init_workers=8, run_workers=2, max_ready_for_run=2
    )
    for i in range(40):
        server.http.post("/jobs", json={"instance": {"data_source": "counting"}, "job_id": f"c{i}"})
    deadline = time.monotonic() + 30
    while len(server.http.get("/jobs", params={"limit": 100}).json()["results"]) < 40:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    # 2 in RUN + at most 2 started in INIT and waiting; never the 8 INIT workers' worth of extra sandboxes
    assert handler.peak <= 4
    assert handler.live == 0


def test_cancelled_jobs_give_their_permit_back(start_server, backend):
    handler = CountingSandboxHandler()
    server = start_server([backend.address], handlers={"counting": handler}, run_workers=1, max_ready_for_run=1)
    for i in range(5):
        server.http.post("/jobs", json={"instance": {"data_source": "counting"}, "job_id": f"x{i}"})
    for i in range(5):
        server.http.delete(f"/jobs/x{i}")
    result = server.http.post("/process", json={"instance": {"data_source": "counting"}}, timeout=10).json()
    assert result["status"] == "completed"
    assert server.state.orchestrator._ready_gate.available == 1


def test_cross_loop_semaphore_hands_permits_between_threads():
    gate = CrossLoopSemaphore(1)
    order: list[str] = []

    async def holder() -> None:
        await gate.acquire()
        order.append("held")
        await asyncio.sleep(0.2)
        gate.release()

    async def waiter() -> None:
        await asyncio.sleep(0.05)
        await gate.acquire()
        order.append("got")
        gate.release()

    threads = [threading.Thread(target=asyncio.run, args=(coro(),)) for coro in (holder, waiter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert order == ["held", "got"] and gate.available == 1


def test_cross_loop_semaphore_cancelled_waiter_passes_permit_on():
    async def scenario() -> int:
        gate = CrossLoopSemaphore(1)
        await gate.acquire()
        waiter = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0.01)
        waiter.cancel()
        gate.release()
        await asyncio.sleep(0.01)
        return gate.available

    assert asyncio.run(scenario()) == 1


def test_cross_loop_semaphore_waiter_cancelled_after_its_permit_came_passes_it_on():
    async def scenario() -> int:
        gate = CrossLoopSemaphore(1)
        await gate.acquire()
        waiter = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0)
        gate.release()
        await asyncio.sleep(0)  # the permit is handed over; the waiter is woken but has not run yet
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        return gate.available

    assert asyncio.run(scenario()) == 1
