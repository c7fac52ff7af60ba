"""Every client error gets its 4xx with a message a person can act on; never a 500."""

from __future__ import annotations

import contextlib
import threading
import time

from prorl_server.testing import ScriptedReply


def test_unknown_data_source_is_400_listing_known_ones(server):
    response = server.http.post("/process", json={"instance": {"data_source": "chess"}})
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert "chess" in detail and "multiturn" in detail and "noop" in detail


def test_missing_data_source_is_400(server):
    response = server.http.post("/jobs", json={"instance": {"question": "x"}})
    assert response.status_code == 400 and "data_source" in response.json()["detail"]


def test_malformed_bodies_are_422(server):
    assert (
        server.http.post("/process", content=b"{not json", headers={"content-type": "application/json"}).status_code
        == 422
    )
    assert (
        server.http.post("/jobs", content=b"\xa2\xffx", headers={"content-type": "application/json"}).status_code == 422
    )
    assert server.http.post("/process", json={"sampling_params": {}}).status_code == 422
    assert server.http.post("/process", json={"instance": "text"}).status_code == 422
    assert server.http.post("/process", json={"instance": {"data_source": "noop"}, "timeout": -1}).status_code == 422
    assert server.http.post("/process", json={"instance": {"data_source": "noop"}, "surprise": 1}).status_code == 422
    assert server.http.post("/add_llm_server", json={"address": "ftp://x"}).status_code == 422
    assert server.http.post("/cancel", json={}).status_code == 422
    assert server.http.get("/jobs", params={"limit": 0}).status_code == 422


def test_duplicate_live_job_id_is_409_and_reusable_after_finish(server, backend):
    backend.double.push(ScriptedReply(text="slow", delay_s=30))
    body = {"instance": {"data_source": "slow"}, "job_id": "dup"}
    assert server.http.post("/jobs", json=body).status_code == 202
    response = server.http.post("/jobs", json=body)
    assert response.status_code == 409 and "dup" in response.json()["detail"]
    assert server.http.post("/process", json=body).status_code == 409
    deadline = time.monotonic() + 10
    while not backend.double.requests and time.monotonic() < deadline:  # the slow reply is being served
        time.sleep(0.01)
    server.http.delete("/jobs/dup")
    backend.double.push("fast")
    again = server.http.post("/process", json=body).json()
    assert again["job_id"] == "dup" and again["status"] == "completed"


def test_no_backend_is_503(start_server):
    server = start_server([])
    response = server.http.post("/process", json={"instance": {"data_source": "noop"}})
    assert response.status_code == 503 and "add_llm_server" in response.json()["detail"]


def test_unhealthy_backends_are_503(start_server):
    server = start_server(["http://127.0.0.1:9/v1"])  # nothing listens on the discard port
    deadline = time.monotonic() + 10
    while server.state.backends.counts()[1] and time.monotonic() < deadline:
        time.sleep(0.05)
    response = server.http.post("/process", json={"instance": {"data_source": "noop"}})
    assert response.status_code == 503 and "unhealthy" in response.json()["detail"]
    servers = server.http.get("/llm_servers").json()["servers"]
    assert servers[0]["healthy"] is False and servers[0]["last_error"]


def test_stopped_server_is_503_and_start_resumes(server):
    assert server.http.post("/stop").json() == {"running": False, "cancelled_jobs": 0}
    response = server.http.post("/process", json={"instance": {"data_source": "noop"}})
    assert response.status_code == 503 and "/start" in response.json()["detail"]
    assert server.http.get("/health").json() == {"status": "ok", "running": False}
    assert server.http.post("/start").json()["running"] is True
    assert server.http.post("/process", json={"instance": {"data_source": "noop"}}).json()["status"] == "completed"


def test_unknown_job_is_404(server):
    assert server.http.get("/jobs/ghost").status_code == 404


def test_listing_non_terminal_status_is_400(server):
    response = server.http.get("/jobs", params={"status": "run"})
    assert response.status_code == 400 and "completed" in response.json()["detail"]


def test_handlers_and_status_endpoints(server):
    handlers = server.http.get("/handlers").json()
    assert {
        "data_source": "noop",
        "target": "handlers_for_tests:NoOpHandler",
        "loaded": True,
        "error": None,
    } in handlers
    status = server.http.get("/status").json()
    assert status["running"] is True
    assert set(status["queues"]) == {"init", "run", "eval"} and status["llm_servers"] == 1


def test_client_disconnect_from_process_loses_nothing(server, backend):
    """A trainer whose blocking /process connection drops finds the result later via GET /jobs."""
    import httpx

    backend.double.push(ScriptedReply(text="late", delay_s=1.0))

    def impatient() -> None:
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(
                f"{server.url}/process", json={"instance": {"data_source": "slow"}, "job_id": "lost"}, timeout=0.3
            )

    thread = threading.Thread(target=impatient)
    thread.start()
    thread.join()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        results = server.http.get("/jobs", params={"wait": 1}).json()["results"]
        if results:
            break
    assert [r["job_id"] for r in results] == ["lost"] and results[0]["status"] == "completed"


def test_openapi_schema_documents_the_job_body(server):
    schema = server.http.get("/openapi.json").json()
    body = schema["paths"]["/process"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) >= {"instance", "sampling_params", "job_id", "timeout"}
    assert server.http.get("/docs").status_code == 200


def test_odd_but_valid_inputs_never_500(server):
    odd = [
        {"instance": {"data_source": 5}},
        {"instance": {"data_source": ""}},
        {"instance": {"data_source": "noop"}, "timeout": 1e300},
        {"instance": {"data_source": "noop"}, "job_id": ""},
        {"instance": {"data_source": "noop"}, "sampling_params": {"n": 4, "prompt": [1], "stream": True}},
    ]
    codes = [server.http.post("/process", json=body).status_code for body in odd]
    assert codes == [400, 400, 422, 422, 200]
    assert server.http.get("/jobs", params={"after": -1}).status_code == 422
    assert server.http.get("/jobs/%2F..%2F").status_code == 404
