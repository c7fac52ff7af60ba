"""A misbehaving LLM backend costs a retry, never the jobs, the other backends or the server's memory.

Each test tells the scripted backend (a test double) to misbehave in one way, over real sockets: fail
transiently, hang on completions while /health answers, answer malformed or out-of-range data, or answer
far more bytes than were asked for. Jobs carry a budget far below --llm-timeout as a hang guard only.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from handlers_for_tests import MultiTurnChatHandler

from prorl_server import AgentHandler, JobContext
from prorl_server.llm import BackendPool, LLMSession, VLLMClient
from prorl_server.protocol import Trajectory
from prorl_server.testing import Endpoint, Fault, ToyChatTokenizer
from prorl_server.testing.misbehaving import HUGE_BODY_BYTES

HANG_GUARD_S = 30  # a job's budget: far more than any test needs, far less than --llm-timeout (3600 s)


class DetokenizingHandler(AgentHandler):
    """One turn, then the text of the sampled ids from the backend's /detokenize."""

    name = "detokenize"

    async def run(self, ctx: JobContext) -> None:
        await ctx.llm.start([{"role": "user", "content": "q"}])
        turn = await ctx.llm.generate()
        ctx.artifacts["text"] = await ctx.llm.detokenize(turn.output_ids)

    async def eval(self, ctx: JobContext) -> float:
        return 1.0


def handlers() -> dict[str, AgentHandler]:
    return {"multiturn": MultiTurnChatHandler(), "detokenize": DetokenizingHandler()}


def job(data_source: str = "multiturn", **extra) -> dict:
    body = {
        "instance": {"data_source": data_source, "question": "q"},
        "sampling_params": {"max_tokens": 16, "max_turns": 2},
        "timeout": HANG_GUARD_S,
    }
    return body | extra


def process(server, body: dict) -> dict:
    response = server.http.post("/process", json=body, timeout=HANG_GUARD_S + 30)
    assert response.status_code == 200, response.text
    return response.json()


def listing(server) -> dict[str, dict]:
    return {s["address"]: s for s in server.http.get("/llm_servers").json()["servers"]}


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def two_backends(start_backend, start_server, models_fault: Fault | None = None, **settings):
    """A backend told to misbehave (first registered, so a lone job is placed there) and a good one.

    The server reads `/v1/models` at a backend's first passing health check, before any job; a
    `models_fault` is therefore injected before the server starts, into every read of it (the job's too)."""
    faulty, good = start_backend(report_vocab_size=True), start_backend(report_vocab_size=True)
    if models_fault is not None:
        faulty.double.inject(Endpoint.MODELS, *[models_fault] * 50)
    return faulty, good, start_server([faulty.address, good.address], handlers=handlers(), **settings)


def inject(start_backend, start_server, endpoint: Endpoint, fault: Fault):
    """`two_backends` whose faulty one answers `endpoint` with `fault` (its next answer; for /v1/models, all)."""
    if endpoint is Endpoint.MODELS:
        return two_backends(start_backend, start_server, models_fault=fault)
    faulty, good, server = two_backends(start_backend, start_server)
    faulty.double.inject(endpoint, fault)
    return faulty, good, server


def assert_completed_on(result: dict, address: str) -> None:
    assert result["status"] == "completed", result["error"]
    turns = result["trajectory"]["turns"]
    assert turns and all(t["backend"] == address for t in turns), [t["backend"] for t in turns]


# 6: a transient failure is retried, failures are counted before a backend leaves, the cause is kept ------


def test_one_transient_500_fails_no_job_in_flight(start_backend, start_server):
    backend = start_backend(default_delay_s=0.2)
    server = start_server([backend.address], handlers=handlers(), run_workers=32, health_check_interval_s=60)
    backend.double.inject(Endpoint.COMPLETIONS, Fault.SERVER_ERROR)
    ids = [f"j{i}" for i in range(24)]
    for job_id in ids:
        assert server.http.post("/jobs", json=job(job_id=job_id)).status_code == 202
    results: dict[str, dict] = {}

    def all_done() -> bool:
        for job_id in ids:
            if job_id not in results and (result := server.http.get(f"/jobs/{job_id}").json()["result"]):
                results[job_id] = result
        return len(results) == len(ids)

    wait_until(all_done, timeout=HANG_GUARD_S + 30)
    failed = {job_id: r["error"] for job_id, r in results.items() if r["status"] != "completed"}
    assert not failed, f"{len(failed)} of 24 jobs failed: {next(iter(failed.values()))}"
    assert [r.fault for r in backend.double.fault_log] == [Fault.SERVER_ERROR]
    info = listing(server)[backend.address]
    assert info["healthy"] and info["circuit"] == "closed" and info["consecutive_failures"] == 0


def test_a_call_that_gives_up_reports_the_backends_own_error(start_backend, start_server):
    backend = start_backend()
    server = start_server([backend.address], handlers=handlers(), llm_max_failovers=1)
    backend.double.inject(Endpoint.COMPLETIONS, Fault.SERVER_ERROR, Fault.SERVER_ERROR)
    result = process(server, job())
    assert result["status"] == "failed" and result["error"]["type"] == "BackendUnavailable"
    message = result["error"]["message"]
    assert "2 failed request(s)" in message and "HTTP 500" in message and "scripted server error" in message


