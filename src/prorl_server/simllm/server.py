"""Run the simulator in this process, on a uvicorn thread (tests, benchmarks)."""

from __future__ import annotations

from typing import Any

from prorl_server.simllm.app import create_app
from prorl_server.simllm.config import SimLLMSettings
from prorl_server.simllm.engine import SimEngine
from prorl_server.testing import UvicornThread


class SimLLMServer:
    """`with SimLLMServer(time_scale=100) as sim: ... sim.address ...` serves a simulator until the block ends.

    Takes a `SimLLMSettings` or its fields as keywords; `port` 0 (the default here) picks a free port.
    """

    def __init__(self, settings: SimLLMSettings | None = None, **fields: Any) -> None:
        fields.setdefault("port", 0)
        self.settings = settings or SimLLMSettings(**fields)
        self.engine = SimEngine(self.settings)
        self._thread = UvicornThread(
            create_app(self.engine),
            host=self.settings.host,
            port=self.settings.port or None,
            log_level=self.settings.log_level,
        )

    @property
    def url(self) -> str:
        """`http://host:port`: /tokenize, /metrics and /health are here."""
        return self._thread.url

    @property
    def address(self) -> str:
        """`http://host:port/v1`, what prorl-server is given."""
        return f"{self._thread.url}/v1"

    def start(self) -> SimLLMServer:
        """Serve and wait until the port accepts connections."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (the step loop ends with the server)."""
        self._thread.stop()

    def __enter__(self) -> SimLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
