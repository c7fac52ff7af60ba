"""Answers the server's own errors with the HTTP status each class carries (`ProrlError.http_status`, see
prorl_server.errors) and a message a person can act on; anything else is a 500."""

from __future__ import annotations

import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from prorl_server.errors import ProrlError
from prorl_server.request_body import MAX_ERRORS

log = logging.getLogger(__name__)

MAX_ECHO_CHARS = 100
"""Characters of an offending string echoed back (as `input`), and of each `loc` part."""


def install_error_handlers(app: FastAPI) -> None:
    """Register the answer of the server's own errors that carry a status, and a last-resort one that logs."""
    for exc_type in _with_status(ProrlError):
        app.add_exception_handler(exc_type, _own_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(ClientDisconnect, _client_gone)
    app.add_exception_handler(Exception, _unexpected)


def _with_status(root: type[ProrlError]) -> list[type[ProrlError]]:
    """The subclasses of `root` (loaded by now: the routes import them) that set an `http_status` of their
    own. Starlette finds an exception's handler by its class's MRO, so a subclass of one of them is answered
    with its own status too; one with no status on its MRO is left to `_unexpected` (a logged 500), as are
    HTTPExceptions to Starlette (BodyTooLarge)."""
    found = []
    for cls in root.__subclasses__():
        if cls.__dict__.get("http_status") is not None and not issubclass(cls, HTTPException):
            found.append(cls)
        found.extend(_with_status(cls))
    return found


async def _own_error(request: Request, exc: Exception) -> JSONResponse:
    """A ProrlError answered with its class's `http_status` and its message."""
    assert isinstance(exc, ProrlError) and exc.http_status is not None
    return JSONResponse({"detail": str(exc)}, status_code=exc.http_status)


async def _client_gone(request: Request, exc: ClientDisconnect) -> JSONResponse:
    """The client closed its connection before its body was read: nothing was done, nobody reads the answer
    (an ordinary event under load, not a server error)."""
    log.debug("%s %s: the client disconnected before its body was read", request.method, request.url.path)
    return JSONResponse({"detail": "the client disconnected before its body was read"}, status_code=400)


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 shape, kept small: at most MAX_ERRORS entries, inputs echoed only when short scalars."""
    errors = exc.errors()
    detail = [_small_error(err) for err in errors[:MAX_ERRORS]]
    if len(errors) > MAX_ERRORS:
        detail.append({"loc": [], "msg": "further errors not shown", "type": "too_many_errors"})
    return JSONResponse({"detail": detail}, status_code=422)


def _small_error(error: dict[str, Any]) -> dict[str, Any]:
    loc = [part if isinstance(part, int) else _clip(str(part)) for part in error["loc"]]
    small = {"loc": loc, "msg": _clip(str(error["msg"]), 4 * MAX_ECHO_CHARS), "type": error["type"]}
    if "input" in error and _echoable(error["input"]):
        value = error["input"]
        small["input"] = _clip(value) if isinstance(value, str) else value
    return small


def _echoable(value: Any) -> bool:
    """A scalar JSON can carry (containers, such as a whole body, are never echoed)."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) < 2**63
    return value is None or isinstance(value, str | bool)


def _clip(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    what = _clip(f"{type(exc).__name__}: {exc}", 4 * MAX_ECHO_CHARS)
    return JSONResponse(
        {"detail": f"internal error ({what}); this is a prorl-server bug, please report it"}, status_code=500
    )
