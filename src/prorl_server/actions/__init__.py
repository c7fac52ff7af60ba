"""Action-level resource management (ARL-Tangram): resources granted per action (a tool call, a test run, a
sandbox start, a judge call), not per trajectory.

- `ActionScheduler`: one node's CPU pool; actions queue first come first served and start with the cores
  the elastic allocation (`allocation.plan`) gives them, within their DoP range; it keeps per-kind
  statistics (queueing, cores, completion time) and the pool's busy core-seconds for the metrics.
- `AmdahlModel` / `ElasticityModels`: each action kind's duration by DoP, learned online.
- `ServiceQuota` / `QuotaRegistry`: external services (the judge pool, a search API, any HTTP service), each
  with a concurrency limit that AIMD cuts on 429, 503 and timeouts and grows back on successes, and a rate
  limit; bursts queue instead of failing.
"""

from prorl_server.actions.elasticity import AmdahlModel, ElasticityModels
from prorl_server.actions.quota import (
    QuotaConfig,
    QuotaRegistry,
    QuotaSnapshot,
    ServiceDisabled,
    ServiceQuota,
    Slot,
)
from prorl_server.actions.scheduler import (
    ActionDemand,
    ActionRefused,
    ActionScheduler,
    Books,
    Distribution,
    Grant,
    KindStats,
)

__all__ = [
    "ActionDemand",
    "ActionRefused",
    "ActionScheduler",
    "AmdahlModel",
    "Books",
    "Distribution",
    "ElasticityModels",
    "Grant",
    "KindStats",
    "QuotaConfig",
    "QuotaRegistry",
    "QuotaSnapshot",
    "ServiceDisabled",
    "ServiceQuota",
    "Slot",
]
