"""prorl-server: rollout-as-a-service for reinforcement learning of multi-turn LLM agents.

The public names are loaded on first use (PEP 562), so importing a light subpackage such as
`prorl_server.tool_server` (the in-sandbox execution server, standard library only) does not pull in pydantic,
httpx or the handler machinery.
"""

from __future__ import annotations

from prorl_server._version import __version__

TYPE_CHECKING = False  # not `typing.TYPE_CHECKING`: importing typing costs milliseconds at startup
if TYPE_CHECKING:
    from typing import Any

    from prorl_server.errors import ProrlError
    from prorl_server.handlers import AgentHandler, JobContext, JobFinished
    from prorl_server.protocol import ErrorInfo, JobResult, JobStatus, ProcessRequest, Trajectory

_EXPORTS = {
    "AgentHandler": "prorl_server.handlers",
    "JobContext": "prorl_server.handlers",
    "JobFinished": "prorl_server.handlers",
    "ErrorInfo": "prorl_server.protocol",
    "JobResult": "prorl_server.protocol",
    "JobStatus": "prorl_server.protocol",
    "ProcessRequest": "prorl_server.protocol",
    "ProrlError": "prorl_server.errors",
    "Trajectory": "prorl_server.protocol",
}

__all__ = [
    "AgentHandler",
    "ErrorInfo",
    "JobContext",
    "JobFinished",
    "JobResult",
    "JobStatus",
    "ProcessRequest",
    "ProrlError",
    "Trajectory",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module on first access and cache the name in this module."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'prorl_server' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Public names, loaded or not."""
    return sorted(set(globals()) | set(_EXPORTS))
