"""Fixtures: a scripted vLLM-protocol backend (a test double) and a prorl-server, both on real sockets."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from prorl_server.api import ServerState, create_app
from prorl_server.auth_key import API_KEY_FILE_ENV
from prorl_server.config import ServerSettings
from prorl_server.handlers import AgentHandler, HandlerRegistry
from prorl_server.testing import ScriptedBackend, UvicornThread, create_scripted_backend_app

sys.path.insert(0, str(Path(__file__).parent))

from suite_servers import SUITE_DEFAULT_REPLY, Backend, Server, default_handlers


@pytest.fixture(scope="session", autouse=True)
def session_api_key_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The key file of every `prorl-server serve` the tests start without a key (child processes, LocalStack,
    Slurm jobs inherit $PRORL_API_KEY_FILE), and where the tests' clients find that key: a file of the
    session's, never the user's own ~/.config/prorl-server/api_key."""
    path = tmp_path_factory.mktemp("api-key") / "api_key"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(API_KEY_FILE_ENV, str(path))
        yield path


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


def wait_for_no_new_threads(before: set[int | None], timeout: float = 30.0) -> list[str]:
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


# Tests that share one exclusive thing run on one xdist worker (`pytest -n N --dist loadgroup`): the real vLLM
# (a session engine, or one a module starts of its own: two at once would each get half of a small machine's
# cores), Podman, the Slurm clusters, the harness programs (their tests look for leftovers among all processes) and the
# image builds (each a CPU-heavy build of the same base).
VLLM_TEST_TIMEOUT_S = 900
_GROUP_BY_MODULE_PREFIX = {
    "test_vllm_": "vllm",
    "test_training_vllm": "vllm",
    "test_tool_format_per_backend": "vllm",
    "test_weights_keep": "vllm",
    "test_podman": "podman",
    "test_slurm": "slurm",
    "test_harness_": "harness",
    "test_images": "images",
    "test_instance_images": "images",
    "test_dockerfile": "images",
}


def xdist_group_of(item: pytest.Item) -> str | None:
    """The exclusive group `item` belongs to, if any."""
    module = item.path.stem
    for prefix, group in _GROUP_BY_MODULE_PREFIX.items():
        if module.startswith(prefix):
            return group
    params = getattr(item, "callspec", None)
    params = params.params if params is not None else {}
    if params.get("engine") == "vllm" or "vllm_engine" in item.fixturenames:
        return "vllm"
    if "podman" in params.values():  # podman's storage: several processes starting containers at once fail
        return "podman"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if group == "vllm" and item.get_closest_marker("timeout") is None:
            # each waits for the shared engine to be idle first; on a loaded 2-core machine one has taken over 300 s
            item.add_marker(pytest.mark.timeout(VLLM_TEST_TIMEOUT_S))
