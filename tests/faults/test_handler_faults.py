"""Whatever a handler raises, from whichever method, fails that job once and leaves the server whole.

One server with small pools (2 workers per stage, 2 ready-for-RUN permits) takes every fault in `FAULTS`
from every method, from `async def` methods, plain `def` methods (worker threads) and `asyncio.to_thread`
inside async methods. After each, probe jobs through all three stages must complete and the server's books
must balance: no live job, no busy worker, every ready-for-RUN permit free.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fault_handlers import FAULTS, METHODS, AsyncFaultHandler, SyncFaultHandler
from suite_servers import SUITE_DEFAULT_REPLY

from prorl_server.api import ServerState, create_app
from prorl_server.config import ServerSettings
from prorl_server.handlers import HandlerRegistry
from prorl_server.pipeline.handler_threads import HandlerThreads
from prorl_server.testing import ScriptedBackend, UvicornThread, create_scripted_backend_app

VARIANTS = ("async", "sync", "async_via_thread")
JOB_TIMEOUT_S = 3.0  # a guard: no case here needs a timeout, except StopIteration through asyncio.to_thread


class FaultServer:
    """A server with 2 workers per stage and the fault handlers, and a client."""

    def __init__(self) -> None:
        self.backend = UvicornThread(create_scripted_backend_app(ScriptedBackend(default_reply=SUITE_DEFAULT_REPLY)))
        self.backend.start()
        self.handlers = {"fault_async": AsyncFaultHandler(), "fault_sync": SyncFaultHandler()}
        registry = HandlerRegistry()
        for name, handler in self.handlers.items():
            registry.register(name, handler)
        settings = ServerSettings(
            llm_servers=[f"{self.backend.url}/v1"],
            init_workers=2,
            run_workers=2,
            eval_workers=2,
            cancel_grace_s=0.5,
            health_check_interval_s=0.5,
        )
        self.state = ServerState.build(settings, registry=registry)
        self.server = UvicornThread(create_app(state=self.state)).start()
        self.http = httpx.Client(base_url=self.server.url, timeout=60)

    def close(self) -> None:
        self.http.close()
        self.server.stop()
        self.backend.stop()


@pytest.fixture(scope="module")
def faults() -> Iterator[FaultServer]:
    server = FaultServer()
    start_handler_threads(server)
    yield server
    server.close()


def start_handler_threads(server: FaultServer) -> None:
    """Start every stage's threads for plain-def methods now (they start on demand): they belong to this
    module's server, and must not count as threads a test left running."""

    async def fill(threads: HandlerThreads) -> None:
        together = threading.Barrier(threads.size, timeout=10)  # all at once: every thread starts
        await asyncio.gather(*(threads.run(together.wait, owner="warm-up") for _ in range(threads.size)))

    for pool in server.state.orchestrator.pools.values():
        asyncio.run(fill(pool.threads))


def instance(variant: str, method: str, fault: str) -> dict[str, Any]:
    data_source = "fault_sync" if variant == "sync" else "fault_async"
    return {"data_source": data_source, "method": method, "fault": fault, "via_thread": variant == "async_via_thread"}


def expected_type(variant: str, fault: str) -> str:
    """The exception type a job's error names for `fault` raised in `variant`."""
    if fault == "stop_iteration" and variant == "async":
        return "RuntimeError"  # PEP 479: a coroutine cannot raise StopIteration
    return {
        "cancelled": "CancelledError",
        "generator_exit": "GeneratorExit",
        "system_exit": "SystemExit",
        "keyboard_interrupt": "KeyboardInterrupt",
        "plugin_base_exception": "PluginAbort",
        "stop_iteration": "StopIteration",
        "unprintable": "UnprintableError",
        "unrepresentable": "UnrepresentableError",
        "exception_group": "BaseExceptionGroup",
        "runtime_error": "RuntimeError",
    }[fault]


