"""One weight update over several servers (`client.weights.update_all`): every server reaches the new version
or every one is rolled back; a server that does not answer is fenced until it catches up; the pause lease frees
every server of a trainer that died; bounded staleness holds on each server. Real servers on loopback, each
with a scripted backend that reloads (or fails to) like vLLM's development endpoints."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
from server_jobs import result, submit
from suite_servers import Backend, Server, default_handlers

from prorl_server.api import ServerState, create_app
from prorl_server.client import (
    ClusterUpdateFailed,
    FailoverPolicy,
    RetryPolicy,
    RolloutClient,
    SyncOutcome,
    SyncRolloutClient,
)
from prorl_server.client.weight_sync import ClusterWeightUpdate
from prorl_server.config import ServerSettings
from prorl_server.handlers import HandlerRegistry
from prorl_server.testing import ScriptedReply, UvicornThread
from prorl_server.testing.uvicorn_thread import free_port

FAST_RETRY = RetryPolicy(attempts=2, budget_s=2.0, base_delay_s=0.01, max_delay_s=0.05)
FAST = FailoverPolicy(heartbeat_s=0.2, probe_timeout_s=0.5, lost_after_s=30.0)
ONE_TURN = {"instance": {"data_source": "multiturn", "question": "q"}, "agent_config": {"max_turns": 1}}


@dataclass
class Node:
    """One prorl-server and its own scripted backend."""

    server: Server
    backend: Backend

    @property
    def url(self) -> str:
        return self.server.url

    def weights(self) -> dict:
        return self.server.http.get("/weights").json()


@pytest.fixture
def start_node(start_backend) -> Iterator[Callable[..., Node]]:
    """Start a server (on `port`, if given) with a backend of its own, swapped to weight version 1 from /ckpt/1;
    every one is stopped at teardown."""
    started: list[Server] = []

    def start(port: int | None = None, **settings) -> Node:
        backend = start_backend()
        registry = HandlerRegistry()
        for name, handler in default_handlers().items():
            registry.register(name, handler)
        settings.setdefault("health_check_interval_s", 0.5)
        state = ServerState.build(ServerSettings(llm_servers=[], **settings), registry=registry)
        server = Server(state, UvicornThread(create_app(state=state), port=port).start())
        if settings.get("api_key"):
            server.http.headers["Authorization"] = f"Bearer {settings['api_key']}"
        started.append(server)
        added = server.http.post("/add_llm_server", json={"address": backend.address})
        assert added.is_success, added.text
        swapped = server.http.post("/weights/swap", json={"version": 1, "reload": {"path": "/ckpt/1"}})
        assert swapped.status_code == 200, swapped.text
        return Node(server, backend)

    yield start
    for server in started:
        server.http.close()
        server.server.stop()


def client_of(urls: list[str]) -> RolloutClient:
    return RolloutClient(urls, retry=FAST_RETRY, failover=FAST, trust_env=False)


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `condition` without blocking the loop (the client's monitor runs on it)."""
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(condition):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting until {what}")
        await asyncio.sleep(0.05)


def reloads(node: Node) -> list[str]:
    """The backend's reloads and prefix-cache resets since the node started (its swap to /ckpt/1 left out)."""
    return node.backend.double.admin_log[2:]


def test_every_server_reaches_the_new_version_and_dispatches_again(start_node):
    nodes = [start_node() for _ in range(3)]
    urls = [n.url for n in nodes]
    with SyncRolloutClient(urls, retry=FAST_RETRY, trust_env=False) as client:
        report = client.weights.update_all(2, reload_path="/ckpt/2", lease_s=30)
        assert report.with_outcome(SyncOutcome.REACHED) == urls
        assert report.previous == 1 and report.fenced == {}
        assert [s.version for s in report.servers.values()] == [2, 2, 2]
        for node in nodes:
            status = node.weights()
            assert status["version"] == 2 and not status["paused"] and status["lease_left_s"] is None
            assert reloads(node) == ["reload_weights /ckpt/2", "reset_prefix_cache"]
        results = [client.jobs.process(ONE_TURN, server=url) for url in urls]
        assert [r.trajectory.weight_versions for r in results] == [[2], [2], [2]]


