"""Tool calls in the Hermes/Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the
agent loop's default (other families' formats are in `prorl_server.tool_formats`).

Parsing never raises: a call that cannot be read becomes a `MalformedCall` whose message the model reads
as its observation, so it can correct itself on the next turn.
"""

from __future__ import annotations

from prorl_server.tool_formats import HERMES, MalformedCall, ToolCall
from prorl_server.tool_formats.hermes import CLOSE, OPEN

FORMAT_HINT = HERMES.hint

__all__ = ["CLOSE", "FORMAT_HINT", "OPEN", "MalformedCall", "ToolCall", "parse_tool_calls"]


def parse_tool_calls(text: str) -> list[ToolCall | MalformedCall]:
    """Every `<tool_call>` block of a model's turn, in order (an unclosed last block counts too)."""
    return HERMES.parse(text)[1]
