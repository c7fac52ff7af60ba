"""The responses a session remembers, so that a request with `previous_response_id` continues one.

Each stored response is its whole conversation as chat messages (the input items of every response it
continues, its own input items, and its reply; never the `instructions`, which OpenAI does not carry over
either). A session keeps at most `MAX_REMEMBERED_RESPONSES`, the oldest forgotten first; they go with the
session when it is closed or expires.
"""

from __future__ import annotations

from collections import OrderedDict

from prorl_server.gateway.protocol import ChatMessage

MAX_REMEMBERED_RESPONSES = 256
"""Responses one session remembers for `previous_response_id` (oldest forgotten)."""

Conversation = tuple[ChatMessage, ...]


class ResponseStore:
    """One session's remembered responses, by id (used on the API's event loop only)."""

    def __init__(self, capacity: int = MAX_REMEMBERED_RESPONSES) -> None:
        self.capacity = capacity
        self._conversations: OrderedDict[str, Conversation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._conversations)

    def get(self, response_id: str) -> Conversation | None:
        """The conversation of a remembered response, None if it is unknown or forgotten."""
        return self._conversations.get(response_id)

    def put(self, response_id: str, conversation: Conversation) -> None:
        """Remember a response, forgetting the oldest beyond `capacity`."""
        self._conversations[response_id] = conversation
        while len(self._conversations) > self.capacity:
            self._conversations.popitem(last=False)
