"""A gateway session reached from inside a sandbox without network (gateway/bridge.py, tools/relay.py), under
the real bubblewrap and Apptainer runtimes, against the scripted double: a command in the sandbox completes a
chat through `OPENAI_BASE_URL`, and reaches nothing else (not another session, not the server's other paths,
not the backend, not with a body over the gateway's limit). On the host, the bridge's Anthropic path: the
official `anthropic` client's messages (plain and streamed; a beta client's `?beta=true`) with the session's
key whatever key it sends, and the bridge's own errors there in Anthropic's shape."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import anthropic
import httpx
import pytest
from gateway_sessions import close_session
from polling import wait_for
from server_jobs import result, submit

from prorl_server import AgentHandler, JobContext
from prorl_server.gateway.bridge import MAX_CONNECTIONS, MAX_HEAD_BYTES, SessionBridge
from prorl_server.gateway.sandbox_access import PLACEHOLDER_KEY, SANDBOX_PORT, sandbox_spec, start_relay
from prorl_server.sandbox import SandboxSpec
from prorl_server.sandbox.registry import unavailable_reason
from prorl_server.testing import ScriptedReply
from prorl_server.tool_server.errors import BadRequest
from prorl_server.tool_server.relay import Relay

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
        env = await sandbox.bash("echo $OPENAI_BASE_URL $OPENAI_MODEL $ANTHROPIC_BASE_URL $ANTHROPIC_MODEL")
        assert env.output.split() == [f"{RELAY}/v1", session["model"], RELAY, session["model"]]
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


@contextlib.contextmanager
def relayed(bridge: SessionBridge) -> Iterator[str]:
    """The bridge on a loopback port of the host, relayed as in a sandbox: what ANTHROPIC_BASE_URL is there."""
    relay = Relay(str(bridge.socket_path), 0)
    try:
        yield f"http://127.0.0.1:{relay.port}"
    finally:
        relay.close()


def anthropic_client(base_url: str, api_key: str) -> anthropic.AsyncAnthropic:
    """An Anthropic client as one in the sandbox is, sending `api_key` in `x-api-key` besides the placeholder
    (in `Authorization`, as recent SDKs send ANTHROPIC_API_KEY)."""
    return anthropic.AsyncAnthropic(
        base_url=base_url, api_key=PLACEHOLDER_KEY, default_headers={"x-api-key": api_key}, max_retries=0
    )


async def test_the_bridge_passes_anthropic_messages_plain_beta_and_streamed_in_one_segment(strict, server, tmp_path):
    strict.double.push("one", "two", "three")
    mine, other = open_session(server), open_session(server)
    bridge = await SessionBridge.open(mine["base_url"], mine["api_key"], BODY_LIMIT, tmp_path)
    history: list = [{"role": "user", "content": "u1"}]
    try:
        with relayed(bridge) as base_url:
            client = anthropic_client(base_url, other["api_key"])  # another session's key: the call is still mine
            first = await client.messages.create(model=mine["model"], max_tokens=16, messages=history)
            history += [{"role": "assistant", "content": [b.model_dump() for b in first.content]}]
            history += [{"role": "user", "content": "u2"}]
            # as the beta client of Anthropic's TypeScript SDK (Claude Code's) sends it
            async with httpx.AsyncClient(base_url=base_url) as raw:
                second = await raw.post(
                    "/v1/messages?beta=true",
                    headers={"x-api-key": other["api_key"], "anthropic-beta": "any"},
                    json={"model": mine["model"], "max_tokens": 16, "messages": history},
                )
            history += [{"role": "assistant", "content": second.json()["content"]}, {"role": "user", "content": "u3"}]
            async with client.messages.stream(model=mine["model"], max_tokens=16, messages=history) as stream:
                third = await stream.get_final_message()
            await client.close()
    finally:
        await bridge.close()
    assert second.status_code == 200, second.text
    texts = [first.content[0].text, second.json()["content"][0]["text"], third.content[0].text]
    assert texts == ["one", "two", "three"]
    record = close_session(server, mine)
    assert (record["calls"], record["rewrites"]) == (3, 0)
    [segment] = record["segments"]
    assert [t["text"] for t in segment["turns"]] == ["one", "two", "three"]
    assert close_session(server, other)["calls"] == 0


async def test_the_bridge_s_own_errors_on_the_anthropic_path_have_anthropic_s_shape(strict, server, tmp_path):
    session = open_session(server)
    bridge = await SessionBridge.open(session["base_url"], session["api_key"], BODY_LIMIT, tmp_path)
    unanswered = await SessionBridge.open("http://127.0.0.1:9/v1", session["api_key"], BODY_LIMIT, tmp_path)
    message = {"model": session["model"], "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    try:
        with relayed(bridge) as base_url, relayed(unanswered) as nowhere:
            client, raw = anthropic_client(base_url, PLACEHOLDER_KEY), httpx.AsyncClient(base_url=base_url)
            with pytest.raises(anthropic.APIStatusError) as too_large:
                await client.messages.create(**message, system="x" * BODY_LIMIT)
            with pytest.raises(anthropic.NotFoundError) as count_tokens:
                await client.messages.count_tokens(model=session["model"], messages=message["messages"])
            with pytest.raises(anthropic.APIStatusError) as no_gateway:  # nothing listens upstream: 502, as 529
                await anthropic_client(nowhere, PLACEHOLDER_KEY).messages.create(**message)
            beta_false = await raw.post("/v1/messages?beta=false", json=message)
            openai_path = await raw.post("/v1/chat/completions?beta=true", json={})
            await client.close()
            await raw.aclose()
    finally:
        await bridge.close()
        await unanswered.close()
    assert too_large.value.status_code == 413
    assert too_large.value.body["error"]["type"] == "request_too_large"
    assert count_tokens.value.body["error"]["type"] == "not_found_error"
    assert "POST /v1/messages?beta=true" in count_tokens.value.body["error"]["message"]
    assert no_gateway.value.status_code == 529
    assert no_gateway.value.body["error"]["type"] == "overloaded_error"
    assert beta_false.status_code == 404 and beta_false.json()["type"] == "error"
    assert openai_path.status_code == 404 and openai_path.json()["error"]["code"] == "not_found"  # OpenAI's shape
    assert strict.double.requests == []
