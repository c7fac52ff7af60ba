"""Llama 3.1 / 3.2 / 3.3 JSON calls: the whole turn is `{"name": ..., "parameters": {...}}`, maybe after
`<|python_tag|>`; several calls are separated by `;`.

A turn that does not start with `{` (after the tag), or whose first JSON object has no "name", is text
(a model may answer with JSON); one that starts as a call but is not JSON is a MalformedCall.
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

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


class Llama3JsonFormat(ToolCallFormat):
    """`{"name": NAME, "parameters": {...}}`, the turn's only text."""

    name = "llama3_json"
    hint = '{"name": "<tool name>", "parameters": {<arguments as a JSON object>}}'

    def parse(self, text: str, tools: ToolSchemas | None = None) -> Parsed:
        body = text.strip()
        tagged = body.startswith(PYTHON_TAG)
        body = body.removeprefix(PYTHON_TAG).strip()
        if not body.startswith("{"):
            return ("", [self.malformed(body, "the tool call is not a JSON object")]) if tagged else (body, [])
        calls: list[ToolCall | MalformedCall] = []
        position = 0
        while position < len(body):
            try:
                value, end = _DECODER.raw_decode(body, position)
            except ValueError as exc:
                if calls or tagged or '"name"' in body:
                    return "", [*calls, self.malformed(body[position:], f"the tool call is not valid JSON ({exc})")]
                return body, []
            if not (isinstance(value, dict) and "name" in value):
                if calls or tagged:
                    return "", [*calls, self.malformed(body[position:end], 'the tool call needs a string "name"')]
                return body, []
            arguments = value.get("parameters", value.get("arguments", {}))
            calls.append(self.call_of(body[position:end], value["name"], arguments))
            position = _skip_separators(body, end)
        return "", calls

    def render(self, calls: Sequence[ToolCall]) -> str:
        return "; ".join(f'{{"name": {dumps(c.name)}, "parameters": {dumps(c.arguments)}}}' for c in calls)

    def detect(self, chat_template: str) -> bool:
        return "<|start_header_id|>" in chat_template and '"parameters"' in chat_template


def _skip_separators(text: str, position: int) -> int:
    while position < len(text) and (text[position].isspace() or text[position] == ";"):
        position += 1
    return position
