"""The suite's running parts as the fixtures of tests/conftest.py hand them out: a scripted backend, a
prorl-server with its HTTP client, and the test handlers a server gets by default."""

from __future__ import annotations

import httpx
from handlers_for_tests import (
    MultiTurnChatHandler,
    NoOpHandler,
    RaisingHandler,
    SlowStageHandler,
    SyncHandler,
)

from prorl_server.api import ServerState
from prorl_server.handlers import AgentHandler
from prorl_server.testing import ScriptedBackend, UvicornThread


class Backend:
    """A running scripted backend: its state object and its /v1 address."""

    def __init__(self, double: ScriptedBackend, server: UvicornThread) -> None:
        self.double = double
        self.server = server
        self.address = f"{server.url}/v1"


# What the suite's backends answer when a test queued nothing (most tests do not care what the model says);
# a test that wants the double's own behaviour, an error for an unscripted completion, passes default_reply=None.
SUITE_DEFAULT_REPLY = "reply"


class Server:
    """A running prorl-server with a sync HTTP client."""

    def __init__(self, state: ServerState, server: UvicornThread) -> None:
        self.state = state
        self.server = server
        self.url = server.url
        self.http = httpx.Client(base_url=server.url, timeout=60)


def default_handlers() -> dict[str, AgentHandler]:
    """Fresh test handlers by data_source."""
    return {
        "multiturn": MultiTurnChatHandler(),
        "noop": NoOpHandler(),
        "sync": SyncHandler(),
        "raising": RaisingHandler(),
        "slow": SlowStageHandler(),
    }
