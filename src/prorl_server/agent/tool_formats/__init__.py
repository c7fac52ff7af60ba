"""Tool-call formats per model family: how a model writes a call in its text, parsed and rendered.

`FORMATS` holds one per family by name; `detect_format(chat_template)` recognises the family from its chat
template (most specific family first). Each format's module says what its calls look like.
"""

from __future__ import annotations

from prorl_server.agent.tool_formats.base import (
    MalformedCall,
    Parsed,
    ToolCall,
    ToolCallFormat,
    ToolSchemas,
)
from prorl_server.agent.tool_formats.deepseek_v3 import DeepSeekV3Format
from prorl_server.agent.tool_formats.gpt_oss import GptOssFormat
from prorl_server.agent.tool_formats.hermes import HermesFormat
from prorl_server.agent.tool_formats.llama3_json import Llama3JsonFormat
from prorl_server.agent.tool_formats.mistral import MistralFormat
from prorl_server.agent.tool_formats.qwen3_coder import Qwen3CoderFormat

HERMES = HermesFormat()
FORMATS: dict[str, ToolCallFormat] = {
    f.name: f
    for f in (
        GptOssFormat(),
        DeepSeekV3Format(),
        MistralFormat(),
        Qwen3CoderFormat(),
        HERMES,
        Llama3JsonFormat(),
    )
}
"""The formats by name, in the order `detect_format` tries them."""


def detect_format(chat_template: str) -> ToolCallFormat | None:
    """The format of the family `chat_template` belongs to (its variant of it), or None."""
    for tool_format in FORMATS.values():
        if tool_format.detect(chat_template):
            return tool_format.for_template(chat_template)
    return None


def tool_format(name: str) -> ToolCallFormat:
    """The format called `name` (`auto`: Hermes, as no backend tells the server its chat template to detect
    the family from); KeyError naming the known ones."""
    if name == "auto":
        return HERMES
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown tool-call format {name!r}; known: {', '.join(FORMATS)}") from None


__all__ = [
    "FORMATS",
    "HERMES",
    "MalformedCall",
    "Parsed",
    "ToolCall",
    "ToolCallFormat",
    "ToolSchemas",
    "detect_format",
    "tool_format",
]