async def test_a_server_down_at_the_pause_is_fenced_until_it_catches_up(start_node):
    up = [start_node(), start_node()]
    port = free_port()
    down = f"http://127.0.0.1:{port}"  # nothing listens there yet
    client = client_of([up[0].url, up[1].url, down])
    try:
        report = await client.weights.update_all(2, reload_path="/ckpt/2")
        assert report.with_outcome(SyncOutcome.REACHED) == [up[0].url, up[1].url]
        fenced = report.servers[down]
        assert fenced.outcome is SyncOutcome.FENCED and fenced.fenced_until == 2 and "did not answer" in fenced.error
        assert client._roster.fenced() == {down: 2}
        assert [n.weights()["version"] for n in up] == [2, 2]

        # no job goes to the fenced server
        job_ids = [await client.jobs.submit(ONE_TURN) for _ in range(6)]
        assert {client.jobs.server_of(j) for j in job_ids} == {up[0].url, up[1].url}

        # it comes back (restarted, still on the old weights): the monitor brings it to version 2, then lifts
        # the fence
        back = start_node(port=port)
        assert back.weights()["version"] == 1
        await until(lambda: not client._roster.fenced(), 20, "the fence is lifted")
        assert back.weights()["version"] == 2 and not back.weights()["paused"]
        assert back.backend.double.weights_path == "/ckpt/2"
        assert client.server_states()[down] == "live"
        answer = await client.jobs.process(ONE_TURN, server=down)
        assert answer.trajectory.weight_versions == [2]
        await client.jobs.collect(job_ids)
    finally:
        await client.aclose()


async def test_a_server_lost_between_its_update_and_the_resume_is_fenced(start_node, monkeypatch):
    nodes = [start_node() for _ in range(3)]
    victim = nodes[2]
    resume = ClusterWeightUpdate._resume

    async def victim_dies_first(self, *args) -> None:
        await asyncio.to_thread(victim.server.server.stop)
        await resume(self, *args)

    monkeypatch.setattr(ClusterWeightUpdate, "_resume", victim_dies_first)
    client = client_of([n.url for n in nodes])
    try:
        report = await client.weights.update_all(2, reload_path="/ckpt/2")
        assert report.with_outcome(SyncOutcome.REACHED) == [nodes[0].url, nodes[1].url]
        lost = report.servers[victim.url]
        assert lost.outcome is SyncOutcome.FENCED and lost.fenced_until == 2 and "cannot reach" in lost.error
        assert client._roster.fenced() == {victim.url: 2}
        assert [(n.weights()["version"], n.weights()["paused"]) for n in nodes[:2]] == [(2, False)] * 2
        job_ids = [await client.jobs.submit(ONE_TURN) for _ in range(4)]
        assert victim.url not in {client.jobs.server_of(j) for j in job_ids}
        await client.jobs.collect(job_ids)
    finally:
        await client.aclose()


async def test_a_reload_failing_on_one_server_rolls_every_server_back(start_node):
    nodes = [start_node() for _ in range(3)]
    bad = nodes[1]
    bad.backend.double.bad_weight_paths.add("/ckpt/2")
    client = client_of([n.url for n in nodes])
    try:
        with pytest.raises(ClusterUpdateFailed) as failed:
            await client.weights.update_all(2, reload_path="/ckpt/2")
        error, report = failed.value, failed.value.report
        assert error.status_code == 502 and error.url == bad.url and bad.url in str(error)
        assert "Cannot find any model weights" in report.servers[bad.url].error
        assert report.servers[bad.url].outcome is SyncOutcome.ERROR
        assert report.with_outcome(SyncOutcome.ROLLED_BACK) == [nodes[0].url, nodes[2].url]
        assert report.fenced == {} and client._roster.fenced() == {}
        for node in nodes:
            status = node.weights()
            assert status["version"] == 1 and not status["paused"], status
            assert node.backend.double.weights_path == "/ckpt/1"
        for node in (nodes[0], nodes[2]):  # loaded it, then their previous checkpoint again
            assert reloads(node) == [
                "reload_weights /ckpt/2",
                "reset_prefix_cache",
                "reload_weights /ckpt/1",
                "reset_prefix_cache",
            ]
        assert reloads(bad) == ["reload_weights /ckpt/2", "reload_weights /ckpt/1"]
        # dispatching under version 1 on every server
        results = [await client.jobs.process(ONE_TURN, server=n.url) for n in nodes]
        assert [r.trajectory.weight_versions for r in results] == [[1], [1], [1]]

        # version 2 was never kept: once the checkpoint is there, the same update goes through
        bad.backend.double.bad_weight_paths.clear()
        report = await client.weights.update_all(2, reload_path="/ckpt/2")
        assert len(report.with_outcome(SyncOutcome.REACHED)) == 3
        assert [n.weights()["version"] for n in nodes] == [2, 2, 2]
    finally:
        await client.aclose()


