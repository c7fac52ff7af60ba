"""Tool calls in the Hermes/Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Parsing never raises: a call that cannot be read becomes a `MalformedCall` whose message the model reads
as its observation, so it can correct itself on the next turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)
FORMAT_HINT = f'{OPEN}{{"name": "<tool name>", "arguments": {{<arguments as a JSON object>}}}}{CLOSE}'


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class MalformedCall:
    """A `<tool_call>` block that is not a call; `message` tells the model why."""

    text: str
    message: str


def parse_tool_calls(text: str) -> list[ToolCall | MalformedCall]:
    """Every `<tool_call>` block of a model's turn, in order (an unclosed last block counts too)."""
    return [_parse_block(match.group(1)) for match in _BLOCK.finditer(text)]


def _parse_block(body: str) -> ToolCall | MalformedCall:
    raw = body.strip()
    if raw.startswith("```"):  # models like to fence JSON
        raw = raw.strip("`").removeprefix("json").strip()
    try:
        call = json.loads(raw)
    except ValueError as exc:
        return MalformedCall(body, f"the tool call is not valid JSON ({exc}); write {FORMAT_HINT}")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return MalformedCall(body, f'the tool call needs a string "name"; write {FORMAT_HINT}')
    arguments = call.get("arguments", call.get("parameters", {}))
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return MalformedCall(
                body, f'"arguments" of {call["name"]} is a string that is not JSON; write {FORMAT_HINT}'
            )
    if not isinstance(arguments, dict):
        return MalformedCall(body, f'"arguments" of {call["name"]} must be a JSON object; write {FORMAT_HINT}')
    return ToolCall(call["name"], arguments)
