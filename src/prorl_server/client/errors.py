"""The one exception family the trainer-side client raises for a failed request, with the server's own message."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from prorl_server.auth_key import API_KEY_FILE_ENV, DEFAULT_LOCATION
from prorl_server.errors import TrainerError
from prorl_server.protocol import API_KEY_ENV

if TYPE_CHECKING:
    from prorl_server.client.connection import Answer
    from prorl_server.client.weight_sync import ClusterUpdateReport

HINTS: dict[int, str] = {
    400: "the request or instance is invalid",
    401: f"the server requires an API key: set ${API_KEY_ENV} (or pass api_key=) to the server's key; a server "
    f"given none uses the key in its user's key file (${API_KEY_FILE_ENV}, else {DEFAULT_LOCATION}), which the "
    "client sends by default when it sees the same file",
    404: "unknown job (never submitted, already acknowledged, or past retention)",
    409: "a job with this id is still running",
    413: "the request body is larger than the server's --max-body-bytes",
    422: "the request body does not match the schema",
    502: "a proxy in front of the server failed",
    503: "the server cannot take jobs now (stopped, no healthy LLM backend, or a handler failed to load)",
    504: "a proxy in front of the server timed out",
}
"""What an HTTP status from prorl-server usually means, appended to the error message."""


class RolloutServerError(TrainerError, RuntimeError):
    """A request to prorl-server failed: refused with an HTTP status, or the server could not be reached.

    `status_code` is None when no answer came (connection error or timeout, after the retries).
    `detail` is the server's own message (FastAPI's validation errors joined into one line).
    """

    def __init__(
        self, message: str, *, status_code: int | None = None, detail: str = "", method: str = "", url: str = ""
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.detail = detail
        self.method = method
        self.url = url

    @classmethod
    def from_response(cls, response: Answer, note: str = "") -> RolloutServerError:
        """The error for a 4xx or 5xx answer: method, path, status, hint and the server's message."""
        detail = response_detail(response)
        hint = HINTS.get(response.status_code)
        message = f"{response.method} {response.path} -> HTTP {response.status_code}"
        message += f" ({hint}): {detail}" if hint else f": {detail}"
        return cls(
            message + note,
            status_code=response.status_code,
            detail=detail,
            method=response.method,
            url=response.url,
        )

    @classmethod
    def unreachable(cls, method: str, url: str, exc: httpx.TransportError, note: str = "") -> RolloutServerError:
        """The error for a request that got no answer (connection refused or reset, timeout)."""
        if isinstance(exc, httpx.TimeoutException):
            message = f"{method} {url} timed out ({type(exc).__name__})"
        else:
            message = (
                f"cannot reach prorl-server: {method} {url} ({type(exc).__name__}: {exc}); is it running? "
                "start it with `prorl-server serve --port PORT ...`"
            )
        return cls(message + note, detail=str(exc), method=method, url=url)


def response_detail(response: Answer) -> str:
    """The server's explanation: `detail` of the JSON body (validation errors on one line), else the text."""
    try:
        body: Any = response.json()
    except ValueError:
        return response.text.strip()
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):  # FastAPI validation errors
        return "; ".join(
            f"{'.'.join(map(str, d.get('loc', [])))}: {d.get('msg')}" if isinstance(d, dict) else str(d) for d in detail
        )
    return str(detail)


class ClusterUpdateFailed(RolloutServerError):
    """`client.weights.update_all` did not make the update: every server is back at (or still at) the old
    version and dispatching, or fenced. `report` is the per-server ClusterUpdateReport; `status_code`,
    `detail` and `url` are those of the first server that refused."""

    def __init__(
        self,
        message: str,
        report: ClusterUpdateReport,
        *,
        status_code: int | None = None,
        detail: str = "",
        url: str = "",
    ) -> None:
        super().__init__(message, status_code=status_code, detail=detail, url=url)
        self.report = report
