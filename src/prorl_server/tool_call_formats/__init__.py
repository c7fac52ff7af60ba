"""Tool-call formats per model family: how a model writes a call in its text, parsed and rendered.

`FORMATS` holds one per family by name; `detect_format(chat_template)` recognises the family from its chat
template (most specific family first), and `backend_format` applies the `--tool-call-format` setting to one
backend. Each format's module says what its calls look like.

A leaf package (it imports nothing else of prorl_server): the agent loop parses a model's turns with it, the
gateway parses and renders them for OpenAI and Anthropic clients.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from prorl_server.tool_call_formats.base import (
    MalformedCall,
    Parsed,
    ToolCall,
    ToolCallFormat,
    ToolSchemas,
)
from prorl_server.tool_call_formats.deepseek_v3 import DeepSeekV3Format
from prorl_server.tool_call_formats.gpt_oss import GptOssFormat
from prorl_server.tool_call_formats.hermes import HermesFormat
from prorl_server.tool_call_formats.llama3_json import Llama3JsonFormat
from prorl_server.tool_call_formats.mistral import MistralFormat
from prorl_server.tool_call_formats.qwen3_coder import Qwen3CoderFormat

log = logging.getLogger(__name__)

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


def parse_tool_calls(text: str) -> list[ToolCall | MalformedCall]:
    """Every Hermes/Qwen `<tool_call>` block of a model's turn, in order (an unclosed last block counts too);
    the agent loop's default format. Never raises: an unreadable call is a `MalformedCall`."""
    return HERMES.parse(text)[1]


def detect_format(chat_template: str) -> ToolCallFormat | None:
    """The format of the family `chat_template` belongs to (its variant of it), or None."""
    for tool_format in FORMATS.values():
        if tool_format.detect(chat_template):
            return tool_format.for_template(chat_template)
    return None


def tool_format(name: str) -> ToolCallFormat:
    """The format called `name` (`auto` without a backend's chat template: Hermes); KeyError naming the known
    ones."""
    if name == "auto":
        return HERMES
    try:
        return FORMATS[name]
    except KeyError:
        raise KeyError(f"unknown tool-call format {name!r}; known: {', '.join(FORMATS)}") from None


def keep_call_markers(sampling_params: Mapping[str, Any]) -> dict[str, Any]:
    """The sampling field a turn whose tool calls are parsed is sent with: `skip_special_tokens: false`, as
    vLLM's own tool parsers set it, since several families write calls with special tokens (gpt-oss's
    harmony markers, Mistral's `[TOOL_CALLS]`) that vLLM otherwise leaves out of the text. Nothing when the
    trainer's `sampling_params` set it: theirs is kept. Token ids are the same either way."""
    return {} if "skip_special_tokens" in sampling_params else {"skip_special_tokens": False}


def backend_format(name: str, chat_template: str | None) -> ToolCallFormat:
    """The format of setting `name` on a backend whose chat template is `chat_template` (None: not known to
    the server). `auto` is the family `detect_format` recognises in the template, else Hermes (logged once
    per template); any other name is that format."""
    return _detected(chat_template) if name == "auto" else tool_format(name)


@lru_cache(maxsize=64)
def _detected(chat_template: str | None) -> ToolCallFormat:
    found = detect_format(chat_template) if chat_template is not None else None
    if found is not None:
        log.info("tool-call format %s detected from a backend's chat template", found.name)
        return found
    why = "is not known to the server" if chat_template is None else "belongs to no known tool-call family"
    log.warning("a backend's chat template %s: tool calls in the hermes format (--tool-call-format auto)", why)
    return HERMES


__all__ = [
    "FORMATS",
    "HERMES",
    "MalformedCall",
    "Parsed",
    "ToolCall",
    "ToolCallFormat",
    "ToolSchemas",
    "backend_format",
    "detect_format",
    "keep_call_markers",
    "parse_tool_calls",
    "tool_format",
]
