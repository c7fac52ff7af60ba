"""The client's failover over several real servers (child processes on loopback): a server killed (kill -9)
or frozen (SIGSTOP, a partition: it accepts connections but answers nothing) mid-step has its unfinished
jobs and groups submitted again on the live servers under the same ids; every result is handed out once;
a server that comes back is fenced until what was moved off it is cancelled there, then used again; a
replacement started on a lost server's journal serves the results that server had finished."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections import Counter

import httpx
import pytest
from polling import wait_for
from repo_paths import TESTS
from serve_process import start_serve, stop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from prorl_server.auth_key import auth_headers
from prorl_server.client import (
    DapoCollector,
    FailoverPolicy,
    Reachability,
    RolloutClient,
    ServerRoster,
    SyncRolloutClient,
)
from prorl_server.testing import UvicornThread

SLOW = f"{TESTS / 'handlers_for_tests.py'}:SlowStageHandler"
FAST = FailoverPolicy(heartbeat_s=0.3, probe_timeout_s=0.5, lost_after_s=1.5)
RECOVERY_BOUND_S = FAST.heartbeat_s + FAST.probe_timeout_s + FAST.lost_after_s


class HealthOnlyProxy:
    """A test double of a partitioned node: forwards every request to `upstream` until `cut()`, then answers
    `GET /health` only (200, as a live server would) and leaves every other request unanswered."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.health_only = False
        self.closing = False

    def cut(self) -> None:
        self.health_only = True

    def app(self) -> Starlette:
        async def forward(request: Request) -> Response:
            while self.health_only and request.url.path != "/health" and not self.closing:
                await asyncio.sleep(0.05)  # not answered (until the test ends)
            if self.health_only:
                return JSONResponse({"status": "ok", "running": True, "problems": []})
            headers = {k: v for k, v in request.headers.items() if k in ("authorization", "content-type")}
            async with httpx.AsyncClient(base_url=self.upstream, timeout=None, trust_env=False) as http:
                answer = await http.request(
                    request.method, request.url.path, params=request.query_params, content=await request.body(),
                    headers=headers,
                )  # fmt: skip
            return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))

        methods = ["GET", "POST", "DELETE", "HEAD"]
        return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


def job(run_s: float, **instance) -> dict:
    return {"instance": {"data_source": "slow", "run_s": run_s, **instance}, "sampling_params": {"max_tokens": 4}}


@pytest.fixture
def servers(tmp_path, backend):
    """Start servers on demand (`servers(n, *options)`), each with the slow test handler and the backend;
    every one still running is stopped at the end, by pid."""
    started: list[subprocess.Popen] = []

    def start(n: int, *options: str) -> list[tuple[subprocess.Popen, str]]:
        out = []
        for _ in range(n):
            proc, url, _ = start_serve(tmp_path, None, "--llm-server", backend.address, "--handler", SLOW, *options)
            started.append(proc)
            out.append((proc, url))
        return out

    yield start
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            stop(proc)


def test_roster_moves_only_along_its_transitions():
    roster = ServerRoster(["a", "b"], FailoverPolicy(lost_after_s=5))
    assert roster.failed("a", "refused", now=0.0) == (Reachability.UP, Reachability.SUSPECT)
    assert roster.failed("a", "refused", now=4.9) is None  # suspect, not lost yet
    assert roster.placeable() == ["b"]
    assert roster.failed("a", "refused", now=5.0) == (Reachability.SUSPECT, Reachability.LOST)
    assert roster.answered("a") == (Reachability.LOST, Reachability.UP)
    assert roster.summary() == {"a": "fenced", "b": "live"}  # back, but not placeable before it rejoins
    roster.rejoined("a")
    roster.fence("b", 7, "missed the update to 7")
    assert roster.placeable() == ["a"] and roster.fenced() == {"b": 7}
    roster.unfence("b")
    assert roster.placeable() == ["a", "b"]
    assert roster.answered("b") is None
    with pytest.raises(ValueError, match="lost_after_s"):
        FailoverPolicy(lost_after_s=0)
    off = ServerRoster(["a"], FailoverPolicy(enabled=False))  # nothing would bring a server back: it stays up
    assert off.failed("a", "refused", now=0.0) is None and off.failed("a", "refused", now=99.0) is None
    assert off.placeable() == ["a"] and off.health("a").last_error == "refused"


