"""A gateway session reached from inside a sandbox without network (gateway/bridge.py, tools/relay.py), under
the real bubblewrap and Apptainer runtimes, against the scripted double: a command in the sandbox completes a
chat through `OPENAI_BASE_URL`, and reaches nothing else (not another session, not the server's other paths,
not the backend, not with a body over the gateway's limit)."""

from __future__ import annotations

import asyncio
import json
import socket
from urllib.parse import urlsplit

import pytest
from polling import wait_for
from server_jobs import result, submit

from prorl_server import AgentHandler, JobContext
from prorl_server.gateway.bridge import MAX_CONNECTIONS, MAX_HEAD_BYTES, SessionBridge
from prorl_server.gateway.sandbox_access import PLACEHOLDER_KEY, SANDBOX_PORT, sandbox_spec, start_relay
from prorl_server.sandbox import SandboxSpec
from prorl_server.sandbox.registry import unavailable_reason
from prorl_server.testing import ScriptedReply
from prorl_server.tools.errors import BadRequest

pytest_plugins = ("sandbox_fixtures",)

BODY_LIMIT = 64 * 1024
RELAY = f"http://127.0.0.1:{SANDBOX_PORT}"

# Runs inside the sandbox with its python3 (standard library only): each probe of probes.json (a JSON list) is
# ["http", method, path, body, key] or ["raw", bytes to send] or ["connect", host, port]; prints the outcomes.
PROBE = r"""
import json, os, socket, urllib.error, urllib.request
base = "http://127.0.0.1:%d" % int(os.environ["OPENAI_BASE_URL"].split(":")[2].split("/")[0])
out = []
for probe in json.load(open("probes.json")):
    kind = probe[0]
    try:
        if kind == "http":
            _, method, path, body, key = probe
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json", "Authorization": "Bearer " + (key or os.environ["OPENAI_API_KEY"])}
            request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    out.append([answer.status, json.loads(answer.read())])
            except urllib.error.HTTPError as exc:
                out.append([exc.code, json.loads(exc.read() or b"null")])
        elif kind == "raw":
            with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=60) as sock:
                sock.sendall(probe[1].encode())
                answer = b""
                while chunk := sock.recv(65536):
                    answer += chunk
            out.append([answer.split(b"\r\n", 1)[0].decode()])
        else:
            socket.create_connection((probe[1], probe[2]), timeout=10).close()
            out.append(["connected"])
    except OSError as exc:
        out.append(["refused", type(exc).__name__])
print(json.dumps(out))
"""


@pytest.fixture
def server(start_server, strict):
    server = start_server([strict.address], gateway_max_body_bytes=BODY_LIMIT)
    server.state.gateway.public_url = server.url  # the test server binds a free port
    return server


def open_session(server) -> dict:
    answer = server.http.post("/sessions", json={})
    assert answer.status_code == 200, answer.text
    return answer.json()


async def sandbox_with_gateway(isolated, server, session: dict):
    """A sandbox of the harness's runtime reaching `session` as JobContext.start_sandbox(gateway=...) does."""
    parent = isolated.runtime.base_dir / isolated.owner
    bridge = await SessionBridge.open(session["base_url"], session["api_key"], BODY_LIMIT, parent)
    spec = sandbox_spec(isolated.spec(), bridge, session["model"])
    sandbox = await isolated.runtime.start(spec)
    isolated.sandboxes.append(sandbox)
    await start_relay(sandbox)
    await sandbox.write_file("probe.py", PROBE)
    return sandbox, bridge


async def probe(sandbox, *probes: list) -> list:
    await sandbox.write_file("probes.json", json.dumps(probes))
    observation = await sandbox.bash("python3 probe.py", timeout=120)
    assert observation.exit_code == 0, observation.output
    return json.loads(observation.output.strip().splitlines()[-1])


def chat(content: str) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


