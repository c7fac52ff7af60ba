"""Fixtures: a scripted vLLM-protocol backend (a test double) and a prorl-server, both on real sockets."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from prorl_server.api import ServerState, create_app
from prorl_server.auth_key import API_KEY_FILE_ENV
from prorl_server.config import ServerSettings
from prorl_server.handlers import AgentHandler, HandlerRegistry
from prorl_server.testing import ScriptedBackend, UvicornThread, create_scripted_backend_app

sys.path.insert(0, str(Path(__file__).parent))

from handlers_for_tests import (
    MultiTurnChatHandler,
    NoOpHandler,
    RaisingHandler,
    SlowStageHandler,
    SyncHandler,
)


@pytest.fixture(scope="session", autouse=True)
def session_api_key_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The key file of every `prorl-server serve` the tests start without a key (child processes, LocalStack,
    Slurm jobs inherit $PRORL_API_KEY_FILE), and where the tests' clients find that key: a file of the
    session's, never the user's own ~/.config/prorl-server/api_key."""
    path = tmp_path_factory.mktemp("api-key") / "api_key"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(API_KEY_FILE_ENV, str(path))
        yield path


class Backend:
    """A running scripted backend: its state object and its /v1 address."""

    def __init__(self, double: ScriptedBackend, server: UvicornThread) -> None:
        self.double = double
        self.server = server
        self.address = f"{server.url}/v1"


# What the suite's backends answer when a test queued nothing (most tests do not care what the model says);
# a test that wants the double's own behaviour, an error for an unscripted completion, passes default_reply=None.
SUITE_DEFAULT_REPLY = "reply"


@pytest.fixture
def start_backend() -> Iterator[Callable[..., Backend]]:
    """Start scripted backends on demand (ScriptedBackend keyword arguments); all are stopped at teardown."""
    started: list[UvicornThread] = []

    def start(**kwargs) -> Backend:
        kwargs.setdefault("default_reply", SUITE_DEFAULT_REPLY)
        double = ScriptedBackend(**kwargs)
        server = UvicornThread(create_scripted_backend_app(double)).start()
        started.append(server)
        return Backend(double, server)

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def backend(start_backend) -> Backend:
    """One scripted backend."""
    return start_backend()


@pytest.fixture
def strict(start_backend) -> Backend:
    """A scripted backend without a default reply: every completion must be scripted (an unscripted one is
    an error)."""
    return start_backend(default_reply=None)


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


@pytest.fixture
def start_server() -> Iterator[Callable[..., Server]]:
    """Start prorl-servers on demand (test handlers registered); all are stopped at teardown."""
    started: list[Server] = []

    def start(llm_servers: list[str] = (), handlers: dict[str, AgentHandler] | None = None, **settings) -> Server:
        registry = HandlerRegistry()
        for name, handler in (handlers or default_handlers()).items():
            registry.register(name, handler)
        settings.setdefault("health_check_interval_s", 0.5)
        state = ServerState.build(ServerSettings(llm_servers=list(llm_servers), **settings), registry=registry)
        server = Server(state, UvicornThread(create_app(state=state)).start())
        started.append(server)
        return server

    yield start
    for server in started:
        server.http.close()
        server.server.stop()


@pytest.fixture
def server(start_server, backend) -> Server:
    """A prorl-server with one scripted backend registered."""
    return start_server([backend.address])


@pytest.fixture(autouse=True)
def no_leaked_threads() -> Iterator[None]:
    """Every test must leave no prorl thread behind."""
    before = {t.ident for t in threading.enumerate()}
    yield
    assert not wait_for_no_new_threads(before), "threads left running"


def wait_for_no_new_threads(before: set[int | None], timeout: float = 5.0) -> list[str]:
    """Names of prorl/uvicorn threads started since `before` still alive after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        leaked = [
            t.name
            for t in threading.enumerate()
            if t.ident not in before and t.is_alive() and t.name.startswith(("prorl-", "uvicorn-"))
        ]
        if not leaked or time.monotonic() > deadline:
            return leaked
        time.sleep(0.05)
