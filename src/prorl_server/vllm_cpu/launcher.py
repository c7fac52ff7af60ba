"""Start the real vLLM (CPU build) as a child process with the settings that work on a CPU, and stop it.

`vllm_command()` is the command line; `VllmProcess` runs it, waits for `GET /health` and stops it by PID
(SIGTERM, which vLLM forwards to its engine process, then SIGKILL to the process group it was started in).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from prorl_server.errors import LaunchError
from prorl_server.vllm_cpu.install import VllmCpuInstall

SERVED_MODEL_NAME = "SmolLM2-135M-Instruct"  # the dev engine's model id, so handlers and tests see one name
READY_TIMEOUT_S = 300.0
STOP_GRACE_S = 20.0
MAIN_SCRIPT = Path(__file__).with_name("vllm_main.py")


@dataclass(frozen=True)
class VllmCpuSettings:
    """The flags of one vLLM on a CPU. The defaults are the ones measured to work on a 2-core machine."""

    host: str = "127.0.0.1"
    port: int = 8101
    served_model_name: str = SERVED_MODEL_NAME
    max_model_len: int = 4096
    # lower `priority` first among queued requests; requests without one all have 0 (first come, first served)
    scheduling_policy: str = "priority"
    max_num_seqs: int | None = None  # vLLM's default
    kv_cache_gib: int = 1  # VLLM_CPU_KVCACHE_SPACE (whole GiB): 1 GiB holds about 23,000 tokens of this model
    # VLLM_SERVER_DEV_MODE=1: vLLM's development endpoints, among them the two that `POST /weights/update`
    # with `reload` calls (/collective_rpc, /reset_prefix_cache); anyone who reaches the port may call them
    weight_reload: bool = False
    extra_args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def address(self) -> str:
        """The OpenAI-style base address (what `--llm-server` and `/add_llm_server` take)."""
        return f"http://{self.host}:{self.port}/v1"


def vllm_command(install: VllmCpuInstall, settings: VllmCpuSettings) -> list[str]:
    """`vllm serve` for the converted model: eager mode (a compiled start takes 70-85 s more, every time, as
    its cache fails to reload) and float32 (AVX2 has no bf16 arithmetic; bf16 is slower here)."""
    argv = [
        str(install.python),
        str(MAIN_SCRIPT),
        "serve",
        str(install.model),
        "--served-model-name",
        settings.served_model_name,
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--max-model-len",
        str(settings.max_model_len),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--scheduling-policy",
        settings.scheduling_policy,
    ]
    if settings.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(settings.max_num_seqs)]
    return argv + list(settings.extra_args)


def vllm_environment(settings: VllmCpuSettings, base: dict[str, str] | None = None) -> dict[str, str]:
    """The process environment: KV cache size, nothing fetched from the network or reported, and with
    `weight_reload` vLLM's development endpoints (VLLM_SERVER_DEV_MODE=1)."""
    env = dict(os.environ if base is None else base)
    env.update(
        VLLM_CPU_KVCACHE_SPACE=str(settings.kv_cache_gib),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    if settings.weight_reload:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


def is_healthy(base_url: str, timeout: float = 2.0) -> bool:
    """`GET {base_url}/health` answered 200 (base_url without `/v1`)."""
    try:
        return httpx.get(f"{base_url}/health", timeout=timeout, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class VllmStartError(LaunchError, RuntimeError):
    """vLLM exited or did not become healthy in time; the message ends with its log's last lines."""


class VllmProcess:
    """One vLLM server, a child of this process in a session of its own.

    with VllmProcess(install, settings, log=path) as vllm:   # waits for GET /health
        ... vllm.settings.address ...
    """

    def __init__(self, install: VllmCpuInstall, settings: VllmCpuSettings, *, log: Path) -> None:
        self.install = install.require()
        self.settings = settings
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready_after_s: float | None = None

    def __enter__(self) -> VllmProcess:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """`http://host:port`, without `/v1`."""
        return f"http://{self.settings.host}:{self.settings.port}"

    def start(self) -> None:
        """Start vLLM (output to the log file); returns at once."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                vllm_command(self.install, self.settings),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=vllm_environment(self.settings),
                start_new_session=True,
            )
        self._started = time.monotonic()

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S, progress: Callable[[float], None] | None = None) -> float:
        """Wait until `GET /health` answers 200; returns the seconds since start. `progress(elapsed)` is
        called about every 10 s while waiting."""
        assert self.proc is not None, "start() first"
        last_report = 0.0
        while True:
            elapsed = time.monotonic() - self._started
            if self.proc.poll() is not None:
                raise VllmStartError(
                    f"vLLM exited with code {self.proc.returncode} during start-up; the end of {self.log}:\n"
                    + tail(self.log)
                )
            if is_healthy(self.base_url):
                self.ready_after_s = elapsed
                return elapsed
            if elapsed > timeout_s:
                raise VllmStartError(
                    f"vLLM was not healthy after {timeout_s:.0f} s; the end of {self.log}:\n" + tail(self.log)
                )
            if progress is not None and elapsed - last_report >= 10:
                last_report = elapsed
                progress(elapsed)
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM by PID (vLLM stops its engine process), then SIGKILL to its process group after a grace."""
        if self.proc is None:
            return
        proc = self.proc
        stop_session(proc.pid, lambda: proc.poll() is not None)
        proc.wait()


def stop_session(pid: int, exited: Callable[[], bool], grace_s: float = STOP_GRACE_S) -> None:
    """Stop a process started with `start_new_session=True` (so `pid` is also its process group's id):
    SIGTERM to it, then, once it exited or after `grace_s`, SIGKILL to whatever is left of its group
    (vLLM's engine process is in it)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while not exited() and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def argv_for_display(argv: Sequence[str]) -> str:
    """The command line as one shell-like string (for logs and `--print-command`)."""
    return " ".join(a if a and " " not in a else repr(a) for a in argv)
