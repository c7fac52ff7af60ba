"""Initialise once, fork N: a group of a handler with `fork_after_init` runs INIT once and starts each member
from a copy-on-write fork of the initialised sandbox, with its own copy of INIT's state; members see nothing
of each other; a handler that does not opt in (or a runtime that cannot fork) runs INIT per member; a fork
whose snapshot is gone fails that member with a SandboxError (an infrastructure error) and the next member
initialises again; the snapshots go when the group ends."""

from __future__ import annotations

import asyncio
import threading

import pytest

from prorl_server import AgentHandler, JobContext
from prorl_server.handlers import default_error
from prorl_server.llm import BackendPool, LLMSession, VLLMClient
from prorl_server.pipeline.fork import ForkStateError, GroupFork
from prorl_server.pipeline.refill import refill_reason
from prorl_server.protocol import JobResult, JobStatus, Trajectory
from prorl_server.sandbox import DEFAULT_BASE_DIR, SandboxError, SandboxManager, make_runtime, new_owner_id
from prorl_server.sandbox.reaper import MEMORY_SNAPSHOT_DIR, remove_owner_files
from prorl_server.sandbox.registry import unavailable_reason

needs_forking_bwrap = pytest.mark.skipif(
    unavailable_reason("bwrap") is not None or make_runtime("bwrap", new_owner_id()).fork_unavailable() is not None,
    reason="bubblewrap forks sandboxes for a server running as root only",
)


class ForkingHandler(AgentHandler):
    """INIT writes a file and leaves a process in its sandbox and a list in ctx.state; RUN writes a file of
    its own, waits for its siblings to write theirs, and reports what it sees."""

    name = "forking"
    fork_after_init = True

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inits = 0

    async def init(self, ctx: JobContext) -> None:
        with self.lock:
            self.inits += 1
        sandbox = await ctx.start_sandbox()
        await sandbox.bash("echo ready > init.txt && (sleep 1002 > /dev/null 2>&1 &)")
        ctx.state["seen"] = ["init"]
        ctx.artifacts["prepared"] = True

    async def run(self, ctx: JobContext) -> None:
        ctx.state["seen"].append(ctx.job_id)
        sandbox = ctx.sandbox
        await sandbox.write_file(ctx.job_id.replace(":", "-"), "mine")
        await asyncio.sleep(0.5)  # the siblings write theirs meanwhile
        ctx.artifacts["files"] = sorted((await sandbox.bash("ls")).output.split())
        ctx.artifacts["init"] = (await sandbox.read_file("init.txt")).strip()
        ctx.artifacts["processes"] = (await sandbox.bash("cat /proc/[0-9]*/cmdline | tr '\\0' ' '")).output
        ctx.artifacts["seen"] = ctx.state["seen"]
        ctx.artifacts["sandbox"] = sandbox.id

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


class PerMemberHandler(ForkingHandler):
    name = "per_member"
    fork_after_init = False


def snapshots(owner: str) -> list[str]:
    """The owner's snapshot directories, on disk or in memory."""
    roots = [DEFAULT_BASE_DIR / owner, MEMORY_SNAPSHOT_DIR / owner]
    return [p.name for root in roots if root.exists() for p in root.iterdir() if p.name.startswith("snap-")]


def run_group(server, data_source: str, n: int, group_id: str) -> list[dict]:
    body = {"instance": {"data_source": data_source}, "n": n, "group_id": group_id}
    group = server.http.post("/groups", json=body).json()
    assert group["status"] == "completed", group
    return [server.http.get(f"/jobs/{m['job_id']}").json()["result"] for m in group["members"]]


@needs_forking_bwrap
def test_a_forking_group_initialises_once_and_its_members_are_isolated(start_server, backend):
    handler = ForkingHandler()
    server = start_server([backend.address], handlers={"forking": handler}, runtime="bwrap", init_workers=4)
    results = run_group(server, "forking", 4, "f")
    assert handler.inits == 1
    assert len({r["artifacts"]["sandbox"] for r in results}) == 4  # a sandbox each
    for result in results:
        own = result["job_id"].replace(":", "-")
        assert result["artifacts"]["files"] == sorted(["init.txt", own]), result["artifacts"]  # no sibling's file
        assert result["artifacts"]["init"] == "ready" and result["artifacts"]["prepared"] is True
        assert result["artifacts"]["seen"] == ["init", result["job_id"]]  # a copy of INIT's state of its own
        assert "sleep 1002" not in result["artifacts"]["processes"]  # INIT's processes are not forked
    assert snapshots(server.state.orchestrator.sandboxes.owner) == []  # removed with the group
    assert server.state.orchestrator.sandboxes.live == 0


@needs_forking_bwrap
def test_a_handler_that_does_not_opt_in_initialises_every_member(start_server, backend):
    handler = PerMemberHandler()
    server = start_server([backend.address], handlers={"per_member": handler}, runtime="bwrap")
    results = run_group(server, "per_member", 3, "p")
    assert handler.inits == 3
    assert all(r["artifacts"]["seen"] == ["init", r["job_id"]] for r in results)


