"""Hermes / Qwen 2.5 / Qwen 3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call."""

from __future__ import annotations

import re
from collections.abc import Sequence

from prorl_server.tool_call_formats.base import (
    MalformedCall,
    Parsed,
    ToolCall,
    ToolCallFormat,
    ToolSchemas,
    dumps,
    loads_object,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)


class HermesFormat(ToolCallFormat):
    """JSON calls in `<tool_call>` blocks; an unclosed last block counts too."""

    name = "hermes"
    hint = f'{OPEN}{{"name": "<tool name>", "arguments": {{<arguments as a JSON object>}}}}{CLOSE}'

    def parse(self, text: str, tools: ToolSchemas | None = None) -> Parsed:
        calls = [self._block(match.group(1)) for match in _BLOCK.finditer(text)]
        return (text[: text.index(OPEN)] if calls else text).strip(), calls

    def render(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(
            f'{OPEN}\n{{"name": {dumps(c.name)}, "arguments": {dumps(c.arguments)}}}\n{CLOSE}' for c in calls
        )

    def detect(self, chat_template: str) -> bool:
        return OPEN in chat_template and "<function=" not in chat_template

    def _block(self, body: str) -> ToolCall | MalformedCall:
        call, error = loads_object(body)
        if error is not None:
            return self.malformed(body, f"the tool call is not valid JSON ({error})")
        if not isinstance(call, dict):
            return self.malformed(body, 'the tool call needs a string "name"')
        return self.call_of(body, call.get("name"), call.get("arguments", call.get("parameters", {})))