async def test_a_command_in_the_sandbox_completes_a_chat_through_its_own_session(isolated, strict, server):
    strict.double.push("hello from the policy")
    session = open_session(server)
    sandbox, bridge = await sandbox_with_gateway(isolated, server, session)
    try:
        env = await sandbox.bash("echo $OPENAI_BASE_URL $OPENAI_MODEL")
        assert env.output.split() == [f"{RELAY}/v1", session["model"]]
        body = chat("hi") | {"model": session["model"]}
        [models, completion] = await probe(
            sandbox, ["http", "GET", "/v1/models", None, None], ["http", "POST", "/v1/chat/completions", body, None]
        )
    finally:
        await bridge.close()
    assert models[0] == 200 and models[1]["data"][0]["id"] == session["model"]
    assert completion[0] == 200, completion
    assert completion[1]["choices"][0]["message"]["content"] == "hello from the policy"
    record = server.http.delete(f"/sessions/{session['session_id']}").json()
    assert record["calls"] == 1
    assert [t["text"] for t in record["segments"][0]["turns"]] == ["hello from the policy"]
    assert not bridge.directory.exists()


async def test_a_sandbox_reaches_no_other_session_no_other_path_no_backend_and_no_huge_body(isolated, strict, server):
    strict.double.push("mine")
    mine, other = open_session(server), open_session(server)
    sandbox, bridge = await sandbox_with_gateway(isolated, server, mine)
    keys = await sandbox.bash("env | grep -o 'sk-prorl-[A-Za-z0-9_-]*' | sort -u")
    assert keys.output.split() == [PLACEHOLDER_KEY]  # no session key inside
    backend, api = urlsplit(strict.address), urlsplit(server.url)
    theirs = f"/sessions/{other['session_id']}/v1"
    body = chat("let me in") | {"model": mine["model"]}
    try:
        outcomes = await probe(
            sandbox,
            ["http", "POST", f"{theirs}/chat/completions", body, other["api_key"]],  # another session's path
            ["http", "GET", f"{theirs}/models", None, other["api_key"]],
            ["http", "POST", "/v1/chat/completions", body, other["api_key"]],  # its key on my path: still mine
            ["http", "GET", f"/sessions/{mine['session_id']}/v1/models", None, None],  # server paths, even mine
            ["http", "GET", "/jobs", None, None],
            ["http", "POST", "/jobs", {"job_id": "x"}, None],
            ["http", "GET", "/health", None, None],
            ["http", "POST", "/sessions", {}, None],
            ["http", "DELETE", f"/sessions/{mine['session_id']}", None, None],
            ["http", "GET", "/v1/models?x=1", None, None],
            ["http", "GET", "/v1/../jobs", None, None],
            ["connect", backend.hostname, backend.port],  # the backend and the server themselves
            ["connect", api.hostname, api.port],
            ["raw", f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {10**9}\r\n\r\n"],
            ["raw", "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: " + "a" * (16 * MAX_HEAD_BYTES) + "\r\n\r\n"],
        )
    finally:
        await bridge.close()
    assert [o[0] for o in outcomes[:3]] == [404, 404, 200], outcomes
    assert outcomes[0][1]["error"]["code"] == "not_found"
    assert outcomes[2][1]["choices"][0]["message"]["content"] == "mine"  # the socket fixes the session
    assert [o[0] for o in outcomes[3:11]] == [404] * 8, outcomes
    assert [o[0] for o in outcomes[11:13]] == ["refused", "refused"], outcomes
    assert outcomes[13] == ["HTTP/1.1 413 "], outcomes
    assert outcomes[14][0] in ("", "refused"), outcomes  # a head over the bound: dropped (EOF or reset)
    assert len(strict.double.requests) == 1  # the one call on the sandbox's own session
    calls = [server.http.delete(f"/sessions/{s['session_id']}").json()["calls"] for s in (mine, other)]
    assert calls == [1, 0]  # both still open; the other untouched


async def test_the_relay_runs_once_per_sandbox_and_closing_the_bridge_ends_the_session_s_reach(
    isolated, strict, server
):
    session = open_session(server)
    sandbox, bridge = await sandbox_with_gateway(isolated, server, session)
    with pytest.raises(BadRequest, match="already listens"):
        await start_relay(sandbox)
    await bridge.close()
    [after] = await probe(sandbox, ["http", "GET", "/v1/models", None, None])
    assert after[0] == "refused", after  # the relay finds no bridge and hangs up


BWRAP = unavailable_reason("bwrap")


class SandboxedAgentHandler(AgentHandler):
    """Runs an OpenAI-client command inside its sandbox, against its job's session."""

    name = "sandboxed_agent"

    async def run(self, ctx: JobContext) -> None:
        access = await ctx.gateway_session()
        sandbox = await ctx.start_sandbox(SandboxSpec(), gateway=access)
        command = (
            'python3 -c "import os, openai; c = openai.OpenAI(max_retries=0); '
            "print(c.chat.completions.create(model=os.environ['OPENAI_MODEL'], "
            "messages=[{'role': 'user', 'content': 'hi'}]).choices[0].message.content)\""
        )
        observation = await sandbox.bash(command, timeout=120)
        ctx.artifacts["output"] = observation.output.strip()

    async def eval(self, ctx: JobContext) -> float:
        return 1.0 if ctx.artifacts["output"] == "42" else 0.0


@pytest.mark.skipif(BWRAP is not None, reason=f"bwrap: {BWRAP}")
def test_a_handler_runs_the_openai_client_in_its_sandbox_against_its_job_s_session(strict, start_server):
    server = start_server([strict.address], handlers={"sandboxed_agent": SandboxedAgentHandler()}, runtime="bwrap")
    server.state.gateway.public_url = server.url
    strict.double.push("42", job="j1")
    submit(server, "j1", instance={"data_source": "sandboxed_agent"})
    res = result(server, "j1")
    assert res["status"] == "completed" and res["reward"] == 1.0, (res["error"], res["artifacts"])
    [recording] = res["artifacts"]["gateway"]
    assert [t["text"] for t in recording["segments"][0]["turns"]] == ["42"]
    assert [r.job_id for r in strict.double.requests] == ["j1"]
    manager = server.state.orchestrator.sandboxes
    owner_dir = manager.base_dir / manager.owner
    assert not owner_dir.exists() or not [p for p in owner_dir.iterdir() if p.name.startswith("gw-")]


def unix_request(path, request: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(60)
    sock.connect(str(path))
    if request:  # a bare connection sends nothing: the bridge may close it before a send (EPIPE)
        sock.sendall(request)
    return sock


def http_request(method: str, path: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: sandbox\r\nAuthorization: Bearer {PLACEHOLDER_KEY}\r\n"
    return (head + f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


async def test_the_bridge_caps_its_connections(strict, server, tmp_path):
    session = open_session(server)
    bridge = await SessionBridge.open(session["base_url"], session["api_key"], BODY_LIMIT, tmp_path)
    models = http_request("GET", "/v1/models")
    try:
        held = [await asyncio.to_thread(unix_request, bridge.socket_path, b"") for _ in range(MAX_CONNECTIONS)]
        extra = await asyncio.to_thread(unix_request, bridge.socket_path, b"")
        assert await asyncio.to_thread(extra.recv, 1024) == b""  # closed at once
        extra.close()
        for sock in held:
            sock.close()

        def answered() -> bool:
            with unix_request(bridge.socket_path, models) as sock:
                try:
                    return sock.recv(1024).startswith(b"HTTP/1.1 200 ")
                except ConnectionResetError:
                    return False

        await asyncio.to_thread(wait_for, answered, 30, "a connection is served once the held ones ended")
    finally:
        await bridge.close()


async def test_a_client_that_hangs_up_aborts_its_completion(strict, server, tmp_path):
    strict.double.push(ScriptedReply(text="too late", delay_s=120))
    session = open_session(server)
    bridge = await SessionBridge.open(session["base_url"], session["api_key"], BODY_LIMIT, tmp_path)
    body = json.dumps(chat("hi") | {"model": session["model"]}).encode()
    try:
        sock = await asyncio.to_thread(
            unix_request, bridge.socket_path, http_request("POST", "/v1/chat/completions", body)
        )
        await asyncio.to_thread(wait_for, lambda: len(strict.double.requests) == 1, 30, "the completion starts")
        sock.close()
        await asyncio.to_thread(
            wait_for, lambda: strict.double.requests[0].outcome == "aborted", 30, "the completion is aborted"
        )
    finally:
        await bridge.close()
