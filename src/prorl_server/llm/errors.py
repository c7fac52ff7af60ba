"""Errors raised by the LLM layer."""

from __future__ import annotations


class LLMError(Exception):
    """Base class of LLM-layer errors."""


class BackendUnavailable(LLMError):
    """The backend could not be reached or answered with a server error; another backend may work.

    For a server error, `status_code` is its HTTP status and `retry_after_s` its `Retry-After` (seconds)."""

    def __init__(self, message: str, *, status_code: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after_s = retry_after_s


class BackendProtocolError(BackendUnavailable):
    """The backend's answer broke vLLM's protocol (malformed, out of range, or larger than the request can need)."""


class BackendStalled(BackendUnavailable):
    """The backend did not answer within the stall timeout; the request was closed (vLLM then aborts it)."""


class BackendRequestError(LLMError):
    """The backend rejected the request (4xx): retrying elsewhere would fail the same way (but a 429 says
    "later", with `retry_after_s` from its `Retry-After` header when it had one)."""

    def __init__(self, message: str, status_code: int, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after_s = retry_after_s


class NoBackendAvailable(LLMError):
    """No registered backend could take the call: none is registered, healthy, and with its circuit closed."""


class ChatTemplateError(LLMError):
    """The backend's chat template cannot be used for incremental (delta) tokenization."""


class SessionFinished(LLMError):
    """The job has ended (finished, timed out or cancelled); its session takes no more calls."""
