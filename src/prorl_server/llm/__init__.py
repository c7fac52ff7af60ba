"""LLM backends: the pool, placement policies, the vLLM token-in/token-out client, per-job sessions."""

from prorl_server.llm.backend import Backend
from prorl_server.llm.backend_pool import BackendPool
from prorl_server.llm.errors import (
    BackendRequestError,
    BackendUnavailable,
    ChatTemplateError,
    LLMError,
    NoBackendAvailable,
    SessionFinished,
)
from prorl_server.llm.placement import MinHeapPolicy, PlacementPolicy, StickyLeastLoadedPolicy, make_policy
from prorl_server.llm.session import LLMSession
from prorl_server.llm.vllm_client import Completion, VLLMClient, parse_completion

__all__ = [
    "Backend",
    "BackendPool",
    "BackendRequestError",
    "BackendUnavailable",
    "ChatTemplateError",
    "Completion",
    "LLMError",
    "LLMSession",
    "MinHeapPolicy",
    "NoBackendAvailable",
    "PlacementPolicy",
    "SessionFinished",
    "StickyLeastLoadedPolicy",
    "VLLMClient",
    "make_policy",
    "parse_completion",
]
