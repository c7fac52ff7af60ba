"""The trainer-side client of prorl-server.

`RolloutClient` (async) and `SyncRolloutClient` (blocking, on a loop thread of its own, generated from the
async one) submit jobs to one or several servers, wait for them or stream their results, register LLM
backends, retry what is safe to retry, and raise `RolloutServerError` for every failed request. Their calls
are grouped by resource: `client.jobs`, `client.groups`, `client.weights`, `client.backends` (the flat
names of before still work, with a DeprecationWarning). `DapoCollector` (and `SyncDapoCollector`)
runs DAPO's dynamic sampling on server-side groups: informative groups as soon as they are decided, the
servers kept full, unfinished groups carried over into the next step.
"""

from prorl_server.client.collector import DapoCollector, StepReport, reward_variance_positive
from prorl_server.client.errors import RolloutServerError
from prorl_server.client.idle_meter import IdleWorkerMeter
from prorl_server.client.placement import assign_backends
from prorl_server.client.resources import APIResource, Backends, Groups, Jobs, Weights
from prorl_server.client.retry import RetryPolicy
from prorl_server.client.rollout_client import RolloutClient
from prorl_server.client.stream import Cursor, ResultStream
from prorl_server.client.sync import (
    SyncBackends,
    SyncDapoCollector,
    SyncGroups,
    SyncJobs,
    SyncResource,
    SyncResultStream,
    SyncRolloutClient,
    SyncWeights,
)

__all__ = [
    "APIResource",
    "Backends",
    "Cursor",
    "DapoCollector",
    "Groups",
    "IdleWorkerMeter",
    "Jobs",
    "ResultStream",
    "RetryPolicy",
    "RolloutClient",
    "RolloutServerError",
    "StepReport",
    "SyncBackends",
    "SyncDapoCollector",
    "SyncGroups",
    "SyncJobs",
    "SyncResource",
    "SyncResultStream",
    "SyncRolloutClient",
    "SyncWeights",
    "Weights",
    "assign_backends",
    "reward_variance_positive",
]
