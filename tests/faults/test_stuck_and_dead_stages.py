"""A job ends within its timeout and the cancel grace whatever its handler does; a stage whose event loop dies
is restarted; /health says when the server is degraded.

Each test starts its own server (2 workers per stage, a 0.5 s cancel grace) with the fault handlers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from fault_handlers import AsyncFaultHandler, LoopKillerHandler, ServiceHolderHandler, SyncFaultHandler

from prorl_server import AgentHandler, JobContext
from prorl_server.client import RolloutClient
from prorl_server.observability import health as health_module
from prorl_server.protocol import HealthResponse

GRACE_S = 0.5
SLACK_S = 3.0  # scheduling noise on a busy machine; a hang would take the whole HTTP timeout


class LoopBlocker(AgentHandler):
    """An `async def` RUN that blocks its event loop with a synchronous sleep (`block_s`)."""

    name = "loop_blocker"

    async def run(self, ctx: JobContext) -> None:
        time.sleep(float(ctx.instance["block_s"]))

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


@pytest.fixture
def handlers() -> dict[str, AgentHandler]:
    return {
        "fault_async": AsyncFaultHandler(),
        "fault_sync": SyncFaultHandler(),
        "loop_killer": LoopKillerHandler(),
        "loop_blocker": LoopBlocker(),
    }


@pytest.fixture
def server(start_server, backend, handlers):
    server = start_server(
        [backend.address], handlers=handlers, init_workers=2, run_workers=2, eval_workers=2, cancel_grace_s=GRACE_S
    )
    yield server
    handlers["fault_sync"].blocked.set()  # let the threads blocked on purpose go before the leak check


def post_all(server, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """POST /process each body at once; their results in order."""
    results: list[dict[str, Any]] = [{}] * len(bodies)

    def post(i: int) -> None:
        results[i] = server.http.post("/process", json=bodies[i]).json()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def probe(server) -> None:
    """Jobs through INIT, RUN and EVAL, more at once than any stage has workers, all complete."""
    bodies = [{"instance": {"data_source": name, "method": "none"}} for name in ("fault_async", "fault_sync") * 3]
    assert [r["status"] for r in post_all(server, bodies)] == ["completed"] * 6


def test_a_handler_ignoring_cancellation_still_times_out_on_schedule(server):
    body = {"instance": {"data_source": "fault_async", "method": "run", "fault": "ignore_cancel"}, "timeout": 1.0}
    started = time.monotonic()
    result = server.http.post("/process", json=body).json()
    elapsed = time.monotonic() - started
    assert result["status"] == "timeout"
    assert "ignored cancellation" in result["error"]["message"]
    assert elapsed < 1.0 + GRACE_S + SLACK_S
    status = server.http.get("/status").json()
    assert status["stuck_calls"]["run"] == 1
    probe(server)


def test_a_cancel_the_server_asked_for_stays_cancelled_even_if_ignored(server):
    body = {"instance": {"data_source": "fault_async", "method": "run", "fault": "ignore_cancel"}, "job_id": "ig"}
    assert server.http.post("/jobs", json=body).status_code == 202
    deadline = time.monotonic() + 10
    while server.http.get("/jobs/ig").json()["status"] != "run" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.http.delete("/jobs/ig").status_code == 200
    result = server.http.get("/jobs/ig").json()["result"]
    assert result["status"] == "cancelled" and result["error"]["type"] == "Cancelled"
    probe(server)


def test_blocked_threads_are_replaced_counted_and_reported(server, handlers):
    body = {"instance": {"data_source": "fault_sync", "method": "run", "fault": "block"}, "timeout": 1.0}
    started = time.monotonic()
    results = post_all(server, [body] * 3)  # more than the stage's 2 threads
    elapsed = time.monotonic() - started
    assert [r["status"] for r in results] == ["timeout"] * 3
    for result in results:
        assert "thread prorl-run-sync-" in result["error"]["message"] and "replaced" in result["error"]["message"]
    assert elapsed < 2 * (1.0 + GRACE_S) + SLACK_S  # the third waited for a replacement, not for the blocked ones

    status = server.http.get("/status").json()
    assert status["stuck_calls"]["run"] == 3
    health = server.http.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "degraded"
    assert any("3 handler calls still running" in p for p in health.json()["problems"])
    metrics = server.http.get("/metrics").text
    assert 'prorl_stage_stuck_threads_total{stage="run"} 3.0' in metrics
    assert 'prorl_stage_stuck_handler_calls{stage="run"} 3.0' in metrics
    assert "prorl_degraded 1.0" in metrics
    probe(server)  # the stage still has its 2 threads

    handlers["fault_sync"].blocked.set()
    deadline = time.monotonic() + 10
    while server.http.get("/status").json()["stuck_calls"]["run"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.http.get("/health").status_code == 200
    pool = server.state.orchestrator.pools["run"]
    run_threads = [t for t in threading.enumerate() if t.name.startswith("prorl-run-sync-")]
    assert len(run_threads) == pool.workers  # the surplus threads left once their calls returned
    probe(server)


@pytest.mark.parametrize("how", ["stop", "callback_exit", "task_exit"])
def test_a_dead_stage_loop_fails_its_jobs_and_is_restarted(server, how):
    result = server.http.post("/process", json={"instance": {"data_source": "loop_killer", "how": how}}).json()
    assert result["status"] == "failed"
    assert result["error"]["stage"] == "run" and result["error"]["type"] == "StageLoopDied"
    status = server.http.get("/status").json()
    assert status["loop_restarts"] == {"init": 0, "run": 1, "eval": 0}
    assert 'prorl_stage_loop_restarts_total{stage="run"} 1.0' in server.http.get("/metrics").text
    assert server.http.get("/health").status_code == 200
    probe(server)
    assert server.http.post("/stop").status_code == 200
    assert server.http.post("/start").status_code == 200
    probe(server)


def test_jobs_queued_behind_a_dying_loop_go_on(server):
    bodies = [{"instance": {"data_source": "loop_killer", "how": "task_exit"}}] + [
        {"instance": {"data_source": "fault_async", "method": "none"}}
    ] * 5
    results = post_all(server, bodies)
    failed = [r for r in results if r["status"] == "failed"]
    assert all(r["error"]["type"] == "StageLoopDied" for r in failed)
    assert results[0] in failed
    assert sum(r["status"] == "completed" for r in results) >= 3  # at most the other RUN worker's job died too
    probe(server)


def test_a_dead_stage_loop_leaves_no_service_slot_held_or_waiting(start_server, backend, handlers):
    server = start_server(
        [backend.address],
        handlers={**handlers, "service_holder": ServiceHolderHandler()},
        run_workers=2,
        cancel_grace_s=GRACE_S,
        service_quotas=["one=1"],
    )
    quota = server.state.orchestrator.services.get("one")
    bodies = [
        {"instance": {"data_source": "service_holder"}},
        {"instance": {"data_source": "service_holder", "then_kill": True}},
    ]
    results = post_all(server, bodies)
    assert [r["error"]["type"] for r in results] == ["StageLoopDied"] * 2
    figures = quota.snapshot()
    assert (figures.in_use, figures.waiting) == (0, 0), figures  # the holder's slot came back, the waiter left
    assert figures.granted_total == figures.released_total == 1
    probe(server)


def test_health_is_degraded_while_a_loop_is_blocked_and_jobs_are_overdue(server, monkeypatch):
    monkeypatch.setattr(health_module, "STALL_S", 1.0)
    body = {"instance": {"data_source": "loop_blocker", "block_s": 4.5}, "timeout": 0.5}
    poster = threading.Thread(target=server.http.post, args=("/process",), kwargs={"json": body})
    poster.start()
    seen: set[str] = set()
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        health = server.http.get("/health")
        if health.status_code == 503:
            seen.update(health.json()["problems"])
        time.sleep(0.1)
    poster.join()
    assert any("the run stage's event loop has not turned" in p for p in seen), seen
    assert any("past their budget" in p for p in seen), seen
    deadline = time.monotonic() + 5
    while server.http.get("/health").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server.http.get("/health").json() == {"status": "ok", "running": True, "problems": []}


def test_health_is_degraded_while_every_backend_fails(start_server, start_backend, handlers):
    backend = start_backend()
    server = start_server([backend.address], handlers=handlers, health_check_interval_s=0.2)
    assert server.http.get("/health").status_code == 200
    backend.server.stop()
    deadline = time.monotonic() + 10
    while server.http.get("/health").status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    health = server.http.get("/health")
    assert health.status_code == 503
    assert health.json()["problems"] == ["all 1 LLM backends fail their health checks"]
    assert server.http.get("/status").json()["problems"] == health.json()["problems"]

    async def client_health() -> HealthResponse:
        async with RolloutClient(server.url, api_key="") as client:
            return await client.health()

    seen = asyncio.run(client_health())  # a degraded answer is information for the client, not an error
    assert seen.status == "degraded" and seen.problems == health.json()["problems"]


def test_health_is_ok_when_stopped_or_without_backends(start_server, handlers):
    server = start_server([], handlers=handlers)
    assert server.http.get("/health").json() == {"status": "ok", "running": True, "problems": []}
    server.http.post("/stop")
    assert server.http.get("/health").json() == {"status": "ok", "running": False, "problems": []}
