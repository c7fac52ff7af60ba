"""Deprecated: this module moved to `prorl_server.launch.local_stack`; import `LocalStack`, `free_port` and
`run_with_stack` from `prorl_server.launch`. Reading them here warns (DeprecationWarning), for a release."""

from __future__ import annotations

from typing import Any

from prorl_server.client.deprecated import moved_attribute


def __getattr__(name: str) -> Any:
    """A name that moved to `prorl_server.launch`, with a DeprecationWarning."""
    return moved_attribute(__name__, name)
