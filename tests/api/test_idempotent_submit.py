"""A submission sent again (a client's retry after a lost answer) is the same job: never a second run."""

from __future__ import annotations

import threading

from prorl_server.testing import ScriptedReply


def test_the_same_request_again_while_it_runs_is_the_same_job(server, backend):
    backend.double.push(ScriptedReply(text="slow DONE", delay_s=1.0))
    body = {"job_id": "retry-1", "instance": {"data_source": "multiturn", "question": "q"}}
    assert server.http.post("/jobs", json=body).json() == {"job_id": "retry-1"}
    assert server.http.post("/jobs", json=body).status_code == 202  # a retry: accepted, not run again
    result = server.http.post("/process", json=body).json()  # blocks on the one run
    assert result["status"] == "completed" and result["job_id"] == "retry-1"
    assert len(backend.double.requests) == 1


def test_the_same_request_after_it_finished_returns_the_stored_result(server, backend):
    backend.double.push("first answer DONE")
    body = {"job_id": "retry-2", "instance": {"data_source": "multiturn", "question": "q"}, "timeout": 30}
    first = server.http.post("/process", json=body).json()
    # the same content with keys in another order is the same request
    reordered = {"timeout": 30, "instance": {"question": "q", "data_source": "multiturn"}, "job_id": "retry-2"}
    second = server.http.post("/process", json=reordered).json()
    assert second == first
    assert server.http.post("/jobs", json=body).json() == {"job_id": "retry-2"}
    assert server.http.get("/jobs/retry-2").json()["result"] == first
    assert len(backend.double.requests) == 1


def test_concurrent_identical_submissions_run_once(server, backend):
    backend.double.push(ScriptedReply(text="DONE", delay_s=0.5))
    body = {"job_id": "retry-3", "instance": {"data_source": "multiturn", "question": "q"}}
    answers: list[int] = []

    def submit() -> None:
        answers.append(server.http.post("/jobs", json=body).status_code)

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [202] * 8
    result = server.http.post("/process", json=body).json()
    assert result["status"] == "completed"
    assert len(backend.double.requests) == 1


def test_a_different_request_under_a_finished_job_id_is_409_until_acknowledged(server, backend):
    backend.double.push("DONE")
    body = {"job_id": "retry-4", "instance": {"data_source": "multiturn", "question": "q"}}
    assert server.http.post("/process", json=body).json()["status"] == "completed"
    other = {**body, "instance": {"data_source": "multiturn", "question": "another"}}
    refused = server.http.post("/jobs", json=other)
    assert refused.status_code == 409 and "different request" in refused.json()["detail"]
    server.http.post("/jobs/ack", json={"job_ids": ["retry-4"]})
    backend.double.push("DONE")
    assert server.http.post("/process", json=other).json()["status"] == "completed"
    assert len(backend.double.requests) == 2
