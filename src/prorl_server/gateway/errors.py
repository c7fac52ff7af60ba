"""Gateway errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, which OpenAI clients
raise as the matching `openai.APIStatusError` subclass (BadRequestError, AuthenticationError, ...)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import JSONResponse

from prorl_server.errors import ProrlError
from prorl_server.gateway.protocol import ErrorBody, ErrorResponse


class GatewayError(ProrlError):
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
        self.http_status = status  # per instance, not per class as for the other ProrlErrors
        self.body = ErrorResponse(error=ErrorBody(message=message, type=type, param=param, code=code))

    @property
    def status(self) -> int:
        """The HTTP status: `http_status`, by its older name."""
        return self.http_status

    def response(self) -> JSONResponse:
        """The error as an HTTP answer."""
        headers = {"WWW-Authenticate": "Bearer"} if self.http_status == 401 else None
        return JSONResponse(self.body.model_dump(), status_code=self.http_status, headers=headers)


class ContextLengthExceeded(GatewayError):
    """400: the prompt fills the backend's context (`max_context` tokens) and leaves no room for an answer;
    worded as OpenAI's Chat Completions error (`context_length_exceeded`), with each dialect's own wording
    beside it, which the harnesses parse to compact their history."""

    def __init__(self, prompt_tokens: int, max_context: int) -> None:
        super().__init__(
            400,
            f"This model's maximum context length is {max_context} tokens. However, your messages resulted in "
            f"{prompt_tokens} tokens. Please reduce the length of the messages.",
            param="messages",
            code="context_length_exceeded",
        )
        self.prompt_tokens = prompt_tokens
        self.max_context = max_context

    def in_responses(self) -> GatewayError:
        """The same error as OpenAI's Responses API words it."""
        return GatewayError(
            400,
            "Your input exceeds the context window of this model. Please adjust your input and try again.",
            param="input",
            code="context_length_exceeded",
        )

    @property
    def anthropic_message(self) -> str:
        """Anthropic's wording: the most prompt tokens that leave room for one output token as the maximum."""
        return f"prompt is too long: {self.prompt_tokens} tokens > {self.max_context - 1} maximum"


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
