"""Reading a Messages request, and the streamed answer.

A streamed request (`stream: true`) is sampled whole first, as on the OpenAI path (the backend is asked for
token ids, which only a non-streamed vLLM completion returns), then sent as Anthropic's server-sent events:
`message_start`, per content block `content_block_start`, one `content_block_delta` (`text_delta`, or
`input_json_delta` for a `tool_use`) and `content_block_stop`, then `message_delta` (the stop reason and
the output tokens) and `message_stop`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request

from prorl_server.gateway.anthropic.protocol import Message, MessagesRequest, TextOut
from prorl_server.gateway.errors import bad_request
from prorl_server.gateway.serving import read_json_object
from prorl_server.gateway.sessions import GatewayLimits


async def read_messages_request(request: Request, limits: GatewayLimits) -> MessagesRequest:
    """The body as a MessagesRequest, or a 4xx GatewayError (413 past `max_body_bytes`, 400 else)."""
    data = await read_json_object(request, limits, "messages", "messages")
    try:
        return MessagesRequest.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        error = max(errors, key=lambda e: len(e["loc"]))  # the deepest: a block's, not "not a string"
        where = _where(error["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise bad_request(f"{where or 'body'}: {error['msg']}{more}"[:500]) from None


async def message_events(message: Message) -> AsyncIterator[str]:
    """The streamed answer, as server-sent events."""
    for event in _events(message):
        yield f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def _events(message: Message) -> Iterator[dict[str, Any]]:
    start = message.model_copy(update={"content": [], "stop_reason": None, "stop_sequence": None})
    start.usage = start.usage.model_copy(update={"output_tokens": 0})
    yield {"type": "message_start", "message": start.model_dump()}
    for index, block in enumerate(message.content):
        if isinstance(block, TextOut):
            opened: dict[str, Any] = {"type": "text", "text": ""}
            delta: dict[str, Any] = {"type": "text_delta", "text": block.text}
        else:
            opened = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.input, ensure_ascii=False)}
        yield {"type": "content_block_start", "index": index, "content_block": opened}
        yield {"type": "content_block_delta", "index": index, "delta": delta}
        yield {"type": "content_block_stop", "index": index}
    yield {
        "type": "message_delta",
        "delta": {"stop_reason": message.stop_reason, "stop_sequence": message.stop_sequence},
        "usage": {"output_tokens": message.usage.output_tokens},
    }
    yield {"type": "message_stop"}


def _where(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a path, e.g. `messages[2].content[0].type` (union tags dropped)."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "str" or "[" in part or (i > 0 and isinstance(loc[i - 1], int) and part in _TAGS):
            continue
        else:
            out += f".{part}" if out else part
    return out[:200]


_TAGS = frozenset({"user", "assistant", "system", "text", "tool_use", "tool_result", "thinking", "redacted_thinking"})
