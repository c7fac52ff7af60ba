"""Synchronous handler methods run on the stage's worker threads and cannot stall the API or other stages."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
from suite_servers import default_handlers

from prorl_server import AgentHandler, JobContext
from prorl_server.handlers import JobFinished


def test_blocking_sync_init_stalls_neither_api_nor_other_jobs(start_server, backend):
    handlers = default_handlers()
    server = start_server([backend.address], handlers=handlers, init_workers=4)
    results: list[dict] = []
    blocker = threading.Thread(
        target=lambda: results.append(
            httpx.post(
                f"{server.url}/process", json={"instance": {"data_source": "sync", "block_s": 2}}, timeout=30
            ).json()
        )
    )
    blocker.start()
    time.sleep(0.3)  # the sync init is now sleeping in an INIT worker thread

    started = time.monotonic()
    assert server.http.get("/health").status_code == 200
    assert time.monotonic() - started < 0.5
    other = server.http.post("/process", json={"instance": {"data_source": "multiturn", "question": "q"}}).json()
    assert other["status"] == "completed" and time.monotonic() - started < 1.5
    assert blocker.is_alive()  # still blocked: the other job really overtook it

    blocker.join(30)
    assert results[0]["status"] == "completed" and results[0]["reward"] == 0.5
    assert results[0]["artifacts"]["text"] == "reply"  # the suite backend's default reply
    assert results[0]["timing"]["init_s"] >= 2
    names = handlers["sync"].threads
    assert {n.rsplit("-", 1)[0] for n in names} == {"prorl-init-sync", "prorl-run-sync", "prorl-eval-sync"}


class WaitsForeverHandler(AgentHandler):
    """RUN, a plain def, waits through ctx.wait on a coroutine that never ends; records how it ended."""

    name = "waits_forever"

    def __init__(self) -> None:
        self.started = threading.Event()
        self.ended: list[BaseException] = []
        self.cancelled = threading.Event()

    def run(self, ctx: JobContext) -> None:
        try:
            ctx.wait(self.forever())
        except Exception as exc:
            self.ended.append(exc)
            raise

    async def forever(self) -> None:
        self.started.set()
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    def eval(self, ctx: JobContext) -> float:
        return 0.0


def test_ending_a_job_cancels_its_sync_stage_wait_and_frees_the_thread(start_server, backend):
    handler = WaitsForeverHandler()
    server = start_server([backend.address], handlers={"waits_forever": handler}, run_workers=1)
    server.http.post("/jobs", json={"instance": {"data_source": "waits_forever"}, "job_id": "stuck"})
    assert handler.started.wait(30)
    assert server.http.post("/cancel", json={"job_id": "stuck"}).json()["status"] == "cancelled"
    assert handler.cancelled.wait(30)  # the coroutine on the stage loop was cancelled...
    assert ended(handler, 1) and isinstance(handler.ended[0], JobFinished)  # ...and the thread let go
    # The only RUN thread is free again: the next job runs (and times out in its own wait).
    body = {"instance": {"data_source": "waits_forever"}, "job_id": "next", "timeout": 0.5}
    assert server.http.post("/process", json=body).json()["status"] == "timeout"
    assert ended(handler, 2) and isinstance(handler.ended[1], JobFinished)


def ended(handler: WaitsForeverHandler, count: int, timeout: float = 30.0) -> bool:
    """Wait until `count` run() calls have ended."""
    deadline = time.monotonic() + timeout
    while len(handler.ended) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(handler.ended) == count


def test_handler_threads_start_when_calls_need_them_up_to_the_stage_size():
    """A stage's threads for plain-def methods start on demand (10,000 async-only workers start none), run
    `size` calls at once, are reused, and a call beyond `size` waits for one to free up."""
    from prorl_server.pipeline.handler_threads import HandlerThreads

    pool = HandlerThreads(4, "on-demand-test")

    def ours() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("on-demand-test-")]

    async def main() -> None:
        assert not ours()
        together = threading.Barrier(4, timeout=10)  # passes only with 4 calls running at once
        outcomes = await asyncio.gather(*(pool.run(together.wait, owner=f"j{i}") for i in range(4)))
        assert all(ok for ok, _ in outcomes), outcomes
        for _ in range(8):
            assert (await pool.run(threading.get_ident, owner="again"))[0]
        assert len(ours()) == 4  # reused, none added
        release = threading.Event()
        busy = [asyncio.ensure_future(pool.run(release.wait, 10, owner=f"b{i}")) for i in range(4)]
        fifth = asyncio.ensure_future(pool.run(time.monotonic, owner="fifth"))
        await asyncio.sleep(0.3)
        assert not fifth.done() and len(ours()) == 4  # waits for a thread: the stage has 4
        release.set()
        assert (await asyncio.wait_for(fifth, 10))[0]
        await asyncio.gather(*busy)

    try:
        asyncio.run(main())
    finally:
        pool.shutdown()


def test_a_timeout_releases_a_sync_stage_wait_as_fast_as_a_cancel(start_server, backend):
    handler = WaitsForeverHandler()
    server = start_server([backend.address], handlers={"waits_forever": handler}, cancel_grace_s=2.5)
    body = {"instance": {"data_source": "waits_forever"}, "job_id": "late", "timeout": 0.3}
    started = time.monotonic()
    result = server.http.post("/process", json=body).json()
    assert time.monotonic() - started < 1.5  # not the 2.5 s cancel grace
    assert result["status"] == "timeout" and "thread" not in result["error"]["message"]
    assert handler.cancelled.wait(5)  # the awaited coroutine was cancelled
    assert ended(handler, 1) and isinstance(handler.ended[0], JobFinished)
    assert server.state.orchestrator.pools["run"].threads.stuck == 0


class KeepsGoingHandler(AgentHandler):
    """RUN, a plain def, ignores the end of its job (it sleeps through it) and then calls ctx.wait again; a
    plain-def final_result waits on a coroutine too."""

    name = "keeps_going"

    def __init__(self) -> None:
        self.ran: list[str] = []  # the coroutines that ran
        self.after_end: list[BaseException] = []
        self.done = threading.Event()

    async def mark(self, name: str) -> str:
        self.ran.append(name)
        return name

    def run(self, ctx: JobContext) -> None:
        try:
            time.sleep(1.0)  # the job times out meanwhile
            ctx.wait(self.mark("run after the end"))
        except JobFinished as exc:
            self.after_end.append(exc)
        finally:
            self.done.set()

    def eval(self, ctx: JobContext) -> float:
        return 0.0

    def final_result(self, ctx, result):
        result.artifacts["final"] = ctx.wait(self.mark("final_result"))
        return result


def test_a_sync_stage_that_outlives_its_job_cannot_start_new_work_but_final_result_can(start_server, backend):
    handler = KeepsGoingHandler()
    server = start_server([backend.address], handlers={"keeps_going": handler})
    body = {"instance": {"data_source": "keeps_going"}, "job_id": "late", "timeout": 0.2}
    result = server.http.post("/process", json=body).json()
    assert result["status"] == "timeout" and result["artifacts"]["final"] == "final_result"
    assert handler.done.wait(10)
    assert len(handler.after_end) == 1 and "has already ended" in str(handler.after_end[0])
    assert handler.ran == ["final_result"]  # run()'s coroutine after the end never ran
