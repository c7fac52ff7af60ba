"""The client's calls, grouped by what they are about (as the OpenAI SDK does): `client.jobs`, `client.groups`,
`client.weights`, `client.backends`. The sync client's resources are generated from these (see `client.sync`)."""

from prorl_server.client.resources.backends import Backends
from prorl_server.client.resources.base import APIResource
from prorl_server.client.resources.groups import GroupRequestLike, Groups
from prorl_server.client.resources.jobs import Jobs, Request
from prorl_server.client.resources.weights import Weights

__all__ = ["APIResource", "Backends", "GroupRequestLike", "Groups", "Jobs", "Request", "Weights"]
