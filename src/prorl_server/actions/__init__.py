"""Action-level resource management (ARL-Tangram): resources granted per action (a tool call, a test run, a
sandbox start, a judge call), not per trajectory.

- `ActionScheduler`: one node's CPU pool; actions queue first come first served and start with the cores
  the elastic allocation (`allocation.plan`) gives them, within their DoP range.
- `AmdahlModel` / `ElasticityModels`: each action kind's duration by DoP, learned online.
"""

from prorl_server.actions.elasticity import AmdahlModel, ElasticityModels
from prorl_server.actions.scheduler import ActionDemand, ActionRefused, ActionScheduler, Books, Grant

__all__ = [
    "ActionDemand",
    "ActionRefused",
    "ActionScheduler",
    "AmdahlModel",
    "Books",
    "ElasticityModels",
    "Grant",
]