def check_result(result: dict[str, Any], variant: str, method: str, fault: str) -> None:
    """The result the server must give for `fault` raised from `method`."""
    if variant == "async_via_thread" and fault == "stop_iteration" and method != "release":
        # asyncio cannot set StopIteration on a future: the handler's own await never returns, and the job's
        # timeout ends it (an exception hook's or final_result's bound ends the job with a failure)
        assert result["status"] in ("timeout", "failed"), result
        return
    kind = expected_type(variant, fault)
    error = result["error"]
    if method == "release":  # a cleanup's exception is logged; the job is not affected
        assert result["status"] == "completed" and result["reward"] == 1.0, result
        return
    assert result["status"] == "failed", result
    assert result["reward"] is None
    if method.endswith("_exception"):  # the stage raised RuntimeError, then its hook raised the fault
        assert error["stage"] == method.removesuffix("_exception")
        assert error["type"] == "RuntimeError"
        assert kind in error["message"], error
        return
    assert error["stage"] == method, error
    assert error["type"] == kind, error
    assert error["message"], error
    assert error["location"] is not None
    if fault != "stop_iteration":
        assert "fault_handlers.py" in error["location"], error
        assert error["traceback"] is not None


def probe(server: FaultServer) -> None:
    """Jobs through INIT, RUN and EVAL (more at once than any stage has workers) all complete."""

    async def run_all() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=server.server.url, timeout=60) as client:
            posts = [
                client.post("/process", json={"instance": {"data_source": name, "method": "none"}})
                for name in ("fault_async", "fault_sync")
                for _ in range(3)
            ]
            return [response.json() for response in await asyncio.gather(*posts)]

    results = asyncio.run(run_all())
    assert [r["status"] for r in results] == ["completed"] * 6, [r.get("error") for r in results]


def assert_balanced(server: FaultServer, timeout: float = 10.0) -> None:
    """No live job, no busy worker, every ready-for-RUN permit back, no stage loop restarted."""
    orchestrator = server.state.orchestrator
    deadline = time.monotonic() + timeout
    while True:
        status = server.http.get("/status").json()
        live = {k: v for k, v in status["jobs"].items() if k != "stored_results" and v}
        free, total = orchestrator.ready_permits
        balanced = not live and not any(status["busy_workers"].values()) and free == total
        if balanced or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert balanced, (status, orchestrator.ready_permits)
    assert status["loop_restarts"] == {"init": 0, "run": 0, "eval": 0}
    assert status["health"] == "ok", status["problems"]
    assert server.http.get("/health").status_code == 200


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_fault_fails_its_job_once_and_the_server_goes_on(faults, variant, method, fault):
    body = {"instance": instance(variant, method, fault), "timeout": JOB_TIMEOUT_S}
    response = faults.http.post("/process", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    check_result(result, variant, method, fault)
    assert faults.http.get(f"/jobs/{result['job_id']}").json()["result"] == result  # stored once, as returned
    handler = faults.handlers[body["instance"]["data_source"]]
    assert handler.released.count(result["job_id"]) == 1  # released exactly once
    probe(faults)
    assert_balanced(faults)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_crashing_instance_validator_gets_a_400(faults, fault):
    response = faults.http.post("/process", json={"instance": instance("sync", "validate_instance", fault)})
    assert response.status_code == 400, response.text
    assert "validator" in response.json()["detail"] and expected_type("sync", fault) in response.json()["detail"]
    probe(faults)
    assert_balanced(faults)


def test_a_thousand_mixed_faults_in_a_row_leave_the_books_balanced(faults):
    rng = random.Random(21)
    cases = [
        (variant, method, fault)
        for variant in VARIANTS
        for method in METHODS
        for fault in FAULTS
        if not (variant == "async_via_thread" and fault == "stop_iteration")  # slow: ends on the timeout
    ]
    chosen = [rng.choice(cases) for _ in range(1000)]
    released_before = {name: len(h.released) for name, h in faults.handlers.items()}

    async def run_all() -> list[dict[str, Any]]:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(base_url=faults.server.url, timeout=120, limits=limits) as client:
            gate = asyncio.Semaphore(16)

            async def one(case: tuple[str, str, str]) -> dict[str, Any]:
                async with gate:
                    body = {"instance": instance(*case), "timeout": JOB_TIMEOUT_S}
                    return (await client.post("/process", json=body)).json()

            return await asyncio.gather(*(one(case) for case in chosen))

    results = asyncio.run(run_all())
    for case, result in zip(chosen, results, strict=True):
        check_result(result, *case)
    assert len({r["job_id"] for r in results}) == 1000
    released = sum(len(h.released) - released_before[name] for name, h in faults.handlers.items())
    assert released == 1000  # every job's cleanup ran, once
    probe(faults)
    assert_balanced(faults)
