"""A Responses request answered on a session: read it, continue the remembered conversation, record the
turn through the chat path (`gateway.serving.complete`), remember the response, answer it.

A streamed response (`stream: true`) is sampled whole first, as a streamed chat completion is, then sent
as OpenAI's server-sent events: `response.created`, `response.in_progress`, per output item
`response.output_item.added`, its text (`response.content_part.added`, `response.output_text.delta`,
`response.output_text.done`, `response.content_part.done`) or its arguments
(`response.function_call_arguments.delta`, `.done`), `response.output_item.done`, and last
`response.completed` (or `response.incomplete`), each with its `sequence_number`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from prorl_server.gateway.errors import ContextLengthExceeded, bad_request
from prorl_server.gateway.responses.protocol import (
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputText,
    ResponseObject,
    ResponsesRequest,
)
from prorl_server.gateway.responses.translate import chat_request, refuse_unsupported, reply_message, response_object
from prorl_server.gateway.serving import complete, read_json_object
from prorl_server.gateway.sessions import GatewayLimits, GatewaySession

_UNION_TAGS = frozenset({"str", "message", "function_call", "function_call_output", "reasoning"})


async def read_responses_request(request: Request, limits: GatewayLimits) -> ResponsesRequest:
    """The body as a ResponsesRequest, or a 4xx GatewayError (413 past `max_body_bytes`, 400 else)."""
    data = await read_json_object(request, limits, "input", "input items")
    try:
        return ResponsesRequest.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        error = max(errors, key=lambda e: len(e["loc"]))  # the deepest: the branch of a union that was meant
        param = _param(error["loc"])
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise bad_request(f"{param or 'body'}: {error['msg']}{more}"[:500], param=param) from None


async def create_response(session: GatewaySession, request: ResponsesRequest, limits: GatewayLimits) -> ResponseObject:
    """Record the turn of `request` in `session` and remember its response (unless `store` is false)."""
    refuse_unsupported(request)
    prior = ()
    if request.previous_response_id is not None:
        remembered = session.responses.get(request.previous_response_id)
        if remembered is None:
            raise bad_request(
                f"previous response {request.previous_response_id[:64]!r} not found in this session (never "
                f"stored here, or forgotten: a session remembers its last {session.responses.capacity})",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        prior = remembered
    chat, conversation = chat_request(request, prior, limits.max_messages)
    try:
        call = await complete(session, chat, "responses")
    except ContextLengthExceeded as exc:
        raise exc.in_responses() from None
    response = response_object(request, call, created_at=int(time.time()))
    if request.store:
        session.responses.put(response.id, (*conversation, reply_message(call.reply)))
    return response


async def response_events(response: ResponseObject) -> AsyncIterator[str]:
    """The streamed answer, as server-sent events."""
    for number, event in enumerate(_events(response)):
        event["sequence_number"] = number
        yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def _events(response: ResponseObject) -> Iterator[dict[str, Any]]:
    started = response.model_copy(update={"status": "in_progress", "output": [], "usage": None})
    yield {"type": "response.created", "response": started.model_dump()}
    yield {"type": "response.in_progress", "response": started.model_dump()}
    for index, item in enumerate(response.output):
        yield from _item_events(index, item)
    final = "response.incomplete" if response.status == "incomplete" else "response.completed"
    yield {"type": final, "response": response.model_dump()}


def _item_events(index: int, item: OutputItem) -> Iterator[dict[str, Any]]:
    at = {"item_id": item.id, "output_index": index}
    if isinstance(item, OutputMessage):
        added = item.model_copy(update={"status": "in_progress", "content": []})
        yield {"type": "response.output_item.added", "output_index": index, "item": added.model_dump()}
        for part_index, part in enumerate(item.content):
            here = {**at, "content_index": part_index}
            empty = OutputText(text="").model_dump()
            yield {"type": "response.content_part.added", **here, "part": empty}
            if part.text:
                yield {"type": "response.output_text.delta", **here, "delta": part.text, "logprobs": []}
            yield {"type": "response.output_text.done", **here, "text": part.text, "logprobs": []}
            yield {"type": "response.content_part.done", **here, "part": part.model_dump()}
    elif isinstance(item, OutputFunctionCall):
        added = item.model_copy(update={"status": "in_progress", "arguments": ""})
        yield {"type": "response.output_item.added", "output_index": index, "item": added.model_dump()}
        yield {"type": "response.function_call_arguments.delta", **at, "delta": item.arguments}
        yield {"type": "response.function_call_arguments.done", **at, "arguments": item.arguments}
    yield {"type": "response.output_item.done", "output_index": index, "item": item.model_dump()}


def _param(loc: tuple[int | str, ...]) -> str | None:
    """A pydantic error location as OpenAI names a parameter, e.g. `input[2].content` (union tags dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in _UNION_TAGS or "[" in part:
            continue
        else:
            out += f".{part}" if out else part
    return out[:200] or None
