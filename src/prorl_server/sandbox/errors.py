"""SandboxError, the sandbox runtimes' error; a leaf of sandbox/, so every module of it can raise it."""

from __future__ import annotations

from prorl_server.errors import ProrlError
from prorl_server.protocol import ErrorKind


class SandboxError(ProrlError, RuntimeError):
    """A sandbox could not be started or used; the message says what to do about it."""

    error_kind = ErrorKind.SANDBOX_ERROR
