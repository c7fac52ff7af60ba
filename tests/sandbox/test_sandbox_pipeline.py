"""Jobs with real sandboxes: cancel closes the job's sandbox, /stop closes every one."""

from __future__ import annotations

import time

from prorl_server import AgentHandler, JobContext
from prorl_server.sandbox import SandboxManager
from prorl_server.sandbox.reaper import tagged_processes

pytest_plugins = ("sandbox_fixtures",)


class SandboxedHandler(AgentHandler):
    """INIT starts a sandbox; RUN runs a command that never returns in it."""

    name = "sandboxed"

    def __init__(self) -> None:
        self.sandbox_ids: list[str] = []

    async def init(self, ctx: JobContext) -> None:
        sandbox = await ctx.start_sandbox()
        self.sandbox_ids.append(sandbox.id)

    async def run(self, ctx: JobContext) -> None:
        await ctx.sandbox.bash("sleep 600", timeout=600, dop=0)  # waits: holds no core

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


def live_processes(sandbox_ids: list[str]) -> list[int]:
    """PIDs of processes of these sandboxes."""
    ids = set(sandbox_ids)
    return [p.pid for p in tagged_processes() if p.sandbox_id in ids]


def serve(start_server, backend, harness, **settings):
    """A server whose jobs get sandboxes from the harness's runtime."""
    handler = SandboxedHandler()
    server = start_server([backend.address], handlers={"sandboxed": handler}, **settings)
    manager = SandboxManager(harness.runtime, harness.owner, harness.spec())
    server.state.orchestrator.sandboxes = manager
    return server, handler, manager


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_cancel_closes_the_jobs_sandbox(start_server, backend, any_runtime):
    server, handler, manager = serve(start_server, backend, any_runtime)
    server.http.post("/jobs", json={"instance": {"data_source": "sandboxed"}, "job_id": "victim"})
    wait_until(lambda: server.http.get("/jobs/victim").json()["status"] == "run" and manager.live == 1)
    wait_until(lambda: len(live_processes(handler.sandbox_ids)) >= 3)  # the sleep runs in the sandbox

    assert server.http.post("/cancel", json={"job_id": "victim"}).json()["status"] == "cancelled"
    wait_until(lambda: manager.live == 0 and not live_processes(handler.sandbox_ids), timeout=15)
    assert any_runtime.leftovers(handler.sandbox_ids) == {}  # processes, private directory, cgroups


def test_stop_closes_every_sandbox(start_server, backend, any_runtime):
    server, handler, manager = serve(start_server, backend, any_runtime, init_workers=4, run_workers=8)
    for i in range(6):
        server.http.post("/jobs", json={"instance": {"data_source": "sandboxed"}, "job_id": f"j{i}"})
    wait_until(lambda: manager.live == 6 and len(handler.sandbox_ids) == 6)

    assert server.http.post("/stop").status_code == 200
    assert manager.live == 0
    wait_until(lambda: not live_processes(handler.sandbox_ids), timeout=15)
    assert any_runtime.leftovers(handler.sandbox_ids) == {}
    assert {server.http.get(f"/jobs/j{i}").json()["result"]["status"] for i in range(6)} == {"cancelled"}
