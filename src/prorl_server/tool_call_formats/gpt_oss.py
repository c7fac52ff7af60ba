"""gpt-oss (OpenAI's harmony format): a call is a message to `functions.NAME` on the commentary channel:

    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>

The recipient may also stand in the header before the channel (`<|start|>assistant to=functions.NAME
<|channel|>commentary json<|message|>`, as gpt-oss's chat template writes past calls). A turn's text starts
after the generation prompt `<|start|>assistant`; its content is the body of its messages that are neither
calls nor reasoning (the `analysis` channel). The markers are special tokens: the engine must return them
(vLLM: `"skip_special_tokens": false`).
"""

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

START, CHANNEL, MESSAGE, CALL = "<|start|>", "<|channel|>", "<|message|>", "<|call|>"
_MESSAGE = re.compile(
    r"(?P<header>(?:(?!<\|message\|>|<\|start\|>).)*)<\|message\|>"
    r"(?P<body>.*?)(?:<\|end\|>|<\|call\|>|<\|return\|>|(?=<\|start\|>)|\Z)",
    re.DOTALL,
)
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*(\w+)")


class GptOssFormat(ToolCallFormat):
    """Harmony messages to `functions.NAME`, JSON bodies."""

    name = "gpt_oss"
    hint = f"{CHANNEL}commentary to=functions.TOOL_NAME <|constrain|>json{MESSAGE}{{<arguments as JSON>}}{CALL}"

    def parse(self, text: str, tools: ToolSchemas | None = None) -> Parsed:
        content: list[str] = []
        calls: list[ToolCall | MalformedCall] = []
        end = 0
        for match in _MESSAGE.finditer(text):
            end = match.end()
            header, body = match.group("header"), match.group("body")
            recipient = _RECIPIENT.search(header)
            if recipient is not None and recipient.group(1) != "assistant":
                calls.append(self._call(match.group(0), recipient.group(1), body))
                continue
            channel = _CHANNEL.search(header)
            if channel is None or channel.group(1) != "analysis":
                content.append(body)
        rest = text[end:]
        if _RECIPIENT.search(rest):  # a call's header with no message after it
            calls.append(self.malformed(rest, "the tool call has no <|message|>"))
        if end == 0 and not calls:  # no harmony message at all: plain text
            return text.strip(), []
        return "\n".join(part.strip() for part in content if part.strip()), calls

    def render(self, calls: Sequence[ToolCall]) -> str:
        return f"{START}assistant".join(
            f"{CHANNEL}commentary to=functions.{c.name} <|constrain|>json{MESSAGE}{dumps(c.arguments)}{CALL}"
            for c in calls
        )

    def detect(self, chat_template: str) -> bool:
        return CHANNEL in chat_template and CALL in chat_template

    def _call(self, text: str, recipient: str, body: str) -> ToolCall | MalformedCall:
        name = recipient.removeprefix("functions.")
        value, error = loads_object(body)
        if error is not None:
            return self.malformed(text, f"the arguments of {name} are not valid JSON ({error})")
        return self.call_of(text, name, value)