async def test_a_refused_pause_resumes_every_server_and_changes_nothing(start_node):
    nodes = [start_node(), start_node(), start_node(api_key="another key")]  # the client's key is refused there
    client = client_of([n.url for n in nodes])
    try:
        with pytest.raises(ClusterUpdateFailed, match=r"1 server\(s\) refused the pause; nothing changed") as failed:
            await client.weights.update_all(2, reload_path="/ckpt/2")
        report = failed.value.report
        assert report.servers[nodes[2].url].outcome is SyncOutcome.ERROR and failed.value.status_code == 401
        assert report.with_outcome(SyncOutcome.UNCHANGED) == [nodes[0].url, nodes[1].url]
        assert [(n.weights()["version"], n.weights()["paused"]) for n in nodes] == [(1, False)] * 3
        assert all(reloads(n) == [] for n in nodes)
    finally:
        await client.aclose()


async def test_a_trainer_dying_between_update_and_resume_leaves_no_server_paused(start_node, monkeypatch):
    nodes = [start_node() for _ in range(3)]

    async def dies_here(*args, **kwargs) -> None:  # the trainer's process stops before it resumes
        await asyncio.Event().wait()

    monkeypatch.setattr(ClusterWeightUpdate, "_resume", dies_here)
    client = client_of([n.url for n in nodes])
    update = asyncio.create_task(client.weights.update_all(2, lease_s=1.5))
    await until(lambda: all(n.weights()["version"] == 2 for n in nodes), 10, "every server is at version 2")
    assert all(n.weights()["paused"] for n in nodes)
    update.cancel()
    await client.aclose()

    for i, node in enumerate(nodes):
        submit(node.server, f"after-{i}", agent_config={"max_turns": 1})
    for i, node in enumerate(nodes):
        res = result(node.server, f"after-{i}")
        assert res["status"] == "completed" and res["trajectory"]["weight_versions"] == [2], res
        status = node.weights()
        assert not status["paused"] and status["lease_expired"] == 1


async def test_a_job_older_than_the_update_ends_stale_on_every_server(start_node):
    nodes = [start_node(max_staleness=0) for _ in range(3)]
    for i, node in enumerate(nodes):
        node.backend.double.push(ScriptedReply(text="thinking", delay_s=0.6), "DONE")
        submit(node.server, f"old-{i}")
    await until(lambda: all(len(n.backend.double.requests) == 1 for n in nodes), 10, "each first turn is sent")
    client = client_of([n.url for n in nodes])
    try:
        report = await client.weights.update_all(2, mode="wait")
        assert len(report.with_outcome(SyncOutcome.REACHED)) == 3
        for i, node in enumerate(nodes):
            res = await asyncio.to_thread(result, node.server, f"old-{i}")
            assert res["status"] == "stale", res
            assert res["trajectory"]["weight_versions"] == [1]  # its second turn was never sampled under 2
            fresh = await client.jobs.process(ONE_TURN, server=node.url)
            assert fresh.status.value == "completed" and fresh.trajectory.weight_versions == [2]
    finally:
        await client.aclose()


def test_the_rollback_endpoint_refuses_when_there_is_nothing_to_undo(start_node):
    node = start_node()
    post = node.server.http.post

    def refused(why: str) -> None:
        answer = post("/weights/rollback")
        assert answer.status_code == 409, answer.text
        assert why in answer.json()["detail"], answer.json()

    refused("not paused")
    assert post("/weights/pause", json={}).status_code == 200
    refused("no weight update in this pause")
    assert post("/weights/update", json={"version": 2}).status_code == 200
    assert post("/weights/rollback").status_code == 200
    refused("rolled back already")
    assert post("/weights/update", json={"version": 2}).status_code == 200
    assert post("/weights/resume").status_code == 200
    assert post("/weights/pause", json={}).status_code == 200
    refused("no weight update in this pause")  # the update was in the pause before
    assert post("/weights/resume").status_code == 200
    assert post("/weights/swap", json={"version": 3}).status_code == 200
    refused("not paused")  # a swap resumes: nothing of it can be undone
    assert post("/weights/rollback", json={"x": 1}).status_code == 409  # a body is ignored, as on resume
    assert node.weights()["version"] == 3 and not node.weights()["paused"]
