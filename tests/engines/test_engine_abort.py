"""A job that ends while its model turn is generating frees the engine: cancel, timeout and server stop
close the LLM request, and the real engine (the dev engine, vLLM) aborts it within seconds."""

from __future__ import annotations

from polling import wait_for

pytest_plugins = ("engine_fixtures",)

LONG_TURN = {"max_tokens": 3000, "ignore_eos": True, "temperature": 1.0}  # minutes of generation on a CPU


def submit_long_turn(server, job_id: str, **extra) -> None:
    body = {"job_id": job_id, "instance": {"data_source": "multiturn", "question": "Tell me a long story."}}
    answer = server.http.post("/jobs", json={**body, "sampling_params": LONG_TURN, **extra})
    assert answer.status_code == 202, answer.text


def job(server, job_id: str) -> dict:
    return server.http.get(f"/jobs/{job_id}").json()


def test_cancelling_a_job_aborts_its_engine_request(start_server, engine):
    engine.wait_idle()
    server = start_server([engine.address])
    submit_long_turn(server, "cancel-me")
    wait_for(lambda: engine.running() == 1, 60, "the engine generating the job's turn")
    assert server.http.delete("/jobs/cancel-me").status_code == 200
    wait_for(lambda: engine.running() == 0, 5, "the engine's request aborted")
    wait_for(lambda: job(server, "cancel-me")["status"] == "cancelled", 10, "the job cancelled")


def test_a_job_that_times_out_aborts_its_engine_request(start_server, engine):
    engine.wait_idle()
    server = start_server([engine.address])
    submit_long_turn(server, "slow-job", timeout=3)
    wait_for(lambda: job(server, "slow-job")["status"] == "timeout", 60, "the job timed out")
    wait_for(lambda: engine.running() == 0, 5, "the engine's request aborted")
    assert job(server, "slow-job")["result"]["error"]["stage"] == "run"


def test_stopping_the_server_aborts_engine_requests(start_server, engine):
    engine.wait_idle()
    server = start_server([engine.address])
    submit_long_turn(server, "stopped-job")
    wait_for(lambda: engine.running() == 1, 60, "the engine generating the job's turn")
    assert server.http.post("/stop").json()["cancelled_jobs"] == 1
    wait_for(lambda: engine.running() == 0, 5, "the engine's request aborted")
