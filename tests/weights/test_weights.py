"""Weight updates: pause/update/resume/swap, per-turn weight versions, cache_salt per version, aborts."""

from __future__ import annotations

import time

import pytest
from polling import wait_for
from server_jobs import JOB, result, submit

from prorl_server.pipeline import PausableTimer
from prorl_server.testing import ScriptedReply


def weights(server) -> dict:
    return server.http.get("/weights").json()


def versioned_server(start_server, backend, version=1, **settings):
    server = start_server([], **settings)
    assert server.http.post("/add_llm_server", json={"address": backend.address, "weight_version": version}).is_success
    return server


def test_pause_wait_finishes_in_flight_and_holds_next_turn(start_server, backend):
    server = versioned_server(start_server, backend, version=1)
    backend.double.push(ScriptedReply(text="a", delay_s=0.6), "DONE")
    submit(server, "j", sampling_params={"cache_salt": "run7"})
    wait_for(lambda: len(backend.double.requests) == 1, 10, "the first completion was sent")

    started = time.monotonic()
    paused = server.http.post("/weights/pause", json={"mode": "wait"})
    assert paused.status_code == 200, paused.text
    body = paused.json()
    assert body["paused"] and body["mode"] == "wait" and body["drained"]
    assert body["waited_for"] == 1 and body["aborted"] == 0 and body["in_flight_calls"] == 0
    assert time.monotonic() - started >= 0.3  # it waited for the call in flight
    assert backend.double.requests[0].outcome == "done"  # which finished normally

    # the job's next call waits at the gate: nothing is dispatched
    wait_for(lambda: weights(server)["waiting_calls"] == 1, 10, "the job's next call waits")
    time.sleep(0.4)
    assert len(backend.double.requests) == 1
    assert server.http.get("/jobs/j").json()["result"] is None

    assert server.http.post("/weights/update", json={"version": 2}).status_code == 200
    assert server.http.get("/llm_servers").json()["servers"][0]["weight_version"] == 2
    resumed = server.http.post("/weights/resume")
    assert resumed.status_code == 200 and resumed.json()["paused"] is False

    res = result(server, "j")
    assert res["status"] == "completed", res
    assert [t["weight_version"] for t in res["trajectory"]["turns"]] == [1, 2]
    assert [r.params.get("cache_salt") for r in backend.double.requests] == ["run7:w1", "run7:w2"]
    assert weights(server) == {
        "paused": False,
        "mode": None,
        "version": 2,
        "in_flight_calls": 0,
        "kept_calls": 0,
        "waiting_calls": 0,
        "lease_left_s": None,
        "lease_expired": 0,
    }


def test_cache_salt_only_with_a_version(server, backend):
    backend.double.push("DONE")
    res = server.http.post("/process", json=JOB).json()
    assert res["trajectory"]["turns"][0]["weight_version"] is None
    assert "cache_salt" not in backend.double.requests[0].params


def test_pause_abort_resends_the_turn_under_the_new_version(start_server, backend):
    server = versioned_server(start_server, backend, version=1, llm_failure_threshold=1)
    backend.double.push(ScriptedReply(text="slow partial", delay_s=10), "DONE")
    submit(server, "j")
    wait_for(lambda: len(backend.double.requests) == 1, 10, "the first completion was sent")

    started = time.monotonic()
    body = server.http.post("/weights/pause", json={"mode": "abort"}).json()
    assert time.monotonic() - started < 5
    assert body["aborted"] == 1 and body["waited_for"] == 0 and body["drained"] and body["mode"] == "abort"
    wait_for(lambda: backend.double.requests[0].outcome == "aborted", 5, "the engine saw the request closed")
    info = server.http.get("/llm_servers").json()["servers"][0]
    assert info["circuit"] == "closed" and info["consecutive_failures"] == 0  # an abort is no backend failure

    time.sleep(0.3)
    assert len(backend.double.requests) == 1  # not resent while paused
    assert server.http.post("/weights/update", json={"version": "v2"}).status_code == 200
    assert server.http.post("/weights/resume").status_code == 200

    res = result(server, "j")
    assert res["status"] == "completed", res
    turns = res["trajectory"]["turns"]
    assert [(t["text"], t["weight_version"]) for t in turns] == [("DONE", "v2")]  # the partial turn is gone
    first, resent = backend.double.requests
    assert resent.prompt == first.prompt  # resent from the same prompt
    assert (first.params["cache_salt"], resent.params["cache_salt"]) == ("w1", "wv2")
    assert res["trajectory"]["response_mask"] == [1] * len(turns[0]["output_ids"])


