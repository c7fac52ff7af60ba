"""LLM backends: the pool, placement policies, circuit breakers, the vLLM token-in/token-out client with its
response checks, per-job sessions."""

from prorl_server.llm.backend import Backend
from prorl_server.llm.backend_pool import BackendPool, Lease
from prorl_server.llm.circuit import CircuitBreaker, CircuitState
from prorl_server.llm.errors import (
    BackendProtocolError,
    BackendRequestError,
    BackendStalled,
    BackendUnavailable,
    ChatTemplateError,
    LLMError,
    NoBackendAvailable,
    SessionFinished,
)
from prorl_server.llm.placement import MinHeapPolicy, PlacementPolicy, StickyLeastLoadedPolicy, make_policy
from prorl_server.llm.retry import RetryPolicy
from prorl_server.llm.session import LLMSession
from prorl_server.llm.vllm_client import VLLMClient
from prorl_server.llm.vllm_parsing import Completion, ServedModel, parse_completion
from prorl_server.llm.weight_pause_gate import DispatchAborted, WeightPauseGate

__all__ = [
    "Backend",
    "BackendPool",
    "BackendProtocolError",
    "BackendRequestError",
    "BackendStalled",
    "BackendUnavailable",
    "ChatTemplateError",
    "CircuitBreaker",
    "CircuitState",
    "Completion",
    "DispatchAborted",
    "LLMError",
    "LLMSession",
    "Lease",
    "MinHeapPolicy",
    "NoBackendAvailable",
    "PlacementPolicy",
    "RetryPolicy",
    "ServedModel",
    "SessionFinished",
    "StickyLeastLoadedPolicy",
    "VLLMClient",
    "WeightPauseGate",
    "make_policy",
    "parse_completion",
]
