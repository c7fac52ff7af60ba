"""SessionBridge: one gateway session served on a Unix socket of its own, for a sandbox without network.

The socket is bound into the sandbox, where the execution server relays `127.0.0.1:<port>` to it
(tool_server/relay.py), so that an OpenAI client inside reaches `http://127.0.0.1:<port>/v1` and an Anthropic
client `http://127.0.0.1:<port>`. The bridge is the trusted end and decides everything; what the sandbox
sends is untrusted:

- only the ROUTES pass: `POST /v1/chat/completions`, `POST /v1/responses`, `POST /v1/messages` (also with
  the query `?beta=true`, which the beta client of Anthropic's TypeScript SDK, Claude Code's, adds; forwarded
  as the plain path), `GET /v1/models`, and `GET` and `HEAD` of `/` and `/v1` (a harness's probe of its base
  URL, answered by the session's), with no other query string; anything else is a 404. Each goes to
  the session's own base URL: the session is fixed by the socket, never by the path, so no other session,
  no trainer endpoint and no backend can be named from inside;
- the errors the bridge gives itself are in Anthropic's shape (`{"type": "error", "error": {...}}`) for a
  path under `/v1/messages`, else in OpenAI's, so that either SDK raises the matching exception;
- the bridge sends the session's key itself (`Authorization`), whatever the sandbox sends (`Authorization`,
  `x-api-key`): the sandbox never holds a key (its `OPENAI_API_KEY` and `ANTHROPIC_API_KEY` are
  placeholders), so nothing it learns opens anything elsewhere; only `Content-Type` of its headers is
  passed on;
- a body over `max_body_bytes` (the gateway's `--gateway-max-body-bytes`) gets 413 before it is forwarded;
  a request head still incomplete at MAX_HEAD_BYTES (so a head is at most that plus one read of CHUNK
  bytes), malformed HTTP, or READ_TIMEOUT_S without a byte while a request is due closes the connection
  (after a refusal, what the client still sends is read and dropped for up to LINGER_S, so that it reads the
  answer rather than a reset);
  at most MAX_CONNECTIONS connections at once (more are closed at once);
- a client that closes its connection while its completion runs aborts it (the upstream request is closed,
  so the gateway aborts the backend request), as a harness on the host would.

HTTP/1.1 is parsed by h11. The bridge runs on the event loop that opened it; `close()` works from any loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
from pathlib import Path

import h11
import httpx

from prorl_server.errors import ProrlError
from prorl_server.gateway.anthropic.errors import anthropic_error
from prorl_server.gateway.errors import GatewayError
from prorl_server.threadsafe import run_in_loop

log = logging.getLogger(__name__)

ROUTES = {
    ("POST", "/v1/chat/completions"): "/chat/completions",
    ("POST", "/v1/responses"): "/responses",
    ("POST", "/v1/messages"): "/messages",
    ("POST", "/v1/messages?beta=true"): "/messages",
    ("GET", "/v1/models"): "/models",
    ("GET", "/"): "",
    ("HEAD", "/"): "",
    ("GET", "/v1"): "",
    ("HEAD", "/v1"): "",
}
"""(method, target) -> the path under the session's base URL it is forwarded to."""
ANTHROPIC_PATH = "/v1/messages"
MAX_CONNECTIONS = 16
MAX_HEAD_BYTES = 16 * 1024
READ_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 10.0
CHUNK = 64 * 1024  # bytes read or relayed at a time
LINGER_S = 2.0  # after a refusal, how long what the client still sends is read and dropped before closing
LINGER_BYTES = 16 * 1024 * 1024  # and at most this much of it
SOCKET_NAME = "gw.sock"
PASSED_HEADERS = (b"content-type",)


class _Refused(ProrlError):
    """A request answered with an error by the bridge itself; the connection is closed after it."""

    def __init__(self, error: GatewayError) -> None:
        self.error = error


