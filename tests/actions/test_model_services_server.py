"""Model services in a server (`--model-service NAME=MEMORY_MB`, `ctx.model_service`): real dev-engine
judges on the CPU under a budget that holds one, evicted and restored as jobs use them in turn; their ports
denied to sandboxes; stopped with the server; bad names and bad settings refused clearly."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest

from prorl_server.config import ServerSettings
from prorl_server.handlers import AgentHandler, JobContext

FOOTPRINT_MB = 450  # one dev engine with SmolLM2-135M Q4_1 and n_ctx 1024 holds about 390 MiB


class ModelJudgedHandler(AgentHandler):
    """EVAL asks model service `instance["judge"]` a question; the reward is 1 when it answered."""

    name = "model_judged"

    async def run(self, ctx: JobContext) -> None:
        ctx.artifacts["answer"] = "4"

    async def eval(self, ctx: JobContext) -> dict[str, Any]:
        judge = ctx.instance["judge"]
        async with ctx.model_service(judge) as base_url, httpx.AsyncClient(trust_env=False, timeout=60) as client:
            reply = await client.post(
                f"{base_url}/chat/completions",
                json={
                    "model": judge,
                    "messages": [{"role": "user", "content": "Is 2 + 2 = 4? Answer yes or no."}],
                    "max_tokens": 4,
                    "temperature": 0,
                },
            )
        body = reply.raise_for_status().json()
        return {"reward": 1.0, "judge_model": body["model"], "verdict": body["choices"][0]["message"]["content"]}


def process(server, judge: str) -> dict:
    body = {"instance": {"data_source": "model_judged", "judge": judge}, "timeout": 120}
    return server.http.post("/process", json=body).json()


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def metric(text: str, name: str) -> float:
    [line] = [line for line in text.splitlines() if line.startswith(name + " ") or line.startswith(name + "{")]
    return float(line.split()[-1])


def test_judges_in_a_budget_of_one_are_evicted_and_restored_as_jobs_use_them(start_server, backend):
    pytest.importorskip("llama_cpp", reason="the dev engine needs llama-cpp-python: pip install 'prorl-server[devllm]'")
    server = start_server(
        [backend.address],
        handlers={"model_judged": ModelJudgedHandler()},
        model_services=[f"judge-a={FOOTPRINT_MB}", f"judge-b={FOOTPRINT_MB}"],
        model_service_budget_mb=FOOTPRINT_MB + 50,
    )
    cache = server.state.orchestrator.model_services
    ports = server.state.orchestrator.sandboxes.runtime.network_guard.judge_ports
    assert len(ports) == 2  # both services' ports are denied to sandboxes from the start
    results = [process(server, judge) for judge in ("judge-a", "judge-b", "judge-a")]
    assert [r["status"] for r in results] == ["completed"] * 3, [r.get("error") for r in results]
    assert [r["eval"]["judge_model"] for r in results] == ["judge-a", "judge-b", "judge-a"]
    figures = cache.snapshot()
    assert (figures.restores, figures.evictions, figures.executing, figures.waiting) == (3, 2, 0, 0)
    assert figures.resident_mb == FOOTPRINT_MB
    text = server.http.get("/metrics").text
    assert metric(text, "prorl_model_service_evictions_total") == 2.0
    assert metric(text, "prorl_model_service_resident_mb") == FOOTPRINT_MB
    assert 'prorl_model_service_resident{service="judge-a"} 1.0' in text
    assert 'prorl_model_service_restores_total{service="judge-b"} 1.0' in text
    assert sum(listening(port) for port in ports) == 1  # one judge runs
    server.server.stop()
    assert not any(listening(port) for port in ports)  # the server's shutdown stopped it


def test_an_unknown_model_service_or_none_at_all_fails_the_job_clearly(start_server, backend):
    pytest.importorskip("llama_cpp", reason="the dev engine needs llama-cpp-python: pip install 'prorl-server[devllm]'")
    server = start_server(
        [backend.address], handlers={"model_judged": ModelJudgedHandler()}, model_services=["judge-a=450"]
    )
    result = process(server, "judge-z")
    assert result["status"] == "failed" and result["error"]["type"] == "ModelServiceRefused"
    assert "judge-z" in result["error"]["message"]
    plain = start_server([backend.address], handlers={"model_judged": ModelJudgedHandler()})
    result = process(plain, "judge-a")
    assert result["status"] == "failed" and "--model-service NAME=MEMORY_MB" in result["error"]["message"]
    assert "prorl_model_service" not in plain.http.get("/metrics").text


def test_model_service_settings_are_checked():
    assert ServerSettings(model_services=["judge-a=450", "rm.v2=300"]).model_services == ["judge-a=450", "rm.v2=300"]
    for bad, reason in [
        (["judge-a"], "NAME=MEMORY_MB"),
        (["judge a=450"], "NAME=MEMORY_MB"),
        (["judge-a=lots"], "NAME=MEMORY_MB"),
        (["judge-a=0"], "at least 1 MiB"),
        (["a=1", "a=2"], "more than once"),
        (["big=4096"], "needs 4096 MiB and --model-service-budget-mb is 1024 MiB"),
    ]:
        with pytest.raises(ValueError, match=reason):
            ServerSettings(model_services=bad)
