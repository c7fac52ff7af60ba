"""Submitting a job of the "multiturn" test handler to a test server and waiting for its result."""

from __future__ import annotations

from polling import wait_for

JOB = {"instance": {"data_source": "multiturn", "question": "q"}}


def submit(server, job_id: str, **extra) -> None:
    """`POST /jobs` of the multiturn job under `job_id` (`extra` fields added); it must be accepted."""
    response = server.http.post("/jobs", json={**JOB, "job_id": job_id, **extra})
    assert response.status_code == 202, response.text


def result(server, job_id: str, timeout: float = 20.0) -> dict:
    """The job's result once it is terminal (polls `GET /jobs/{job_id}`)."""
    found: dict = {}

    def done() -> bool:
        found["r"] = server.http.get(f"/jobs/{job_id}").json()["result"]
        return found["r"] is not None

    wait_for(done, timeout, f"job {job_id} finished")
    return found["r"]
