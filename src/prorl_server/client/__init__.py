"""The trainer-side client of prorl-server.

`RolloutClient` (async) and `SyncRolloutClient` (blocking, on a loop thread of its own, generated from the
async one) submit jobs to one or several servers, wait for them or stream their results, register LLM
backends, retry what is safe to retry, and raise `RolloutServerError` for every failed request (a
`ProrlError`, the root of prorl-server's errors, exported here too).
`client.weights.update_all` updates every server's weights as one operation (`weight_sync`). Their calls
are grouped by resource: `client.jobs`, `client.groups`, `client.weights`, `client.backends` (the flat
names of before still work, with a DeprecationWarning). `DapoCollector` (and `SyncDapoCollector`)
runs DAPO's dynamic sampling on server-side groups: informative groups as soon as they are decided, the
servers kept full, unfinished groups carried over into the next step.

Over several servers the client fails over (`FailoverPolicy`): it probes each server, and the unfinished
jobs and groups of one that stops answering are submitted again, under the same ids, to live servers; each
result is handed out once (`client.server_states()`, `client.recoveries`).

`LocalStack`, `free_port` and `run_with_stack` moved to `prorl_server.launch`; reading them here still works,
with a DeprecationWarning, for a release.
"""

from typing import Any

from prorl_server.client.collector import DapoCollector, StepReport, reward_variance_positive
from prorl_server.client.deprecated import moved_attribute
from prorl_server.client.errors import ClusterUpdateFailed, RolloutServerError
from prorl_server.client.idle_meter import IdleWorkerMeter
from prorl_server.client.membership import FailoverPolicy, Reachability, ServerRoster
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
from prorl_server.client.weight_sync import ClusterUpdateReport, ServerSync, SyncOutcome
from prorl_server.errors import ProrlError

__all__ = [
    "APIResource",
    "Backends",
    "ClusterUpdateFailed",
    "ClusterUpdateReport",
    "Cursor",
    "DapoCollector",
    "FailoverPolicy",
    "Groups",
    "IdleWorkerMeter",
    "Jobs",
    "ProrlError",
    "Reachability",
    "ResultStream",
    "RetryPolicy",
    "RolloutClient",
    "RolloutServerError",
    "ServerRoster",
    "ServerSync",
    "StepReport",
    "SyncBackends",
    "SyncDapoCollector",
    "SyncGroups",
    "SyncJobs",
    "SyncOutcome",
    "SyncResource",
    "SyncResultStream",
    "SyncRolloutClient",
    "SyncWeights",
    "Weights",
    "assign_backends",
    "reward_variance_positive",
]


def __getattr__(name: str) -> Any:
    """The names that moved to `prorl_server.launch`, with a DeprecationWarning (`deprecated.MOVED`)."""
    return moved_attribute(__name__, name)
