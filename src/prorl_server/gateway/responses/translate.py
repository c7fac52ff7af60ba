"""A Responses request to the gateway's chat request, and a recorded call to a response object.

The translation is deterministic, so that a conversation continued with `previous_response_id` and the
same conversation resent whole (its input items, the response's output items, the new items) give the
same chat messages, the ones the recorder continues its segment with:

- `instructions` -> a system message first (not carried over by `previous_response_id`, as at OpenAI);
- a string input -> a user message; a message item -> a message of its role (its text parts joined);
- a `function_call` item -> a tool call (same `call_id`) of the assistant message right before it, or of a
  new assistant message when the message before is not the assistant's;
- a `function_call_output` item -> a tool message answering that call; a `reasoning` item -> nothing;
- a reply -> a `message` item with its text (when it has text, or no calls), then a `function_call` item
  per call, whose `call_id` is the chat tool call's id.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import NoReturn

from prorl_server.gateway.errors import bad_request
from prorl_server.gateway.protocol import (
    AssistantMessage,
    AssistantReply,
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
from prorl_server.gateway.responses.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    IncompleteDetails,
    InputItem,
    ItemContent,
    MessageItem,
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponsesRequest,
    ResponseUsage,
)
from prorl_server.gateway.responses.store import Conversation


def refuse_unsupported(request: ResponsesRequest) -> None:
    """400 for what the gateway cannot honour: structured output, background mode, automatic truncation,
    stored conversations and prompts, logprobs, a `tool_choice` that would constrain decoding. (`reasoning`,
    `include` and `text.verbosity` are ignored, as for a model without them.)"""
    text = request.text or {}
    if text.get("format") not in (None, {"type": "text"}):
        _refuse("only text output is supported (no JSON schema or JSON mode)", "text.format")
    refused = {
        "background": "background responses are not supported",
        "conversation": "conversations are not supported: continue with previous_response_id or resend the input",
        "prompt": "stored prompts are not supported",
        "top_logprobs": "logprobs are not returned (they are in the session's recording)",
    }
    for field, message in refused.items():
        if getattr(request, field):
            _refuse(message, field)
    if request.truncation == "auto":
        _refuse("truncation 'auto' is not supported: the gateway never drops input items", "truncation")
    if request.tool_choice not in (None, "auto", "none"):
        _refuse(
            "tool_choice must be 'auto' or 'none': the gateway does not constrain decoding, so that the recorded "
            "trajectory is what the model sampled",
            "tool_choice",
        )


def chat_request(
    request: ResponsesRequest, prior: Conversation, max_messages: int
) -> tuple[ChatCompletionRequest, Conversation]:
    """The chat request of `request` continuing `prior` (a remembered response's conversation), and the
    conversation to remember with its reply (without the instructions)."""
    items = request.input if isinstance(request.input, list) else None
    conversation = (
        to_messages(items, prior) if items is not None else (*prior, UserMessage(role="user", content=request.input))
    )
    if not conversation:
        _refuse("the input holds no message, call or call output (reasoning items are dropped)", "input")
    system = [SystemMessage(role="system", content=request.instructions)] if request.instructions else []
    messages = [*system, *conversation]
    if len(messages) > max_messages:
        _refuse(
            f"{len(messages)} messages with the previous response's; at most {max_messages} (--gateway-max-messages)",
            "input",
        )
    tools = [
        ToolDefinition(
            type="function",
            function=FunctionDefinition(
                name=t.name, description=t.description, parameters=t.parameters, strict=t.strict
            ),
        )
        for t in request.tools or ()
    ]
    chat = ChatCompletionRequest(
        model=request.model,
        messages=messages,
        tools=tools or None,
        tool_choice=request.tool_choice if isinstance(request.tool_choice, str) else None,
        temperature=request.temperature,
        top_p=request.top_p,
        max_tokens=request.max_output_tokens,
    )
    return chat, conversation


def to_messages(items: Sequence[InputItem], prior: Conversation = ()) -> Conversation:
    """`prior` followed by `items` as chat messages; 400 (naming `input[i]`) for a call output that answers
    no call of the assistant message before it, or call arguments that are not a JSON object."""
    out: list[ChatMessage] = list(prior)
    open_calls = _open_calls(out)
    for i, item in enumerate(items):
        if isinstance(item, FunctionCallItem):
            _check_arguments(item.arguments, f"input[{i}].arguments")
            call = ToolCallParam(id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments))
            last = out[-1] if out else None
            if isinstance(last, AssistantMessage):
                out[-1] = last.model_copy(update={"tool_calls": [*(last.tool_calls or ()), call]})
            else:
                out.append(AssistantMessage(role="assistant", content=None, tool_calls=[call]))
            open_calls = _open_calls(out)
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in open_calls:
                _refuse(
                    f"input[{i}] is the output of call {item.call_id[:64]!r}, but no function_call item right "
                    "before it (or in the previous response) made that call",
                    f"input[{i}].call_id",
                )
            out.append(ToolMessage(role="tool", content=_text(item.output), tool_call_id=item.call_id))
        elif isinstance(item, MessageItem):
            text = _text(item.content)
            if item.role == "assistant":
                out.append(AssistantMessage(role="assistant", content=text))
            elif item.role == "user":
                out.append(UserMessage(role="user", content=text))
            else:
                out.append(SystemMessage(role=item.role, content=text))
            open_calls = set()
    return tuple(out)


def reply_message(reply: AssistantReply) -> AssistantMessage:
    """The assistant message a reply is in the conversation (as its output items are sent back)."""
    calls = [
        ToolCallParam(id=c.id, function=FunctionCall(name=c.function.name, arguments=c.function.arguments))
        for c in reply.tool_calls or ()
    ]
    return AssistantMessage(role="assistant", content=reply.content, tool_calls=calls or None)


def response_object(request: ResponsesRequest, call: RecordedCall, created_at: int) -> ResponseObject:
    """The response of a recorded call: `incomplete` when the turn hit its token limit."""
    incomplete = call.finish_reason == "length"
    status = "incomplete" if incomplete else "completed"
    output: list[OutputItem] = []
    if call.reply.content is not None or not call.reply.tool_calls:
        text = OutputText(text=call.reply.content or "")
        output.append(OutputMessage(id=_item_id("msg"), status=status, content=[text]))
    for c in call.reply.tool_calls or ():
        output.append(
            OutputFunctionCall(
                id=_item_id("fc"),
                status="completed",
                call_id=c.id,
                name=c.function.name,
                arguments=c.function.arguments,
            )
        )
    return ResponseObject(
        id=_item_id("resp"),
        created_at=created_at,
        status=status,
        incomplete_details=IncompleteDetails(reason="max_output_tokens") if incomplete else None,
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        model=request.model,
        output=output,
        parallel_tool_calls=request.parallel_tool_calls is not False,
        previous_response_id=request.previous_response_id,
        store=request.store,
        temperature=request.temperature,
        tool_choice=request.tool_choice if isinstance(request.tool_choice, str) else "auto",
        tools=[t.model_dump() for t in request.tools or ()],
        top_p=request.top_p,
        usage=ResponseUsage(
            input_tokens=call.prompt_tokens,
            output_tokens=call.completion_tokens,
            total_tokens=call.prompt_tokens + call.completion_tokens,
        ),
        metadata=request.metadata or {},
    )


def _open_calls(messages: Sequence[ChatMessage]) -> set[str]:
    """The calls a tool message may answer next: those of the last assistant message, if only tool
    messages follow it."""
    for message in reversed(messages):
        if isinstance(message, ToolMessage):
            continue
        if isinstance(message, AssistantMessage):
            return {c.id for c in message.tool_calls or ()}
        return set()
    return set()


def _text(content: ItemContent) -> str:
    return content if isinstance(content, str) else "".join(part.text for part in content)


def _check_arguments(raw: str, param: str) -> None:
    try:
        value = json.loads(raw) if raw.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        _refuse("function_call arguments must be a JSON object (as a string)", param)


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _refuse(message: str, param: str) -> NoReturn:
    raise bad_request(message, param=param)
