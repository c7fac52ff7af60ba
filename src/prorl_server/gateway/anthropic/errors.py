"""Gateway errors in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`, which Anthropic's
clients raise as the matching `anthropic.APIStatusError` subclass; for the Messages route and the sandbox
bridge (which imports this module alone, not the route's)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from prorl_server.gateway.anthropic.protocol import ErrorDetail, ErrorResponse
from prorl_server.gateway.errors import ContextLengthExceeded, GatewayError

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
"""Anthropic's error type of a status; any other (the OpenAI path's 503) is 529 `overloaded_error`."""


def anthropic_error(error: GatewayError) -> tuple[int, ErrorResponse]:
    """A GatewayError's status and body in Anthropic's shape (the OpenAI `param`, if any, before the message)."""
    status = error.http_status if error.http_status in ERROR_TYPES else 529
    kind = ERROR_TYPES.get(status, "overloaded_error")
    message = error.body.error.message
    if isinstance(error, ContextLengthExceeded):
        message = error.anthropic_message
    elif error.body.error.param:
        message = f"{error.body.error.param}: {message}"
    return status, ErrorResponse(error=ErrorDetail(type=kind, message=message))


def error_response(error: GatewayError) -> JSONResponse:
    """A GatewayError in Anthropic's shape, as an HTTP answer."""
    status, body = anthropic_error(error)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)
