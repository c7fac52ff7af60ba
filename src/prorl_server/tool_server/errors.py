"""Exceptions of the tool client: one class per way an action can fail, all `ToolError`s.

Two families. `SandboxFailure`: the sandbox or the channel to it failed, not the action (the server is
gone, did not answer in time, broke the protocol, or the client was closed); an agent cannot do anything
about it, so the job should fail. `ActionError`: the execution server answered that the action failed
(a refused edit, a missing file, a bad request, ...); its message says why and an agent can read it.

`ERROR_CLASSES` maps the `error` code of a failure response (the server's exception class name, see
protocol.py) to its class; `tool_error()` builds the exception for a code, `ServerError` for a code the
table does not know (an unexpected exception inside the server, which sends its traceback). Every
exception keeps the code in `.error` (e.g. "FileNotFoundError" for a `FileMissing`), the text in
`.message` and the server's traceback, if any, in `.traceback`.
"""

from __future__ import annotations

import builtins
from typing import ClassVar

from prorl_server.errors import ProrlError


class ToolError(ProrlError):
    """An action that failed: `error` is its code (the server's exception class name, or a client-side
    kind), `message` says what happened. `ToolError(error, message)` builds the base class itself."""

    code: ClassVar[str] = "ToolError"

    def __init__(self, error: str, message: str, traceback: str | None = None) -> None:
        super().__init__(f"{error}: {message}")
        self.error = error
        self.message = message
        self.traceback = traceback


class _Typed(ToolError):
    """A subclass built from its message alone: the code is the class's own unless given."""

    def __init__(self, message: str, traceback: str | None = None, *, error: str | None = None) -> None:
        super().__init__(error or self.code, message, traceback)


class SandboxFailure(_Typed):
    """The sandbox or the connection to it failed, not the action: nothing an agent can fix."""


class SandboxGone(SandboxFailure):
    """Nothing answers on the sandbox's socket, or the server went away mid-request (closed or crashed)."""

    code = "SandboxGone"


class ToolTimeout(SandboxFailure):
    """The execution server did not answer within the client's deadline (hung or overloaded). A bash or
    IPython command past its own `timeout` is not this: its observation says `timed_out`."""

    code = "Timeout"


class ClientClosed(SandboxGone):
    """The `ToolClient` was closed before the call: its sandbox was closed (a `SandboxGone` too)."""

    code = "ClientClosed"


class ProtocolError(SandboxFailure):
    """The server's answer broke the protocol (too long, not JSON, wrong shape or id); the connection was
    dropped. The server runs inside the sandbox and is not trusted, so this is the sandbox's failure."""

    code = "ProtocolError"


class ActionError(_Typed):
    """The server answered that the action failed; the message says why (an agent can read it)."""


class BadRequest(ActionError):
    """The request was not one the server accepts: unknown action or argument, wrong type."""

    code = "BadRequest"


class EditRefused(ActionError):
    """The editor refused a command (text not found or not unique, bad line, path missing, ...)."""

    code = "EditError"


class FileTooLarge(ActionError):
    """A file is too large to download in one response."""

    code = "FileTooLarge"


class IPythonUnavailable(ActionError):
    """The sandbox has no IPython kernel (not installed, or it did not start)."""

    code = "IPythonUnavailable"


class FileSystemError(ActionError):
    """A file action failed with an OSError; `.error` is its class name (e.g. "FileExistsError")."""

    code = "OSError"


class FileMissing(FileSystemError):
    """The path does not exist (FileNotFoundError), or a part of it is not a directory (NotADirectoryError)."""

    code = "FileNotFoundError"


class IsADirectory(FileSystemError):
    """The path is a directory where a file was expected."""

    code = "IsADirectoryError"


class PermissionDenied(FileSystemError):
    """The sandbox's file system refused the access (read-only or not permitted)."""

    code = "PermissionError"


class ServerError(ActionError):
    """An unexpected exception inside the execution server; `.error` names it, `.traceback` has its trace."""

    code = "ServerError"


_OS_ERRORS = {
    name: FileSystemError
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, OSError)
}
ERROR_CLASSES: dict[str, type[_Typed]] = {
    **_OS_ERRORS,
    "NotADirectoryError": FileMissing,
    **{
        cls.code: cls
        for cls in (
            SandboxGone,
            ToolTimeout,
            ClientClosed,
            ProtocolError,
            BadRequest,
            EditRefused,
            FileTooLarge,
            IPythonUnavailable,
            FileMissing,
            IsADirectory,
            PermissionDenied,
        )
    },
}


def tool_error(error: str, message: str, traceback: str | None = None) -> ToolError:
    """The exception for a failure `error` code (`ERROR_CLASSES`; `ServerError` for unknown codes)."""
    return ERROR_CLASSES.get(error, ServerError)(message, traceback, error=error)
