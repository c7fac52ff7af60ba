"""Run an ASGI app with uvicorn on a background thread (tests, benchmarks, examples)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class UvicornThread:
    """`with UvicornThread(app) as server: ... server.url ...` serves `app` until the block ends."""

    def __init__(
        self,
        app,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_level: str = "warning",
        thread_name: str | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        config = uvicorn.Config(app, host=host, port=self.port, log_level=log_level, lifespan="on")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name=thread_name or f"uvicorn-{self.port}", daemon=True)

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:PORT."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> UvicornThread:
        """Start serving and wait until the server accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"uvicorn on port {self.port} exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"uvicorn on port {self.port} did not start within {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Shut down gracefully (lifespan shutdown runs) and join the thread."""
        self.server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.server.force_exit = True
            self._thread.join(5)

    def __enter__(self) -> UvicornThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
