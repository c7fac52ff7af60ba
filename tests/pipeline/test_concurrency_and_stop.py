"""Hundreds of concurrent jobs all finish; /stop leaves every job terminal and nothing running."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
from httpx_aiohttp import AiohttpTransport
from suite_servers import default_handlers


def test_500_concurrent_jobs_all_terminal(server, backend):
    async def run_all() -> list[dict]:
        transport = AiohttpTransport(limits=httpx.Limits(max_connections=600))  # httpx's pool crawls at 500
        async with httpx.AsyncClient(base_url=server.url, timeout=120, transport=transport) as client:
            body = {"instance": {"data_source": "multiturn", "question": "q"}, "sampling_params": {"max_turns": 2}}
            responses = await asyncio.gather(*(client.post("/process", json=body) for _ in range(500)))
        return [r.json() for r in responses]

    results = asyncio.run(run_all())
    assert len({r["job_id"] for r in results}) == 500
    assert {r["status"] for r in results} == {"completed"}
    assert all(len(r["trajectory"]["turns"]) == 2 for r in results)
    status = server.http.get("/status").json()
    assert status["jobs"] == {"stored_results": 500}
    assert server.state.backends.backends()[0].in_flight == 0


def test_stop_with_jobs_in_flight_cancels_all_and_leaves_nothing_running(start_server, backend):
    handlers = default_handlers()
    server = start_server([backend.address], handlers=handlers, init_workers=4, run_workers=8, eval_workers=2)
    backend.double.default_delay_s = 30  # every generation hangs until aborted
    ids = [f"j{i}" for i in range(60)]
    for i, job_id in enumerate(ids):
        instance = {"data_source": "slow", "init_s": 0.2 if i % 2 else 0.0}
        assert server.http.post("/jobs", json={"instance": instance, "job_id": job_id}).status_code == 202
    deadline = time.monotonic() + 10
    while sum(r.outcome == "running" for r in backend.double.requests) < 8 and time.monotonic() < deadline:
        time.sleep(0.02)
    stages = {server.http.get(f"/jobs/{j}").json()["status"] for j in ids}
    assert {"run", "queued"} <= stages

    stopped = server.http.post("/stop", timeout=30).json()
    assert stopped == {"running": False, "cancelled_jobs": 60}
    results = {j: server.http.get(f"/jobs/{j}").json() for j in ids}
    assert {r["status"] for r in results.values()} == {"cancelled"}
    assert {r["result"]["error"]["type"] for r in results.values()} == {"ServerStopped"}
    # every job whose INIT ran got its resources released; no stage thread or LLM request is left
    deadline = time.monotonic() + 5
    while any(r.outcome == "running" for r in backend.double.requests) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(r.outcome == "running" for r in backend.double.requests)
    assert sorted(handlers["slow"].released) == sorted(set(handlers["slow"].released))
    assert not any(p.running for p in server.state.orchestrator.pools.values())
    assert not [t.name for t in threading.enumerate() if t.name.startswith(("prorl-init", "prorl-run", "prorl-eval"))]
    assert server.state.backends.backends()[0].in_flight == 0
    assert server.http.get("/status").json()["jobs"] == {"stored_results": 60}

    backend.double.default_delay_s = 0
    assert server.http.post("/start").json()["running"] is True
    assert server.http.post("/process", json={"instance": {"data_source": "noop"}}).json()["status"] == "completed"
