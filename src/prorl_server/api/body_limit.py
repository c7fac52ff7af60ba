"""Request-body size limit: a pure ASGI middleware answering 413 beyond `max_body_bytes`."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from prorl_server.errors import ProrlError


class BodyTooLarge(HTTPException, ProrlError):
    """Raised by the receive channel once a streamed (chunked) body passes the limit: the app answers 413."""

    http_status = 413

    def __init__(self, limit: int) -> None:
        super().__init__(self.http_status, _message(limit))


class BodyLimitMiddleware:
    """413 for a body over `max_bytes`: on its Content-Length before the app runs, else while it is read."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self._too_large = JSONResponse({"detail": _message(max_bytes)}, status_code=413)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, receive_within_limit, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _message(limit: int) -> str:
    return f"request body larger than {limit} bytes (the server's --max-body-bytes)"
