"""The execution server's start-up-lean JSON, line reader and flag (tools/wire.py) against the standard library."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import threading

import pytest

from prorl_server.tool_server import wire

DOCUMENTS = [
    {"id": 1, "action": "bash", "command": "echo 'hé ✓ \\u0000'\n", "timeout": 2.5, "max_output": 10},
    {"nested": [1, [2, {"a": None, "b": True, "c": False}], -3.5e-7, 10**30], "": ""},
    ["😀 emoji", 'tab\tquote"backslash\\'],
    "just a string",
    123,
    None,
]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_json_round_trips_exactly_like_the_json_package(document):
    text = wire.dumps(document)
    assert text == json.dumps(document, separators=(",", ":"))
    assert wire.loads(text) == json.loads(text) == document
    assert wire.loads(f" \n{json.dumps(document, indent=2)}\r\n ") == document


def test_json_constants_and_errors_match_the_json_package():
    assert math.isnan(wire.loads("NaN")) and wire.loads("[Infinity,-Infinity]") == [math.inf, -math.inf]
    assert wire.dumps(math.inf) == "Infinity"
    for bad in ("", "   ", "{", '{"a" 1}', "[1,]", "{} {}", "nul", '"unterminated', '"\\x"', '"ctrl\x01"'):
        with pytest.raises(ValueError):
            json.loads(bad)
        with pytest.raises(ValueError):
            wire.loads(bad)
    with pytest.raises(TypeError):
        wire.dumps({"bytes": b"x"})


def test_line_reader_splits_lines_across_chunks_and_caps_long_lines():
    left, right = socket.socketpair()
    with left, right:
        right.sendall(b'{"a":1}\n{"b"' + b":2}\npartial")
        right.shutdown(socket.SHUT_WR)
        reader = wire.LineReader(left, limit=100)
        assert [reader.readline() for _ in range(4)] == [b'{"a":1}\n', b'{"b":2}\n', b"partial", b""]

    left, right = socket.socketpair()
    with left, right:
        sender = threading.Thread(target=right.sendall, args=(b"x" * 300_000 + b"\nok\n",))
        sender.start()
        reader = wire.LineReader(left, limit=1000)
        line = reader.readline()
        assert not line.endswith(b"\n") and len(line) > 1000  # too long: returned without its newline
        while line != b"ok\n":
            line = reader.readline()
        sender.join()


def test_a_large_line_is_read_in_linear_time():
    left, right = socket.socketpair()
    payload = b"y" * (32 << 20) + b"\n"
    with left, right:
        sender = threading.Thread(target=right.sendall, args=(payload,))
        sender.start()
        assert wire.LineReader(left, limit=64 << 20).readline() == payload
        sender.join()


def test_flag_wakes_a_waiter_once_and_tolerates_repeated_sets():
    flag = wire.Flag()
    assert not flag.is_set()
    waiter = threading.Thread(target=flag.wait)
    waiter.start()
    setters = [threading.Thread(target=flag.set) for _ in range(8)]
    for setter in setters:
        setter.start()
    for thread in (*setters, waiter):
        thread.join(timeout=5)
    assert flag.is_set() and not waiter.is_alive()
    flag.wait()  # returns at once once set


def test_the_server_module_imports_neither_json_nor_socket_nor_threading_at_start():
    code = (
        "import sys; import prorl_server.tool_server.__main__, prorl_server.tool_server.server; "
        "print(sorted(m for m in ('json', 're', 'socket', 'threading', 'enum', 'contextlib') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"import sys; sys.path[:0] = {sys.path!r}; {code}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout
