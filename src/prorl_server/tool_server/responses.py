"""What the host accepts from an execution server: each action's response as a strict model, and its bounds.

The execution server runs inside the sandbox, so whatever runs there can replace it and answer anything.
The host therefore trusts nothing of a response: its size in bytes is bounded by what the request asked for
(`response_limit`), it must be one JSON object of the action's shape with strict types (`RESPONSES`), and
text fields are capped host-side again (`cap`), whatever the server claims to have done.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from prorl_server.tool_server.output import cap_text, truncation_marker
from prorl_server.tool_server.protocol import DEFAULT_MAX_OUTPUT, MAX_LINE

JSON_BYTES_PER_CHAR = 12  # ASCII JSON: a character outside the BMP is two \uXXXX escapes
FIXED_ROOM = 64 * 1024  # bytes for the fields around an output, a server traceback, the working directory
# Characters an output may have past `max_output`: the truncation marker and the server's own notes after
# it (a killed shell or a dead kernel; a note names the working directory, up to PATH_MAX).
OUTPUT_ROOM_CHARS = len(truncation_marker(sys.maxsize)) + 4096 + 512
ECHOED_ARGUMENTS = ("path", "old_str", "view_range", "insert_line")  # an error message may quote them
MAX_MESSAGE_CHARS = 8192  # of a failure's message (an edit's: its max_output)
MAX_TRACEBACK_CHARS = 16_384
MAX_NAME_CHARS = 256  # an exception class name (`error`, `error_name`)

_STRICT = ConfigDict(strict=True)
_Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]


class ActionResponse(BaseModel):
    """A successful response: the request's `id`, `ok: true` and the action's fields."""

    model_config = _STRICT
    id: int
    ok: Literal[True]


class FailureResponse(BaseModel):
    """A failed action: the exception class name, its message and, for a server bug, the traceback."""

    model_config = _STRICT
    id: int
    ok: Literal[False]
    error: _Name
    message: str
    traceback: str | None = None


class PingResponse(ActionResponse):
    """`ping`: the server's PID."""

    pid: int


class CommandResponse(ActionResponse):
    """`bash`: a command observation (see protocol.py)."""

    output: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_s: float


class IPythonResponse(CommandResponse):
    """`ipython`: a command observation plus the exception class name of a cell that raised."""

    error_name: _Name | None = None


class EditResponse(ActionResponse):
    """`edit`: the editor's text."""

    output: str


class ReadFileResponse(ActionResponse):
    """`read_file`: the text read."""

    content: str


class WrittenResponse(ActionResponse):
    """`write_file`, `upload`: the bytes written."""

    written: int = Field(alias="bytes", ge=0)


class DownloadResponse(ActionResponse):
    """`download`: the file's bytes as base64."""

    data_b64: str


class RelayResponse(ActionResponse):
    """`gateway_relay`: the port the relay listens on inside the sandbox."""

    port: int = Field(ge=1, le=65535)


def _either(success: type[ActionResponse]) -> TypeAdapter[Any]:
    return TypeAdapter(Annotated[success | FailureResponse, Field(discriminator="ok")])


RESPONSES: dict[str, TypeAdapter[Any]] = {
    "ping": _either(PingResponse),
    "shutdown": _either(ActionResponse),
    "bash": _either(CommandResponse),
    "ipython": _either(IPythonResponse),
    "edit": _either(EditResponse),
    "read_file": _either(ReadFileResponse),
    "write_file": _either(WrittenResponse),
    "upload": _either(WrittenResponse),
    "download": _either(DownloadResponse),
    "gateway_relay": _either(RelayResponse),
}
FAILURE_ONLY: TypeAdapter[FailureResponse] = TypeAdapter(FailureResponse)  # an unknown action cannot succeed
_LARGE = frozenset({"read_file", "download"})  # a file's content: one line of the protocol at most
_CAPPED = frozenset({"bash", "ipython", "edit"})


def max_output_of(args: dict[str, Any]) -> int:
    """The output cap a request asked for (the server's default when it gave none the server accepts)."""
    value = args.get("max_output", DEFAULT_MAX_OUTPUT)
    if type(value) is not int:  # the server refuses it (bool and float included)
        return DEFAULT_MAX_OUTPUT
    return max(value, 0)


def response_limit(action: str, args: dict[str, Any]) -> int:
    """Bytes a response line to this request may take, newline included."""
    if action in _LARGE:
        return MAX_LINE
    limit = FIXED_ROOM
    if action in _CAPPED:
        limit += JSON_BYTES_PER_CHAR * (max_output_of(args) + OUTPUT_ROOM_CHARS)
    for name in ECHOED_ARGUMENTS:
        value = args.get(name)
        if value is not None:
            limit += JSON_BYTES_PER_CHAR * len(str(value))
    return min(limit, MAX_LINE)


def message_chars(action: str, args: dict[str, Any]) -> int:
    """Characters kept of a failure's message: an edit's message is output the agent reads."""
    return max_output_of(args) if action == "edit" else MAX_MESSAGE_CHARS


def cap(text: str, max_chars: int) -> tuple[str, bool]:
    """`text` cut to `max_chars` around a truncation marker as the server cuts, unless it is within
    `max_chars` plus the room the server may use past it; returns (text, whether it was cut)."""
    if len(text) <= max_chars + OUTPUT_ROOM_CHARS:
        return text, False
    return cap_text(text, "", 0, max_chars)[0], True


def describe(exc: ValidationError) -> str:
    """A validation error in a few words, without quoting the (untrusted) input."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False)[:3]:
        where = ".".join(str(part) for part in error["loc"] if isinstance(part, str)) or "response"  # no union tag
        message = error["msg"]  # may quote a value: a few words of it at most
        problems.append(f"{where}: {message if len(message) <= 200 else message[:200] + '...'}")
    more = exc.error_count() - len(problems)
    return "; ".join(problems) + (f" (and {more} more)" if more > 0 else "")
