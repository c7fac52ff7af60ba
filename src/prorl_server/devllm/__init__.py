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
    from prorl_server.devllm.app import add_engine_basics, completion_logprobs, create_app, usage
    from prorl_server.devllm.cli import add_arguments, run_from_args, serve_announcing
    from prorl_server.devllm.engine import DevEngine, EngineStats, Generation
    from prorl_server.devllm.keep_pause import DEFAULT_LABEL, add_keep_routes, spans, track
    from prorl_server.devllm.metrics import ENGINE_INDEX, LABELS, engine_registry
    from prorl_server.devllm.sampler import GREEDY_EPS, Sampler, SamplingParams
    from prorl_server.devllm.validation import (
        check_completion_request,
        check_model,
        check_prompt_ids,
        fit_context,
        sampling_params,
    )
    from prorl_server.devllm.vllm_routes import VLLMServing, add_vllm_routes

_LAZY = {
    "create_app": "prorl_server.devllm.app",
    "DevEngine": "prorl_server.devllm.engine",
    "Generation": "prorl_server.devllm.engine",
    "Sampler": "prorl_server.devllm.sampler",
    "SamplingParams": "prorl_server.devllm.sampler",
    "add_engine_basics": "prorl_server.devllm.app",
    "completion_logprobs": "prorl_server.devllm.app",
    "usage": "prorl_server.devllm.app",
    "add_arguments": "prorl_server.devllm.cli",
    "run_from_args": "prorl_server.devllm.cli",
    "serve_announcing": "prorl_server.devllm.cli",
    "EngineStats": "prorl_server.devllm.engine",
    "DEFAULT_LABEL": "prorl_server.devllm.keep_pause",
    "add_keep_routes": "prorl_server.devllm.keep_pause",
    "spans": "prorl_server.devllm.keep_pause",
    "track": "prorl_server.devllm.keep_pause",
    "ENGINE_INDEX": "prorl_server.devllm.metrics",
    "LABELS": "prorl_server.devllm.metrics",
    "engine_registry": "prorl_server.devllm.metrics",
    "GREEDY_EPS": "prorl_server.devllm.sampler",
    "check_completion_request": "prorl_server.devllm.validation",
    "check_model": "prorl_server.devllm.validation",
    "check_prompt_ids": "prorl_server.devllm.validation",
    "fit_context": "prorl_server.devllm.validation",
    "sampling_params": "prorl_server.devllm.validation",
    "VLLMServing": "prorl_server.devllm.vllm_routes",
    "add_vllm_routes": "prorl_server.devllm.vllm_routes",
}
_NEEDS_LLAMA_CPP = {"create_app", "DevEngine", "Generation", "Sampler", "SamplingParams"}
"""The exports that load the model runtime; the others (the request checks, the vLLM route skeleton, the
command line) serve the simulator and the test double too, which have no llama_cpp."""

__all__ = [
    "DEFAULT_LABEL",
    "ENGINE_INDEX",
    "GREEDY_EPS",
    "LABELS",
    "DevEngine",
    "DevLLMRequestError",
    "DevLLMSettings",
    "EngineStats",
    "Generation",
    "MissingDependency",
    "Sampler",
    "SamplingParams",
    "VLLMServing",
    "add_arguments",
    "add_engine_basics",
    "add_keep_routes",
    "add_vllm_routes",
    "check_completion_request",
    "check_model",
    "check_prompt_ids",
    "completion_logprobs",
    "create_app",
    "engine_registry",
    "fit_context",
    "require_llama_cpp",
    "run_from_args",
    "sampling_params",
    "serve_announcing",
    "spans",
    "track",
    "usage",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'prorl_server.devllm' has no attribute {name!r}")
    if name in _NEEDS_LLAMA_CPP:
        require_llama_cpp()
    return getattr(importlib.import_module(_LAZY[name]), name)
