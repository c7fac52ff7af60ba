"""The host does not trust the execution server: ToolClient against a hostile stand-in on a Unix socket.

A sandbox can replace its execution server with one of its own. Whatever that server sends, a call must
end in a ToolError with a clear message or in an observation capped to what was asked for, never in a raw
Python error, and the client's memory must stay bounded by the request, not by what the server sends.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest

from prorl_server.tool_server.client import ToolClient, ToolError
from prorl_server.tool_server.output import truncation_marker
from prorl_server.tool_server.responses import MAX_MESSAGE_CHARS, MAX_TRACEBACK_CHARS, OUTPUT_ROOM_CHARS

Answer = Callable[[dict[str, Any]], Iterable[bytes]]
MiB = 1 << 20
CHUNK = b"a" * MiB  # made once, before any memory is traced
BASH_DEADLINE_S = 1  # bash's timeout: the client's deadline is this plus its grace (a hang guard)


def line(value: object) -> bytes:
    """One JSON response line."""
    return json.dumps(value).encode() + b"\n"


def observation(request: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A well-formed successful command response to `request`, with `fields` on top."""
    return {
        "id": request["id"],
        "ok": True,
        "output": "fine\n",
        "exit_code": 0,
        "timed_out": False,
        "truncated": False,
        "duration_s": 0.01,
        **fields,
    }


