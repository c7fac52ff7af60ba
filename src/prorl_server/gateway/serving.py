"""The gateway's logic: read a harness's request, record the completion, answer in OpenAI's shape.

A streamed completion (`stream: true`) is sampled whole first (the backend is asked for token ids, which
only a non-streamed vLLM completion returns) and then sent as server-sent events: the role, the content,
the tool calls, the finish reason, the usage when `stream_options.include_usage` asks for it, `[DONE]`.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from pydantic import ValidationError
from pydantic_core import from_json
from starlette.requests import Request

from prorl_server.gateway.errors import GatewayError, bad_request
from prorl_server.gateway.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    ToolCallDelta,
    Usage,
)
from prorl_server.gateway.recorder import RecordedCall
from prorl_server.gateway.sessions import GatewayLimits, GatewaySession
from prorl_server.llm import (
    BackendRequestError,
    BackendStalled,
    BackendUnavailable,
    LLMError,
    NoBackendAvailable,
    SessionFinished,
)

log = logging.getLogger(__name__)


async def read_json_object(request: Request, limits: GatewayLimits, items: str, noun: str) -> dict[str, Any]:
    """The body as a JSON object, or a 4xx GatewayError: 413 past `max_body_bytes`; 400 when it is not a JSON
    object, or when its list `items` (`noun` in the message) is longer than `max_messages`."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limits.max_body_bytes:
            raise GatewayError(
                413,
                f"request body larger than {limits.max_body_bytes} bytes (the server's --gateway-max-body-bytes)",
                code="body_too_large",
            )
    try:
        data = from_json(body, cache_strings=False, allow_inf_nan=False)
    except ValueError as exc:
        raise bad_request(f"the body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    listed = data.get(items)
    if isinstance(listed, list) and len(listed) > limits.max_messages:
        raise bad_request(
            f"{len(listed)} {noun}; a request may have at most {limits.max_messages} (--gateway-max-messages)",
            param=items,
        )
    return data


async def read_chat_request(request: Request, limits: GatewayLimits) -> ChatCompletionRequest:
    """The body as a ChatCompletionRequest, or a 4xx GatewayError (413 past `max_body_bytes`, 400 else)."""
    data = await read_json_object(request, limits, "messages", "messages")
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_context=False, include_input=False)[0]
        param = _param(error["loc"])
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise bad_request(f"{param or 'body'}: {error['msg']}{more}"[:500], param=param) from None


async def complete(session: GatewaySession, request: ChatCompletionRequest, api: str = "chat") -> RecordedCall:
    """Record one completion of `session` (a side call in its own chains) for a call of `api`; LLM failures
    become OpenAI-shaped errors, which never name a backend (its address and the whole failure are logged here
    instead). An answered call's seconds go to `session.on_call`."""
    started = time.perf_counter()
    side_call = session.admit(request.model)
    try:
        recorded = await session.recorder.complete(request, side_call=side_call)
    except SessionFinished:
        raise GatewayError(404, "the session is closed", code="session_closed") from None
    except BackendRequestError as exc:
        log.warning("gateway session %s: the backend refused a call: %s", session.id, exc)
        raise bad_request(f"the model's backend refused the request: {exc.detail}", code="backend_rejected") from None
    except (BackendUnavailable, NoBackendAvailable) as exc:
        log.warning("gateway session %s: a call failed: %s", session.id, exc)
        why = "did not answer in time" if isinstance(exc, BackendStalled) else "failed or is unavailable"
        raise GatewayError(503, f"the model's backend {why}; try again", type="server_error") from None
    except LLMError as exc:  # the template or the session's state, which name no backend
        log.warning("gateway session %s: a call failed: %s", session.id, exc)
        raise GatewayError(503, f"the model's backend failed: {exc}", type="server_error") from None
    session.answered_as(request.model)
    if session.on_call is not None:
        session.on_call(api, time.perf_counter() - started)
    return recorded


def completion_body(request: ChatCompletionRequest, call: RecordedCall) -> dict[str, Any]:
    """The non-streamed answer."""
    answer = ChatCompletion(
        id=_completion_id(),
        created=int(time.time()),
        model=request.model,
        choices=[Choice(message=call.reply, finish_reason=call.finish_reason)],
        usage=_usage(call),
    )
    body = answer.model_dump(exclude_none=True)
    body["choices"][0]["message"]["content"] = call.reply.content  # null with tool calls, as OpenAI sends it
    return body


async def completion_events(request: ChatCompletionRequest, call: RecordedCall) -> AsyncIterator[str]:
    """The streamed answer, as server-sent events."""
    for chunk in _chunks(request, call):
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"


def _chunks(request: ChatCompletionRequest, call: RecordedCall) -> Iterator[dict[str, Any]]:
    chunk_id, created = _completion_id(), int(time.time())

    def chunk(delta: Delta, finish: str | None = None) -> dict[str, Any]:
        c = ChatCompletionChunk(
            id=chunk_id,
            created=created,
            model=request.model,
            choices=[ChunkChoice(delta=delta, finish_reason=finish)],
        )
        return c.model_dump(exclude_none=True)

    yield chunk(Delta(role="assistant", content=""))
    if call.reply.content:
        yield chunk(Delta(content=call.reply.content))
    if call.reply.tool_calls:
        calls = [ToolCallDelta(index=i, id=c.id, function=c.function) for i, c in enumerate(call.reply.tool_calls)]
        yield chunk(Delta(tool_calls=calls))
    yield chunk(Delta(), call.finish_reason)
    if request.stream_options is not None and request.stream_options.include_usage:
        usage = ChatCompletionChunk(id=chunk_id, created=created, model=request.model, choices=[], usage=_usage(call))
        yield usage.model_dump(exclude_none=True)


def _usage(call: RecordedCall) -> Usage:
    return Usage(
        prompt_tokens=call.prompt_tokens,
        completion_tokens=call.completion_tokens,
        total_tokens=call.prompt_tokens + call.completion_tokens,
    )


def _completion_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


def _param(loc: tuple[int | str, ...]) -> str | None:
    """A pydantic error location as OpenAI names a parameter, e.g. `messages[2].content` (union tags dropped)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("system", "developer", "user", "assistant", "tool", "str", "list[TextPart]") or "[" in part:
            continue
        else:
            out += f".{part}" if out else part
    return out[:200] or None
