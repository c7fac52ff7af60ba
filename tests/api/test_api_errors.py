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


def test_another_request_under_a_live_job_id_is_409_and_the_id_is_reusable_after_ack(server, backend):
    backend.double.push(ScriptedReply(text="slow", delay_s=30))
    body = {"instance": {"data_source": "slow"}, "job_id": "dup"}
    assert server.http.post("/jobs", json=body).status_code == 202
    other = {**body, "timeout": 5}
    response = server.http.post("/jobs", json=other)
    assert response.status_code == 409 and "dup" in response.json()["detail"]
    assert server.http.post("/process", json=other).status_code == 409
    deadline = time.monotonic() + 10
    while not backend.double.requests and time.monotonic() < deadline:  # the slow reply is being served
        time.sleep(0.01)
    server.http.delete("/jobs/dup")
    assert server.http.post("/process", json=other).status_code == 409  # the cancelled result is still stored
    assert server.http.post("/jobs/ack", json={"job_ids": ["dup"]}).json() == {"acknowledged": 1}
    backend.double.push("fast")
    again = server.http.post("/process", json=other).json()
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
    assert server.http.get("/health").json() == {"status": "ok", "running": False, "problems": []}
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


JSON = {"content-type": "application/json"}
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]
# Where a non-finite number can hide in each JSON body; "@" marks the spot.
NON_FINITE_SPOTS = [
    ("/jobs", '{"instance": {"data_source": "noop", "x": @}}'),
    ("/process", '{"instance": {"data_source": "noop"}, "sampling_params": {"temperature": @}}'),
    ("/process", '{"instance": {"data_source": "noop"}, "agent_config": {"a": [1, {"b": @}]}}'),
    ("/jobs", '{"instance": {"data_source": "noop"}, "timeout": @}'),
    ("/cancel", '{"job_id": @}'),
    ("/jobs/ack", '{"through": @}'),
    ("/jobs/ack", '{"job_ids": [@]}'),
    ("/add_llm_server", '{"address": "http://127.0.0.1:9/v1", "tags": {"a": @}}'),
    ("/add_llm_server", '{"address": "http://127.0.0.1:9/v1", "weight_version": @}'),
]


def test_non_finite_numbers_are_422_with_a_clear_message_everywhere(server):
    for path, template in NON_FINITE_SPOTS:
        for number in NON_FINITE:
            response = server.http.post(path, content=template.replace("@", number), headers=JSON)
            assert response.status_code == 422, (path, number, response.text)
            msgs = " ".join(err["msg"] for err in response.json()["detail"])
            assert "finite number" in msgs or "valid string" in msgs, (path, number, msgs)
    for number in ("nan", "inf", "-inf", "1e400"):
        response = server.http.get("/jobs", params={"wait": number})
        assert response.status_code == 422 and "finite number" in response.text, response.text
    servers = server.http.get("/llm_servers").json()["servers"]
    assert [s["address"] for s in servers] == [server.state.settings.llm_servers[0]]
    assert server.http.post("/process", json={"instance": {"data_source": "noop"}}).json()["status"] == "completed"


def test_deeply_nested_tags_are_422_and_llm_servers_keeps_answering(server):
    for depth in (256, 300, 5000, 100, 9):  # 256 levels were a 500, then every GET /llm_servers too
        tags = '{"a": ' + "[" * depth + "]" * depth + "}"
        body = f'{{"address": "http://127.0.0.1:9/v{depth}", "tags": {tags}}}'
        response = server.http.post("/add_llm_server", content=body, headers=JSON)
        assert response.status_code == 422, (depth, response.text)
        assert server.http.get("/llm_servers").status_code == 200
    assert len(server.http.get("/llm_servers").json()["servers"]) == 1


def test_free_form_fields_are_bounded_with_messages_naming_the_spot(server):
    def error(path: str, body: dict) -> dict:
        response = server.http.post(path, json=body)
        assert response.status_code == 422, response.text
        return response.json()["detail"][0]

    deep: dict = {}
    inner = deep
    for _ in range(64):
        inner["n"] = inner = {}
    err = error("/jobs", {"instance": {"data_source": "noop", "d": deep}})
    assert err["loc"] == ["body", "instance"] and err["type"] == "json_too_deep" and "(at d.n.n" in err["msg"]
    add = {"address": "http://127.0.0.1:9/v1"}
    assert error("/add_llm_server", {**add, "tags": {"k": "x" * 4097}})["type"] == "string_too_long"
    assert error("/add_llm_server", {**add, "tags": {"k" * 257: 1}})["type"] == "string_too_long"
    assert error("/add_llm_server", {**add, "tags": {"k": list(range(1000))}})["type"] == "json_too_large"
    assert error("/add_llm_server", {**add, "weight_version": 2**64})["loc"][:2] == ["body", "weight_version"]
    assert error("/cancel", {"job_id": "j" * 257})["type"] == "string_too_long"
    # generous for real instances: megabytes of text, thousands of members, 64 levels
    swe = {
        "data_source": "noop",
        "problem": "p" * 3_000_000,
        "files": {f"src/f{i}.py": "x = 1\n" * 50 for i in range(5000)},
    }
    swe["deep"] = deep["n"]["n"]  # with the instance itself: 64 levels
    assert server.http.post("/process", json={"instance": swe}).json()["status"] == "completed"


def test_validation_errors_stay_small(server):
    response = server.http.post("/process", json={"instance": {"data_source": "noop"}, "job_id": "j" * 100_000})
    assert response.status_code == 422 and len(response.content) < 1000
    assert response.json()["detail"][0]["input"] == "j" * 100 + "..."
    response = server.http.post("/jobs", json={"instance": {"data_source": "noop"}, "k" * 100_000: 1})
    assert response.status_code == 422 and len(response.content) < 1000
    many = {f"unknown{i}": i for i in range(1000)}
    detail = server.http.post("/jobs", json=many).json()["detail"]
    assert len(detail) == 21 and detail[-1] == {"loc": [], "msg": "further errors not shown", "type": "too_many_errors"}
    assert detail[0] == {
        "loc": ["body", "unknown0"],
        "msg": "Extra inputs are not permitted",
        "type": "extra_forbidden",
    }


def test_a_million_unknown_fields_get_a_small_422_while_health_keeps_answering(server):
    body = ("{" + ",".join(f'"k{i}": 1' for i in range(1_000_000)) + "}").encode()
    got: dict = {}
    poster = threading.Thread(
        target=lambda: got.update(response=server.http.post("/jobs", content=body, headers=JSON)), daemon=True
    )
    poster.start()
    health: list[int] = []
    while poster.is_alive():  # a hang guard, not a timing assertion: each /health gets 10 s
        health.append(server.http.get("/health", timeout=10).status_code)
        time.sleep(0.05)
    poster.join()
    assert got["response"].status_code == 422 and len(got["response"].content) < 8192
    assert set(health) <= {200}


def test_bodies_over_the_limit_are_413_before_the_app_runs(start_server, backend):
    server = start_server([backend.address], max_body_bytes=64 * 1024)
    big = {"instance": {"data_source": "noop", "text": "x" * 70_000}}
    response = server.http.post("/process", json=big)
    assert response.status_code == 413 and "65536" in response.json()["detail"]
    response = server.http.post("/stop", content=b"x" * 70_000)  # a route that never reads its body
    assert response.status_code == 413 and server.http.get("/health").json()["running"] is True

    def chunks():  # no Content-Length: counted while read
        for _ in range(5):
            yield b" " * 16_000

    response = server.http.post("/jobs", content=chunks(), headers=JSON)
    assert response.status_code == 413
    assert (
        server.http.post("/process", json={"instance": {"data_source": "noop", "t": "x" * 60_000}}).status_code == 200
    )


KEY = "test-key-0123456789"


def test_api_key_is_required_everywhere_but_health(start_server, backend):
    server = start_server([backend.address], api_key=KEY)
    assert server.http.get("/health").json() == {"status": "ok", "running": True, "problems": []}
    for method, path in [("GET", "/status"), ("GET", "/docs"), ("GET", "/openapi.json"), ("POST", "/stop"),
                         ("POST", "/clear_llm_server"), ("POST", "/cancel"), ("GET", "/nowhere"), ("POST", "/health")]:  # fmt: skip
        for auth in (None, "Bearer wrong", f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer"):
            headers = {"authorization": auth} if auth else {}
            response = server.http.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path, auth)
            assert response.headers["www-authenticate"] == "Bearer" and "PRORL_API_KEY" in response.json()["detail"]
    assert server.http.get("/llm_servers").status_code == 401
    authed = {"authorization": f"Bearer {KEY}"}
    assert server.http.get("/status", headers=authed).json()["running"] is True
    assert server.http.get("/openapi.json", headers={"authorization": f"bearer {KEY}"}).status_code == 200
    body = {"instance": {"data_source": "noop"}}
    assert server.http.post("/process", json=body, headers=authed).json()["status"] == "completed"
