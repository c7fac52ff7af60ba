"""Maps domain errors to HTTP statuses with messages a person can act on."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from prorl_server.handlers import HandlerLoadError, UnknownDataSource
from prorl_server.pipeline import DuplicateJob, InvalidInstance, NotAccepting

log = logging.getLogger(__name__)

_STATUS: dict[type[Exception], int] = {
    UnknownDataSource: 400,
    InvalidInstance: 400,
    DuplicateJob: 409,
    NotAccepting: 503,
    HandlerLoadError: 503,
}


def install_error_handlers(app: FastAPI) -> None:
    """Register one handler per mapped exception type, and a last-resort one that logs."""
    for exc_type, status in _STATUS.items():
        app.add_exception_handler(exc_type, _mapped(status))
    app.add_exception_handler(Exception, _unexpected)


def _mapped(status: int):
    async def handler(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status)

    return handler


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error on %s %s", request.method, request.url.path)
    return JSONResponse(
        {"detail": f"internal error ({type(exc).__name__}: {exc}); this is a prorl-server bug, please report it"},
        status_code=500,
    )
