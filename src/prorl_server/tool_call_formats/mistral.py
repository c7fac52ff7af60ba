"""Mistral: calls after the `[TOOL_CALLS]` token, in one of two forms.

- `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`: Mistral 7B v0.3, Mistral Nemo, Mistral Large 2;
- `[TOOL_CALLS]name[ARGS]{...}` (or `name[CALL_ID]id[ARGS]{...}`), once per call: Mistral Small 3.2,
  Devstral, Ministral 3, Magistral.

Both are parsed; `render` writes the newer form unless the format was made for a template of the older one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from prorl_server.tool_call_formats.base import (
    MalformedCall,
    Parsed,
    ToolCall,
    ToolCallFormat,
    ToolSchemas,
    dumps,
)

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_DECODER = json.JSONDecoder()


class MistralFormat(ToolCallFormat):
    """`[TOOL_CALLS]name[ARGS]{...}`; with `list_form`, `[TOOL_CALLS][{"name": ..., "arguments": ...}]`."""

    name = "mistral"

    def __init__(self, list_form: bool = False) -> None:
        self.list_form = list_form
        self.hint = (
            f'{TOOL_CALLS}[{{"name": "<tool name>", "arguments": {{<arguments as a JSON object>}}}}]'
            if list_form
            else f"{TOOL_CALLS}<tool name>{ARGS}{{<arguments as a JSON object>}}"
        )

    def parse(self, text: str, tools: ToolSchemas | None = None) -> Parsed:
        start = text.find(TOOL_CALLS)
        if start < 0:
            return text.strip(), []
        calls: list[ToolCall | MalformedCall] = []
        for part in text[start:].split(TOOL_CALLS)[1:]:
            calls.extend(self._list(part) if part.lstrip().startswith("[") else [self._named(part)])
        return text[:start].strip(), calls

    def render(self, calls: Sequence[ToolCall]) -> str:
        if self.list_form:
            return TOOL_CALLS + "[" + ", ".join(dumps({"name": c.name, "arguments": c.arguments}) for c in calls) + "]"
        return "".join(f"{TOOL_CALLS}{c.name}{ARGS}{dumps(c.arguments)}" for c in calls)

    def detect(self, chat_template: str) -> bool:
        return TOOL_CALLS in chat_template

    def for_template(self, chat_template: str) -> MistralFormat:
        return MistralFormat(list_form=ARGS not in chat_template)

    def _list(self, part: str) -> list[ToolCall | MalformedCall]:
        body = part.strip()
        try:
            value, _ = _DECODER.raw_decode(body)
        except ValueError as exc:
            return [self.malformed(body, f"the tool calls are not a valid JSON list ({exc})")]
        if not isinstance(value, list) or not value:
            return [self.malformed(body, "the tool calls must be a non-empty JSON list of calls")]
        return [
            self.call_of(dumps(item), item.get("name"), item.get("arguments", {}))
            if isinstance(item, dict)
            else self.malformed(dumps(item), "each tool call must be a JSON object")
            for item in value
        ]

    def _named(self, part: str) -> ToolCall | MalformedCall:
        head, found, arguments = part.partition(ARGS)
        if not found:
            return self.malformed(part, f"the tool call has no {ARGS}")
        name = head.split(CALL_ID)[0].strip()
        try:
            value, _ = _DECODER.raw_decode(arguments.strip())
        except ValueError as exc:
            return self.malformed(part, f"the arguments of {name or 'the tool call'} are not valid JSON ({exc})")
        return self.call_of(part, name, value)
