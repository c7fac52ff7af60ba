"""prorl_server.client: the trainer-side client against real prorl-servers (and a flaky proxy in front of one)."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
import threading
from collections.abc import Iterator

import httpx
import pytest
from repo_paths import EXAMPLES
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from prorl_server.auth_key import API_KEY_FILE_ENV
from prorl_server.client import (
    RetryPolicy,
    RolloutClient,
    RolloutServerError,
    SyncRolloutClient,
    assign_backends,
)
from prorl_server.protocol import (
    CancelResponse,
    HealthResponse,
    JobResult,
    JobStatus,
    LLMServerInfo,
    ProcessRequest,
    StatusResponse,
)
from prorl_server.protocol.server import API_KEY_ENV
from prorl_server.testing import UvicornThread
from prorl_server.testing.uvicorn_thread import free_port

EXAMPLES = EXAMPLES
FAST_RETRY = RetryPolicy(attempts=5, budget_s=10.0, base_delay_s=0.01, max_delay_s=0.05)
NOOP = {"instance": {"data_source": "noop"}}
SLOW = {"instance": {"data_source": "slow", "run_s": 30}}


@pytest.fixture(autouse=True)
def no_api_key_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    monkeypatch.setenv(API_KEY_FILE_ENV, str(tmp_path / "no-key-file"))  # nor from a key file


async def test_submit_wait_process_stream_ack_and_cancel_with_typed_answers(server, backend):
    backend.double.push("thinking", "DONE: 42")
    async with RolloutClient(server.url, retry=FAST_RETRY) as client:
        health = await client.health()
        assert isinstance(health, HealthResponse) and health.running
        assert {"multiturn", "noop"} <= {h.data_source for h in await client.handlers()}

        job_id = await client.jobs.submit({"instance": {"data_source": "multiturn", "question": "6 x 7?"}})
        assert re.fullmatch(r"[0-9a-f]{32}", job_id)  # the client made the id up
        result = await client.jobs.wait(job_id, timeout=10)
        assert isinstance(result, JobResult) and result.status is JobStatus.COMPLETED
        assert result.reward == 1.0 and len(result.trajectory.turns) == 2
        assert result.artifacts["answer"] == "DONE: 42"

        processed = await client.jobs.process(ProcessRequest(instance={"data_source": "noop"}, job_id="p1"))
        assert (processed.job_id, processed.status, processed.reward) == ("p1", JobStatus.COMPLETED, 1.0)

        stream = client.jobs.stream(wait=1, ack=True, timeout=5)
        async with stream:
            seen = [r async for r in _take(stream, 2)]
        assert [r.job_id for r in seen] == [job_id, "p1"] and all(isinstance(r, JobResult) for r in seen)
        assert stream.cursor == {server.url: 2}
        with pytest.raises(RolloutServerError) as gone:  # acknowledged: dropped from the server
            await client.jobs.get(job_id)
        assert gone.value.status_code == 404

        slow = await client.jobs.submit(SLOW)
        cancelled = await client.jobs.cancel(slow)
        assert isinstance(cancelled, CancelResponse) and cancelled.job_id == slow
        final = await client.jobs.wait(slow, timeout=10)
        assert final.status is JobStatus.CANCELLED and final.error is not None


async def _take(stream, n: int):
    """The first `n` results of a stream."""
    taken = 0
    async for result in stream:
        yield result
        taken += 1
        if taken == n:
            return


async def test_api_key_argument_and_environment(start_server, backend, monkeypatch):
    server = start_server([backend.address], api_key="s3cret")
    async with RolloutClient(server.url, retry=FAST_RETRY) as anonymous:
        with pytest.raises(RolloutServerError) as refused:
            await anonymous.status()
        assert refused.value.status_code == 401
        assert f"${API_KEY_ENV}" in str(refused.value) and "Bearer" in refused.value.detail
        assert (await anonymous.health()).status == "ok"  # the one open path
    async with RolloutClient(server.url, api_key="s3cret") as keyed:
        assert isinstance(await keyed.status(), StatusResponse)
        assert (await keyed.jobs.process(NOOP)).reward == 1.0
    monkeypatch.setenv(API_KEY_ENV, "s3cret")
    async with RolloutClient(server.url) as from_env:
        assert (await from_env.status()).running
    async with RolloutClient(server.url, api_key="wrong") as wrong:
        with pytest.raises(RolloutServerError, match="401"):
            await wrong.jobs.submit(NOOP)


async def test_http_errors_become_rollout_server_errors(server):
    async with RolloutClient(server.url, retry=FAST_RETRY) as client:
        with pytest.raises(RolloutServerError) as unknown_source:
            await client.jobs.submit({"instance": {"data_source": "nosuch"}})
        assert unknown_source.value.status_code == 400
        assert "nosuch" in unknown_source.value.detail and "multiturn" in unknown_source.value.detail
        assert "the request or instance is invalid" in str(unknown_source.value)

        with pytest.raises(RolloutServerError) as unknown_job:
            await client.jobs.wait("ghost")
        assert unknown_job.value.status_code == 404 and "ghost" in unknown_job.value.detail
        with pytest.raises(RolloutServerError) as cancel_unknown:
            await client.jobs.cancel("ghost")
        assert cancel_unknown.value.status_code == 404

        await client.jobs.submit({**SLOW, "job_id": "twice"})
        with pytest.raises(RolloutServerError) as duplicate:  # a 409 on a first attempt is an error
            await client.jobs.submit({**NOOP, "job_id": "twice"})
        assert duplicate.value.status_code == 409
        await client.jobs.cancel("twice")

    async with RolloutClient(f"http://127.0.0.1:{free_port()}", retry=RetryPolicy(attempts=2, base_delay_s=0.01)) as c:
        with pytest.raises(RolloutServerError) as unreachable:
            await c.health()
        assert unreachable.value.status_code is None and "cannot reach prorl-server" in str(unreachable.value)
        assert isinstance(unreachable.value.__cause__, httpx.ConnectError)


class FlakyProxy:
    """A proxy in front of a real server that misbehaves as scripted, one action per request, then forwards.

    Actions: an int (answer that status without forwarding), "hang" (forward, then answer only after
    `hang_s`: the client times out although the server got the request)."""

    def __init__(self, target: str, *actions: int | str, hang_s: float = 1.0) -> None:
        self.target = target
        self.actions = list(actions)
        self.hang_s = hang_s
        self.seen: list[str] = []
        methods = ["GET", "POST", "DELETE"]
        self.app = Starlette(routes=[Route("/{path:path}", self.handle, methods=methods)])

    async def handle(self, request: Request) -> Response:
        self.seen.append(f"{request.method} {request.url.path}")
        action = self.actions.pop(0) if self.actions else "forward"
        if isinstance(action, int):
            return JSONResponse({"detail": f"scripted {action}"}, status_code=action)
        async with httpx.AsyncClient(base_url=self.target, timeout=30) as http:
            answer = await http.request(
                request.method, request.url.path, params=request.query_params, content=await request.body()
            )
        if action == "hang":
            await asyncio.sleep(self.hang_s)
        return Response(answer.content, status_code=answer.status_code, media_type="application/json")


@pytest.fixture
def proxy_to(server) -> Iterator:
    started: list[UvicornThread] = []

    def start(*actions: int | str, port: int | None = None, delay_s: float = 0.0) -> tuple[FlakyProxy, str]:
        proxy = FlakyProxy(server.url, *actions)
        thread = UvicornThread(proxy.app, port=port)
        started.append(thread)
        if delay_s:
            threading.Timer(delay_s, thread.start).start()
        else:
            thread.start()
        return proxy, thread.url

    yield start
    for thread in started:
        thread.stop()


async def test_submit_retries_503_and_succeeds(proxy_to, server):
    proxy, url = proxy_to(503, 503)
    async with RolloutClient(url, retry=FAST_RETRY) as client:
        job_id = await client.jobs.submit(NOOP)
        assert proxy.seen == ["POST /jobs"] * 3
        assert (await client.jobs.wait(job_id, timeout=10)).status is JobStatus.COMPLETED
    assert server.http.get(f"/jobs/{job_id}").json()["status"] == "completed"


async def test_a_retried_submit_whose_first_attempt_got_through_returns_the_same_job(proxy_to, server):
    proxy, url = proxy_to("hang")  # the server gets the job, the client's read times out
    async with RolloutClient(url, retry=FAST_RETRY, timeout=0.3) as client:
        job_id = await client.jobs.submit({**SLOW, "job_id": "once"})
        assert job_id == "once" and proxy.seen == ["POST /jobs"] * 2
        live = (await client.status()).jobs
        assert sum(n for status, n in live.items() if status != "stored_results") == 1, "the job runs once"
        await client.jobs.cancel("once")
        assert (await client.jobs.wait("once", timeout=10)).status is JobStatus.CANCELLED


async def test_a_refused_request_is_not_retried_and_retries_give_up(proxy_to):
    proxy, url = proxy_to(400, 400, 400)
    async with RolloutClient(url, retry=FAST_RETRY) as client:
        with pytest.raises(RolloutServerError) as refused:
            await client.jobs.submit(NOOP)
    assert refused.value.status_code == 400 and proxy.seen == ["POST /jobs"]

    proxy, url = proxy_to(*[503] * 10)
    async with RolloutClient(url, retry=RetryPolicy(attempts=3, base_delay_s=0.01)) as client:
        with pytest.raises(RolloutServerError) as unavailable:
            await client.jobs.submit(NOOP)
    assert unavailable.value.status_code == 503 and "after 3 attempts" in str(unavailable.value)
    assert proxy.seen == ["POST /jobs"] * 3


async def test_a_server_not_up_yet_is_retried_until_it_answers(proxy_to):
    port = free_port()
    proxy, url = proxy_to(port=port, delay_s=0.4)  # nothing listens for the first 0.4 s
    retry = RetryPolicy(attempts=20, budget_s=10.0, base_delay_s=0.05, max_delay_s=0.1)
    async with RolloutClient(url, retry=retry) as client:
        result = await client.jobs.wait(await client.jobs.submit(NOOP), timeout=10)
    assert result.status is JobStatus.COMPLETED and proxy.seen[0] == "POST /jobs"


async def test_jobs_go_to_the_less_loaded_server_and_results_are_merged(start_server, backend):
    busy = start_server([backend.address])
    idle = start_server([backend.address])
    async with RolloutClient([busy.url, idle.url], retry=FAST_RETRY, load_refresh_s=60) as even:
        spread = await even.jobs.submit_many([NOOP] * 4)
        assert sorted(even.jobs.server_of(j) for j in spread) == sorted([busy.url, idle.url] * 2)
        await even.jobs.collect(spread, timeout=10)

    slow_ids = [busy.http.post("/jobs", json=SLOW).json()["job_id"] for _ in range(6)]
    async with RolloutClient([idle.url, busy.url], retry=FAST_RETRY, load_refresh_s=60) as client:
        job_ids = await client.jobs.submit_many([NOOP] * 4)
        assert {client.jobs.server_of(j) for j in job_ids} == {idle.url}
        for slow in slow_ids:  # not submitted by this client: found on the server that has it
            assert (await client.jobs.cancel(slow)).job_id == slow

        async with client.jobs.stream(wait=1, ack=True, timeout=10) as stream:
            results = [r async for r in _take(stream, 14)]
        assert sorted(r.job_id for r in results) == sorted(spread + slow_ids + job_ids)
        assert {r.job_id for r in results if r.status is JobStatus.CANCELLED} == set(slow_ids)
        assert stream.cursor == {idle.url: 6, busy.url: 8}
        for server in (busy, idle):
            assert (await client.status(server=server.url)).jobs["stored_results"] == 0
        with pytest.raises(ValueError, match="several servers"):
            await client.status()


def test_two_phase_backend_assignment_puts_local_backends_first():
    servers = ["http://127.0.0.1:8000", "http://10.0.0.2:8000", "http://node3:9000"]
    addresses = [
        "http://10.0.0.2:8100/v1",
        "http://localhost:8101/v1",
        "http://node9:8000/v1",
        "http://127.0.0.1:8102/v1",
        "http://node8:8000/v1",
        "http://node7:8000/v1",
        "http://10.0.0.2:8103/v1",
    ]
    assert assign_backends(servers, addresses) == {
        "http://127.0.0.1:8000": ["http://localhost:8101/v1", "http://127.0.0.1:8102/v1", "http://node7:8000/v1"],
        "http://10.0.0.2:8000": ["http://10.0.0.2:8100/v1", "http://10.0.0.2:8103/v1"],
        "http://node3:9000": ["http://node9:8000/v1", "http://node8:8000/v1"],
    }
    assert assign_backends(["http://a:1", "http://b:1"], [f"http://c{i}:1" for i in range(5)]) == {
        "http://a:1": ["http://c0:1", "http://c2:1", "http://c4:1"],
        "http://b:1": ["http://c1:1", "http://c3:1"],
    }


async def test_register_backends_calls_add_llm_server_per_assignment(start_server, start_backend):
    first, second = start_server(), start_server()
    local = [start_backend().address, start_backend().address]
    remote = "http://backend.invalid:8000/v1"
    async with RolloutClient([first.url, second.url], retry=FAST_RETRY) as client:
        assignment = await client.backends.register([remote, *local], weight_version=7)
        assert assignment == {first.url: [local[0], remote], second.url: [local[1]]}
        for url, addresses in assignment.items():
            listed = (await client.backends.list(server=url)).servers
            assert sorted(s.address for s in listed) == sorted(addresses)
            assert {s.weight_version for s in listed} == {7}
        info = await client.backends.add(local[0], weight_version=8, tags={"node": 0}, server=second.url)
        assert isinstance(info, LLMServerInfo) and (info.weight_version, info.tags) == (8, {"node": 0})
        drained = await client.backends.remove(remote, server=first.url)
        assert drained.removed.address == remote and drained.drained and drained.remaining == 1
        with pytest.raises(RolloutServerError) as unknown:
            await client.backends.remove(remote, server=first.url)
        assert unknown.value.status_code == 404
        assert await client.backends.clear() == 3
        assert (await client.backends.list(server=first.url)).servers == []


def test_sync_client_submits_collects_with_progress_and_streams(server, capsys):
    with SyncRolloutClient(server.url, retry=FAST_RETRY) as client:
        assert client.health().running
        job_ids = client.jobs.submit_many([NOOP, NOOP, {**NOOP, "job_id": "mine"}])
        assert job_ids[2] == "mine"
        results = client.jobs.collect(job_ids, progress="rollouts", ack=True, timeout=10)
        assert sorted(r.job_id for r in results) == sorted(job_ids)
        assert all(isinstance(r, JobResult) and r.reward == 1.0 for r in results)
        bar = capsys.readouterr().err
        assert "rollouts" in bar and "3/3" in bar
        assert client.status().jobs["stored_results"] == 0  # acknowledged by id
        assert client.jobs.collect([], timeout=None) == []  # nothing to wait for: no endless stream

        client.jobs.process({**NOOP, "job_id": "later"})
        with client.jobs.stream(wait=0.5, timeout=3) as stream:
            assert next(stream).job_id == "later"
        assert stream.cursor == {server.url: 4}
        with pytest.raises(RolloutServerError) as missing:
            client.jobs.wait("ghost")
        assert missing.value.status_code == 404
    assert not [t for t in threading.enumerate() if t.name == "prorl-client-loop"]
    with pytest.raises(RuntimeError, match="closed"):
        client.status()


def test_the_trainer_client_example_runs_on_the_client(server, backend, tmp_path, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("trainer_client", EXAMPLES / "trainer_client.py")
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "trainer_client", example)  # its dataclasses look their module up
    spec.loader.exec_module(example)
    instances = tmp_path / "instances.jsonl"
    instances.write_text('{"data_source": "noop"}\n{"data_source": "noop", "n": 2}\n')
    argv = ["--server", server.url, "--llm-server", backend.address, "--weight-version", "3"]
    argv += ["--instances", str(instances), "--samples", "2", "--poll-wait", "1", "--deadline", "20"]
    assert example.main(argv) == 0
    out = capsys.readouterr().out
    assert f"registered LLM backend {backend.address} (healthy=True)" in out
    assert "submitted 4 jobs: 2 instances x 2 samples" in out and out.count("completed reward=1.0") == 4
    assert "group 1: rewards=[1.0, 1.0] mean=1.000 variance=0.0000" in out
    assert "statuses: completed=4, unfinished=0" in out
    assert server.http.get("/jobs").json()["results"] == []  # acknowledged


def test_the_readme_example_runs(server, capsys):
    readme = (EXAMPLES.parent / "README.md").read_text()
    section = readme[readme.index("## Trainer client") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    assert '"http://127.0.0.1:8000"' in code and '"data_source": "math"' in code
    code = code.replace('"http://127.0.0.1:8000"', repr(server.url)).replace('"math"', '"noop"')
    exec(compile(code, "README.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and all(line.endswith(" completed 1.0 0") for line in lines), lines
    assert server.http.get("/jobs").json()["results"] == []  # acknowledged


def test_weight_calls_pause_update_resume_and_swap_every_server(start_server, backend):
    servers = [start_server([backend.address]), start_server([backend.address])]
    with SyncRolloutClient([s.url for s in servers], retry=FAST_RETRY) as client:
        paused = client.weights.pause()
        assert set(paused) == {s.url for s in servers} and all(p.paused and p.drained for p in paused.values())
        updated = client.weights.update(3)
        assert {u.version for u in updated.values()} == {3}
        assert all(not r.paused for r in client.weights.resume().values())
        swapped = client.weights.swap(4, server=servers[0].url)
        assert list(swapped) == [servers[0].url] and swapped[servers[0].url].version == 4
        assert {url: w.version for url, w in client.weights.status().items()} == {servers[0].url: 4, servers[1].url: 3}
        with pytest.raises(RolloutServerError) as backwards:
            client.weights.swap(2, server=servers[1].url)
        assert backwards.value.status_code == 409