class SessionBridge:
    """Serves one session's OpenAI and Anthropic paths on a Unix socket, forwarding them to `upstream` (the
    session's base URL, ending in `/v1`) with its `api_key`. Open with `await SessionBridge.open(...)`."""

    def __init__(self, upstream: str, api_key: str, max_body_bytes: int, directory: Path) -> None:
        self.upstream = upstream.rstrip("/")
        self._authorization = ("authorization", f"Bearer {api_key}")
        self.max_body_bytes = max_body_bytes
        self.directory = directory
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S))
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def socket_path(self) -> Path:
        """The socket to bind into the sandbox (any user may connect; its directory is private)."""
        return self.directory / SOCKET_NAME

    @classmethod
    async def open(cls, upstream: str, api_key: str, max_body_bytes: int, parent: Path) -> SessionBridge:
        """A bridge listening in a new private directory under `parent` (made mode 0700 if missing)."""
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory = parent / f"gw-{secrets.token_hex(6)}"
        directory.mkdir(mode=0o700)
        bridge = cls(upstream, api_key, max_body_bytes, directory)
        try:
            bridge._server = await asyncio.start_unix_server(bridge._accept, path=str(bridge.socket_path))
            os.chmod(bridge.socket_path, 0o666)  # the sandbox's user (nobody, under a root server) connects
        except BaseException:
            await bridge._close()
            raise
        bridge._loop = asyncio.get_running_loop()
        return bridge

    async def close(self) -> None:
        """Stop serving, abort the requests in flight, remove the directory (idempotent; from any loop)."""
        loop = self._loop
        if loop is None or loop is asyncio.get_running_loop():
            await self._close()
        elif loop.is_closed() or not loop.is_running():
            shutil.rmtree(self.directory, ignore_errors=True)
        else:
            await asyncio.wrap_future(run_in_loop(loop, self._close()))

    async def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections)
        await self._client.aclose()
        shutil.rmtree(self.directory, ignore_errors=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        over = len(self._connections) >= MAX_CONNECTIONS
        self._connections.add(task)
        try:
            if not over:
                connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
                await self._serve(connection, reader, writer)
        except (OSError, TimeoutError, h11.ProtocolError):
            pass  # the client went away, stalled or spoke no HTTP: drop the connection
        except asyncio.CancelledError:
            pass  # close(): ended here, so that asyncio's stream callback does not log the task as failed
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(
        self, connection: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Answer requests on one connection (kept alive) until it closes or one is refused."""
        while True:
            request = await _next_event(connection, reader)
            if not isinstance(request, h11.Request):
                return  # the client closed the connection
            try:
                suffix = self._route(request)
                body = await self._body(connection, reader, request)
            except _Refused as refused:
                await _send_error(connection, writer, request, refused.error)
                await _linger(reader)
                return
            if not await self._forward(connection, reader, writer, request, suffix, body):
                return
            if connection.our_state is not h11.DONE or connection.their_state is not h11.DONE:
                return
            connection.start_next_cycle()

    def _route(self, request: h11.Request) -> str:
        """The upstream path of an allowed request (404 for anything else)."""
        suffix = ROUTES.get((request.method.decode(), request.target.decode(errors="replace")))
        if suffix is None:
            served = ", ".join(f"{method} {target}" for method, target in ROUTES)
            raise _Refused(
                GatewayError(
                    404, f"this address serves only {served} of the sandbox's own gateway session", code="not_found"
                )
            )
        return suffix

    async def _body(self, connection: h11.Connection, reader: asyncio.StreamReader, request: h11.Request) -> bytes:
        """The request's body, refused (413) as soon as it is known to exceed `max_body_bytes`."""
        too_large = _Refused(
            GatewayError(413, f"request body over {self.max_body_bytes} bytes (--gateway-max-body-bytes)")
        )
        for name, value in request.headers:
            if name == b"content-length" and int(value) > self.max_body_bytes:
                raise too_large
        body = bytearray()
        while True:
            event = await _next_event(connection, reader)
            if isinstance(event, h11.Data):
                body += event.data
                if len(body) > self.max_body_bytes:
                    raise too_large
            elif isinstance(event, h11.EndOfMessage):
                return bytes(body)
            else:  # the client closed the connection mid-body
                raise OSError("connection closed before the request's end")

    async def _forward(
        self,
        connection: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: h11.Request,
        suffix: str,
        body: bytes,
    ) -> bool:
        """Send the request to the session and its answer back; False if the connection must close."""
        headers = [(k.decode(), v.decode("latin-1")) for k, v in request.headers if k in PASSED_HEADERS]
        upstream = self._client.build_request(
            request.method.decode(),
            self.upstream + suffix,
            headers=[*headers, self._authorization, ("accept-encoding", "identity")],
            content=body,
        )
        sending = asyncio.ensure_future(self._client.send(upstream, stream=True))
        hangup = asyncio.ensure_future(reader.read(1))  # a client sends nothing more while it waits
        try:
            await asyncio.wait({sending, hangup}, return_when=asyncio.FIRST_COMPLETED)
            if not sending.done():  # it hung up (or sent more than one request at a time): abort the call
                sending.cancel()
                with contextlib.suppress(BaseException):
                    await sending
                return False
        finally:
            hangup.cancel()
        try:
            response = sending.result()
        except httpx.HTTPError as exc:
            log.warning("session bridge %s: the gateway did not answer: %s", self.directory.name, exc)
            error = GatewayError(502, "the gateway did not answer", type="server_error")
            await _send_error(connection, writer, request, error)
            return False
        try:
            out = [(b"content-type", response.headers.get("content-type", "application/json").encode())]
            length = response.headers.get("content-length")
            out.append((b"content-length", length.encode()) if length else (b"transfer-encoding", b"chunked"))
            await _send(connection, writer, h11.Response(status_code=response.status_code, headers=out))
            async for chunk in response.aiter_raw(CHUNK):
                await _send(connection, writer, h11.Data(data=chunk))
            await _send(connection, writer, h11.EndOfMessage())
        finally:
            await response.aclose()
        return True


async def _linger(reader: asyncio.StreamReader) -> None:
    """Read and drop what the client still sends after a refusal (at most LINGER_BYTES, for at most LINGER_S),
    so that a client still writing the body it was refused for reads the answer, not a reset connection."""
    received = 0
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(LINGER_S):
            while received < LINGER_BYTES:
                chunk = await reader.read(CHUNK)
                if not chunk:
                    return
                received += len(chunk)


async def _next_event(connection: h11.Connection, reader: asyncio.StreamReader) -> h11.Event | type[h11.PAUSED]:
    """The next HTTP event from the client, reading as needed (each read within READ_TIMEOUT_S)."""
    while True:
        event = connection.next_event()
        if event is not h11.NEED_DATA:
            return event
        async with asyncio.timeout(READ_TIMEOUT_S):
            data = await reader.read(CHUNK)
        connection.receive_data(data)


async def _send(connection: h11.Connection, writer: asyncio.StreamWriter, event: h11.Event) -> None:
    data = connection.send(event)
    if data:
        writer.write(data)
        await writer.drain()


async def _send_error(
    connection: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request, error: GatewayError
) -> None:
    """Answer `request` with `error` (in Anthropic's shape on its path, else OpenAI's) and end the connection."""
    if connection.our_state is not h11.SEND_RESPONSE:
        return
    path = request.target.decode(errors="replace").split("?", 1)[0]
    if path == ANTHROPIC_PATH or path.startswith(f"{ANTHROPIC_PATH}/"):
        status, shaped = anthropic_error(error)
    else:
        status, shaped = error.http_status, error.body
    body = json.dumps(shaped.model_dump()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await _send(connection, writer, h11.Response(status_code=status, headers=[*headers, (b"connection", b"close")]))
    await _send(connection, writer, h11.Data(data=body))
    await _send(connection, writer, h11.EndOfMessage())
