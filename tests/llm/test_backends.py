"""Backend pool: placement, registration, health, circuit breakers, stall timeouts, failover, response checks."""

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
    BackendProtocolError,
    BackendUnavailable,
    CircuitBreaker,
    CircuitState,
    MinHeapPolicy,
    NoBackendAvailable,
    RetryPolicy,
    VLLMClient,
    parse_completion,
)
from prorl_server.llm.response_limits import completion_bytes, requested_tokens
from prorl_server.llm.stall import (
    PRIOR_TOKENS_PER_S,
    STALL_FLOOR_S,
    STALL_SAFETY_FACTOR,
    derived_stall_timeout_s,
    updated_speed,
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
    chosen = [pool.acquire(f"job{i}").backend.address for i in range(6)]
    assert chosen == ["http://b0/v1", "http://b1/v1", "http://b2/v1"] * 2
    assert pool.acquire("job0").backend.address == "http://b0/v1"  # later turns stay on the same backend
    assert [b.assigned for b in pool.backends()] == [2, 2, 2]
    pool.release("job0")
    pool.release("job3")
    assert pool.acquire("job6").backend.address == "http://b0/v1"  # ProRL counts assignments, not load: a tie
    assert isinstance(pool.policy, MinHeapPolicy)


def test_sticky_least_loaded_follows_in_flight_jobs():
    pool = pool_with(2, "sticky_least_loaded")
    assert pool.acquire("a").backend.address == "http://b0/v1"
    assert pool.acquire("b").backend.address == "http://b1/v1"
    assert pool.acquire("c").backend.address == "http://b0/v1"
    pool.release("a")
    pool.release("c")  # b0 is now idle, b1 still has one job
    assert pool.acquire("d").backend.address == "http://b0/v1"
    assert pool.acquire("e").backend.address == "http://b1/v1"  # equal load: fewer jobs ever assigned wins
    assert [b.in_flight for b in pool.backends()] == [1, 2]
    assert [b.assigned for b in pool.backends()] == [3, 2]


def test_backend_out_of_placement_is_skipped_and_job_repinned():
    pool = BackendPool(VLLMClient(), failure_threshold=1)
    for i in range(2):
        pool.add(f"http://b{i}/v1")
    first = pool.acquire("job")
    pool.failed(first, "connection refused")  # threshold 1: its circuit opens
    second = pool.acquire("job")
    assert second.backend is not first.backend
    assert first.backend.in_flight == 0 and second.backend.in_flight == 1
    second.backend.healthy = False  # as a failed health check leaves it
    with pytest.raises(
        NoBackendAvailable, match=r"b0/v1 circuit open after 1 failed.*connection refused.*b1/v1 unhealthy"
    ):
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
    cmd = [sys.executable, "-m", "prorl_server.testing", "--port", str(port), "--delay", str(delay)]
    proc = subprocess.Popen([*cmd, "--default-reply", "reply"])
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
    with pytest.raises(BackendUnavailable, match="choices: Field required"):
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


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_circuit_opens_after_threshold_and_returns_only_through_a_trial():
    clock = FakeClock()
    breaker = CircuitBreaker(threshold=3, cooldown_s=5, max_cooldown_s=12, clock=clock)
    assert breaker.record_failure(trial=False) is False
    breaker.record_success(trial=False)  # a success in between resets the count
    assert [breaker.record_failure(trial=False) for _ in range(3)] == [False, False, True]
    assert breaker.state is CircuitState.OPEN and not breaker.admits_request()
    assert breaker.health_passed() is False  # within the cooldown a passing check changes nothing
    clock.now += 5
    assert breaker.health_passed() is True and breaker.state is CircuitState.HALF_OPEN
    assert breaker.start_request() is True and not breaker.admits_request()  # one trial at a time
    breaker.abandon_trial()  # a cancelled trial gives no verdict
    assert breaker.admits_request() and breaker.start_request() is True
    assert breaker.record_failure(trial=True) is True
    assert breaker.state is CircuitState.OPEN and breaker.cooldown_s == 10  # longer out after a failed trial
    clock.now += 10
    breaker.health_passed()
    breaker.start_request()
    breaker.record_failure(trial=True)
    assert breaker.cooldown_s == 12  # capped
    clock.now += 12
    breaker.health_passed()
    assert breaker.start_request() is True
    breaker.record_success(trial=True)
    assert breaker.state is CircuitState.CLOSED and breaker.consecutive_failures == 0 and breaker.cooldown_s == 5


def test_requests_sent_before_the_circuit_opened_do_not_decide_the_trial():
    breaker = CircuitBreaker(threshold=1, cooldown_s=0.0)
    breaker.record_failure(trial=False)
    breaker.health_passed()
    assert breaker.state is CircuitState.HALF_OPEN
    breaker.record_success(trial=False)  # an old request finishing late
    breaker.record_failure(trial=False)
    assert breaker.state is CircuitState.HALF_OPEN and breaker.admits_request()


def test_stall_timeout_from_max_tokens_and_measured_speed():
    assert derived_stall_timeout_s(16, None) == STALL_FLOOR_S  # short requests: the floor
    assert derived_stall_timeout_s(4000, None) == STALL_SAFETY_FACTOR * 4000 / PRIOR_TOKENS_PER_S
    speed = None
    for _ in range(50):
        speed = updated_speed(speed, 500, 5.0)  # 100 tokens/s
    assert speed == pytest.approx(100, rel=1e-3)
    assert updated_speed(speed, 2, 10.0) == speed  # too short to say anything about speed
    assert derived_stall_timeout_s(4000, speed) == pytest.approx(STALL_SAFETY_FACTOR * 40, rel=1e-3)
    pool = pool_with(1, "sticky_least_loaded")
    (backend,) = pool.backends()
    assert pool.completion_timeout(backend, None) is None  # length unknown: only the request timeout
    pool.observe_completion(backend, 100, 500, 5.0)
    assert pool.completion_timeout(backend, 4000) == derived_stall_timeout_s(4000, backend.tokens_per_s)
    configured = BackendPool(VLLMClient(), stall_timeout_s=2.0)
    assert configured.completion_timeout(backend, 4000) == 2.0 and configured.short_call_timeout == 2.0


def test_retry_delays_grow_and_stay_capped():
    policy = RetryPolicy(budget_s=10, base_delay_s=0.1, max_delay_s=2.0)
    for attempt, ceiling in [(0, 0.1), (1, 0.2), (3, 0.8), (10, 2.0), (10_000, 2.0)]:
        assert ceiling / 2 <= policy.delay_s(attempt) <= ceiling


def test_parse_completion_is_strict_about_ids_logprobs_and_length():
    good = {"choices": [{"text": "x", "token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.3, 0]}}]}
    assert parse_completion(good, max_tokens=2, vocab_size=7).output_ids == [5, 6]
    for ids, logprobs, match in [
        ([5.0, 6], [-0.3, -1], "valid integer"),
        ([True, 6], [-0.3, -1], "valid integer"),
        ([-1, 6], [-0.3, -1], "greater than or equal to 0"),
        ([2**31, 6], [-0.3, -1], "less than 2147483648"),
        ([5, 6], [float("nan"), -1], "finite number"),
        ([5, 6], [0.25, -1], "less than or equal to 0"),
        ([5, 6], [None, -1], "valid number"),
        ([5, 6], [-0.3], "2 token ids but 1 logprobs"),
        ([5, 6, 7], [-0.3, -1, -1], "more than max_tokens=2"),
        ([5, 7], [-0.3, -1], "outside the vocabulary of 7"),
    ]:
        body = {"choices": [{"text": "x", "token_ids": ids, "logprobs": {"token_logprobs": logprobs}}]}
        with pytest.raises(BackendProtocolError, match=match):
            parse_completion(body, max_tokens=2, vocab_size=7)
    legacy = {
        "choices": [{"text": "x", "logprobs": {"tokens": ["token_id:5", "token_id:٣"], "token_logprobs": [-1, -1]}}]
    }
    with pytest.raises(BackendProtocolError, match="not token_id:N"):
        parse_completion(legacy)


def test_requested_tokens_and_response_bounds():
    assert requested_tokens({"max_tokens": 16}, 100, 4096) == 16
    assert requested_tokens({}, 100, 4096) == 3996  # vLLM's default: what is left of the context
    assert requested_tokens({"max_tokens": True}, 100, None) is None
    assert completion_bytes(16, 100) < completion_bytes(17, 100) < completion_bytes(None, 100)
