"""No sandbox outlives its job: a plain-def handler cancelled or timed out while its sandbox starts, and a
forking group (`fork_after_init`) cancelled while it initialises, snapshots or forks.

A synchronous handler runs in a worker thread and reaches the stage's loop through `ctx.wait`, apart from
the stage task the server cancels. Once the job has ended, JobContext cancels the `ctx.wait` calls still
running, releases at once what is registered with `on_release`, refuses `start_sandbox`, and closes a
sandbox whose start completes anyway.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from prorl_server import AgentHandler, JobContext
from prorl_server.handlers import JobFinished
from prorl_server.llm import BackendPool, LLMSession, VLLMClient
from prorl_server.pipeline.loop_thread import LoopThread
from prorl_server.protocol import Trajectory
from prorl_server.sandbox import SandboxManager, make_runtime
from prorl_server.sandbox.containers import monitors, owner_containers
from prorl_server.sandbox.reaper import tagged_processes
from prorl_server.sandbox.registry import unavailable_reason

pytest_plugins = ("sandbox_fixtures",)

JOBS = 40  # of each kind: timed out, cancelled
TERMINAL = {"completed", "failed", "timeout", "cancelled"}


class SyncSandboxHandler(AgentHandler):
    """RUN, a plain def: start a sandbox, then wait on a command that never returns in it."""

    name = "sync_sandbox"

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.ended: list[str] = []  # how each run() ended

    def run(self, ctx: JobContext) -> None:
        with self.lock:
            self.running += 1
        outcome = "returned"
        try:
            sandbox = ctx.wait(ctx.start_sandbox())
            ctx.wait(sandbox.bash("sleep 600", timeout=600, dop=0))
        except Exception as exc:
            outcome = type(exc).__name__
            raise
        finally:
            with self.lock:
                self.running -= 1
                self.ended.append(outcome)

    def eval(self, ctx: JobContext) -> float:
        return 1.0


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.05) -> bool:
    """Poll `predicate` until it is true or `timeout` passes; returns its last value."""
    deadline = time.monotonic() + timeout
    while not (ok := predicate()) and time.monotonic() < deadline:
        time.sleep(interval)
    return bool(ok)


def owner_processes(owner: str) -> list[int]:
    """PIDs of live processes tagged with `owner`."""
    return [p.pid for p in tagged_processes() if p.owner == owner]


def described(pids: list[int]) -> list[str]:
    """Each PID with its command line (a leak's report says what leaked)."""
    lines = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        lines.append(f"{pid}: {b' '.join(argv).decode(errors='replace')[:200]}")
    return lines


@pytest.mark.parametrize("prewarm", [0, 2])
def test_sync_handlers_ended_during_their_sandbox_start_leak_nothing(start_server, backend, isolated, prewarm):
    if isolated.name != "bwrap" and prewarm:
        pytest.skip("waiting launchers (prewarm) are a bubblewrap option")
    options = {"prewarm": prewarm} if isolated.name == "bwrap" else {}
    handler = SyncSandboxHandler()
    server = start_server([backend.address], handlers={"sync_sandbox": handler}, run_workers=8)
    runtime = make_runtime(isolated.name, isolated.owner, **options)
    manager = SandboxManager(runtime, isolated.owner, isolated.spec())
    server.state.orchestrator.sandboxes = manager
    instance = {"data_source": "sync_sandbox"}

    # Budgets from 5 ms to 1.6 s: some end before the start, most during it, some after it.
    for i in range(JOBS):
        body = {"instance": instance, "job_id": f"timeout-{i}", "timeout": 0.005 * 1.16**i}
        assert server.http.post("/jobs", json=body).is_success
    # Cancels at moments spread over the same span, while the earlier jobs are still ending.
    for i in range(JOBS):
        assert server.http.post("/jobs", json={"instance": instance, "job_id": f"cancel-{i}"}).is_success
        time.sleep(0.02 * (i % 10))
        server.http.post("/cancel", json={"job_id": f"cancel-{i}"})

    ids = [f"{kind}-{i}" for kind in ("timeout", "cancel") for i in range(JOBS)]
    assert wait_until(lambda: all(server.http.get(f"/jobs/{j}").json()["status"] in TERMINAL for j in ids))
    statuses = {server.http.get(f"/jobs/{j}").json()["result"]["status"] for j in ids}
    assert statuses <= {"timeout", "cancelled"}, statuses
    assert wait_until(lambda: manager.live == 0), f"{manager.live} sandboxes outlived their jobs"
    runtime.close()  # the waiting launchers (prewarm) are not sandboxes of jobs
    assert wait_until(lambda: not owner_processes(isolated.owner)), described(owner_processes(isolated.owner))
    assert owner_containers(isolated.owner) == []  # podman's
    assert monitors(runtime.base_dir / isolated.owner) == [], described(monitors(runtime.base_dir / isolated.owner))
    # Every worker thread gets out of ctx.wait: the call it was waiting on was cancelled.
    assert wait_until(lambda: handler.running == 0), f"{handler.running} run() calls still blocked"
    assert "returned" not in handler.ended


class SlowForkingHandler(AgentHandler):
    """A forking handler whose INIT leaves 20 MB to snapshot, and whose RUN waits in its fork."""

    name = "slow_fork"
    fork_after_init = True

    async def init(self, ctx: JobContext) -> None:
        sandbox = await ctx.start_sandbox()
        await sandbox.bash("mkdir data && for i in $(seq 200); do head -c 100000 /dev/urandom > data/$i; done", 60)

    async def run(self, ctx: JobContext) -> None:
        await ctx.sandbox.bash("sleep 600", timeout=600, dop=0)

    def eval(self, ctx: JobContext) -> float:
        return 1.0


FORKING = [
    pytest.param(
        name, marks=pytest.mark.skipif(unavailable_reason(name) is not None, reason=f"{unavailable_reason(name)}")
    )
    for name in ("bwrap", "apptainer")
]


@pytest.mark.parametrize("isolated", FORKING, indirect=True)
def test_a_forking_group_cancelled_while_it_initialises_or_forks_leaves_nothing(start_server, backend, isolated):
    if isolated.runtime.fork_unavailable() is not None:
        pytest.skip(isolated.runtime.fork_unavailable())
    server = start_server([backend.address], handlers={"slow_fork": SlowForkingHandler()}, init_workers=4)
    runtime = isolated.remake(**({"prewarm": 0} if isolated.name == "bwrap" else {}))  # no waiting launchers
    manager = SandboxManager(runtime, isolated.owner, isolated.spec())
    server.state.orchestrator.sandboxes = manager
    delays = [0.0, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 1.0, 1.4, 2.0, 3.0]  # during INIT, the snapshot, the forks, RUN
    for i, delay in enumerate(delays):
        body = {"instance": {"data_source": "slow_fork"}, "n": 4, "group_id": f"g{i}"}
        assert server.http.post("/groups?wait=false", json=body).status_code == 202
        time.sleep(delay)
        assert server.http.delete(f"/groups/g{i}").is_success
    assert wait_until(lambda: all(server.http.get(f"/groups/g{i}").json()["status"] != "running" for i in range(11)))
    assert wait_until(lambda: manager.live == 0), f"{manager.live} sandboxes outlived their group"
    assert wait_until(lambda: not owner_processes(isolated.owner)), owner_processes(isolated.owner)
    assert wait_until(lambda: not isolated.leftovers()), isolated.leftovers()  # sandboxes' and snapshots' files
    with open("/proc/self/mountinfo") as mounts:
        assert isolated.owner not in mounts.read()  # forks' overlays lived in mount namespaces of their own


# --- JobContext after the job ended -------------------------------------------------------------------


class RecordingManager:
    """A SandboxManager stand-in: counts starts, records closes; a start may be held until released."""

    def __init__(self) -> None:
        self.started: list[object] = []
        self.closed: list[object] = []
        self.hold: asyncio.Event | None = None
        self.starting = asyncio.Event()

    async def start(self, spec: object = None) -> object:
        self.starting.set()
        if self.hold is not None:
            await self.hold.wait()
        sandbox = object()
        self.started.append(sandbox)
        return sandbox

    async def close(self, sandbox: object) -> None:
        await asyncio.sleep(0)
        self.closed.append(sandbox)


def context(manager: RecordingManager | None = None) -> JobContext:
    """A JobContext on its own, as the orchestrator makes it."""
    trajectory = Trajectory()
    return JobContext(
        job_id="j",
        instance={"data_source": "x"},
        sampling_params={},
        agent_config={},
        llm=LLMSession("j", BackendPool(VLLMClient()), trajectory, {}),  # no backend: never called here
        trajectory=trajectory,
        _sandboxes=manager,  # type: ignore[arg-type]
    )


async def test_start_sandbox_after_the_end_raises_and_starts_nothing() -> None:
    manager = RecordingManager()
    ctx = context(manager)
    ctx.finish()
    assert ctx.finished
    with pytest.raises(JobFinished, match="already ended"):
        await ctx.start_sandbox()
    assert manager.started == []


async def test_a_start_that_completes_after_the_end_is_closed_at_once() -> None:
    manager = RecordingManager()
    manager.hold = asyncio.Event()
    ctx = context(manager)
    starting = asyncio.create_task(ctx.start_sandbox())
    await manager.starting.wait()
    ctx.finish()
    await ctx.release()  # the job's last release: nothing registered yet
    manager.hold.set()
    with pytest.raises(JobFinished, match="was closed"):
        await starting
    assert manager.closed == manager.started and len(manager.started) == 1
    assert ctx.sandbox is None


async def test_release_after_run_is_not_the_end() -> None:
    manager = RecordingManager()
    ctx = context(manager)
    first = await ctx.start_sandbox()
    await ctx.release()  # after RUN: the sandbox goes, EVAL may start another
    assert manager.closed == [first] and not ctx.finished
    second = await ctx.start_sandbox()
    assert ctx.sandbox is second and manager.closed == [first]
    ctx.finish()
    await ctx.release()
    assert manager.closed == [first, second]


async def test_on_release_after_the_end_runs_at_once() -> None:
    ctx = context()
    ctx.finish()
    calls: list[str] = []
    ctx.on_release(lambda: calls.append("sync"))
    assert calls == ["sync"]

    async def cleanup() -> None:
        calls.append("async")

    ctx.on_release(cleanup)  # from a coroutine: a task of the running loop
    await asyncio.sleep(0.01)
    assert calls == ["sync", "async"]

    def failing() -> None:
        raise OSError("already gone")

    ctx.on_release(failing)  # logged, not raised, as in release()


def test_on_release_after_the_end_from_a_worker_thread_waits_for_the_cleanup() -> None:
    stage = LoopThread("test-stage-loop")
    stage.start()
    try:
        ctx = context()
        ctx._loop = loop = stage.loop
        ctx.finish()
        ran_on: list[asyncio.AbstractEventLoop] = []

        async def cleanup() -> None:
            await asyncio.sleep(0.01)
            ran_on.append(asyncio.get_running_loop())

        ctx.on_release(cleanup)  # this thread has no loop: run on the stage's and waited for
        assert ran_on == [loop]
    finally:
        stage.stop()


def test_a_pending_wait_is_cancelled_at_the_end() -> None:
    stage = LoopThread("test-stage-loop")
    stage.start()
    try:
        ctx = context()
        ctx._loop = stage.loop
        cancelled = threading.Event()
        started = threading.Event()

        async def forever() -> None:
            started.set()
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        outcome: list[BaseException] = []

        def handler_thread() -> None:
            try:
                ctx.wait(forever())
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(target=handler_thread, name="test-handler", daemon=True)
        worker.start()
        assert started.wait(10)
        ctx.finish()
        worker.join(10)
        assert not worker.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], JobFinished)
        assert cancelled.wait(10)  # the coroutine itself was cancelled on its loop

        # After the end a new ctx.wait does not run, except where the server runs final_result.
        ran: list[int] = []

        async def answer() -> int:
            ran.append(42)
            return 42

        with pytest.raises(JobFinished, match="has already ended"):
            ctx.wait(answer(), timeout=10)
        assert ran == []
        with ctx.waits_after_end():
            assert ctx.wait(answer(), timeout=10) == 42
        assert ran == [42]
    finally:
        stage.stop()
