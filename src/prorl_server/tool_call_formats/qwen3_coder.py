"""Qwen3-Coder: XML calls, one `<parameter=...>` element per argument, values as plain text:

    <tool_call>
    <function=bash>
    <parameter=command>
    ls -la
    </parameter>
    </function>
    </tool_call>

A value is written as text (objects and arrays as JSON), so its type comes from the tool's schema when
`tools` are given: a `string` parameter keeps the text, any other is read as JSON (Python's `True`,
`False` and `None`, which the chat template writes for booleans and null, too). Without a schema a value
that is JSON other than a string is read as JSON, the rest stays text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from prorl_server.tool_call_formats.base import (
    MalformedCall,
    Parsed,
    ToolCall,
    ToolCallFormat,
    ToolSchemas,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)
_PYTHON_LITERALS = {"True": True, "False": False, "None": None}


class Qwen3CoderFormat(ToolCallFormat):
    """`<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>`."""

    name = "qwen3_coder"
    hint = f"{OPEN}\n<function=TOOL_NAME>\n<parameter=ARGUMENT_NAME>\nvalue\n</parameter>\n</function>\n{CLOSE}"

    def parse(self, text: str, tools: ToolSchemas | None = None) -> Parsed:
        blocks = list(_BLOCK.finditer(text))
        types = _parameter_types(tools or ())
        calls = [self._block(match.group(1), types) for match in blocks]
        return (text[: blocks[0].start()] if blocks else text).strip(), calls

    def render(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join(
            f"{OPEN}\n<function={c.name}>\n"
            + "".join(f"<parameter={key}>\n{_text(value)}\n</parameter>\n" for key, value in c.arguments.items())
            + f"</function>\n{CLOSE}"
            for c in calls
        )

    def detect(self, chat_template: str) -> bool:
        return "<function=" in chat_template and "<parameter=" in chat_template

    def _block(self, body: str, types: dict[str, dict[str, Any]]) -> ToolCall | MalformedCall:
        function = _FUNCTION.search(body)
        if function is None:
            return self.malformed(body, "the tool call has no <function=NAME> element")
        name = function.group(1).strip()
        if not name:
            return self.malformed(body, "the tool call needs a function name")
        schema = types.get(name, {})
        arguments = {
            key.strip(): _value(_unwrap(value), schema.get(key.strip()))
            for key, value in _PARAMETER.findall(function.group(2))
        }
        return ToolCall(name, arguments)


def _parameter_types(tools: ToolSchemas) -> dict[str, dict[str, Any]]:
    """Tool name -> parameter name -> its JSON-schema `type` (as given: a string, a list, or None)."""
    types: dict[str, dict[str, Any]] = {}
    for tool in tools:
        function = tool.get("function", tool)
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        if isinstance(properties, Mapping):
            types[function["name"]] = {
                key: spec.get("type") if isinstance(spec, Mapping) else None for key, spec in properties.items()
            }
    return types


def _unwrap(value: str) -> str:
    """The value without the newline the format puts on each side of it."""
    return value.removeprefix("\n").removesuffix("\n")


def _value(text: str, schema_type: Any) -> Any:
    if schema_type == "string":
        return text
    try:
        value = json.loads(text)
    except ValueError:
        if schema_type is not None and text.strip() in _PYTHON_LITERALS:
            return _PYTHON_LITERALS[text.strip()]
        return text
    return text if isinstance(value, str) else value


def _text(value: Any) -> str:
    """A value as the chat template writes it: strings as they are, objects and arrays as JSON, the rest
    as Jinja's `string` filter does (Python's `str`)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict | list):
        return json.dumps(value, ensure_ascii=False)
    return str(value)