def test_a_killed_server_s_unfinished_jobs_finish_on_the_live_servers_once_each(servers):
    (victim, victim_url), *rest = servers(3)
    live = [url for _, url in rest]
    with SyncRolloutClient([victim_url, *live], failover=FAST, trust_env=False) as client:
        job_ids = [client.jobs.submit(job(2.0), server=url) for url in (victim_url, *live) for _ in range(3)]
        on_victim = [j for j in job_ids if client.jobs.server_of(j) == victim_url]
        wait_for(lambda: client.jobs.get(on_victim[0]).status.value == "run", 30, "the victim's jobs in RUN")
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        results = client.jobs.collect(job_ids, timeout=60)
        assert Counter(r.job_id for r in results) == Counter(job_ids)  # every id handed out exactly once
        assert all(r.status.value == "completed" for r in results), [r.error for r in results]
        assert {client.jobs.server_of(j) for j in on_victim} <= set(live)
        assert client.server_states()[victim_url] == "lost"
        (recovery,) = client.recoveries
        assert recovery["server"] == victim_url and recovery["jobs"] == 3 and recovery["moved"] == 3
        assert recovery["seconds"] < RECOVERY_BOUND_S + 3.0  # bounded: heartbeat + probe + lost_after_s
        more = client.jobs.submit_many([job(0.0) for _ in range(4)])  # placement keeps off the lost server
        assert {client.jobs.server_of(j) for j in more} <= set(live)
        assert len(client.jobs.collect(more, timeout=30)) == 4


def test_a_frozen_server_is_lost_then_fenced_when_it_answers_again_until_its_moved_jobs_are_cancelled(servers):
    (frozen, frozen_url), (_, live_url) = servers(2)
    with SyncRolloutClient([frozen_url, live_url], failover=FAST, trust_env=False) as client:
        moved = [client.jobs.submit(job(3.0), server=frozen_url) for _ in range(2)]
        wait_for(lambda: client.jobs.get(moved[0]).status.value == "run", 30, "the jobs in RUN")
        os.kill(frozen.pid, signal.SIGSTOP)  # a partition: connections open, nothing answers
        try:
            wait_for(lambda: client.server_states()[frozen_url] == "lost", 20, "the frozen server lost")
            wait_for(lambda: all(client.jobs.server_of(j) == live_url for j in moved), 20, "its jobs moved")
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        wait_for(lambda: client.server_states()[frozen_url] == "live", 20, "the server back in placement")
        with httpx.Client(base_url=frozen_url, headers=auth_headers(), trust_env=False, timeout=10) as http:
            for job_id in moved:  # the copies left there were cancelled and acknowledged
                answer = http.get(f"/jobs/{job_id}")
                assert answer.status_code == 404 or answer.json()["status"] == "cancelled", answer.text
        results = client.jobs.collect(moved, timeout=60)
        assert [r.status.value for r in results] == ["completed", "completed"]
        again = client.jobs.submit_many([job(0.0) for _ in range(6)])
        assert frozen_url in {client.jobs.server_of(j) for j in again}  # used again
        assert len(client.jobs.collect(again, timeout=30)) == 6


def test_groups_of_a_killed_server_are_decided_on_the_live_ones_and_the_dapo_collector_goes_on(servers):
    (victim, victim_url), (_, live_url) = servers(2)

    async def scenario() -> None:
        async with RolloutClient([victim_url, live_url], failover=FAST, trust_env=False) as client:
            group_id = await client.groups.submit({**job(2.0), "n": 2}, server=victim_url)
            prompts = ({**job(0.5, seed=i, coin_reward=True), "n": 2} for i in range(200))
            async with DapoCollector(client, prompts, target_groups=2, max_groups_in_flight=4) as collector:
                first = await collector.collect_step()
                os.kill(victim.pid, signal.SIGKILL)
                second = await collector.collect_step()
            decided = await client.groups.wait(group_id, timeout=60)
            assert decided.status.value == "completed" and len(decided.results) == 2
            assert client.groups.server_of(group_id) == live_url
            assert second.step == first.step + 1 and len(second.groups) == 2
            assert second.groups_failed == 0, second

    asyncio.run(scenario())
    victim.wait(10)


