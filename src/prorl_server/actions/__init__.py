"""Action-level resource management (ARL-Tangram): resources granted per action (a tool call, a test run, a
sandbox start, a judge call), not per trajectory.

- `ActionScheduler`: one node's CPU pool; actions queue first come first served and start with the cores
  the elastic allocation (`allocation.plan`) gives them, within their DoP range; it keeps per-kind
  statistics (queueing, cores, completion time) and the pool's busy core-seconds for the metrics.
- `AmdahlModel` / `ElasticityModels`: each action kind's duration by DoP, learned online.
- `ServiceQuota` / `QuotaRegistry`: external services (the judge pool, a search API, any HTTP service), each
  with a concurrency limit that AIMD cuts on 429, 503 and timeouts and grows back on successes, and a rate
  limit; bursts queue instead of failing.
- `ModelServiceCache`: model services (reward models, judges) that do not all fit at once, under a memory
  budget: evicted least recently used when idle, restored from their host copy on use (evict-on-execution);
  `ServiceLauncher` starts and stops one service's process; `model_processes.DevEngineLauncher` runs a real
  one (the dev engine on the CPU, a judge served by a small model; imported from its module, it is not light).
- `GpuChunkManager` / `simulate`: the same on GPUs (chunk allocation, eviction from GPU memory, restore over
  PCIe), simulated only: nothing here has run on a GPU.
"""

from prorl_server.actions.elasticity import AmdahlModel, ElasticityModels
from prorl_server.actions.gpu_chunks import Call, CallResult, Chunk, GpuChunkManager, GpuService, Placement, simulate
from prorl_server.actions.model_processes import DevEngineLauncher, DevEngineService
from prorl_server.actions.model_services import (
    ModelServiceCache,
    ModelServiceRefused,
    ModelServiceSnapshot,
    ModelServiceUnavailable,
    ServiceLauncher,
    ServiceSnapshot,
    ServiceState,
    parse_model_service,
)
from prorl_server.actions.quota import (
    QuotaConfig,
    QuotaRegistry,
    QuotaSnapshot,
    ServiceDisabled,
    ServiceQuota,
    Slot,
    parse_service_quota,
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
    "Call",
    "CallResult",
    "Chunk",
    "DevEngineLauncher",
    "DevEngineService",
    "Distribution",
    "ElasticityModels",
    "GpuChunkManager",
    "GpuService",
    "Grant",
    "KindStats",
    "ModelServiceCache",
    "ModelServiceRefused",
    "ModelServiceSnapshot",
    "ModelServiceUnavailable",
    "Placement",
    "QuotaConfig",
    "QuotaRegistry",
    "QuotaSnapshot",
    "ServiceDisabled",
    "ServiceLauncher",
    "ServiceQuota",
    "ServiceSnapshot",
    "ServiceState",
    "Slot",
    "parse_model_service",
    "parse_service_quota",
    "simulate",
]
