"""Errors raised by the LLM layer."""

from __future__ import annotations

from prorl_server.errors import ProrlError
from prorl_server.protocol import ErrorKind


class LLMError(ProrlError):
    """Base class of LLM-layer errors."""


class BackendUnavailable(LLMError):
    """The backend could not be reached or answered with a server error; another backend may work.

    For a server error, `status_code` is its HTTP status and `retry_after_s` its `Retry-After` (seconds)."""

    error_kind = ErrorKind.BACKEND_UNAVAILABLE

    def __init__(self, message: str, *, status_code: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after_s = retry_after_s


class BackendProtocolError(BackendUnavailable):
    """The backend's answer broke vLLM's protocol (malformed, out of range, or larger than the request can need)."""

    error_kind = ErrorKind.BACKEND_PROTOCOL_ERROR


class BackendStalled(BackendUnavailable):
    """The backend did not answer within the stall timeout; the request was closed (vLLM then aborts it)."""

    error_kind = ErrorKind.BACKEND_STALLED


class BackendRequestError(LLMError):
    """The backend rejected the request (4xx): retrying elsewhere would fail the same way (but a 429 says
    "later", with `retry_after_s` from its `Retry-After` header when it had one). `detail` is what the
    backend said, without its address (for a client that must not learn it); default: the message."""

    def __init__(
        self, message: str, status_code: int, *, retry_after_s: float | None = None, detail: str | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after_s = retry_after_s
        self.detail = message if detail is None else detail


class NoBackendAvailable(LLMError):
    """No registered backend could take the call: none is registered, healthy, and with its circuit closed."""

    error_kind = ErrorKind.NO_BACKEND_AVAILABLE


class ChatTemplateError(LLMError):
    """The backend's chat template cannot be used for incremental (delta) tokenization."""


class SessionFinished(LLMError):
    """The job has ended (finished, timed out or cancelled); its session takes no more calls."""
