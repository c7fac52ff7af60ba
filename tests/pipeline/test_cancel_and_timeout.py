"""Cancellation aborts the backend request and releases resources; timeouts return partial trajectories."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time

import httpx
import pytest
from suite_servers import default_handlers

from prorl_server import AgentHandler, JobContext
from prorl_server.pipeline import PausableTimer
from prorl_server.testing import ScriptedReply


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(interval)


def test_cancel_mid_run_aborts_backend_request_releases_and_wakes_waiter(start_server, backend):
    handlers = default_handlers()
    server = start_server([backend.address], handlers=handlers)
    backend.double.push(ScriptedReply(text="slow", delay_s=30))
    waiter_result: dict = {}

    def blocking_process() -> None:
        body = {"instance": {"data_source": "slow"}, "job_id": "victim"}
        waiter_result.update(httpx.post(f"{server.url}/process", json=body, timeout=60).json())

    waiter = threading.Thread(target=blocking_process)
    waiter.start()
    wait_until(lambda: backend.double.requests and backend.double.requests[0].outcome == "running")
    assert server.http.get("/jobs/victim").json()["status"] == "run"

    started = time.monotonic()
    first = server.http.post("/cancel", json={"job_id": "victim"})
    assert first.status_code == 200 and first.json() == {"job_id": "victim", "status": "cancelled"}
    waiter.join(10)
    assert not waiter.is_alive() and time.monotonic() - started < 5
    assert waiter_result["status"] == "cancelled"
    assert waiter_result["error"]["stage"] == "run" and waiter_result["error"]["type"] == "Cancelled"

    wait_until(lambda: backend.double.requests[0].outcome == "aborted")  # vLLM sees the disconnect
    wait_until(lambda: handlers["slow"].released == ["victim"])
    assert handlers["slow"].cancelled == ["victim"]
    # idempotent, through both routes
    assert server.http.post("/cancel", json={"job_id": "victim"}).json()["status"] == "cancelled"
    assert server.http.delete("/jobs/victim").json()["status"] == "cancelled"
    assert server.http.get("/jobs/victim").json()["result"]["status"] == "cancelled"
    assert server.state.backends.backends()[0].in_flight == 0


def test_cancel_queued_job_releases_what_init_acquired(start_server, backend):
    handlers = default_handlers()
    server = start_server([backend.address], handlers=handlers, run_workers=1)
    backend.double.push(ScriptedReply(text="hog", delay_s=30))
    server.http.post("/jobs", json={"instance": {"data_source": "slow"}, "job_id": "hog"})
    wait_until(lambda: server.http.get("/jobs/hog").json()["status"] == "run")
    server.http.post("/jobs", json={"instance": {"data_source": "slow"}, "job_id": "waiting"})
    wait_until(lambda: "waiting" not in handlers["slow"].released and server.state.orchestrator.pools["run"].depth == 1)
    assert server.http.get("/jobs/waiting").json()["status"] == "queued"

    assert server.http.delete("/jobs/waiting").json()["status"] == "cancelled"
    wait_until(lambda: "waiting" in handlers["slow"].released)
    result = server.http.get("/jobs/waiting").json()["result"]
    assert result["error"]["stage"] == "run" and "queued" in result["error"]["message"]
    server.http.delete("/jobs/hog")


def test_cancel_unknown_job_is_404(server):
    response = server.http.post("/cancel", json={"job_id": "nope"})
    assert response.status_code == 404 and "nope" in response.json()["detail"]
    assert server.http.delete("/jobs/nope").status_code == 404


def test_timeout_returns_partial_trajectory(server, backend):
    backend.double.push("one", "two")
    body = {"instance": {"data_source": "slow", "turns": 2, "run_s": 30}, "timeout": 0.5}
    started = time.monotonic()
    result = server.http.post("/process", json=body).json()
    assert time.monotonic() - started < 10
    assert result["status"] == "timeout"
    assert result["error"]["stage"] == "run" and result["error"]["type"] == "Timeout"
    traj = result["trajectory"]
    assert len(traj["turns"]) == 2 and [t["text"] for t in traj["turns"]] == ["one", "two"]
    assert len(traj["response_ids"]) == len(traj["response_mask"]) == len(traj["response_logprobs"]) > 0
    assert result["reward"] is None
    assert 0.4 < result["timing"]["run_s"] < 5


def test_timeout_counts_stage_time_not_queue_time(start_server, backend):
    server = start_server([backend.address], eval_workers=1)
    # the first job holds the only EVAL worker for 1.5 s; the second waits in the EVAL queue meanwhile
    jobs = [
        {"instance": {"data_source": "slow", "eval_s": 1.5}, "job_id": "first", "timeout": 5},
        {"instance": {"data_source": "slow", "eval_s": 0.1}, "job_id": "second", "timeout": 1.0},
    ]
    server.http.post("/jobs", json=jobs[0])
    wait_until(lambda: server.http.get("/jobs/first").json()["status"] == "eval")
    server.http.post("/jobs", json=jobs[1])
    wait_until(lambda: all(server.http.get(f"/jobs/{j['job_id']}").json()["result"] for j in jobs), timeout=20)
    second = server.http.get("/jobs/second").json()["result"]
    assert second["status"] == "completed", second
    assert second["timing"]["queue_s"] > 1.0 > second["timing"]["eval_s"]


def test_pausable_timer_books_stage_time_only():
    now = [0.0]
    timer = PausableTimer(10.0, clock=lambda: now[0])
    now[0] = 5.0  # queued: not counted
    timer.start("init")
    now[0] = 6.0
    timer.pause()
    now[0] = 20.0  # queued again
    timer.start("run")
    now[0] = 23.0
    assert timer.remaining() == 6.0
    timer.pause()
    assert timer.stage_seconds("init") == 1.0 and timer.stage_seconds("run") == 3.0
    assert timer.wall_s() == 23.0 and timer.active_s == 4.0
    assert PausableTimer(None).remaining() is None


class TurnsCancelIntoHandler(AgentHandler):
    """RUN waits; a cancel becomes the BaseException named by `instance["into"]`."""

    name = "turns_cancel"

    def __init__(self) -> None:
        self.waiting = threading.Event()

    async def run(self, ctx: JobContext) -> None:
        self.waiting.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise {"SystemExit": SystemExit, "GeneratorExit": GeneratorExit}.get(
                ctx.instance["into"], KeyboardInterrupt
            )() from None

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


@pytest.mark.parametrize("into", ["SystemExit", "GeneratorExit", "KeyboardInterrupt"])
def test_a_cancel_the_handler_turns_into_a_base_exception_logs_no_unretrieved_task(start_server, backend, caplog, into):
    handler = TurnsCancelIntoHandler()
    server = start_server([backend.address], handlers={"turns_cancel": handler})
    caplog.set_level(logging.ERROR)
    server.http.post("/jobs", json={"instance": {"data_source": "turns_cancel", "into": into}, "job_id": "turned"})
    assert handler.waiting.wait(10)
    wait_until(lambda: server.http.get("/jobs/turned").json()["status"] == "run")
    assert server.http.post("/cancel", json={"job_id": "turned"}).json()["status"] == "cancelled"
    assert server.http.get("/jobs/turned").json()["result"]["error"]["type"] == "Cancelled"
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # the stage task is collected once the stage has let go of it
        gc.collect()
        time.sleep(0.05)
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
