"""A Messages request as the gateway's `ChatCompletionRequest`, and a recorded call as a Messages answer.

The request side is a pure function of the request, so a harness that sends back the `message` it got
(its text and `tool_use` blocks) followed by new turns maps to the previous call's chat messages, plus the
reply the recorder returned, plus new messages: a continuation the recorder extends token-exact.

- `system` is a system message; text blocks are joined with a newline (as vLLM joins text parts). A
  `system` turn among the messages is a system message in the same place: ChatML, Hermes, Qwen and Llama 3
  templates render a system turn anywhere, and keeping it in place keeps the conversation a prefix of the
  next call's (merged into the first system message, it would rewrite the start at every such turn and
  break the token-exact segment).
- An assistant turn is one assistant message: its text is the content, its `tool_use` blocks the tool
  calls, with the same ids and the input as JSON arguments; thinking blocks are dropped.
- A user turn is one `tool` message per `tool_result` block (which must come first, and answer a
  `tool_use` of the assistant turn before), then a user message of its text, if any. A result with
  `is_error` reads `Error: ` before its text.
- Tools are function tools (`input_schema` as `parameters`); `tool_choice` `auto` and `none` map to the
  same, `any` and `tool` are refused (the gateway does not constrain decoding).
"""

from __future__ import annotations

import json
import secrets

from prorl_server.gateway.anthropic.protocol import (
    AssistantTurn,
    Message,
    MessagesRequest,
    MessageUsage,
    StopReason,
    SystemTurn,
    TextBlock,
    TextOut,
    ToolResultBlock,
    ToolUseBlock,
    ToolUseOut,
    UserTurn,
)
from prorl_server.gateway.errors import bad_request
from prorl_server.gateway.protocol import (
    AssistantMessage,
    ChatCompletionRequest,
    ChatMessage,
    FunctionCall,
    FunctionDefinition,
    SystemMessage,
    ToolCallParam,
    ToolDefinition,
    ToolMessage,
    UserMessage,
)
from prorl_server.gateway.recorder import RecordedCall

STOP_REASONS: dict[str, StopReason] = {"tool_calls": "tool_use", "length": "max_tokens"}
"""The recorder's finish reasons as Anthropic's stop reasons (any other is `end_turn`)."""


def chat_request(request: MessagesRequest) -> ChatCompletionRequest:
    """The chat completion `request` stands for; a 400 for what the gateway cannot honour."""
    _refuse_unsupported(request)
    messages: list[ChatMessage] = []
    if request.system is not None:
        messages.append(SystemMessage(role="system", content=_text(request.system)))
    open_calls: set[str] = set()
    for i, turn in enumerate(request.messages):
        if isinstance(turn, AssistantTurn):
            message = _assistant(turn)
            open_calls = {call.id for call in message.tool_calls or ()}
            messages.append(message)
        elif isinstance(turn, SystemTurn):
            messages.append(SystemMessage(role="system", content=_text(turn.content)))
            open_calls = set()
        else:
            messages.extend(_user(turn, i, open_calls))
            open_calls = set()
    tools = [
        ToolDefinition(
            type="function",
            function=FunctionDefinition(name=t.name, description=t.description, parameters=t.input_schema),
        )
        for t in request.tools or ()
    ]
    return ChatCompletionRequest(
        model=request.model,
        messages=messages,
        tools=tools or None,
        tool_choice=request.tool_choice.type if request.tool_choice is not None else None,  # type: ignore[arg-type]
        stream=request.stream,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        max_tokens=request.max_tokens,
        stop=request.stop_sequences,
    )


