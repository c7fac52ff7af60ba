"""Quotas for external services a handler calls (ARL-Tangram's basic resource manager, issue 22 item 3):
`--service-quota NAME=MAX[/RATE]` and `ctx.service(name)`, against a real HTTP service (a test double that
counts its requests in flight and answers 429 when told to); names are bounded; the metrics show each service."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from prorl_server.actions.quota import MAX_SERVICES, QuotaConfig, QuotaRegistry, ServiceQuota, parse_service_quota
from prorl_server.config import ServerSettings
from prorl_server.handlers import AgentHandler, JobContext
from prorl_server.testing import UvicornThread


class SearchDouble:
    """A test double of an external search API: each request takes `delay_s`; the first `overload` answer 429
    with Retry-After 0; it records the most requests it had in flight at once."""

    def __init__(self, delay_s: float = 0.2, overload: int = 0) -> None:
        self.delay_s = delay_s
        self.overload = overload
        self.in_flight = self.max_in_flight = self.requests = 0
        self._lock = threading.Lock()
        app = FastAPI()

        @app.get("/search")
        async def search(q: str) -> JSONResponse:
            with self._lock:
                self.requests += 1
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)
                overloaded = self.overload > 0
                self.overload -= overloaded
            try:
                await asyncio.sleep(self.delay_s)
            finally:
                with self._lock:
                    self.in_flight -= 1
            if overloaded:
                return JSONResponse({"error": "slow down"}, status_code=429, headers={"Retry-After": "0"})
            return JSONResponse({"hits": [q.upper()]})

        self.server = UvicornThread(app).start()


class SearchingHandler(AgentHandler):
    """RUN asks the search service through `ctx.service`, retrying a 429 once the quota lets it."""

    name = "searching"

    async def run(self, ctx: JobContext) -> None:
        url = ctx.instance["url"]
        async with httpx.AsyncClient(timeout=30) as client:
            for _ in range(5):
                async with ctx.service(ctx.instance.get("service", "search")) as slot:
                    reply = await client.get(url, params={"q": ctx.instance["q"]})
                    if reply.status_code == 429:
                        slot.overloaded(float(reply.headers.get("Retry-After", 0)))
                        continue
                ctx.artifacts["hits"] = reply.json()["hits"]
                return

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        return {"reward": 1.0 if ctx.artifacts.get("hits") == [ctx.instance["q"].upper()] else 0.0}


@pytest.fixture
def search():
    double = SearchDouble()
    yield double
    double.server.stop()


def serve(start_server, backend, **settings):
    return start_server([backend.address], handlers={"searching": SearchingHandler()}, **settings)


def process(server, **instance) -> dict:
    body = {"instance": {"data_source": "searching", **instance}, "timeout": 60}
    return server.http.post("/process", json=body).json()


def metric(text: str, name: str, service: str) -> float:
    prefix = f'{name}{{service="{service}"}} '
    [line] = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(line.removeprefix(prefix))


def test_a_service_limited_to_2_never_sees_more_than_2_requests_and_a_burst_queues(start_server, backend, search):
    server = serve(start_server, backend, service_quotas=["search=2"])
    url = f"{search.server.url}/search"
    bodies = [{"instance": {"data_source": "searching", "url": url, "q": f"q{i}"}, "timeout": 60} for i in range(8)]
    results = asyncio.run(_post_all(server, bodies))
    assert [r["status"] for r in results] == ["completed"] * 8, [r.get("error") for r in results]
    assert [r["reward"] for r in results] == [1.0] * 8
    assert search.max_in_flight <= 2 and search.requests == 8
    text = server.http.get("/metrics").text
    assert metric(text, "prorl_service_concurrency_limit", "search") == 2.0
    assert metric(text, "prorl_service_granted_total", "search") == 8.0
    assert metric(text, "prorl_service_in_use", "search") == 0.0


async def _post_all(server, bodies: list[dict]) -> list[dict]:
    async with httpx.AsyncClient(base_url=server.url, timeout=60, headers=server.http.headers) as client:
        replies = await asyncio.gather(*(client.post("/process", json=b) for b in bodies))
    return [r.json() for r in replies]


def test_429s_cut_the_limit_and_the_calls_succeed_after(start_server, backend):
    search = SearchDouble(delay_s=0.05, overload=3)
    try:
        server = serve(start_server, backend, service_quotas=["search=4/50"])
        url = f"{search.server.url}/search"
        bodies = [{"instance": {"data_source": "searching", "url": url, "q": f"q{i}"}, "timeout": 60} for i in range(6)]
        results = asyncio.run(_post_all(server, bodies))
        assert [r["reward"] for r in results] == [1.0] * 6, [r.get("error") for r in results]
        text = server.http.get("/metrics").text
        assert metric(text, "prorl_service_overloads_total", "search") == 3.0
        assert search.requests == 9  # each 429 asked again
    finally:
        search.server.stop()


def test_an_unlisted_service_gets_the_default_quota_and_a_bad_name_fails_its_job(start_server, backend, search):
    server = serve(start_server, backend)
    url = f"{search.server.url}/search"
    assert process(server, url=url, q="x", service="maps")["reward"] == 1.0
    assert metric(server.http.get("/metrics").text, "prorl_service_concurrency_limit", "maps") == 32.0
    bad = process(server, url=url, q="x", service="no spaces allowed")
    assert bad["status"] == "failed" and "a service name is 1 to 64 of" in bad["error"]["message"]


def test_service_quota_settings_are_checked():
    assert parse_service_quota("search=8/20") == ("search", QuotaConfig(max_concurrency=8, rate_per_s=20.0))
    assert parse_service_quota("api.v2=1") == ("api.v2", QuotaConfig(max_concurrency=1))
    for bad, reason in [
        ("search", "NAME=MAX_CONCURRENCY"),
        ("=3", "NAME=MAX_CONCURRENCY"),
        ("a b=3", "NAME=MAX_CONCURRENCY"),
        ("s=x", "invalid literal"),
        ("s=-1", "max_concurrency must be >= 0"),
        ("s=2/0", "rate_per_s must be a positive number"),
    ]:
        with pytest.raises(ValueError, match=reason):
            parse_service_quota(bad)
    with pytest.raises(ValueError, match="more than once"):
        ServerSettings(service_quotas=["a=1", "a=2"])
    with pytest.raises(ValueError, match="--judge-max-concurrency"):
        ServerSettings(service_quotas=["judge=3"])


def test_a_registry_holds_at_most_64_services_and_each_name_once():
    registry = QuotaRegistry()
    registry.add(ServiceQuota("judge", QuotaConfig(max_concurrency=3)))
    with pytest.raises(ValueError, match="already has a quota"):
        registry.configure("judge", QuotaConfig())
    for i in range(MAX_SERVICES - 1):
        registry.get(f"svc-{i}")
    assert registry.get("svc-0") is registry.get("svc-0")  # a known name is no new service
    with pytest.raises(ValueError, match="already has 64 services"):
        registry.get("one-too-many")
    assert len(registry.snapshot()) == MAX_SERVICES
