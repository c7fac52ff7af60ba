"""Task plugins: the AgentHandler interface, the JobContext it receives, and the plugin registry."""

from prorl_server.handlers.base import AGENT_CONFIG_KEYS, AgentHandler, default_error
from prorl_server.handlers.context import GatewayAccess, JobContext, JobFinished, ReleaseCallback
from prorl_server.handlers.failure import cancel_requested, exception_location, exception_message, short_traceback
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
    "ReleaseCallback",
    "UnknownDataSource",
    "cancel_requested",
    "default_error",
    "exception_location",
    "exception_message",
    "load_target",
    "short_traceback",
]
