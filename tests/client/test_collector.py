"""DapoCollector and the client's group calls against a real prorl-server.

A test handler ("ctl") makes each member's reward and run time explicit: member `i` of a group sleeps
`instance["delays"][i]` seconds and scores `instance["rewards"][i]`, so a group's informativeness and timing
are fixed by its request, whatever order the server runs members in.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from prorl_server import AgentHandler, JobContext
from prorl_server.auth_key import API_KEY_FILE_ENV
from prorl_server.client import (
    DapoCollector,
    RetryPolicy,
    RolloutClient,
    StepReport,
    SyncDapoCollector,
    SyncRolloutClient,
)
from prorl_server.protocol import GroupRequest, GroupResult, GroupStatus, JobStatus
from prorl_server.protocol.server import API_KEY_ENV
from prorl_server.testing import UvicornThread

FAST_RETRY = RetryPolicy(attempts=5, budget_s=10.0, base_delay_s=0.01, max_delay_s=0.05)


class ControlledHandler(AgentHandler):
    """Member i sleeps `delays[i]` seconds in RUN and scores `rewards[i]` (indices wrap around)."""

    name = "ctl"

    async def run(self, ctx: JobContext) -> None:
        delays = ctx.instance.get("delays", [0.0])
        await asyncio.sleep(float(delays[_member(ctx) % len(delays)]))

    async def eval(self, ctx: JobContext) -> float:
        rewards = ctx.instance["rewards"]
        return float(rewards[_member(ctx) % len(rewards)])


def _member(ctx: JobContext) -> int:
    return int(ctx.job_id.rsplit(":", 1)[1])


def group(rewards: list[float], delay: float = 0.05, n: int = 2, **fields) -> dict:
    """A group request of the ctl handler: n members with these rewards, each running `delay` seconds."""
    instance = {"data_source": "ctl", "rewards": rewards, "delays": [delay]}
    return {"instance": instance, "n": n, **fields}


INFORMATIVE = [1.0, 0.0]
ZERO_VARIANCE = [1.0, 1.0]


@pytest.fixture(autouse=True)
def no_api_key_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    monkeypatch.setenv(API_KEY_FILE_ENV, str(tmp_path / "no-key-file"))  # nor from a key file


@pytest.fixture
def ctl_server(start_server, backend):
    return start_server([backend.address], handlers={"ctl": ControlledHandler()})


def live_jobs(server) -> int:
    jobs = server.http.get("/status").json()["jobs"]
    return sum(count for status, count in jobs.items() if status != "stored_results")


# client group calls --------------------------------------------------------------------------------


async def test_group_calls_round_trip_with_typed_answers(ctl_server):
    async with RolloutClient(ctl_server.url, retry=FAST_RETRY) as client:
        gid = await client.groups.submit(group(INFORMATIVE, delay=0.3))
        assert client.groups.server_of(gid) == ctl_server.url
        assert client.jobs.server_of(f"{gid}:0") == ctl_server.url  # the members are the client's jobs too
        running = await client.groups.get(gid)
        assert isinstance(running, GroupResult) and running.status is GroupStatus.RUNNING
        assert [m.job_id for m in running.members] == [f"{gid}:0", f"{gid}:1"] and running.results == []

        decided = await client.groups.wait(gid, timeout=10)
        assert decided.status is GroupStatus.COMPLETED and decided.usable == 2
        assert sorted(r.reward for r in decided.results) == [0.0, 1.0]
        assert (await client.groups.get(gid, wait=5)) == decided

        # the same request under the same id is the same group; the model works as well as a dict
        again = await client.groups.submit(
            GroupRequest.model_validate({**group(INFORMATIVE, delay=0.3), "group_id": gid})
        )
        assert again == gid and (await client.groups.get(gid)) == decided
        assert (await client.jobs.wait(f"{gid}:1", timeout=5)).status is JobStatus.COMPLETED

        slow = await client.groups.submit(group(INFORMATIVE, delay=30, group_id="slow"))
        assert slow == "slow"
        with pytest.raises(TimeoutError):
            await client.groups.wait(slow, timeout=0.3)
        cancelled = await client.groups.cancel(slow)
        assert cancelled.status is GroupStatus.FAILED and cancelled.usable == 0
        assert {m.status for m in cancelled.members} == {JobStatus.CANCELLED}
        assert (await client.groups.cancel(slow)) == cancelled  # idempotent


async def test_a_retried_group_submit_whose_first_attempt_got_through_launches_once(ctl_server):
    # the first answer comes after 4 s, the client gives up on it after 2 s; the members outlive both
    proxy = HangOnceProxy(ctl_server.url, hang_s=4.0)
    thread = UvicornThread(proxy.app).start()
    try:
        async with RolloutClient(thread.url, retry=FAST_RETRY, timeout=2.0) as client:
            gid = await client.groups.submit(group(INFORMATIVE, delay=10.0))
            assert proxy.seen == ["POST /groups", "POST /groups"]
            assert live_jobs(ctl_server) == 2, "the members run once"
            await client.groups.cancel(gid)
    finally:
        thread.stop()


class HangOnceProxy:
    """Forwards every request; answers the first one only after `hang_s` (the client times out by then)."""

    def __init__(self, target: str, hang_s: float = 1.0) -> None:
        self.target = target
        self.hang_s = hang_s
        self.seen: list[str] = []
        self.app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST", "DELETE"])])

    async def handle(self, request: Request) -> Response:
        self.seen.append(f"{request.method} {request.url.path}")
        async with httpx.AsyncClient(base_url=self.target, timeout=30) as http:
            answer = await http.request(
                request.method, request.url.path, params=request.query_params, content=await request.body()
            )
        if len(self.seen) == 1:
            await asyncio.sleep(self.hang_s)
        return Response(answer.content, status_code=answer.status_code, media_type="application/json")


def test_sync_client_mirrors_the_group_calls(ctl_server):
    with SyncRolloutClient(ctl_server.url, retry=FAST_RETRY) as client:
        gid = client.groups.submit(group(ZERO_VARIANCE, group_id="sync-g"))
        assert gid == "sync-g" and client.groups.server_of(gid) == ctl_server.url
        decided = client.groups.wait(gid, timeout=10)
        assert decided.status is GroupStatus.COMPLETED and client.groups.get(gid) == decided
        assert client.groups.cancel(gid).status is GroupStatus.COMPLETED  # already decided: nothing to cancel


# the collector -------------------------------------------------------------------------------------


async def test_collector_returns_the_target_of_informative_groups_and_drops_the_rest(ctl_server):
    kinds = [INFORMATIVE, ZERO_VARIANCE, [0.0, 0.0], INFORMATIVE, ZERO_VARIANCE, INFORMATIVE, INFORMATIVE]
    requests = [group(rewards) for rewards in kinds]
    async with RolloutClient(ctl_server.url, retry=FAST_RETRY) as client:
        collector = DapoCollector(client, requests, target_groups=3, max_groups_in_flight=2, group_id_prefix="t")
        async with collector:
            report = await collector.collect_step()
            assert isinstance(report, StepReport) and len(report.groups) == 3
            for g in report.groups:
                assert g.status is GroupStatus.COMPLETED and len({r.reward for r in g.results}) == 2
            # K = 2 in flight: the informative groups 0, 3, 5 come back after 6 groups ran; 3 were dropped
            assert report.groups_informative == 3 and report.groups_filtered == 3 and report.groups_failed == 0
            assert report.groups_finished == 6 and report.groups_launched in (6, 7)
            assert {g.group_id for g in report.groups} <= {f"t-{i}" for i in range(7)}
            assert report.rollouts_used == 6 and report.rollouts_finished == 12
            assert report.rollouts_filtered == 6 and report.rollouts_cancelled == 0
            assert report.rollouts_wasted == 6 and report.rollouts_wasted_beyond_filter == 0
            assert report.groups_carried_over == report.groups_launched - 6
            assert 0 < report.wall_s < 10 and 0 <= report.underfilled_s <= report.wall_s

            # the source runs out: the last step returns what there is
            rest = await collector.collect_step()
            assert rest.exhausted and [g.group_id for g in rest.groups] == ["t-6"]
            assert rest.groups_carried_in == report.groups_carried_over
    # acknowledged: the member results do not pile up on the server
    assert ctl_server.http.get("/status").json()["jobs"].get("stored_results", 0) == 0


async def test_groups_running_at_the_target_are_carried_over_into_the_next_step(ctl_server):
    requests = [group(INFORMATIVE, group_id="a"), group(INFORMATIVE, delay=1.5, group_id="slow")]
    requests += [group(INFORMATIVE, delay=0.4, group_id="b"), group(INFORMATIVE, delay=2.0, group_id="c")]
    async with (
        RolloutClient(ctl_server.url, retry=FAST_RETRY) as client,
        DapoCollector(client, requests, target_groups=2, max_groups_in_flight=3) as collector,
    ):
        first = await collector.collect_step()
        assert [g.group_id for g in first.groups] == ["a", "b"]
        assert collector.running == ["slow", "c"] and first.groups_carried_over == 2
        assert first.groups_cancelled == 0 and first.rollouts_cancelled == 0
        assert (await client.groups.get("slow")).status is GroupStatus.RUNNING  # not cancelled, still running

        await asyncio.sleep(1.0)  # the trainer trains; the carried groups keep running
        started = time.monotonic()
        second = await collector.collect_step()
        assert [g.group_id for g in second.groups] == ["slow", "c"], "carried groups count in the next step"
        assert second.groups_carried_in == 2 and second.groups_launched == 0 and second.exhausted
        assert time.monotonic() - started < 1.5, "the carried groups kept running between the steps"
        for carried in second.groups:
            assert {m.status for m in carried.members} == {JobStatus.COMPLETED}
        assert first.rollouts_used + second.rollouts_used == 8
        assert first.rollouts_wasted + second.rollouts_wasted == 0


async def test_without_carry_over_the_groups_still_running_are_cancelled(ctl_server):
    requests = [group(INFORMATIVE, group_id="quick"), group(INFORMATIVE, delay=30, group_id="stuck")]
    async with RolloutClient(ctl_server.url, retry=FAST_RETRY) as client:
        collector = DapoCollector(client, requests, target_groups=1, max_groups_in_flight=2, carry_over=False)
        async with collector:
            report = await collector.collect_step()
            assert [g.group_id for g in report.groups] == ["quick"]
            assert report.groups_cancelled == 1 and report.groups_carried_over == 0 and collector.running == []
            assert report.rollouts_cancelled == 2 and report.rollouts_wasted == 2
            stuck = await client.groups.get("stuck")
            assert stuck.status is not GroupStatus.RUNNING
            assert {m.status for m in stuck.members} == {JobStatus.CANCELLED}
    assert live_jobs(ctl_server) == 0


async def test_close_cancels_the_carried_groups_and_status_sampling_measures_idle_workers(ctl_server):
    requests = [group(INFORMATIVE, group_id="x"), group(ZERO_VARIANCE, delay=30, group_id="y")]
    async with RolloutClient(ctl_server.url, retry=FAST_RETRY) as client:
        collector = DapoCollector(client, requests, target_groups=1, max_groups_in_flight=2, status_interval_s=0.02)
        report = await collector.collect_step()
        assert [g.group_id for g in report.groups] == ["x"] and report.groups_carried_over == 1
        assert report.idle_worker_s is not None and report.worker_s is not None
        assert 0 <= report.idle_worker_s <= report.worker_s and report.worker_s > 0
        closing = await collector.aclose()
        assert closing.groups_cancelled == 1 and closing.rollouts_cancelled == 2
        assert (await collector.aclose()).groups_cancelled == 0  # idempotent
        with pytest.raises(RuntimeError):
            await collector.collect_step()
    assert live_jobs(ctl_server) == 0


def test_sync_collector(ctl_server):
    requests = [group(ZERO_VARIANCE), group(INFORMATIVE), group(INFORMATIVE)]
    with (
        SyncRolloutClient(ctl_server.url, retry=FAST_RETRY) as client,
        SyncDapoCollector(client, requests, target_groups=2, max_groups_in_flight=3) as collector,
    ):
        report = collector.collect_step()
        assert len(report.groups) == 2 and report.groups_filtered == 1
