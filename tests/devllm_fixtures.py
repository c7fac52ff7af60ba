"""A real small LLM for end-to-end tests: the dev engine (SmolLM2-135M) on a thread, one per test session.

Load with `pytest_plugins = ("devllm_fixtures",)`. Tests skip when llama-cpp-python is not installed (the
`devllm` extra; `scripts/test.sh` installs it). The engine keeps what it sampled (`sampled(request_id)`),
so tests can check that a trajectory carries exactly the engine's ids and logprobs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from prorl_server.testing.uvicorn_thread import UvicornThread

N_CTX = 4096


@dataclass
class DevLLM:
    """The running dev engine: its `/v1` address and the engine (for its record of sampled ids)."""

    engine: object
    server: UvicornThread

    @property
    def address(self) -> str:
        """The OpenAI-style base address (what `/add_llm_server` takes)."""
        return f"{self.server.url}/v1"

    def generations(self) -> list:
        """Every finished request the engine remembers, oldest first (ids and logprobs as sampled)."""
        return list(self.engine.recent)


@pytest.fixture(scope="session")
def dev_llm() -> Iterator[DevLLM]:
    """The dev engine with 2 slots, recording the last 1,000 requests' sampled ids and logprobs."""
    pytest.importorskip("llama_cpp", reason="the dev engine needs llama-cpp-python: pip install 'prorl-server[devllm]'")
    from prorl_server.devllm import DevEngine, DevLLMSettings, create_app

    engine = DevEngine(DevLLMSettings(slots=2, n_ctx=N_CTX, debug_sampled=1000))
    # a session-long thread: named so the per-test thread-leak check does not count it
    server = UvicornThread(create_app(engine), thread_name="session-dev-llm").start()
    yield DevLLM(engine, server)
    server.stop()
    engine.close()
