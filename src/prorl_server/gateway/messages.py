"""A harness's chat messages, three ways: checked (tool results answer calls), as the chat template gets
them, and as a key to compare histories with; and the model's text as an OpenAI reply.

Tool calls use the server's tool-call format (`tool_call_formats`, `--tool-call-format`; Hermes/Qwen,
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, by default): a reply's calls are parsed from the
sampled text, and an assistant message the chat template renders is given the text the model sampled for
it when the gateway returned that message, else its content followed by its calls written in that format.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any

from prorl_server.gateway.errors import bad_request
from prorl_server.gateway.protocol import (
    AssistantMessage,
    AssistantReply,
    ChatMessage,
    Content,
    FunctionCallOut,
    ToolCallOut,
    ToolMessage,
)
from prorl_server.tool_call_formats import HERMES, ToolCall, ToolCallFormat

MessageKey = str
"""A message in a canonical JSON form: equal keys mean the same message for the model."""


def content_text(content: Content) -> str:
    """The text of a message's content (parts joined; None is empty)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content)


def check_messages(messages: Sequence[ChatMessage]) -> None:
    """Refuse (400) a tool message that answers no call of the assistant message before it, and tool-call
    arguments that are not a JSON object."""
    open_calls: set[str] = set()
    for i, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            if message.tool_call_id not in open_calls:
                raise bad_request(
                    f"messages[{i}] is a tool message for call {message.tool_call_id[:64]!r}, but the assistant "
                    "message before it made no such call",
                    param=f"messages[{i}].tool_call_id",
                )
            continue
        open_calls = set()
        if isinstance(message, AssistantMessage):
            for j, call in enumerate(message.tool_calls or ()):
                _arguments(call.function.arguments, f"messages[{i}].tool_calls[{j}].function.arguments")
                open_calls.add(call.id)


def message_key(message: ChatMessage) -> MessageKey:
    """`message` in a canonical form (None content is empty; call arguments compared as JSON)."""
    fields: dict[str, Any] = {"role": message.role, "content": content_text(message.content)}
    if isinstance(message, AssistantMessage):
        calls = message.tool_calls or ()
        fields["tool_calls"] = [[c.id, c.function.name, _arguments(c.function.arguments, "")] for c in calls]
    elif isinstance(message, ToolMessage):
        fields["tool_call_id"] = message.tool_call_id
    else:
        fields["name"] = message.name
    return json.dumps(fields, sort_keys=True, ensure_ascii=False)


def reply_key(reply: AssistantReply) -> MessageKey:
    """The key of the message a harness sends back for `reply`."""
    calls = reply.tool_calls or ()
    fields = {
        "role": "assistant",
        "content": reply.content or "",
        "tool_calls": [[c.id, c.function.name, json.loads(c.function.arguments)] for c in calls],
    }
    return json.dumps(fields, sort_keys=True, ensure_ascii=False)


def template_message(
    message: ChatMessage, sampled_text: str | None = None, tool_format: ToolCallFormat = HERMES
) -> dict[str, Any]:
    """`message` as the chat template gets it; an assistant message the gateway returned is given its
    `sampled_text` (what the model actually said, calls included), another one its content followed by
    its calls in `tool_format`."""
    if isinstance(message, AssistantMessage):
        if sampled_text is not None:
            return {"role": "assistant", "content": sampled_text}
        calls = [ToolCall(c.function.name, _arguments(c.function.arguments, "")) for c in message.tool_calls or ()]
        return {
            "role": "assistant",
            "content": content_text(message.content) + (tool_format.render(calls) if calls else ""),
        }
    if isinstance(message, ToolMessage):
        return {"role": "tool", "content": content_text(message.content), "tool_call_id": message.tool_call_id}
    role = "system" if message.role == "developer" else message.role
    return {"role": role, "content": content_text(message.content)}


def reply_of(
    text: str,
    parse_calls: bool,
    tool_format: ToolCallFormat = HERMES,
    tools: list[dict[str, Any]] | None = None,
) -> AssistantReply:
    """The OpenAI message of a sampled turn: with `parse_calls`, its tool calls (in `tool_format`, typed by
    the request's `tools` where the format needs it) when every call is well-formed (the text before the
    first call is the content); else all text."""
    if parse_calls:
        content, calls = tool_format.parse(text, tools)
        if calls and all(isinstance(c, ToolCall) for c in calls):
            return AssistantReply(
                content=content or None,
                tool_calls=[
                    ToolCallOut(
                        id=f"call_{secrets.token_hex(12)}",
                        function=FunctionCallOut(name=c.name, arguments=json.dumps(c.arguments, ensure_ascii=False)),
                    )
                    for c in calls
                    if isinstance(c, ToolCall)
                ],
            )
    return AssistantReply(content=text)


def _arguments(raw: str, param: str) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise bad_request("tool-call arguments must be a JSON object (as a string)", param=param or None)
    return value
