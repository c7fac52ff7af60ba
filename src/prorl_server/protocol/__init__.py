"""Wire schemas (pydantic v2) shared by the server, the trainer-side client and the tests.

Everything that crosses HTTP is defined here and nowhere else.
"""

from prorl_server.protocol.groups import (
    GroupAccepted,
    GroupMember,
    GroupRequest,
    GroupResult,
    GroupStatus,
    MemberRole,
    Selection,
)
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
from prorl_server.protocol.weights import (
    PauseRequest,
    PauseResponse,
    SwapRequest,
    SwapResponse,
    UpdateRequest,
    UpdateResponse,
    WeightServer,
    WeightsStatus,
)

__all__ = [
    "TERMINAL_STATUSES",
    "AckRequest",
    "AckResponse",
    "AddLLMServerRequest",
    "CancelRequest",
    "CancelResponse",
    "ErrorInfo",
    "GroupAccepted",
    "GroupMember",
    "GroupRequest",
    "GroupResult",
    "GroupStatus",
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
    "MemberRole",
    "PauseRequest",
    "PauseResponse",
    "ProcessRequest",
    "Selection",
    "StageTiming",
    "StatusResponse",
    "SwapRequest",
    "SwapResponse",
    "Trajectory",
    "TurnRecord",
    "UpdateRequest",
    "UpdateResponse",
    "WeightServer",
    "WeightsStatus",
]