def test_update_with_servers_moves_pinned_jobs(start_server, start_backend):
    old, new = start_backend(), start_backend()
    server = versioned_server(start_server, old, version=1)
    old.double.push(ScriptedReply(text="a", delay_s=0.3))
    new.double.push("DONE")
    submit(server, "j")
    wait_for(lambda: len(old.double.requests) == 1, 10, "the first completion was sent")
    assert server.http.post("/weights/pause", json={}).json()["waited_for"] == 1

    updated = server.http.post("/weights/update", json={"version": 2, "servers": [{"address": new.address}]})
    assert updated.status_code == 200, updated.text
    assert [(s["address"], s["weight_version"]) for s in updated.json()["servers"]] == [(new.address, 2)]
    assert server.http.post("/weights/resume").status_code == 200

    res = result(server, "j")
    assert res["status"] == "completed", res
    turns = res["trajectory"]["turns"]
    assert [(t["backend"], t["weight_version"]) for t in turns] == [(old.address, 1), (new.address, 2)]
    assert len(old.double.requests) == 1 and len(new.double.requests) == 1
    # the new backend got the whole context again: prompt, the first turn, the observation
    moved = new.double.requests[0].prompt
    assert moved[: len(old.double.requests[0].prompt)] == old.double.requests[0].prompt
    assert len(moved) == turns[1]["prompt_len"]
    assert [s["address"] for s in server.http.get("/llm_servers").json()["servers"]] == [new.address]


def test_swap_pauses_updates_and_resumes(start_server, backend):
    server = versioned_server(start_server, backend, version=1)
    backend.double.push(ScriptedReply(text="a", delay_s=0.5), "DONE")
    submit(server, "j")
    wait_for(lambda: len(backend.double.requests) == 1, 10, "the first completion was sent")
    swapped = server.http.post("/weights/swap", json={"version": 3})
    assert swapped.status_code == 200, swapped.text
    body = swapped.json()
    assert body["paused"] is False and body["version"] == 3 and body["waited_for"] == 1
    assert body["servers"][0]["weight_version"] == 3
    res = result(server, "j")
    assert [t["weight_version"] for t in res["trajectory"]["turns"]] == [1, 3]
    assert [r.params["cache_salt"] for r in backend.double.requests] == ["w1", "w3"]


def test_bad_inputs_are_clear_4xx(server):
    post = server.http.post

    def status(path: str, **kwargs) -> int:
        return post(path, **kwargs).status_code

    # out of order
    assert status("/weights/resume") == 409
    response = post("/weights/update", json={"version": 1})
    assert response.status_code == 409 and "/weights/pause" in response.json()["detail"]
    # malformed bodies
    assert status("/weights/pause", json={"mode": "later"}) == 422
    assert status("/weights/pause", json={"mode": "wait", "why": 1}) == 422
    assert status("/weights/pause", content=b"{not json") == 422
    assert status("/weights/pause", json=[]) == 422
    assert status("/weights/pause", json={"timeout_s": -1}) == 422
    assert not weights(server)["paused"]  # nothing of that paused the server

    assert status("/weights/pause") == 422  # a body is required (`{}` for the defaults)
    assert status("/weights/pause", json={}) == 200
    assert weights(server)["mode"] == "wait"
    assert status("/weights/pause", json={"mode": "wait"}) == 200  # idempotent
    for body in (
        {},
        {"version": 1.5},
        {"version": None},
        {"version": [1]},
        {"version": "x" * 300},
        {"version": 2, "servers": []},
        {"version": 2, "servers": [{"address": "ftp://host/v1"}]},
        {"version": 2, "servers": [{"address": "http://h/v1", "weight": 1}]},
        {"version": 2, "extra": True},
    ):
        assert status("/weights/update", json=body) == 422, body
    assert status("/weights/update", content=b"") == 422

    assert status("/weights/update", json={"version": 5}) == 200
    for backwards in (5, 4, "5"):  # an integer must increase; a string must not name a used version
        response = post("/weights/update", json={"version": backwards})
        assert response.status_code == 409 and "version" in response.json()["detail"], backwards
    assert status("/weights/update", json={"version": "policy-a"}) == 200
    assert status("/weights/update", json={"version": "policy-a"}) == 409
    assert status("/weights/update", json={"version": 6}) == 200
    assert weights(server)["version"] == 6

    assert status("/weights/resume") == 200
    assert status("/weights/resume") == 409
    assert status("/weights/swap", json={"version": 6}) == 409  # backwards: refused before pausing
    assert not weights(server)["paused"]
    assert status("/weights/swap", json={"version": 7, "mode": "never"}) == 422
    assert status("/weights/swap", json={"version": 7}) == 200


def test_pause_spends_no_retry_budget_and_trips_no_breaker(start_server, backend):
    server = versioned_server(start_server, backend, version=1, llm_retry_budget_s=1.0, llm_failure_threshold=2)
    # the first request is aborted by the pause; its resend fails once and is retried within the budget
    backend.double.push(ScriptedReply(text="slow", delay_s=10), ScriptedReply(status_code=500), "DONE")
    submit(server, "j")
    wait_for(lambda: len(backend.double.requests) == 1, 10, "the first completion was sent")
    assert server.http.post("/weights/pause", json={"mode": "abort"}).json()["aborted"] == 1
    wait_for(lambda: weights(server)["waiting_calls"] == 1, 10, "the aborted call waits to be resent")
    time.sleep(2.0)  # twice the retry budget
    assert server.http.get("/jobs/j").json()["result"] is None
    info = server.http.get("/llm_servers").json()["servers"][0]
    assert info["circuit"] == "closed" and info["consecutive_failures"] == 0
    assert server.http.post("/weights/resume").status_code == 200
    res = result(server, "j")
    assert res["status"] == "completed", res
    assert [r.outcome for r in backend.double.requests] == ["aborted", "done", "done"]