def test_open_circuit_makes_calls_wait_and_still_admits_jobs(start_backend, start_server):
    backend = start_backend()
    server = start_server([backend.address], handlers=handlers(), llm_failure_threshold=1)  # cooldown 5 s
    backend.double.inject(Endpoint.COMPLETIONS, Fault.SERVER_ERROR)
    assert server.http.post("/jobs", json=job(job_id="first")).status_code == 202
    wait_until(lambda: listing(server)[backend.address]["circuit"] == "open")
    info = listing(server)[backend.address]
    assert info["healthy"] and info["consecutive_failures"] == 1 and "scripted server error" in info["last_error"]
    assert server.http.post("/jobs", json=job(job_id="second")).status_code == 202  # not 503: /health passes
    for job_id in ("first", "second"):
        wait_until(lambda j=job_id: server.http.get(f"/jobs/{j}").json()["result"], timeout=HANG_GUARD_S + 30)
        assert_completed_on(server.http.get(f"/jobs/{job_id}").json()["result"], backend.address)
    assert listing(server)[backend.address]["circuit"] == "closed"


def test_waiting_for_a_backend_ends_with_the_retry_budget_and_keeps_the_cause(start_backend, start_server):
    backend = start_backend()
    server = start_server(
        [backend.address],
        handlers=handlers(),
        llm_failure_threshold=1,
        llm_breaker_cooldown_s=600,
        llm_retry_budget_s=1,
    )
    backend.double.inject(Endpoint.COMPLETIONS, Fault.SERVER_ERROR)
    result = process(server, job())
    assert result["status"] == "failed" and result["error"]["type"] == "NoBackendAvailable"
    message = result["error"]["message"]
    assert "1s retry budget" in message and "circuit open" in message and "scripted server error" in message
    assert len(backend.double.requests) == 1  # no request reached the backend while its circuit was open


async def test_passing_health_check_allows_one_trial_not_full_rotation(start_backend):
    faulty, good = start_backend(), start_backend()
    pool = BackendPool(VLLMClient(), failure_threshold=1, breaker_cooldown_s=0.01)
    for backend in (faulty, good):
        pool.add(backend.address)
    faulty.double.inject(Endpoint.COMPLETIONS, Fault.SERVER_ERROR)
    try:
        first = LLMSession("first", pool, Trajectory(), {"max_tokens": 16})
        await first.start([{"role": "user", "content": "q"}])
        assert (await first.generate()).backend == good.address  # the faulty backend failed, its circuit opened
        state = {b.address: b for b in pool.backends()}[faulty.address]
        assert state.breaker.state == "open" and state.healthy
        await asyncio.sleep(0.02)  # the cooldown is over, but only a passing health check lets a trial through
        assert pool.acquire("probe").backend.address == good.address
        await pool.check_health()
        assert state.breaker.state == "half_open"
        trial, other = pool.acquire("trial-job"), pool.acquire("other-job")
        assert trial.backend is state and trial.trial
        assert other.backend.address == good.address  # one trial at a time: not back in full rotation
        pool.failed(trial, "HTTP 500")
        assert state.breaker.state == "open" and state.breaker.cooldown_s == 0.02  # a failed trial: longer out
        assert state.healthy
    finally:
        await pool.client.aclose_current_loop()


# 7: a backend that answers /health but hangs on completions leaves the job's path -------------------------


def test_stalled_backend_fails_over_long_before_the_llm_timeout(start_backend, start_server):
    faulty, good, server = two_backends(start_backend, start_server, llm_stall_timeout_s=1.0)
    faulty.double.inject(Endpoint.COMPLETIONS, Fault.HANG)
    result = process(server, job())
    assert_completed_on(result, good.address)
    wait_until(lambda: faulty.double.fault_log[0].outcome == "aborted")  # the request was closed: vLLM aborts it
    info = listing(server)[faulty.address]
    assert info["consecutive_failures"] == 1 and "stall timeout" in info["last_error"]


# 8: malformed answers are the backend's failure, never the trainer's data or a raw crash -----------------

COMPLETION_FAULTS = [
    Fault.NAN_LOGPROB,
    Fault.POSITIVE_LOGPROB,
    Fault.NULL_LOGPROB,
    Fault.FLOAT_ID,
    Fault.BOOL_ID,
    Fault.NEGATIVE_ID,
    Fault.OUT_OF_VOCAB_ID,
    Fault.LENGTH_MISMATCH,
    Fault.TOO_MANY_IDS,
    Fault.MISSING_FIELD,
    Fault.WRONG_TYPE,
    Fault.CHOICE_NOT_OBJECT,
    Fault.NOT_JSON,
]


