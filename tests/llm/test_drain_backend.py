"""Draining one backend (`POST /remove_llm_server`, or `DELETE /llm_servers/{address}`): it takes no new calls, jobs pinned to it move to another
backend at their next call (resending their token prefix), its calls in flight finish or are aborted."""

from __future__ import annotations

import time
from urllib.parse import quote

from polling import wait_for
from server_jobs import JOB, result, submit

from prorl_server.testing import ScriptedReply


def registered(server) -> list[str]:
    return [s["address"] for s in server.http.get("/llm_servers").json()["servers"]]


def add(server, backend) -> None:
    assert server.http.post("/add_llm_server", json={"address": backend.address}).status_code == 200


def remove(server, address: str, **extra):
    return server.http.post("/remove_llm_server", json={"address": address, **extra})


def delete(server, address: str, **params):
    return server.http.delete(f"/llm_servers/{quote(address, safe='')}", params=params)


def test_drain_lets_the_call_in_flight_finish_then_moves_pinned_jobs(start_server, start_backend):
    old, new = start_backend(), start_backend()
    server = start_server([old.address])
    old.double.push(ScriptedReply(text="a", delay_s=0.6), ScriptedReply(text="b", delay_s=0.6))
    new.double.push("DONE", "DONE")
    submit(server, "x", agent_config={"max_turns": 5})
    submit(server, "y", agent_config={"max_turns": 5})
    wait_for(lambda: len(old.double.requests) == 2, 10, "both jobs' first completions were sent")
    add(server, new)  # no job moves by itself: they stay pinned to the old backend

    started = time.monotonic()
    response = remove(server, old.address + "/")  # the address is normalized as on registration
    assert response.status_code == 200, response.text
    body = response.json()
    assert time.monotonic() - started >= 0.3  # it waited for the calls in flight
    assert [r.outcome for r in old.double.requests] == ["done", "done"]  # which finished normally
    assert body["removed"]["address"] == old.address
    assert body["moved_jobs"] == 2 and body["aborted_calls"] == 0
    assert body["drained"] is True and body["in_flight_calls"] == 0 and body["remaining"] == 1
    assert registered(server) == [new.address]

    for job_id in ("x", "y"):
        res = result(server, job_id)
        assert res["status"] == "completed", res
        turns = res["trajectory"]["turns"]
        assert [t["backend"] for t in turns] == [old.address, new.address], turns
        first = next(r for r in old.double.requests if len(r.prompt) == res["trajectory"]["turns"][0]["prompt_len"])
        moved = next(r for r in new.double.requests if len(r.prompt) == turns[1]["prompt_len"])
        assert moved.prompt[: len(first.prompt)] == first.prompt  # the whole context was sent again
    assert len(old.double.requests) == 2  # nothing more went to the drained backend
    server_info = server.http.get("/llm_servers").json()["servers"][0]
    assert server_info["in_flight"] == 0 and server_info["assigned"] == 2


def test_drain_with_abort_resends_the_call_elsewhere(start_server, start_backend):
    old, new = start_backend(), start_backend()
    server = start_server([old.address])
    old.double.push("a", ScriptedReply(text="slow", delay_s=10))
    new.double.push("DONE")
    submit(server, "j")
    wait_for(lambda: len(old.double.requests) == 2, 10, "the second completion was sent")
    add(server, new)

    started = time.monotonic()
    body = delete(server, old.address, abort="true").json()  # the same drain, as DELETE
    assert time.monotonic() - started < 5
    assert body["aborted_calls"] == 1 and body["moved_jobs"] == 1 and body["drained"] is True, body
    wait_for(lambda: old.double.requests[1].outcome == "aborted", 5, "the engine saw the request closed")

    res = result(server, "j")
    assert res["status"] == "completed", res
    turns = res["trajectory"]["turns"]
    assert [(t["backend"], t["text"]) for t in turns] == [(old.address, "a"), (new.address, "DONE")]
    assert new.double.requests[0].prompt == old.double.requests[1].prompt  # resent from the same prompt


