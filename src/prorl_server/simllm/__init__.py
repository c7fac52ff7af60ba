"""A simulated LLM backend: vLLM's HTTP protocol with synthetic tokens and modelled timing (batch-size
interference, prefill with a prefix cache, a batch-size limit, priority with preemption, a time scale).

Not a model: token ids and logprobs are synthetic. See docs/simllm.md. Importing this package imports no
engine code; the exports below are resolved on first use (they need numpy, through the dev engine's
request checks).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from prorl_server.scheduling import DEFAULT_PROFILE, LatencyProfile
from prorl_server.simllm.config import SimLLMSettings

if TYPE_CHECKING:
    from prorl_server.simllm.app import create_app
    from prorl_server.simllm.cli import add_arguments, run_from_args
    from prorl_server.simllm.engine import SimEngine, SimTiming
    from prorl_server.simllm.server import SimLLMServer

_LAZY = {
    "create_app": "prorl_server.simllm.app",
    "SimEngine": "prorl_server.simllm.engine",
    "SimTiming": "prorl_server.simllm.engine",
    "SimLLMServer": "prorl_server.simllm.server",
    "add_arguments": "prorl_server.simllm.cli",
    "run_from_args": "prorl_server.simllm.cli",
}

__all__ = [
    "DEFAULT_PROFILE",
    "LatencyProfile",
    "SimEngine",
    "SimLLMServer",
    "SimLLMSettings",
    "SimTiming",
    "add_arguments",
    "create_app",
    "run_from_args",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'prorl_server.simllm' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