@pytest.mark.parametrize("mode", ["wait", "abort"])
def test_pause_from_another_thread_while_jobs_run_on_stage_loops(start_server, backend, mode):
    """Several jobs on the RUN pool's loop; the pause comes from the API loop; every job ends completed."""
    backend.double.default_delay_s = 0.2
    server = versioned_server(start_server, backend, version=1)
    for i in range(4):
        submit(server, f"j{i}", agent_config={"max_turns": 2})
    wait_for(lambda: len(backend.double.requests) >= 2, 10, "completions were sent")
    body = server.http.post("/weights/pause", json={"mode": mode}).json()
    assert body["drained"] and body["in_flight_calls"] == 0
    sent = len(backend.double.requests)
    time.sleep(0.5)
    # a request the pause aborted while its bytes were on the wire may reach the double late: it is logged
    # then, already aborted; nothing is sent afresh and nothing runs while paused
    late = [r.outcome for r in backend.double.requests[sent:]]
    running = [r for r in backend.double.requests if r.outcome == "running"]
    assert (not late if mode == "wait" else set(late) <= {"aborted"}) and not running, (late, running)
    assert server.http.post("/weights/update", json={"version": 2}).status_code == 200
    assert server.http.post("/weights/resume").status_code == 200
    for i in range(4):
        res = result(server, f"j{i}")
        assert res["status"] == "completed", res
        versions = [t["weight_version"] for t in res["trajectory"]["turns"]]
        assert versions == sorted(versions) and set(versions) <= {1, 2}


def test_a_job_waiting_at_the_pause_can_be_cancelled(start_server, backend):
    server = versioned_server(start_server, backend, version=1)
    assert server.http.post("/weights/pause", json={}).status_code == 200
    assert server.http.post("/weights/pause").status_code == 422  # a body is required, as on every POST
    submit(server, "j")
    wait_for(lambda: weights(server)["waiting_calls"] == 1, 10, "the job's first call waits")
    assert server.http.delete("/jobs/j").status_code == 200
    assert result(server, "j")["status"] == "cancelled"
    wait_for(lambda: weights(server)["waiting_calls"] == 0, 5, "the cancelled call left the gate")
    assert backend.double.requests == []


def test_a_pause_does_not_use_up_a_jobs_timeout(start_server, backend):
    """A 1.5 s job waits 3 s at a pause and still completes; the wait is reported apart from its stages."""
    server = versioned_server(start_server, backend, version=1)
    backend.double.push(ScriptedReply(text="a", delay_s=0.3), "DONE")
    assert server.http.post("/weights/pause", json={}).status_code == 200
    submit(server, "patient", timeout=1.5, agent_config={"max_turns": 3})
    wait_for(lambda: weights(server)["waiting_calls"] == 1, 10, "the job's first call waits")
    time.sleep(3.0)
    assert server.http.get("/jobs/patient").json()["status"] == "run"  # twice its budget, and not timed out
    assert server.http.post("/weights/resume").status_code == 200
    res = result(server, "patient")
    assert res["status"] == "completed", res
    timing = res["timing"]
    assert timing["weight_pause_s"] >= 2.9 and timing["run_s"] < 1.5, timing
    parts = timing["queue_s"] + timing["init_s"] + timing["run_s"] + timing["eval_s"] + timing["weight_pause_s"]
    assert parts == pytest.approx(timing["total_s"], abs=0.05)

    # without a pause the same budget still ends a job that takes too long
    backend.double.push(ScriptedReply(text="slow", delay_s=5))
    submit(server, "impatient", timeout=1.5)
    res = result(server, "impatient")
    assert res["status"] == "timeout" and res["timing"]["weight_pause_s"] == 0.0, res


def test_budget_timer_holds_nest_and_stop_the_clock():
    now = [0.0]
    timer = PausableTimer(10.0, clock=lambda: now[0])
    timer.start("run")
    now[0] = 2.0
    timer.hold()
    timer.hold()
    now[0] = 5.0
    timer.release()
    assert timer.held and timer.remaining() == 8.0 and timer.held_s == 3.0
    now[0] = 7.0
    timer.release()
    timer.release()  # one too many: ignored
    now[0] = 8.0
    assert not timer.held and timer.stage_seconds("run") == 3.0 and timer.remaining() == 7.0
    timer.pause()
    assert timer.held_s == 5.0 and timer.wall_s() == 8.0
