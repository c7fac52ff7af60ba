"""Run an LLM engine (the dev engine or the real vLLM) and a prorl-server as child processes on this machine, and stop them by PID.

For scripts, examples and benchmarks that need the whole stack locally::

    with LocalStack(log_dir) as stack:
        llm = stack.dev_llm()                       # http://127.0.0.1:P/v1 (or stack.vllm())
        server = stack.server("--llm-server", llm)  # http://127.0.0.1:Q
        ...

Each child runs in its own session (Ctrl-C reaches only this process, which stops them). Leaving the
block, even on an exception, sends SIGTERM to each child by PID, then SIGKILL to what is left of its
process group after it exits or after a grace period.

The server's API key, chosen when the stack is made:

- by default children inherit the environment, so the server's key is the one a client of this process finds:
  `$PRORL_API_KEY` when it is set, else the key in the user's key file, which the server makes at its first
  start (`prorl_server.auth_key`). `RolloutClient` sends it by itself; `auth_headers()` gives the header for
  other HTTP clients;
- `LocalStack(log_dir, api_key="...")`: every server of the stack serves with that key (given to it in
  `$PRORL_API_KEY`, not on its command line, which `ps` shows); pass `stack.api_key` to the clients;
- `LocalStack(log_dir, no_api_key=True)`: every server serves without a key (`--no-api-key`, with
  `$PRORL_API_KEY` taken out of its environment, since serve refuses both); for tests and single-user machines.

`stack.api_key` is the key the stack's servers use (None without one) and `stack.auth_headers()` its header.
The health checks here need no key.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import FrameType, TracebackType

import httpx

from prorl_server.auth_key import client_api_key
from prorl_server.protocol import API_KEY_ENV
from prorl_server.vllm_cpu import READY_TIMEOUT_S as VLLM_READY_TIMEOUT_S
from prorl_server.vllm_cpu import VllmCpuInstall, VllmCpuSettings, stop_session, vllm_command, vllm_environment

READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 15.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalStack:
    """Child processes of this script: started, waited for, always stopped."""

    def __init__(self, log_dir: Path, *, api_key: str | None = None, no_api_key: bool = False) -> None:
        """`api_key`: the key every server of the stack serves with; `no_api_key`: serve without one; neither:
        the key of the inherited environment or the user's key file (the module's docstring says more)."""
        if api_key is not None and no_api_key:
            raise ValueError("LocalStack: give api_key or no_api_key=True, not both")
        if api_key is not None and (not api_key or any(c.isspace() for c in api_key)):
            raise ValueError("LocalStack: api_key must be a non-empty string without spaces")
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self._api_key = api_key
        self._no_api_key = no_api_key
        self._previous_sigterm: signal.Handlers | None = None

    @property
    def api_key(self) -> str | None:
        """The key the stack's servers use: the one given, None with `no_api_key`, else what a client of this
        process finds (`$PRORL_API_KEY`, else the user's key file, which exists once a server has started)."""
        if self._no_api_key:
            return None
        return self._api_key if self._api_key is not None else client_api_key()

    def auth_headers(self) -> dict[str, str]:
        """`Authorization: Bearer <api_key>`, or no header when the servers have no key."""
        key = self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def __enter__(self) -> LocalStack:
        self._previous_sigterm = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM acts like Ctrl-C
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
        signal.signal(signal.SIGTERM, self._previous_sigterm or signal.SIG_DFL)

    def launch(
        self,
        name: str,
        argv: list[str],
        health_url: str,
        timeout_s: float = READY_TIMEOUT_S,
        env: dict[str, str] | None = None,
    ) -> None:
        """Start `argv` (output to `<log_dir>/<name>.log`) and wait until `health_url` answers 200."""
        with (self.log_dir / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        self.procs.append(proc)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode} before it was ready:\n{self.tail(name)}")
            try:
                if httpx.get(health_url, timeout=1.0, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{name} was not ready within {timeout_s:.0f} s:\n{self.tail(name)}")

    def dev_llm(self, *options: str) -> str:
        """Start `prorl-server dev-llm` (extra options passed on); returns its `/v1` address."""
        port = free_port()
        argv = [sys.executable, "-m", "prorl_server.devllm", "--port", str(port), *options]
        self.launch("dev_llm", argv, f"http://127.0.0.1:{port}/health")
        return f"http://127.0.0.1:{port}/v1"

    def vllm(self, settings: VllmCpuSettings | None = None) -> str:
        """Start the real vLLM (CPU build, from `scripts/setup-vllm.sh`) on a free port; returns its `/v1`
        address. VllmNotInstalled says what to run when it is not set up."""
        settings = replace(settings or VllmCpuSettings(), port=free_port())
        argv = vllm_command(VllmCpuInstall.default().require(), settings)
        base = settings.address.removesuffix("/v1")
        self.launch("vllm", argv, f"{base}/health", VLLM_READY_TIMEOUT_S, env=vllm_environment(settings))
        return settings.address

    def server(self, *options: str) -> str:
        """Start `prorl-server serve` (extra options passed on) with the stack's key choice; returns its address."""
        port = free_port()
        argv = [sys.executable, "-m", "prorl_server.cli", "serve", "--port", str(port), *options]
        env = None  # inherited
        if self._no_api_key:
            argv.append("--no-api-key")
            env = {name: value for name, value in os.environ.items() if name != API_KEY_ENV}
        elif self._api_key is not None:
            env = {**os.environ, API_KEY_ENV: self._api_key}
        self.launch("prorl_server", argv, f"http://127.0.0.1:{port}/health", env=env)
        return f"http://127.0.0.1:{port}"

    def tail(self, name: str, lines: int = 20) -> str:
        """The last lines of a child's log."""
        path = self.log_dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self) -> None:
        """SIGTERM each child by PID, newest first; after it exits (or the grace period) SIGKILL what is left
        of its process group (a child's own children, such as vLLM's engine process)."""
        for proc in reversed(self.procs):
            stop_session(proc.pid, lambda proc=proc: proc.poll() is not None, STOP_GRACE_S)
            proc.wait()


def run_with_stack(
    prefix: str, demo: Callable[[LocalStack], int], *, api_key: str | None = None, no_api_key: bool = False
) -> int:
    """`demo(stack)` with a fresh LocalStack (logs in a temporary directory; `api_key`, `no_api_key` as
    LocalStack's); returns its exit code, 130 on Ctrl-C or SIGTERM, 1 on an error (printed with the children's
    last log lines). Children always stop."""
    with (
        tempfile.TemporaryDirectory(prefix=prefix) as tmp,
        LocalStack(Path(tmp), api_key=api_key, no_api_key=no_api_key) as stack,
    ):
        try:
            return demo(stack)
        except KeyboardInterrupt:
            print("\ninterrupted")
            return 130
        except Exception as exc:
            print(f"\nERROR: {type(exc).__name__}: {exc}")
            for log in sorted(Path(tmp).glob("*.log")):
                print(f"--- last lines of {log.name} ---\n{stack.tail(log.stem)}")
            return 1
        finally:
            print(f"stopping {len(stack.procs)} child process(es): " + ", ".join(f"pid {p.pid}" for p in stack.procs))


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
