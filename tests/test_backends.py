"""Backend pool: placement policies, registration, health, failover to another backend, legacy token ids."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from prorl_server.llm import (
    BackendPool,
    BackendUnavailable,
    MinHeapPolicy,
    NoBackendAvailable,
    VLLMClient,
    parse_completion,
)
from prorl_server.testing import ScriptedReply, ToyChatTokenizer
from prorl_server.testing.uvicorn_thread import free_port


def pool_with(n: int, policy: str) -> BackendPool:
    pool = BackendPool(VLLMClient(), policy)
    for i in range(n):
        pool.add(f"http://b{i}/v1")
    return pool


def test_min_heap_counts_jobs_not_calls_and_round_robins():
    pool = pool_with(3, "min_heap")
    chosen = [pool.acquire(f"job{i}").address for i in range(6)]
    assert chosen == ["http://b0/v1", "http://b1/v1", "http://b2/v1"] * 2
    assert pool.acquire("job0").address == "http://b0/v1"  # later turns stay on the same backend
    assert [b.assigned for b in pool.backends()] == [2, 2, 2]
    pool.release("job0")
    pool.release("job3")
    assert pool.acquire("job6").address == "http://b0/v1"  # ProRL counts assignments, not load: still a tie
    assert isinstance(pool.policy, MinHeapPolicy)


def test_sticky_least_loaded_follows_in_flight_jobs():
    pool = pool_with(2, "sticky_least_loaded")
    assert pool.acquire("a").address == "http://b0/v1"
    assert pool.acquire("b").address == "http://b1/v1"
    assert pool.acquire("c").address == "http://b0/v1"
    pool.release("a")
    pool.release("c")  # b0 is now idle, b1 still has one job
    assert pool.acquire("d").address == "http://b0/v1"
    assert pool.acquire("e").address == "http://b1/v1"  # equal load: fewer jobs ever assigned wins
    assert [b.in_flight for b in pool.backends()] == [1, 2]
    assert [b.assigned for b in pool.backends()] == [3, 2]


def test_unhealthy_backend_is_skipped_and_job_repinned():
    pool = pool_with(2, "sticky_least_loaded")
    first = pool.acquire("job")
    pool.mark_unhealthy(first, "connection refused")
    second = pool.acquire("job")
    assert second is not first and first.in_flight == 0 and second.in_flight == 1
    pool.mark_unhealthy(second, "gone")
    with pytest.raises(NoBackendAvailable, match="unhealthy"):
        pool.acquire("job")


def test_registration_listing_and_clear(server, backend):
    added = server.http.post(
        "/add_llm_server", json={"address": "http://127.0.0.1:1/v1/", "weight_version": 7, "tags": {"gpu": "a100"}}
    ).json()
    assert added["address"] == "http://127.0.0.1:1/v1" and added["weight_version"] == 7
    listing = server.http.get("/llm_servers").json()
    assert listing["policy"] == "sticky_least_loaded"
    assert [s["address"] for s in listing["servers"]] == [backend.address, "http://127.0.0.1:1/v1"]
    assert set(listing["servers"][0]) >= {"address", "weight_version", "assigned", "in_flight", "healthy"}
    assert server.http.post("/clear_llm_server").json() == {"removed": 2}
    assert server.http.get("/llm_servers").json()["servers"] == []
    assert server.http.post("/process", json={"instance": {"data_source": "noop"}}).status_code == 503


def test_registration_before_start_is_kept(start_server, backend):
    server = start_server([], autostart=False)
    assert server.http.post("/process", json={"instance": {"data_source": "noop"}}).status_code == 503
    server.http.post("/add_llm_server", json={"address": backend.address, "weight_version": "v1"})
    server.http.post("/start")
    backend.double.push("DONE")
    result = server.http.post("/process", json={"instance": {"data_source": "multiturn", "question": "q"}}).json()
    assert result["trajectory"]["turns"][0]["weight_version"] == "v1"


def test_weight_version_update_applies_to_next_turns(server, backend):
    backend.double.push(ScriptedReply(text="a", delay_s=0.5), "b", "DONE")
    server.http.post("/jobs", json={"instance": {"data_source": "multiturn", "question": "q"}, "job_id": "w"})
    time.sleep(0.2)
    server.http.post("/add_llm_server", json={"address": backend.address, "weight_version": 2})
    deadline = time.monotonic() + 10
    while (result := server.http.get("/jobs/w").json()["result"]) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [t["weight_version"] for t in result["trajectory"]["turns"]] == [None, 2, 2]


def spawn_backend(port: int, delay: float) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "prorl_server.testing", "--port", str(port), "--delay", str(delay)],
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("scripted backend did not start")


def test_backend_killed_mid_job_job_finishes_on_another(start_server):
    ports = [free_port(), free_port()]
    procs = [spawn_backend(p, delay=0.4) for p in ports]
    try:
        addresses = [f"http://127.0.0.1:{p}/v1" for p in ports]
        server = start_server(addresses)
        body = {
            "instance": {"data_source": "multiturn", "question": "q"},
            "sampling_params": {"max_turns": 4},
            "job_id": "k",
        }
        server.http.post("/jobs", json=body)
        deadline = time.monotonic() + 10
        pinned = None
        while pinned is None and time.monotonic() < deadline:
            servers = server.http.get("/llm_servers").json()["servers"]
            pinned = next((s["address"] for s in servers if s["in_flight"]), None)
            time.sleep(0.01)
        assert pinned is not None
        victim = addresses.index(pinned)
        time.sleep(0.5)  # let a turn or two happen there; a request is in flight now with high probability
        os.kill(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait(5)

        deadline = time.monotonic() + 20
        while (result := server.http.get("/jobs/k").json()["result"]) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert result is not None and result["status"] == "completed", result
        turns = result["trajectory"]["turns"]
        assert len(turns) == 4
        survivor = addresses[1 - victim]
        assert turns[-1]["backend"] == survivor
        # the survivor received the whole token prefix of the job, not a fresh conversation
        first_on_survivor = next(t for t in turns if t["backend"] == survivor)
        seen = httpx.get(f"http://127.0.0.1:{ports[1 - victim]}/requests").json()
        assert len(seen[0]["prompt"]) == first_on_survivor["prompt_len"]
        traj = result["trajectory"]
        assert seen[0]["prompt"] == (traj["prompt_ids"] + traj["response_ids"])[: first_on_survivor["prompt_len"]]
        listing = {s["address"]: s for s in server.http.get("/llm_servers").json()["servers"]}
        assert listing[pinned]["healthy"] is False
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)


def test_legacy_token_id_strings_are_understood(start_backend, start_server):
    legacy = start_backend(legacy_token_strings=True)
    server = start_server([legacy.address])
    legacy.double.push(ScriptedReply(ids=[40, 41, 2], logprobs=[-1.5, -2.5, -0.5]), "DONE")
    result = server.http.post("/process", json={"instance": {"data_source": "multiturn", "question": "q"}}).json()
    assert result["trajectory"]["turns"][0]["output_ids"] == [40, 41, 2]
    assert result["trajectory"]["response_logprobs"][:3] == [-1.5, -2.5, -0.5]


def test_parse_completion_rejects_responses_without_ids_or_logprobs():
    with pytest.raises(BackendUnavailable, match="return_token_ids"):
        parse_completion({"choices": [{"text": "x", "logprobs": {"tokens": ["x"], "token_logprobs": [-1]}}]})
    with pytest.raises(BackendUnavailable, match="logprobs"):
        parse_completion({"choices": [{"text": "x", "token_ids": [5]}]})
    with pytest.raises(BackendUnavailable, match="no choices"):
        parse_completion({"error": "x"})
    done = parse_completion({"choices": [{"text": "x", "token_ids": [5], "logprobs": {"token_logprobs": [-0.3]}}]})
    assert done.output_ids == [5] and done.logprobs == [-0.3]


def test_backend_rejection_fails_job_with_vllm_message(server, backend):
    backend.double.push(ScriptedReply(status_code=400))
    result = server.http.post("/process", json={"instance": {"data_source": "multiturn", "question": "q"}}).json()
    assert result["status"] == "failed"
    assert result["error"]["stage"] == "run" and result["error"]["type"] == "BackendRequestError"
    assert "scripted failure 400" in result["error"]["message"]
    assert ToyChatTokenizer().decode(result["trajectory"]["prompt_ids"]).endswith("assistant\n")
