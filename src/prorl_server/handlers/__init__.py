"""Task plugins: the AgentHandler interface, the JobContext it receives, and the plugin registry."""

from prorl_server.handlers.base import AGENT_CONFIG_KEYS, AgentHandler, default_error
from prorl_server.handlers.context import GatewayAccess, JobContext, JobFinished
from prorl_server.handlers.registry import (
    ENTRY_POINT_GROUP,
    HandlerEntry,
    HandlerLoadError,
    HandlerRegistry,
    UnknownDataSource,
    load_target,
)

__all__ = [
    "AGENT_CONFIG_KEYS",
    "ENTRY_POINT_GROUP",
    "AgentHandler",
    "GatewayAccess",
    "HandlerEntry",
    "HandlerLoadError",
    "HandlerRegistry",
    "JobContext",
    "JobFinished",
    "UnknownDataSource",
    "default_error",
    "load_target",
]