def failure(request: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A well-formed failure response to `request`, with `fields` on top."""
    return {"id": request["id"], "ok": False, "error": "FileNotFoundError", "message": "no such file", **fields}


def streamed(request: dict[str, Any], fields: str, megabytes: int, rest: str = "") -> Iterator[bytes]:
    """A response whose last string field is `megabytes` MiB of 'a', sent piece by piece (nothing is built):
    `{"id": ..., FIELDS"aaa...aaa"REST}`."""
    yield f'{{"id":{request["id"]},{fields}"'.encode()
    for _ in range(megabytes):
        yield CHUNK
    yield f'"{rest}}}\n'.encode()


def endless(request: dict[str, Any]) -> Iterator[bytes]:
    """A line that never ends (bounded at 128 MiB, past any limit, so a broken client cannot hang the test)."""
    for _ in range(128):
        yield CHUNK


class HostileServer:
    """Answers each request line on a Unix socket with the pieces `answer(request)` yields, in order (an
    empty piece: hang up)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.answer: Answer = lambda request: [line({"id": request["id"], "ok": True, "pid": 4242})]
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(16)
        threading.Thread(target=self._accept, name="hostile-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(connection,), name="hostile-serve", daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as requests:
            for request in requests:
                try:
                    for piece in self.answer(json.loads(request)):
                        if not piece:  # hang up
                            return
                        connection.sendall(piece)
                except OSError:  # the client hung up on us, as it should
                    return

    def close(self) -> None:
        """Stop accepting (connections being served end when their client closes them)."""
        self.listener.close()


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    """A hostile server in a short private directory (AF_UNIX paths are limited to 107 bytes)."""
    base = tempfile.mkdtemp(prefix="pt-hostile-")
    server = HostileServer(os.path.join(base, "tools.sock"))
    yield server
    server.close()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
async def client(hostile: HostileServer) -> ToolClient:
    """A client of the hostile server."""
    tools = ToolClient(hostile.path)
    yield tools
    await tools.aclose()


async def peak_during(call: Callable[[], Any]) -> tuple[BaseException | Any, int]:
    """(what `call()` returned or raised, peak bytes traced while it ran)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        try:
            outcome = await call()
        except Exception as exc:
            outcome = exc
        return outcome, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# --- too much: the client stops reading at what the request allows ------------------------------------


OVERSIZED: dict[str, tuple[Answer, Callable[[ToolClient], Any]]] = {
    "50 MB output for max_output=8000": (
        lambda r: streamed(
            r, '"ok":true,"output":', 50, ',"exit_code":0,"timed_out":false,"truncated":false,"duration_s":1'
        ),
        lambda c: c.bash("yes", timeout=BASH_DEADLINE_S, max_output=8000),
    ),
    "bash: a line that never ends": (endless, lambda c: c.bash("true", timeout=BASH_DEADLINE_S)),
    "ping: a line that never ends": (endless, lambda c: c.ping()),
    "write_file: 10 MB error message": (
        lambda r: streamed(r, '"ok":false,"error":"OSError","message":', 10),
        lambda c: c.write_file("a.txt", "text"),
    ),
    "bash max_output=8000: 10 MB error message": (
        lambda r: streamed(r, '"ok":false,"error":"BadRequest","message":', 10),
        lambda c: c.bash("true", timeout=BASH_DEADLINE_S, max_output=8000),
    ),
    "edit max_output=8000: 10 MB output": (
        lambda r: streamed(r, '"ok":true,"output":', 10),
        lambda c: c.edit("view", "a.txt", max_output=8000),
    ),
}


@pytest.mark.parametrize("case", OVERSIZED)
async def test_an_oversized_response_is_cut_off_with_bounded_memory(
    case: str, hostile: HostileServer, client: ToolClient
) -> None:
    assert await client.ping() == 4242  # connected and warmed up before measuring
    hostile.answer, call = OVERSIZED[case]
    outcome, peak = await peak_during(lambda: call(client))
    assert isinstance(outcome, ToolError), outcome
    assert outcome.error == "ProtocolError"
    assert "more than" in outcome.message and "bytes" in outcome.message and "closed" in outcome.message
    assert peak < 2 * MiB, f"peak {peak} bytes while the server sent megabytes"
    hostile.answer = lambda r: [line({"id": r["id"], "ok": True, "pid": 7})]
    assert await client.ping() == 7  # the client goes on working (on a fresh connection)


# --- malformed: ProtocolError, never a raw Python error ------------------------------------------------


def bash_call(client: ToolClient) -> Any:
    """A bash call with the default cap."""
    return client.bash("true", timeout=BASH_DEADLINE_S)


MALFORMED: dict[str, tuple[Answer, Callable[[ToolClient], Any]]] = {
    "a JSON array": (lambda r: [b"[1, 2, 3]\n"], bash_call),
    "a JSON string": (lambda r: [b'"ok"\n'], bash_call),
    "JSON null": (lambda r: [b"null\n"], bash_call),
    "a JSON number": (lambda r: [b"42\n"], bash_call),
    "not JSON": (lambda r: [b"hello there\n"], bash_call),
    "not UTF-8": (lambda r: [b'{"id": \xff\xfe}\n'], bash_call),
    "an empty line": (lambda r: [b"\n"], bash_call),
    "two objects on a line": (lambda r: [line(observation(r))[:-1] + line(observation(r))], bash_call),
    "the wrong id": (lambda r: [line(observation(r, id=r["id"] + 1))], bash_call),
    "the id as a string": (lambda r: [line(observation(r, id=str(r["id"])))], bash_call),
    "no id": (lambda r: [line({k: v for k, v in observation(r).items() if k != "id"})], bash_call),
    "no ok": (lambda r: [line({k: v for k, v in observation(r).items() if k != "ok"})], bash_call),
    "ok as a string": (lambda r: [line(observation(r, ok="true"))], bash_call),
    "output as a number": (lambda r: [line(observation(r, output=5))], bash_call),
    "output as a list": (lambda r: [line(observation(r, output=["a"]))], bash_call),
    "exit_code as a string": (lambda r: [line(observation(r, exit_code="0"))], bash_call),
    "exit_code as a bool": (lambda r: [line(observation(r, exit_code=True))], bash_call),
    "timed_out as a string": (lambda r: [line(observation(r, timed_out="no"))], bash_call),
    "duration_s as a string": (lambda r: [line(observation(r, duration_s="fast"))], bash_call),
    "fields missing": (lambda r: [line({"id": r["id"], "ok": True})], bash_call),
    "nested arrays 100k deep": (lambda r: [b"[" * 100_000 + b"]" * 100_000 + b"\n"], bash_call),
    "nested arrays 100k deep in a field": (
        lambda r: [line(observation(r))[:-2] + b',"junk":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"],
        bash_call,
    ),
    "nested arrays 100k deep as the output": (
        lambda r: [line(observation(r))[:-2] + b',"output":' + b"[" * 100_000 + b"]" * 100_000 + b"}\n"],
        bash_call,
    ),
    "failure: error as a number": (lambda r: [line(failure(r, error=5))], bash_call),
    "failure: message missing": (lambda r: [line({"id": r["id"], "ok": False, "error": "X"})], bash_call),
    "failure: a 1000-character error name": (lambda r: [line(failure(r, error="E" * 1000))], bash_call),
    "ipython: a 10k-character error_name": (
        lambda r: [line(observation(r, error_name="E" * 10_000))],
        lambda c: c.ipython("1/0", timeout=BASH_DEADLINE_S),
    ),
    "ping: pid as a string": (lambda r: [line({"id": r["id"], "ok": True, "pid": "1"})], lambda c: c.ping()),
    "ping: a bash observation": (lambda r: [line(observation(r))], lambda c: c.ping()),
    "write_file: bytes negative": (
        lambda r: [line({"id": r["id"], "ok": True, "bytes": -1})],
        lambda c: c.write_file("a.txt", "text"),
    ),
    "write_file: bytes as a float": (
        lambda r: [line({"id": r["id"], "ok": True, "bytes": 4.0})],
        lambda c: c.write_file("a.txt", "text"),
    ),
    "read_file: content as null": (
        lambda r: [line({"id": r["id"], "ok": True, "content": None})],
        lambda c: c.read_file("a.txt"),
    ),
    "download: not base64": (
        lambda r: [line({"id": r["id"], "ok": True, "data_b64": "not base64 at all!"})],
        lambda c: c.download("a.bin"),
    ),
    "download: non-ASCII base64": (
        lambda r: [line({"id": r["id"], "ok": True, "data_b64": "aGVsbG8=\u00e9"})],
        lambda c: c.download("a.bin"),
    ),
    "an unknown action answered with success": (
        lambda r: [line({"id": r["id"], "ok": True})],
        lambda c: c.request("frobnicate"),
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
async def test_a_malformed_response_is_a_protocol_error(case: str, hostile: HostileServer, client: ToolClient) -> None:
    hostile.answer, call = MALFORMED[case]
    with pytest.raises(ToolError) as caught:
        await call(client)
    assert caught.value.error == "ProtocolError"
    assert client.socket_path in caught.value.message
    assert len(caught.value.message) < 2000  # says what is wrong without quoting the hostile input


async def test_a_closed_connection_mid_response_is_sandbox_gone(hostile: HostileServer, client: ToolClient) -> None:
    hostile.answer = lambda r: [b'{"id": 1, "ok": tr', b""]
    with pytest.raises(ToolError) as caught:
        await bash_call(client)
    assert caught.value.error == "SandboxGone"


# --- too long but within the byte bound: capped host-side -----------------------------------------


def assert_capped(text: str, max_output: int, head: str, tail: str) -> None:
    """`text` is the head and the tail of the original around a truncation marker, `max_output` in all."""
    assert "[... output truncated:" in text
    assert len(text) <= max_output + len(truncation_marker(10**9))
    kept_head, _, kept_tail = text.partition("\n[... output truncated:")
    assert kept_head == head * (max_output // 2)
    assert kept_tail.endswith(tail * (max_output - max_output // 2))


async def test_a_long_output_is_capped_host_side(hostile: HostileServer, client: ToolClient) -> None:
    # 100k characters for max_output=8000 fit the byte bound (it allows 12 bytes a character) but not the cap.
    hostile.answer = lambda r: [line(observation(r, output="h" * 50_000 + "t" * 50_000, truncated=False))]
    result = await client.bash("yes", timeout=BASH_DEADLINE_S, max_output=8000)
    assert result.truncated
    assert_capped(result.output, 8000, "h", "t")
    assert "92000 more characters" in result.output


async def test_a_long_ipython_output_is_capped_host_side(hostile: HostileServer, client: ToolClient) -> None:
    hostile.answer = lambda r: [line(observation(r, output="h" * 50_000 + "t" * 50_000, error_name="ValueError"))]
    result = await client.ipython("print('x' * 10**5)", timeout=BASH_DEADLINE_S, max_output=8000)
    assert result.truncated and result.error_name == "ValueError"
    assert_capped(result.output, 8000, "h", "t")


async def test_a_long_edit_output_and_edit_message_are_capped(hostile: HostileServer, client: ToolClient) -> None:
    hostile.answer = lambda r: [line({"id": r["id"], "ok": True, "output": "h" * 50_000 + "t" * 50_000})]
    viewed = await client.edit("view", "a.txt", max_output=8000)
    assert viewed.success
    assert_capped(viewed.output, 8000, "h", "t")
    hostile.answer = lambda r: [line(failure(r, error="EditError", message="h" * 50_000 + "t" * 50_000))]
    refused = await client.edit("str_replace", "a.txt", old_str="a", new_str="b", max_output=8000)
    assert not refused.success
    assert_capped(refused.output, 8000, "h", "t")


async def test_long_failure_messages_and_tracebacks_are_capped(hostile: HostileServer, client: ToolClient) -> None:
    # read_file may answer with a whole protocol line (a file's content), so 10 MB get through: then capped.
    hostile.answer = lambda r: [
        line(failure(r, message="h" * (5 * MiB) + "t" * (5 * MiB), traceback="h" * MiB + "t" * MiB))
    ]
    with pytest.raises(ToolError) as caught:
        await client.read_file("a.txt")
    assert caught.value.error == "FileNotFoundError"
    assert_capped(caught.value.message, MAX_MESSAGE_CHARS, "h", "t")
    assert caught.value.traceback is not None
    assert_capped(caught.value.traceback, MAX_TRACEBACK_CHARS, "h", "t")


async def test_what_an_honest_server_may_send_is_not_cut(hostile: HostileServer, client: ToolClient) -> None:
    # The server's own cap: head and tail around a marker, then a note about a killed shell.
    capped = "h" * 4000 + truncation_marker(123_456) + "t" * 4000
    note = "\n[the shell exited (status 1); the next command starts a new shell in /workspace: ...]"
    hostile.answer = lambda r: [line(observation(r, output=capped + note, truncated=True))]
    result = await client.bash("yes", timeout=BASH_DEADLINE_S, max_output=8000)
    assert result.output == capped + note and result.truncated
    # 8000 characters outside the BMP: 12 bytes each in ASCII JSON, within the byte bound.
    emoji = "\U0001f600" * (8000 + OUTPUT_ROOM_CHARS)
    hostile.answer = lambda r: [line(observation(r, output=emoji))]
    result = await client.bash("yes", timeout=BASH_DEADLINE_S, max_output=8000)
    assert result.output == emoji and not result.truncated
