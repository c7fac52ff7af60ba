"""Model services for real: three judge services, each a dev-engine process serving SmolLM2-135M on the CPU,
under a budget that holds two. Used in turn A, B, C, A (then A again), the cache evicts the least recently used
judge by stopping its process and restores an evicted one by starting it again from the GGUF on disk, and each
judge answers a real chat completion under its own name."""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest

from prorl_server.actions import ModelServiceCache, ServiceState
from prorl_server.actions.model_processes import DevEngineLauncher, DevEngineService

pytest.importorskip("llama_cpp", reason="the dev engine needs llama-cpp-python: pip install 'prorl-server[devllm]'")

FOOTPRINT_MB = 450  # measured: one dev engine with SmolLM2-135M Q4_1 and n_ctx 1024 holds about 390 MiB
JUDGES = ("judge-a", "judge-b", "judge-c")


async def ask(endpoint: str, model: str) -> dict:
    async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
        answer = await client.post(
            f"{endpoint}/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": "Is 2 + 2 = 4? Answer yes or no."}],
                "max_tokens": 8,
                "temperature": 0,
            },
        )
    return answer.raise_for_status().json()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_three_judge_processes_in_a_budget_of_two_are_evicted_and_restored(tmp_path):
    cache = ModelServiceCache(2 * FOOTPRINT_MB)
    launchers = {name: DevEngineLauncher(DevEngineService(name, tmp_path / f"{name}.log")) for name in JUDGES}
    for name, launcher in launchers.items():
        cache.register(name, FOOTPRINT_MB, launcher)
    pids: dict[str, list[int]] = {name: [] for name in JUDGES}
    try:
        for name in ("judge-a", "judge-b", "judge-c", "judge-a", "judge-a"):
            async with cache.use(name) as endpoint:
                answer = await ask(endpoint, name)
                assert answer["model"] == name and answer["choices"][0]["message"]["content"]
                assert answer["usage"]["completion_tokens"] > 0
                launcher = launchers[name]
                assert launcher.proc is not None and 0 < launcher.rss_mb() <= FOOTPRINT_MB
                if launcher.proc.pid not in pids[name]:
                    pids[name].append(launcher.proc.pid)
                running = [n for n, other in launchers.items() if other.proc is not None]
                assert len(running) <= 2, running

        figures = cache.snapshot()
        assert (figures.hits, figures.misses, figures.restores, figures.evictions) == (1, 4, 4, 2)
        assert figures.resident_mb == 2 * FOOTPRINT_MB
        states = {s.name: s.state for s in figures.services}
        assert states == {
            "judge-a": ServiceState.RESIDENT,
            "judge-b": ServiceState.ABSENT,
            "judge-c": ServiceState.RESIDENT,
        }
        assert len(pids["judge-a"]) == 2 and not alive(pids["judge-a"][0])  # evicted for C, restored as a new process
        assert not alive(pids["judge-b"][0])  # evicted for A's restore
        by_name = {s.name: s for s in figures.services}
        assert by_name["judge-a"].restores == 2 and by_name["judge-a"].last_restore_s > 0
        restore_s = [s.restore_s_total / s.restores for s in figures.services if s.restores]
        print(  # shown with -s: the restore time measured here (a process start from the GGUF on disk)
            f"model-service restores: {figures.restores}, {figures.restore_s_total / figures.restores:.2f} s mean "
            f"({min(restore_s):.2f}-{max(restore_s):.2f} s); evictions: {figures.evictions}, "
            f"{figures.evict_s_total / figures.evictions:.2f} s mean"
        )
    finally:
        await asyncio.to_thread(cache.close)
    assert all(launcher.proc is None for launcher in launchers.values())
    assert not any(alive(pid) for pid_list in pids.values() for pid in pid_list)
