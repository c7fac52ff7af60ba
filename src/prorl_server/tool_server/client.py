"""Host-side client of the in-sandbox execution server (wire format in protocol.py).

One `ToolClient` may be used from any thread and any running event loop, also concurrently: every call
borrows an idle socket from a small pool (or connects, ~0.1 ms on a Unix socket) and does its
request/response on the loop it runs on, so no connection is tied to a loop. Each call has a deadline a
little past the action's own timeout, so a hung server never hangs the caller.

The server runs inside the sandbox and is not trusted (responses.py): a response longer than the request
allows, or not of the action's shape, is `ProtocolError` and its connection is closed; outputs and messages
are capped here again.

Failures are typed (errors.py): every call raises a subclass of `ToolError`, chosen by the failure
response's `error` code through one table (`ERROR_CLASSES`), or by the client itself (`SandboxGone`,
`ToolTimeout`, `ClientClosed`, `ProtocolError`: the `SandboxFailure`s). Catch the class, not the string.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import socket
import threading
import time
import warnings
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from prorl_server.tool_server.errors import (
    ClientClosed,
    EditRefused,
    ProtocolError,
    SandboxGone,
    ToolError,
    ToolTimeout,
    tool_error,
)
from prorl_server.tool_server.protocol import DEFAULT_MAX_OUTPUT
from prorl_server.tool_server.responses import (
    FAILURE_ONLY,
    MAX_TRACEBACK_CHARS,
    RESPONSES,
    ActionResponse,
    CommandResponse,
    FailureResponse,
    cap,
    describe,
    max_output_of,
    message_chars,
    response_limit,
)

DEFAULT_TIMEOUT_S = 30.0
COMMAND_GRACE_S = 15.0  # past a bash/ipython timeout: interrupting, killing, restarting the shell
KERNEL_START_S = 60.0  # extra for ipython: the first call starts the kernel
REQUEST_TIMEOUT_S = 120.0  # deadline of the other actions (large uploads and downloads)
MAX_IDLE_SOCKETS = 4
RECV_SIZE = 1 << 18

__all__ = ["CommandObservation", "EditObservation", "IPythonObservation", "ToolClient", "ToolError"]


def __getattr__(name: str) -> Any:
    """`CLIENT_ERRORS` (the codes of the sandbox's failures): deprecated, catch `SandboxFailure` instead."""
    if name == "CLIENT_ERRORS":
        warnings.warn(
            "prorl_server.tool_server.client.CLIENT_ERRORS is deprecated and will be removed in the next release; "
            "catch prorl_server.tool_server.errors.SandboxFailure instead of comparing error codes",
            DeprecationWarning,
            stacklevel=2,
        )
        return frozenset({"SandboxGone", "Timeout", "ClientClosed", "ProtocolError"})
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CommandObservation(BaseModel):
    """What a bash command (or an IPython cell) produced."""

    output: str
    exit_code: int | None  # None when the command timed out or its shell died
    timed_out: bool
    truncated: bool
    duration_s: float


class IPythonObservation(CommandObservation):
    """A cell's observation; exit_code is 0, or 1 when it raised, and error_name names the exception."""

    error_name: str | None = None


class EditObservation(BaseModel):
    """An editor command's result: on failure `success` is false and `output` says why."""

    output: str
    success: bool = True


class ToolClient:
    """Talks to one sandbox's execution server over its Unix domain socket."""

    def __init__(self, socket_path: str, request_timeout: float = REQUEST_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self.request_timeout = request_timeout
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        # metrics: each answered or failed (ToolError) request: (action, seconds, succeeded)
        self.on_request: Callable[[str, float, bool], None] | None = None
        # resources held around each request, by action (the sandbox's CPU grants, cpu_grants.py); its wait
        # counts against no deadline
        self.admission: Callable[[str], AbstractAsyncContextManager[object]] | None = None

    async def ping(self) -> int:
        """The server's PID; raises SandboxGone when nothing answers on the socket."""
        return (await self.request("ping")).pid

    async def wait_ready(self, timeout: float = 30.0, poll_s: float = 0.005) -> int:
        """Ping until the server answers (returns its PID) or `timeout` passes (ToolTimeout)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                return await self.ping()
            except ClientClosed:
                raise
            except SandboxGone as exc:
                if loop.time() > deadline:
                    raise ToolTimeout(
                        f"no execution server answered on {self.socket_path} "
                        f"within {timeout:g}s (last error: {exc.message})",
                    ) from None
            await asyncio.sleep(poll_s)

    async def bash(
        self, command: str, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT
    ) -> CommandObservation:
        """Run a command in the sandbox's persistent shell (cwd and environment persist)."""
        response = await self.request(
            "bash", timeout + COMMAND_GRACE_S, command=command, timeout=timeout, max_output=max_output
        )
        return _observation(CommandObservation, response, max_output)

    async def ipython(
        self, code: str, timeout: float = DEFAULT_TIMEOUT_S, max_output: int = DEFAULT_MAX_OUTPUT
    ) -> IPythonObservation:
        """Run a cell in the sandbox's persistent IPython kernel."""
        response = await self.request(
            "ipython", timeout + COMMAND_GRACE_S + KERNEL_START_S, code=code, timeout=timeout, max_output=max_output
        )
        return _observation(IPythonObservation, response, max_output, error_name=response.error_name)

    async def edit(self, command: str, path: str, **args: Any) -> EditObservation:
        """An editor command (view, create, str_replace, insert, undo_edit); a refused edit is data."""
        try:
            response = await self.request("edit", command=command, path=path, **args)
        except EditRefused as exc:  # its message is already capped to max_output (message_chars)
            return EditObservation(output=exc.message, success=False)
        return EditObservation(output=cap(response.output, max_output_of(args))[0])

    async def read_file(self, path: str, offset: int = 0, limit: int | None = None) -> str:
        """A text file's content; `offset` and `limit` select lines (0-based). FileMissing when it does not
        exist, IsADirectory for a directory."""
        return (await self.request("read_file", path=path, offset=offset, limit=limit)).content

    async def write_file(self, path: str, content: str) -> int:
        """Write a text file (parent directories are created); returns the bytes written."""
        return (await self.request("write_file", path=path, content=content)).written

    async def upload(self, path: str, data: bytes, mode: int | None = None) -> int:
        """Write bytes to a file, optionally chmod to `mode`; returns the bytes written."""
        encoded = base64.b64encode(data).decode("ascii")
        return (await self.request("upload", path=path, data_b64=encoded, mode=mode)).written

    async def download(self, path: str) -> bytes:
        """A file's bytes."""
        encoded = (await self.request("download", path=path)).data_b64
        try:
            return base64.b64decode(encoded, validate=True)
        except ValueError as exc:  # binascii.Error, or a non-ASCII character
            raise ProtocolError(f"download of {path} from {self.socket_path}: not base64 ({exc})") from None

    async def gateway_relay(self, socket_path: str, port: int) -> int:
        """Have the server relay `127.0.0.1:port` inside the sandbox to the Unix socket `socket_path` (0: any
        free port); returns the port."""
        return (await self.request("gateway_relay", socket=socket_path, port=port)).port

    async def shutdown(self) -> None:
        """Ask the server to stop (it kills its shell and kernel); a server already gone (or a client already
        closed) is fine."""
        try:
            await self.request("shutdown")
        except SandboxGone:
            pass
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the idle sockets; later calls raise ClientClosed."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    async def request(self, action: str, deadline_s: float | None = None, **args: Any) -> Any:
        """Send one request and return its response, validated (a model of responses.py); unless it is `ok`
        raises the `ToolError` subclass of its `error` code (`tool_error`), ProtocolError when the response
        breaks the protocol, ToolTimeout past `deadline_s`, SandboxGone when the server is not there."""
        if self.admission is None:
            return await self._measured(action, deadline_s, args)
        async with self.admission(action):
            return await self._measured(action, deadline_s, args)

    async def _measured(self, action: str, deadline_s: float | None, args: dict[str, Any]) -> Any:
        if self.on_request is None:
            return await self._request(action, deadline_s, args)
        started = time.monotonic()
        try:
            response = await self._request(action, deadline_s, args)
        except ToolError:  # a cancelled request is neither answered nor failed
            self.on_request(action, time.monotonic() - started, False)
            raise
        self.on_request(action, time.monotonic() - started, True)
        return response

    async def _request(self, action: str, deadline_s: float | None, args: dict[str, Any]) -> Any:
        request_id = next(self._ids)
        payload = json.dumps({"id": request_id, "action": action, **args}, separators=(",", ":")).encode() + b"\n"
        deadline_s = self.request_timeout if deadline_s is None else deadline_s
        limit = response_limit(action, args)
        sock: socket.socket | None = None
        try:
            async with asyncio.timeout(deadline_s):
                sock = await self._borrow()
                line = await self._roundtrip(sock, payload, action, limit)
            response = self._parse(action, request_id, line)
        except TimeoutError:
            if sock is not None:
                sock.close()
            raise ToolTimeout(
                f"no response to {action} from {self.socket_path} within {deadline_s:g}s; the "
                "execution server is hung or overloaded",
            ) from None
        except BaseException:  # a protocol error too: what is left on the connection cannot be trusted
            if sock is not None:
                sock.close()
            raise
        self._give_back(sock)
        if isinstance(response, FailureResponse):
            traceback = None if response.traceback is None else cap(response.traceback, MAX_TRACEBACK_CHARS)[0]
            raise tool_error(response.error, cap(response.message, message_chars(action, args))[0], traceback)
        return response

    def _parse(self, action: str, request_id: int, line: bytearray) -> ActionResponse | FailureResponse:
        """The response line as the action's model; ProtocolError for anything else."""
        try:
            response = RESPONSES.get(action, FAILURE_ONLY).validate_json(line)
        except (ValueError, RecursionError) as exc:  # ValidationError is a ValueError
            reason = describe(exc) if isinstance(exc, ValidationError) else type(exc).__name__
            raise ProtocolError(
                f"the execution server at {self.socket_path} answered {action} with a response that breaks "
                f"the protocol ({reason}); the connection was closed",
            ) from None
        if response.id != request_id:
            raise ProtocolError(
                f"the execution server at {self.socket_path} answered request {request_id} ({action}) with "
                f"the id {response.id}; the connection was closed",
            )
        return response

    async def _borrow(self) -> socket.socket:
        with self._lock:
            if self._closed:
                raise ClientClosed(f"the client of {self.socket_path} was closed")
            if self._idle:
                return self._idle.pop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, self.socket_path)
        except OSError as exc:
            sock.close()
            raise SandboxGone(
                f"cannot connect to the execution server at {self.socket_path} ({exc}); the "
                "sandbox was closed, crashed, or has not started yet",
            ) from None
        return sock

    def _give_back(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < MAX_IDLE_SOCKETS:
                self._idle.append(sock)
                return
        sock.close()

    async def _roundtrip(self, sock: socket.socket, payload: bytes, action: str, limit: int) -> bytearray:
        """Send a request line and read the response line, of at most `limit` bytes, on the running loop."""
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_sendall(sock, payload)
            buffer = bytearray()
            while True:
                chunk = await loop.sock_recv(sock, min(RECV_SIZE, limit + 1 - len(buffer)))
                if not chunk:
                    raise ConnectionResetError("connection closed by the server")
                buffer += chunk
                if len(buffer) > limit:
                    raise ProtocolError(
                        f"the execution server at {self.socket_path} sent more than {limit} bytes in answer to "
                        f"{action}, more than the request allows (its outputs are capped); the connection was "
                        "closed",
                    )
                if chunk.endswith(b"\n"):
                    return buffer
        except OSError as exc:
            raise SandboxGone(
                f"the execution server at {self.socket_path} went away mid-request ({exc}); "
                "the sandbox was closed or crashed",
            ) from None


Observation = TypeVar("Observation", bound=CommandObservation)


def _observation(kind: type[Observation], response: CommandResponse, max_output: int, **extra: Any) -> Observation:
    """A command observation whose output is capped host-side to `max_output`, whatever the server sent."""
    output, cut = cap(response.output, max(max_output, 0))
    return kind(
        output=output,
        exit_code=response.exit_code,
        timed_out=response.timed_out,
        truncated=response.truncated or cut,
        duration_s=response.duration_s,
        **extra,
    )