@needs_forking_bwrap
def test_a_member_whose_snapshot_is_gone_is_refilled_and_the_group_initialises_again(start_server, backend):
    handler = ForkingHandler()
    server = start_server([backend.address], handlers={"forking": handler}, runtime="bwrap")
    manager = server.state.orchestrator.sandboxes
    fork, removed = manager.fork, []

    async def first_snapshot_gone(snapshot):  # fault injection: the first fork finds its snapshot deleted
        if not removed:
            removed.append(snapshot.id)
            snapshot.remove()
        return await fork(snapshot)

    manager.fork = first_snapshot_gone
    body = {"instance": {"data_source": "forking"}, "n": 3, "group_id": "gone"}
    group = server.http.post("/groups", json=body).json()
    assert group["status"] == "completed" and group["usable"] == 3, group
    refills = group["refills"]  # the members forking that snapshot meanwhile failed the same way
    assert refills and all(refill["reason"] == "SandboxError" for refill in refills)
    for refill in refills:
        failed = server.http.get(f"/jobs/{refill['replaced_job_id']}").json()["result"]
        assert f"snapshot {removed[0]} is gone" in failed["error"]["message"]
    assert handler.inits == 2  # the next member to reach INIT initialised again; the others forked that
    assert snapshots(manager.owner) == [] and manager.live == 0


def test_on_a_runtime_that_cannot_fork_every_member_initialises(start_server, backend):
    handler = ForkingHandler()
    server = start_server([backend.address], handlers={"forking": handler}, runtime="local")
    run_group(server, "forking", 3, "l")
    assert handler.inits == 3


# --- GroupFork on its own, with real bubblewrap sandboxes ----------------------------------------------


def context(job_id: str, manager: SandboxManager) -> JobContext:
    trajectory = Trajectory()
    return JobContext(
        job_id=job_id,
        instance={"data_source": "x"},
        sampling_params={},
        agent_config={},
        llm=LLMSession(job_id, BackendPool(VLLMClient()), trajectory, {}),  # never called here
        trajectory=trajectory,
        _sandboxes=manager,
    )


@pytest.fixture
async def manager():
    owner = new_owner_id()
    manager = SandboxManager(make_runtime("bwrap", owner, prewarm=0), owner)
    yield manager
    await manager.shutdown()
    remove_owner_files(owner)


@needs_forking_bwrap
async def test_a_gone_snapshot_fails_the_fork_as_an_infrastructure_error_and_the_next_member_reinitialises(
    manager,
):
    fork = GroupFork("g", manager)
    inits = []

    def init_of(ctx: JobContext):
        async def init() -> None:
            inits.append(ctx.job_id)
            await (await ctx.start_sandbox()).bash("echo v > v.txt")
            ctx.on_release(lambda: inits.append(f"released {ctx.job_id}"))

        return init

    a, b, c = (context(name, manager) for name in "abc")
    await fork.init(a, init_of(a))
    assert (await a.sandbox.read_file("v.txt")).strip() == "v"
    [snapshot] = [t.snapshot for t in fork._made]
    snapshot.remove()
    with pytest.raises(SandboxError, match=f"snapshot {snapshot.id} is gone") as failed:
        await fork.init(b, init_of(b))
    result = JobResult(job_id="b", status=JobStatus.FAILED, error=default_error("init", failed.value))
    assert refill_reason(result) == "SandboxError"  # so its group refills it
    await fork.init(c, init_of(c))  # leads again: a fresh INIT and snapshot
    assert inits == ["a", "c"] and fork.inits == 2
    assert (await c.sandbox.read_file("v.txt")).strip() == "v"
    for ctx in (a, b, c):
        await ctx.release()
    assert snapshots(manager.owner) != []
    await fork.aclose()  # the group ended: snapshots removed, INIT's cleanups run
    assert snapshots(manager.owner) == [] and manager.live == 0
    assert inits[2:] == ["released c", "released a"]
    with pytest.raises(SandboxError, match="has ended"):
        await fork.init(context("d", manager), init_of(context("d", manager)))


@needs_forking_bwrap
async def test_a_failed_leader_hands_the_lead_to_a_waiting_member(manager):
    fork = GroupFork("g", manager)
    leader_started = asyncio.Event()

    async def failing_init() -> None:
        leader_started.set()
        await asyncio.sleep(0.1)
        raise ValueError("the handler's own error")

    a, b = context("a", manager), context("b", manager)
    first = asyncio.ensure_future(fork.init(a, failing_init))
    await leader_started.wait()
    ran = []

    async def second_init() -> None:
        ran.append("b")
        b.state["x"] = 1

    await fork.init(b, second_init)  # waited for a, then led
    with pytest.raises(ValueError, match="own error"):
        await first
    assert ran == ["b"] and fork.inits == 1 and b.sandbox is None  # an INIT without a sandbox forks state only
    await fork.aclose()


@needs_forking_bwrap
async def test_state_that_cannot_be_copied_fails_the_leader_clearly(manager):
    fork = GroupFork("g", manager)
    a = context("a", manager)

    async def init() -> None:
        await a.start_sandbox()
        a.state["lock"] = threading.Lock()

    with pytest.raises(ForkStateError, match="cannot be copied"):
        await fork.init(a, init)
    await a.release()
    await fork.aclose()
    assert snapshots(manager.owner) == [] and manager.live == 0


@needs_forking_bwrap
async def test_an_init_that_starts_two_sandboxes_fails_the_leader_clearly(manager):
    fork = GroupFork("g", manager)
    a = context("a", manager)

    async def init() -> None:
        await a.start_sandbox()
        await a.start_sandbox()

    with pytest.raises(ForkStateError, match="started 2 sandboxes"):
        await fork.init(a, init)
    await a.release()
    await fork.aclose()
    assert snapshots(manager.owner) == [] and manager.live == 0