@pytest.mark.parametrize("fault", COMPLETION_FAULTS)
def test_malformed_completion_fails_over(start_backend, start_server, fault):
    faulty, good, server = two_backends(start_backend, start_server)
    faulty.double.inject(Endpoint.COMPLETIONS, fault)
    result = process(server, job())
    assert_completed_on(result, good.address)
    assert all(lp <= 0 for lp in result["trajectory"]["response_logprobs"])
    info = listing(server)[faulty.address]
    assert info["consecutive_failures"] == 1 and info["last_error"]


@pytest.mark.parametrize(
    ("backend_kwargs", "fault"),
    [
        ({"report_vocab_size": False}, Fault.OUT_OF_VOCAB_ID),  # no vocabulary reported: ids below 2**31
        ({"legacy_token_strings": True}, Fault.FLOAT_ID),  # "token_id:40.0"
        ({"legacy_token_strings": True}, Fault.NEGATIVE_ID),  # "token_id:-1"
    ],
    ids=["unreported-vocabulary", "legacy-float-id", "legacy-negative-id"],
)
def test_out_of_range_ids_fail_over_in_every_format(start_backend, start_server, backend_kwargs, fault):
    faulty, good = start_backend(**backend_kwargs), start_backend()
    server = start_server([faulty.address, good.address], handlers=handlers())
    faulty.double.inject(Endpoint.COMPLETIONS, fault)
    assert_completed_on(process(server, job()), good.address)


@pytest.mark.parametrize(
    ("endpoint", "fault"),
    [
        (Endpoint.TOKENIZE, Fault.FLOAT_ID),
        (Endpoint.TOKENIZE, Fault.BOOL_ID),
        (Endpoint.TOKENIZE, Fault.NEGATIVE_ID),
        (Endpoint.TOKENIZE, Fault.OUT_OF_VOCAB_ID),
        (Endpoint.TOKENIZE, Fault.MISSING_FIELD),
        (Endpoint.TOKENIZE, Fault.WRONG_TYPE),
        (Endpoint.TOKENIZE, Fault.NOT_JSON),
        (Endpoint.MODELS, Fault.MISSING_FIELD),
        (Endpoint.MODELS, Fault.WRONG_TYPE),
        (Endpoint.MODELS, Fault.NOT_JSON),
    ],
)
def test_malformed_tokenize_or_models_answer_fails_over(start_backend, start_server, endpoint, fault):
    faulty, good, server = inject(start_backend, start_server, endpoint, fault)
    result = process(server, job())
    assert_completed_on(result, good.address)
    assert listing(server)[faulty.address]["consecutive_failures"] == 1


@pytest.mark.parametrize("fault", [Fault.MISSING_FIELD, Fault.WRONG_TYPE, Fault.NOT_JSON])
def test_malformed_detokenize_answer_fails_over(start_backend, start_server, fault):
    faulty, _, server = two_backends(start_backend, start_server)
    faulty.double.inject(Endpoint.DETOKENIZE, fault)
    result = process(server, job("detokenize"))
    assert result["status"] == "completed", result["error"]
    assert result["artifacts"]["text"] == ToyChatTokenizer().decode(result["trajectory"]["turns"][0]["output_ids"])
    assert listing(server)[faulty.address]["consecutive_failures"] == 1


# 9: what is read from a backend is bounded by what was asked for -----------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "fault", "data_source"),
    [
        (Endpoint.COMPLETIONS, Fault.HUGE_BODY, "multiturn"),
        (Endpoint.COMPLETIONS, Fault.HUGE_CONTENT_LENGTH, "multiturn"),
        (Endpoint.TOKENIZE, Fault.HUGE_BODY, "multiturn"),
        (Endpoint.TOKENIZE, Fault.HUGE_CONTENT_LENGTH, "multiturn"),
        (Endpoint.MODELS, Fault.HUGE_BODY, "multiturn"),
        (Endpoint.DETOKENIZE, Fault.HUGE_BODY, "detokenize"),
    ],
)
def test_oversized_answer_is_refused_unread_and_fails_over(start_backend, start_server, endpoint, fault, data_source):
    faulty, good, server = inject(start_backend, start_server, endpoint, fault)
    result = process(server, job(data_source))
    assert result["status"] == "completed", result["error"]
    if endpoint is not Endpoint.DETOKENIZE:  # detokenize comes after a turn on the faulty backend
        assert_completed_on(result, good.address)
    record = faulty.double.fault_log[0]
    wait_until(lambda: record.outcome != "running")
    assert record.outcome == "aborted" and record.bytes_sent < HUGE_BODY_BYTES // 2
    assert "bytes" in listing(server)[faulty.address]["last_error"]


async def test_oversized_health_answer_fails_the_check(backend):
    pool = BackendPool(VLLMClient())
    pool.add(backend.address)
    backend.double.inject(Endpoint.HEALTH, Fault.HUGE_BODY)
    try:
        await pool.check_health()
        (state,) = pool.backends()
        assert not state.healthy and "bytes" in state.last_error
        record = backend.double.fault_log[0]
        await asyncio.to_thread(wait_until, lambda: record.outcome != "running")
        assert record.outcome == "aborted" and record.bytes_sent < HUGE_BODY_BYTES // 2
    finally:
        await pool.client.aclose_current_loop()
