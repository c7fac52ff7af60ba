"""The trainer-side client of prorl-server.

`RolloutClient` (async) and `SyncRolloutClient` (blocking, on a loop thread of its own) submit jobs to one
or several servers, wait for them or stream their results, register LLM backends, retry what is safe to
retry, and raise `RolloutServerError` for every failed request. `DapoCollector` (and `SyncDapoCollector`)
runs DAPO's dynamic sampling on server-side groups: informative groups as soon as they are decided, the
servers kept full, unfinished groups carried over into the next step.
"""

from prorl_server.client.collector import (
    DapoCollector,
    IdleWorkerMeter,
    StepReport,
    SyncDapoCollector,
    reward_variance_positive,
)
from prorl_server.client.errors import RolloutServerError
from prorl_server.client.placement import assign_backends
from prorl_server.client.retry import RetryPolicy
from prorl_server.client.rollout_client import RolloutClient
from prorl_server.client.stream import Cursor, ResultStream
from prorl_server.client.sync import SyncResultStream, SyncRolloutClient

__all__ = [
    "Cursor",
    "DapoCollector",
    "IdleWorkerMeter",
    "ResultStream",
    "RetryPolicy",
    "RolloutClient",
    "RolloutServerError",
    "StepReport",
    "SyncDapoCollector",
    "SyncResultStream",
    "SyncRolloutClient",
    "assign_backends",
    "reward_variance_positive",
]