def message_of(request: MessagesRequest, call: RecordedCall) -> Message:
    """The Messages answer of a recorded call: its text, then its tool calls as `tool_use` blocks."""
    content: list[TextOut | ToolUseOut] = []
    if call.reply.content:
        content.append(TextOut(text=call.reply.content))
    for tool_call in call.reply.tool_calls or ():
        arguments = json.loads(tool_call.function.arguments)
        content.append(ToolUseOut(id=tool_call.id, name=tool_call.function.name, input=arguments))
    stop_sequence = call.stop_sequence if call.finish_reason == "stop" else None
    return Message(
        id=f"msg_{secrets.token_hex(12)}",
        model=request.model,
        content=content,
        stop_reason="stop_sequence" if stop_sequence is not None else STOP_REASONS.get(call.finish_reason, "end_turn"),
        stop_sequence=stop_sequence,
        usage=MessageUsage(input_tokens=call.prompt_tokens, output_tokens=call.completion_tokens),
    )


def _refuse_unsupported(request: MessagesRequest) -> None:
    if not any(isinstance(turn, UserTurn) for turn in request.messages):
        raise bad_request("messages: at least one user turn is needed", param="messages")
    if isinstance(request.messages[-1], AssistantTurn):
        raise bad_request(
            "the last message is the assistant's: continuing a prefilled assistant turn is not supported (the "
            "gateway samples a new turn after the last user turn)",
            param=f"messages[{len(request.messages) - 1}]",
        )
    choice = request.tool_choice
    if choice is not None and choice.type in ("any", "tool"):
        raise bad_request(
            f"tool_choice {choice.type!r} is not supported: the gateway does not constrain decoding, so that the "
            "recorded trajectory is what the model sampled; use 'auto' or 'none'",
            param="tool_choice",
        )
    if choice is not None and choice.disable_parallel_tool_use:
        raise bad_request(
            "tool_choice.disable_parallel_tool_use is not supported: the gateway does not constrain decoding",
            param="tool_choice.disable_parallel_tool_use",
        )
    if request.mcp_servers:
        raise bad_request("MCP servers are not supported: give the harness's tools as `tools`", param="mcp_servers")
    if request.output_format is not None or (request.output_config or {}).get("format") is not None:
        raise bad_request(
            "structured outputs (output_format, output_config.format) are not supported: the gateway does not "
            "constrain decoding",
            param="output_config.format" if request.output_format is None else "output_format",
        )


def _assistant(turn: AssistantTurn) -> AssistantMessage:
    if isinstance(turn.content, str):
        return AssistantMessage(role="assistant", content=turn.content)
    texts = [b for b in turn.content if isinstance(b, TextBlock)]
    calls = [
        ToolCallParam(id=b.id, function=FunctionCall(name=b.name, arguments=json.dumps(b.input, ensure_ascii=False)))
        for b in turn.content
        if isinstance(b, ToolUseBlock)
    ]
    return AssistantMessage(role="assistant", content=_text(texts) if texts else None, tool_calls=calls or None)


def _user(turn: UserTurn, index: int, open_calls: set[str]) -> list[ChatMessage]:
    if isinstance(turn.content, str):
        return [UserMessage(role="user", content=turn.content)]
    out: list[ChatMessage] = []
    texts: list[TextBlock] = []
    for j, block in enumerate(turn.content):
        if isinstance(block, TextBlock):
            texts.append(block)
            continue
        where = f"messages[{index}].content[{j}]"
        if texts:
            raise bad_request("tool_result blocks must come before any text in a user turn", param=where)
        if block.tool_use_id not in open_calls:
            raise bad_request(
                f"{where} is a tool_result for {block.tool_use_id[:64]!r}, but the assistant turn before it made no "
                "such tool_use",
                param=f"{where}.tool_use_id",
            )
        out.append(ToolMessage(role="tool", content=_result_text(block), tool_call_id=block.tool_use_id))
    if texts or not out:
        out.append(UserMessage(role="user", content=_text(texts)))
    return out


def _result_text(block: ToolResultBlock) -> str:
    text = "" if block.content is None else _text(block.content)
    return f"Error: {text}" if block.is_error else text


def _text(content: str | list[TextBlock]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(block.text for block in content)