def test_a_replacement_on_the_lost_server_s_journal_serves_its_finished_results(servers, tmp_path):
    journal = tmp_path / "journal.sqlite3"
    (victim, victim_url), (_, live_url) = servers(1, "--journal", str(journal)) + servers(1)
    patient = FailoverPolicy(heartbeat_s=0.3, probe_timeout_s=0.5, lost_after_s=120)  # the replacement comes first
    with SyncRolloutClient([victim_url, live_url], failover=patient, trust_env=False) as client:
        done = [client.jobs.submit(job(0.0), server=victim_url) for _ in range(3)]
        running = [client.jobs.submit(job(30.0), server=victim_url) for _ in range(2)]
        with httpx.Client(base_url=victim_url, headers=auth_headers(), trust_env=False, timeout=10) as http:
            wait_for(lambda: all(http.get(f"/jobs/{j}").json()["result"] for j in done), 30, "3 results stored")
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        ((_, replacement_url),) = servers(1, "--journal", str(journal))
        client.replace_server(victim_url, replacement_url)
        finished = {r.job_id: r for r in client.jobs.collect(done, timeout=30)}
        assert all(r.status.value == "completed" for r in finished.values())
        assert {client.jobs.server_of(j) for j in done} == {replacement_url}  # served from the journal
        assert {client.jobs.server_of(j) for j in running} == {live_url}  # the unfinished ones moved, not to
        # the replacement, which failed them at its restart (submitted there, they would get that failure back)
        for job_id in running:
            client.jobs.cancel(job_id)
        assert client.server_states() == {victim_url: "lost", live_url: "live", replacement_url: "live"}


def test_a_stale_endpoint_naming_a_dead_server_costs_nothing(servers):
    ((_, live_url),) = servers(1)
    dead_url = "http://127.0.0.1:9"  # discard port: nothing listens
    with SyncRolloutClient([dead_url, live_url], failover=FAST, trust_env=False) as client:
        job_ids = client.jobs.submit_many([job(0.0) for _ in range(4)])
        assert {client.jobs.server_of(j) for j in job_ids} == {live_url}
        assert len(client.jobs.collect(job_ids, timeout=30)) == 4
        wait_for(lambda: client.server_states()[dead_url] == "lost", 10, "the dead server lost")


def test_a_job_id_sent_twice_goes_to_the_server_that_has_it_and_a_restarted_trainer_picks_its_results_up(servers):
    urls = [url for _, url in servers(2)]
    request = {**job(0.5), "job_id": "same-id"}
    with SyncRolloutClient(urls, failover=FAST, trust_env=False) as client:
        first = client.jobs.submit(request)
        owner = client.jobs.server_of(first)
        for _ in range(3):
            assert client.jobs.submit(request) == first and client.jobs.server_of(first) == owner
        with pytest.raises(Exception, match="409"):
            client.jobs.submit({**job(1.0), "job_id": "same-id"})  # another request under the same id
        others = client.jobs.submit_many([job(0.2) for _ in range(4)])
    # the trainer restarts: a new client, the same ids
    with SyncRolloutClient(urls, failover=FAST, trust_env=False) as client:
        results = client.jobs.collect([first, *others], timeout=30, ack=True)
    assert sorted(r.job_id for r in results) == sorted([first, *others])
    assert all(r.status.value == "completed" for r in results)


def test_a_node_that_answers_health_but_not_jobs_is_lost_and_its_jobs_finish_elsewhere(servers):
    (_, hidden_url), (_, live_url) = servers(2)
    proxy = HealthOnlyProxy(hidden_url)
    with UvicornThread(proxy.app()) as front:
        try:
            with SyncRolloutClient([front.url, live_url], failover=FAST, trust_env=False) as client:
                moved = [client.jobs.submit(job(2.0), server=front.url) for _ in range(3)]
                proxy.cut()
                assert httpx.get(f"{front.url}/health", trust_env=False, timeout=5).status_code == 200
                results = client.jobs.collect(moved, timeout=60)
                assert sorted(r.job_id for r in results) == sorted(moved)
                assert all(r.status.value == "completed" for r in results)
                assert {client.jobs.server_of(j) for j in moved} == {live_url}
                assert client.server_states()[front.url] == "lost"
        finally:
            proxy.closing = True
