"""prorl-server: rollout-as-a-service for reinforcement learning of multi-turn LLM agents."""

__version__ = "0.1.0"

from prorl_server.handlers import AgentHandler, JobContext
from prorl_server.protocol import ErrorInfo, JobResult, JobStatus, ProcessRequest, Trajectory

__all__ = [
    "AgentHandler",
    "ErrorInfo",
    "JobContext",
    "JobResult",
    "JobStatus",
    "ProcessRequest",
    "Trajectory",
    "__version__",
]
