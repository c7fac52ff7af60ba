"""The error `prorl-server eval` reports in one line (exit code 2)."""

from __future__ import annotations

from prorl_server.errors import LaunchError


class EvalError(LaunchError):
    """Bad input to `prorl-server eval`: a missing or malformed tasks file, a bad option, an unreachable server,
    a tracking package that is not installed."""
