"""Wire schemas (pydantic v2) shared by the server, the trainer-side client and the tests.

Everything that crosses HTTP is defined here and nowhere else.
"""

from prorl_server.protocol.jobs import (
    TERMINAL_STATUSES,
    ErrorInfo,
    JobAccepted,
    JobList,
    JobResult,
    JobStatus,
    JobStatusResponse,
    ProcessRequest,
    StageTiming,
    Trajectory,
    TurnRecord,
)
from prorl_server.protocol.llm_servers import AddLLMServerRequest, LLMServerInfo, LLMServerList
from prorl_server.protocol.server import (
    AckRequest,
    AckResponse,
    CancelRequest,
    CancelResponse,
    HandlerInfo,
    HealthResponse,
    LifecycleResponse,
    StatusResponse,
)

__all__ = [
    "TERMINAL_STATUSES",
    "AckRequest",
    "AckResponse",
    "AddLLMServerRequest",
    "CancelRequest",
    "CancelResponse",
    "ErrorInfo",
    "HandlerInfo",
    "HealthResponse",
    "JobAccepted",
    "JobList",
    "JobResult",
    "JobStatus",
    "JobStatusResponse",
    "LLMServerInfo",
    "LLMServerList",
    "LifecycleResponse",
    "ProcessRequest",
    "StageTiming",
    "StatusResponse",
    "Trajectory",
    "TurnRecord",
]
