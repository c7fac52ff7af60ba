"""A CPU development engine: a real small LLM (llama.cpp) speaking the subset of vLLM's HTTP protocol
that prorl-server and trainers use. Needs the `devllm` extra: `pip install 'prorl-server[devllm]'`.

Importing this package imports neither llama_cpp nor numpy (the `prorl-server` command line loads it);
the exports below are resolved on first use, which names the extra when it is missing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from prorl_server.devllm.config import DevLLMSettings
from prorl_server.devllm.errors import DevLLMRequestError, MissingDependency, require_llama_cpp

if TYPE_CHECKING:
    from prorl_server.devllm.app import create_app
    from prorl_server.devllm.engine import DevEngine, Generation
    from prorl_server.devllm.sampler import Sampler, SamplingParams

_LAZY = {
    "create_app": "prorl_server.devllm.app",
    "DevEngine": "prorl_server.devllm.engine",
    "Generation": "prorl_server.devllm.engine",
    "Sampler": "prorl_server.devllm.sampler",
    "SamplingParams": "prorl_server.devllm.sampler",
}

__all__ = [
    "DevEngine",
    "DevLLMRequestError",
    "DevLLMSettings",
    "Generation",
    "MissingDependency",
    "Sampler",
    "SamplingParams",
    "create_app",
    "require_llama_cpp",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'prorl_server.devllm' has no attribute {name!r}")
    require_llama_cpp()
    return getattr(importlib.import_module(_LAZY[name]), name)