def test_drain_answers_after_timeout_while_a_call_is_still_in_flight(start_server, start_backend):
    old, new = start_backend(), start_backend()
    server = start_server([old.address, new.address])
    old.double.push(ScriptedReply(text="a", delay_s=1.5))
    new.double.push("DONE")
    submit(server, "j")  # the first registered backend, equally loaded, takes it
    wait_for(lambda: len(old.double.requests) == 1, 10, "the first completion was sent")

    body = remove(server, old.address, timeout_s=0.2).json()
    assert body["drained"] is False and body["in_flight_calls"] == 1 and body["aborted_calls"] == 0, body
    res = result(server, "j")
    assert res["status"] == "completed", res
    assert [t["backend"] for t in res["trajectory"]["turns"]] == [old.address, new.address]
    assert old.double.requests[0].outcome == "done"


def test_removing_the_last_backend_makes_calls_wait_for_a_new_one(start_server, start_backend):
    old, new = start_backend(), start_backend()
    server = start_server([old.address], llm_retry_budget_s=30)
    old.double.push(ScriptedReply(text="a", delay_s=0.5))
    new.double.push("DONE")
    submit(server, "j")
    wait_for(lambda: len(old.double.requests) == 1, 10, "the first completion was sent")

    body = remove(server, old.address).json()
    assert body["remaining"] == 0 and body["drained"] is True, body
    assert registered(server) == []
    time.sleep(1.0)  # the job's next call waits: no backend, its budget not yet spent
    assert server.http.get("/jobs/j").json()["result"] is None
    refused = server.http.post("/jobs", json=JOB)
    assert refused.status_code == 503 and "no LLM backend" in refused.text  # new jobs are refused meanwhile

    add(server, new)
    res = result(server, "j")
    assert res["status"] == "completed", res
    assert [t["backend"] for t in res["trajectory"]["turns"]] == [old.address, new.address]


def test_removing_the_last_backend_fails_jobs_past_the_retry_budget(start_server, backend):
    server = start_server([backend.address], llm_retry_budget_s=1.0)
    backend.double.push(ScriptedReply(text="a", delay_s=0.5))
    submit(server, "j")
    wait_for(lambda: len(backend.double.requests) == 1, 10, "the first completion was sent")
    assert remove(server, backend.address).json()["remaining"] == 0

    res = result(server, "j")
    assert res["status"] == "failed", res
    assert res["error"]["type"] == "NoBackendAvailable" and "retry budget" in res["error"]["message"], res
    assert len(res["trajectory"]["turns"]) == 1  # the turn sampled before the drain is kept
    assert len(backend.double.requests) == 1


def test_unknown_address_is_404_and_bad_bodies_422(server, backend):
    response = remove(server, "http://127.0.0.1:1/v1")
    assert response.status_code == 404, response.text
    assert "http://127.0.0.1:1/v1" in response.json()["detail"] and backend.address in response.json()["detail"]
    for body in (
        {},
        {"address": "ftp://host/v1"},
        {"address": backend.address, "abort": "maybe"},
        {"address": backend.address, "timeout_s": 0},
        {"address": backend.address, "extra": 1},
    ):
        response = server.http.post("/remove_llm_server", json=body)
        assert response.status_code == 422, (body, response.text)
    for params in ({"abort": "maybe"}, {"timeout_s": "0"}, {"timeout_s": "nan"}):
        response = delete(server, backend.address, **params)
        assert response.status_code == 422, (params, response.text)
    response = delete(server, "ftp://host/v1")
    assert response.status_code == 422 and response.json()["detail"][0]["loc"][0] == "path", response.text
    assert delete(server, "http://127.0.0.1:1/v1").status_code == 404
    assert registered(server) == [backend.address]  # nothing of that removed it

    assert remove(server, backend.address).status_code == 200
    assert remove(server, backend.address).status_code == 404  # already removed
    assert registered(server) == []
