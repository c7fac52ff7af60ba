"""LLM backends: the pool, placement policies, circuit breakers, the vLLM token-in/token-out client with its
response checks, per-job sessions."""

from prorl_server.llm.backend import Backend
from prorl_server.llm.backend_pool import BackendPool, Lease
from prorl_server.llm.circuit import CircuitBreaker, CircuitState
from prorl_server.llm.engine_freeze import EngineFreeze, FreezeRefused
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
from prorl_server.llm.judge import (
    HOW_TO_CONFIGURE,
    JUDGE_API_KEY_ENV,
    JudgeConfigError,
    JudgePool,
    JudgeUnavailable,
    parse_verdict,
)
from prorl_server.llm.local_tokenizer import TokenizerCache, vllm_tool, without_claude_code_header
from prorl_server.llm.pause_lease import PauseLease
from prorl_server.llm.placement import (
    MinHeapPolicy,
    PlacementPolicy,
    StickyLeastLoadedPolicy,
    backend_profiles,
    interference_profile,
    make_policy,
)
from prorl_server.llm.retry import RetryPolicy
from prorl_server.llm.session import LLMSession
from prorl_server.llm.vllm_client import JOB_ID_HEADER, VLLMClient
from prorl_server.llm.vllm_parsing import Completion, ServedModel, parse_completion
from prorl_server.llm.weight_pause_gate import DispatchAborted, WeightPauseGate
from prorl_server.llm.weight_update import WeightReloadFailed, WeightRestoreFailed, WeightUpdate, WeightUpdateConflict

__all__ = [
    "HOW_TO_CONFIGURE",
    "JOB_ID_HEADER",
    "JUDGE_API_KEY_ENV",
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
    "EngineFreeze",
    "FreezeRefused",
    "JudgeConfigError",
    "JudgePool",
    "JudgeUnavailable",
    "LLMError",
    "LLMSession",
    "Lease",
    "MinHeapPolicy",
    "NoBackendAvailable",
    "PauseLease",
    "PlacementPolicy",
    "RetryPolicy",
    "ServedModel",
    "SessionFinished",
    "StickyLeastLoadedPolicy",
    "TokenizerCache",
    "VLLMClient",
    "WeightPauseGate",
    "WeightReloadFailed",
    "WeightRestoreFailed",
    "WeightUpdate",
    "WeightUpdateConflict",
    "backend_profiles",
    "interference_profile",
    "make_policy",
    "parse_completion",
    "parse_verdict",
    "vllm_tool",
    "without_claude_code_header",
]
