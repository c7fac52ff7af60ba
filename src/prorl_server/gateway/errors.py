"""Gateway errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, which OpenAI clients
raise as the matching `openai.APIStatusError` subclass (BadRequestError, AuthenticationError, ...)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from prorl_server.gateway.protocol import ErrorBody, ErrorResponse


class GatewayError(Exception):
    """An answer to a harness or trainer that is not a completion: an HTTP status and OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = ErrorResponse(error=ErrorBody(message=message, type=type, param=param, code=code))

    def response(self) -> JSONResponse:
        """The error as an HTTP answer."""
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else None
        return JSONResponse(self.body.model_dump(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    """400 invalid_request_error."""
    return GatewayError(400, message, param=param, code=code)


def invalid_key() -> GatewayError:
    """401, the same whether the session exists or not (a key never tells which sessions exist)."""
    return GatewayError(
        401,
        "invalid API key for this session: send 'Authorization: Bearer <key>' with the key the session was opened "
        "with (OPENAI_API_KEY)",
        type="authentication_error",
        code="invalid_api_key",
    )


def session_not_found(session_id: str) -> GatewayError:
    """404 for the operator's key (or a trainer's DELETE): the session is unknown, closed or expired."""
    return GatewayError(
        404,
        f"no open session {session_id[:64]!r}: it was never opened, was closed, or expired while idle",
        code="session_not_found",
    )


async def gateway_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI exception handler for GatewayError."""
    assert isinstance(exc, GatewayError)
    return exc.response()
