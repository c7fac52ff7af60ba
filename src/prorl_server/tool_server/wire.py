"""The execution server's JSON and socket primitives, on C modules only, for a fast start.

A sandbox is ready when its execution server answers; every millisecond of the server's start-up is a
millisecond of every rollout's start. The `json` package imports `re`, `socket` and `signal` import `enum`
(which pulls `functools` and `collections`), `socket` also `selectors`: together about 20 ms of a 50 ms
budget. What the server needs of them is here, on `_json`, `_socket` and `_thread`, which load in well under
a millisecond each (`_signal` stands in for `signal`). Where `_json` is missing (another Python implementation) the `json` package is used.

The JSON is the standard library's: the same C scanner and encoder `json.loads` and `json.dumps` use, with
their defaults (strict, NaN allowed, ASCII output).
"""

from __future__ import annotations

import _socket
import _thread

try:
    import _json
except ImportError:  # pragma: no cover - CPython always has it
    _json = None

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: the server imports nothing it does not need at startup
if TYPE_CHECKING:
    from collections.abc import Callable

_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_WHITESPACE = " \t\n\r"


class _ScannerSettings:
    """What `_json.make_scanner` reads from its context (json.JSONDecoder's defaults)."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


def _python_json() -> tuple[Callable[[str], object], Callable[[object], str]]:
    import json

    return json.loads, lambda value: json.dumps(value, separators=(",", ":"))


if _json is not None:
    _scan = _json.make_scanner(_ScannerSettings())
    _encode = _json.make_encoder(
        None, None, _json.encode_basestring_ascii, None, ":", ",", False, False, True
    )  # (markers, default, encoder, indent, key_separator, item_separator, sort_keys, skipkeys, allow_nan)

    def loads(text: str) -> object:
        """Parse one JSON document; ValueError if it is not one."""
        text = text.strip(_WHITESPACE)
        try:
            value, end = _scan(text, 0)
        except StopIteration:
            raise ValueError("Expecting value: line 1 column 1 (char 0)") from None
        if end != len(text):
            raise ValueError(f"Extra data: char {end}")
        return value

    def dumps(value: object) -> str:
        """Compact ASCII JSON; ValueError or TypeError for what JSON cannot hold."""
        return "".join(_encode(value, 0))

else:  # pragma: no cover
    loads, dumps = _python_json()


def encode_line(value: object) -> bytes:
    """One newline-terminated JSON line."""
    return dumps(value).encode() + b"\n"


def unix_listener(path: str, backlog: int = 128) -> _socket.socket:
    """A stream socket bound to `path` and listening."""
    listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(backlog)
    except BaseException:
        listener.close()
        raise
    return listener


def inherited_listener(fd: int) -> _socket.socket:
    """The listening Unix stream socket on an inherited descriptor."""
    return _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, fd)


def accept(listener: _socket.socket) -> _socket.socket:
    """The next connection of a listener (OSError once the listener is closed)."""
    fd, _ = listener._accept()
    return _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, fd)


class LineReader:
    """Newline-terminated lines from a connected socket, at most `limit` bytes each."""

    def __init__(self, connection: _socket.socket, limit: int) -> None:
        self.connection = connection
        self.limit = limit
        self._buffer = bytearray()
        self._scanned = 0  # no newline before this offset of the buffer

    def readline(self) -> bytes:
        """The next line with its newline; b"" at end of stream; a longer-than-limit line without newline."""
        while True:
            end = self._buffer.find(b"\n", self._scanned)
            if end >= 0 or len(self._buffer) > self.limit:
                cut = end + 1 if end >= 0 else len(self._buffer)
                line = bytes(self._buffer[:cut])
                del self._buffer[:cut]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)
            chunk = self.connection.recv(1 << 16)
            if not chunk:
                line = bytes(self._buffer)
                self._buffer.clear()
                return line
            self._buffer += chunk


class Flag:
    """A one-way event on `_thread` locks: `set()` once, `wait()` blocks until then (signals still run)."""

    def __init__(self) -> None:
        self._set = False
        self._guard = _thread.allocate_lock()
        self._released = _thread.allocate_lock()
        self._released.acquire()

    def set(self) -> None:
        """Wake the waiters; later calls do nothing."""
        with self._guard:
            if not self._set:
                self._set = True
                self._released.release()

    def is_set(self) -> bool:
        """Whether `set()` was called."""
        return self._set

    def wait(self) -> None:
        """Block until `set()`."""
        with self._released:
            pass


allocate_lock = _thread.allocate_lock


def start_thread(target: Callable[..., object], *args: object) -> None:
    """Run `target(*args)` on a new daemon thread (the interpreter does not wait for it at exit)."""
    _thread.start_new_thread(target, args)
