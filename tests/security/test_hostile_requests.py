"""Hostile requests against every route of the app: each gets a small 4xx, never a 500, and the server
serves normally afterwards.

The routes and their bodies, query and path parameters come from the app itself (its routes and its
OpenAPI document), so a new route gets every case below without an edit here. Schemathesis then fuzzes
every operation of the OpenAPI document, with data that fits the schema and data that does not.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import fastapi.routing
import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode

from prorl_server.api.auth import OPEN_PATHS

KEY = "hostile-test-key-7f3a"
AUTH = {"authorization": f"Bearer {KEY}"}
MAX_BODY = 1024 * 1024
SMALL = 16 * 1024
"""Bytes an answer to a hostile request may have, at most."""

# A valid body per route, so that a hostile value which slipped through would be stored and acted on. A
# route missing here gets the same cases on an empty base: each hostile value is invalid whatever the rest.
VALID_BODIES: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/process"): {"instance": {"data_source": "noop"}},
    ("POST", "/jobs"): {"instance": {"data_source": "noop"}},
    ("POST", "/cancel"): {"job_id": "nobody"},
    ("POST", "/jobs/ack"): {"job_ids": ["nobody"]},
    ("POST", "/add_llm_server"): {"address": "http://127.0.0.1:9/v1"},
}


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


# Values put in each field of a JSON body, as raw JSON text (bytes where the text is not UTF-8).
FIELD_VALUES: dict[str, str | bytes] = {
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "1e400": "1e400",
    "-1e400": "-1e400",
    "NaN in an object": '{"a": NaN}',
    "Infinity in arrays": "[[1, Infinity]]",
    "1e400 deep inside": '{"a": {"b": [{"c": 1e400}]}}',
    "objects 65 deep": nested(65),
    "objects 300 deep": nested(300),
    "arrays 100000 deep": "[" * 100_000 + "]" * 100_000,
    "wrong type": "[[]]",
    "100000-char string": '"' + "x" * 100_000 + '"',
    "5000-digit integer": "9" * 5000,
    "invalid UTF-8 in a string": b'"\xff\xfe"',
    "lone surrogate": '"\\ud800"',
}

# Whole bodies.
BODIES: dict[str, bytes] = {
    "empty": b"",
    "not JSON": b"{not json",
    "truncated": b'{"a": [1, 2',
    "invalid UTF-8": b"\xa2\xff\xfe",
    "UTF-16": '{"a": 1}'.encode("utf-16"),
    "top-level array": b"[]",
    "top-level NaN": b"NaN",
    "top-level string": b'"text"',
    "top-level null": b"null",
    "arrays 100000 deep": b"[" * 100_000 + b"]" * 100_000,
    "60000 unknown fields": ("{" + ",".join(f'"k{i}": {i}' for i in range(60_000)) + "}").encode(),
}

QUERY_VALUES = {"nan": "nan", "inf": "inf", "-inf": "-inf", "1e400": "1e400", "-1": "-1", "5000 chars": "x" * 5000}
PATH_VALUES = {"5000 chars": "x" * 5000, "invalid UTF-8": "%FF%FE", "NUL": "%00", "traversal": "..%2F..%2Fhealth"}

WRONG_AUTH = {
    "no key": None,
    "wrong key": "Bearer wrong",
    "key one byte short": f"Bearer {KEY[:-1]}",
    "key plus a byte": f"Bearer {KEY}x",
    "key as Basic": f"Basic {KEY}",
    "bearer without a key": "Bearer",
}


@dataclass(frozen=True)
class Route:
    """One method of one path, with its OpenAPI operation (empty for the docs routes)."""

    method: str
    path: str
    operation: dict[str, Any]

    def params(self, where: str) -> list[str]:
        return [p["name"] for p in self.operation.get("parameters", []) if p["in"] == where]

    def url(self, **values: str) -> str:
        return self.path.format(**({name: "nobody" for name in self.params("path")} | values))


@dataclass
class Hostile:
    """One hostile request and what it got."""

    what: str
    route: Route
    url: str
    content: bytes | None = None
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=lambda: dict(AUTH))
    status: int = 0
    body: bytes = b""

    @property
    def contained(self) -> bool:
        return 400 <= self.status < 500 and len(self.body) <= SMALL

    def __str__(self) -> str:
        return f"{self.route.method} {self.route.path} [{self.what}] -> {self.status}, {len(self.body)} B: {self.body[:120]!r}"


def app_routes(app: fastapi.FastAPI) -> list[Route]:
    """Every (method, path) the app serves, HEAD aside; FastAPI >= 0.16x keeps included routers nested."""
    paths = app.openapi()["paths"]
    flatten = getattr(fastapi.routing, "iter_route_contexts", lambda routes: routes)
    routes = []
    for route in flatten(app.routes):
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)  # `{address:path}` is `{address}` in OpenAPI
        routes += [
            Route(m, path, paths.get(path, {}).get(m.lower(), {})) for m in sorted((route.methods or set()) - {"HEAD"})
        ]
    return routes


def body_schema(route: Route, components: dict[str, Any]) -> dict[str, Any] | None:
    schema = route.operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if schema and "$ref" in schema:
        schema = components[schema["$ref"].rsplit("/", 1)[1]]
    return schema


def with_field(base: dict[str, Any], name: str, raw: str | bytes) -> bytes:
    """`base` as JSON with field `name` set to the raw JSON text `raw`."""
    text = json.dumps({**base, name: "@HOSTILE@"}).encode()
    return text.replace(b'"@HOSTILE@"', raw if isinstance(raw, bytes) else raw.encode())


def hostile_cases(routes: list[Route], components: dict[str, Any]) -> Iterator[Hostile]:
    for route in routes:
        if route.method != "GET" or route.path not in OPEN_PATHS:
            for what, auth in WRONG_AUTH.items():
                yield Hostile(f"auth: {what}", route, route.url(), headers={"authorization": auth} if auth else {})
        schema = body_schema(route, components)
        if schema is not None:
            yield Hostile("chunked body over the limit", route, route.url(), content=b" " * (MAX_BODY + 1))
            for what, content in BODIES.items():
                yield Hostile(f"body: {what}", route, route.url(), content=content)
            base = VALID_BODIES.get((route.method, route.path), {})
            for name in schema.get("properties", {}):
                for what, raw in FIELD_VALUES.items():
                    yield Hostile(f"{name}: {what}", route, route.url(), content=with_field(base, name, raw))
        for name in route.params("query"):
            for what, value in QUERY_VALUES.items():
                yield Hostile(f"?{name}: {what}", route, route.url(), params={name: value})
        for name in route.params("path"):
            for what, value in PATH_VALUES.items():
                yield Hostile(f"{{{name}}}: {what}", route, route.url(**{name: value}))


def send(http, case: Hostile) -> None:
    content = case.content
    if case.what == "chunked body over the limit":  # no Content-Length: the limit applies while reading
        content = iter([case.content[i : i + 65536] for i in range(0, len(case.content), 65536)])
    headers = {"content-type": "application/json", **case.headers} if case.content is not None else case.headers
    try:
        response = http.request(case.route.method, case.url, content=content, params=case.params, headers=headers)
    except httpx.TransportError as exc:  # a dropped connection is no answer (status stays 0)
        case.body = repr(exc).encode()
        return
    case.status, case.body = response.status_code, response.content


def declare_too_much(base_url: str, route: Route) -> Hostile:
    """A request whose Content-Length is over the limit, sent without a body: the answer must not wait for it."""
    case = Hostile("Content-Length over the limit", route, route.url())
    address = urlsplit(base_url)
    head = (
        f"{route.method} {case.url} HTTP/1.1\r\nHost: {address.netloc}\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {MAX_BODY + 1}\r\nConnection: close\r\n\r\n"
    )
    with socket.create_connection((address.hostname, address.port), timeout=3) as sock:
        sock.sendall(head.encode())
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except TimeoutError:  # the server waits for the body it was promised
            return case
    status_line, _, rest = answer.partition(b"\r\n")
    case.status = int(status_line.split()[1])
    case.body = rest.partition(b"\r\n\r\n")[2]
    return case


@pytest.fixture
def hostile_server(start_server, backend):
    return start_server([backend.address], api_key=KEY, max_body_bytes=MAX_BODY)


def test_every_route_contains_hostile_requests_and_keeps_serving(hostile_server, backend):
    server = hostile_server
    app = server.server.server.config.app
    routes = app_routes(app)
    assert {("POST", "/process"), ("GET", "/openapi.json"), ("GET", "/docs")} <= {(r.method, r.path) for r in routes}
    cases = list(hostile_cases(routes, app.openapi().get("components", {}).get("schemas", {})))
    for case in cases:
        send(server.http, case)
    cases += [declare_too_much(server.url, route) for route in routes]
    failed = [str(case) for case in cases if not case.contained]
    print(f"\nhostile requests: {len(cases)} tried, {len(cases) - len(failed)} contained")
    assert not failed, f"{len(failed)} of {len(cases)} hostile requests not contained:\n" + "\n".join(failed)

    http, authed = server.http, {"headers": AUTH}
    assert http.get("/health").json() == {"status": "ok", "running": True, "problems": []}
    assert http.post("/process", json={"instance": {"data_source": "noop"}}, **authed).json()["status"] == "completed"
    assert [s["address"] for s in http.get("/llm_servers", **authed).json()["servers"]] == [backend.address]
    assert http.get("/jobs", params={"limit": 10_000}, **authed).status_code == 200
    assert http.get("/status", **authed).json()["running"] is True


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis_finds_no_internal_error(hostile_server, mode):
    """Fuzz every documented operation (about 3 s per mode); /stop and /clear_llm_server would only make
    the rest answer 503, and `wait` is pinned to 0 so that no long-poll holds a case for minutes."""
    server = hostile_server
    schema = schemathesis.openapi.from_dict(server.http.get("/openapi.json", headers=AUTH).json())
    schema = schema.exclude(path=["/stop", "/clear_llm_server"])
    statuses: set[int] = set()

    @given(case=schema.as_strategy(generation_mode=mode, headers=AUTH, query={"wait": 0}))
    @settings(max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    def fuzz(case) -> None:
        response = case.call(base_url=server.url, timeout=30)
        statuses.add(response.status_code)
        assert response.status_code != 500, f"{case.method} {case.formatted_path}: {response.text[:300]}"
        assert response.status_code < 400 or len(response.content) <= SMALL, f"{case.method} {case.formatted_path}"

    fuzz()
    assert statuses & {400, 404, 422}
    assert server.http.get("/health").json() == {"status": "ok", "running": True, "problems": []}


def test_a_client_that_leaves_mid_body_is_no_server_error(hostile_server, caplog):
    """Under load a client may close its connection while its body is still on the way: that is logged as
    nothing worse than debug, and the server goes on serving."""
    address = urlsplit(hostile_server.url)
    head = (
        f"POST /jobs HTTP/1.1\r\nHost: {address.netloc}\r\nAuthorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            with socket.create_connection((address.hostname, address.port), timeout=3) as sock:
                sock.sendall(head.encode() + b'{"instance": {"data_')
            time.sleep(0.2)
        assert hostile_server.http.get("/health").status_code == 200
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not errors, [r.getMessage() for r in errors]
