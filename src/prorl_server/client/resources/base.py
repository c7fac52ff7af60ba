"""The base of the client's resources: each one is a group of calls about one thing on the servers."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prorl_server.client.rollout_client import RolloutClient


class APIResource:
    """Calls about one kind of thing (`client.jobs`, `client.groups`, ...), as the OpenAI SDK groups its own
    (`client.chat.completions`). A resource holds no state of its own: it talks to the servers through the
    client it belongs to (its connections, its placement, which server has which job)."""

    def __init__(self, client: RolloutClient) -> None:
        self._client = client
