"""ConversationRecorder: a harness's chat completions recorded token-exact, as segments.

Each segment is an `LLMSession` with its own trajectory (prompt ids, response ids, mask, logprobs). A call
continues the current segment when its messages are the previous call's messages, plus the reply the
gateway returned, plus at least one new message, with the same tools: the stored ids are reused and only
the new messages are tokenized (the session's chat-template delta), so the segment holds exactly the ids
the engine sampled. Any other call (a truncated, summarised or edited history, another system prompt,
other tools) starts a new segment from the chat template of all its messages, and counts as a rewrite.

A call that failed after its new messages were appended leaves them in the segment: the same messages
sent again (a retry) sample the turn there; anything else starts a new segment. A segment without a
sampled turn is left out of the result.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from prorl_server.gateway.errors import GatewayError, bad_request
from prorl_server.gateway.messages import (
    MessageKey,
    check_messages,
    message_key,
    reply_key,
    reply_of,
    template_message,
)
from prorl_server.gateway.protocol import AssistantReply, ChatCompletionRequest
from prorl_server.llm import LLMSession
from prorl_server.llm.backend_pool import BackendPool
from prorl_server.llm.errors import SessionFinished
from prorl_server.protocol import Trajectory
from prorl_server.scheduling.dispatch import DispatchPolicy
from prorl_server.tool_formats import ToolCallFormat, backend_format, keep_call_markers

MAX_REMEMBERED_REPLIES = 4096
"""Replies whose sampled text a new segment can still render as the model said it (oldest forgotten)."""


@dataclass(frozen=True)
class RecordedCall:
    """One answered chat completion: the reply and its counts."""

    reply: AssistantReply
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    stop_sequence: str | None = None


@dataclass
class _Cursor:
    """Where the next call may continue: the keys of the messages it must start with, its tools, and
    whether its turn was sampled (False after a failed call: a retry of the same messages samples it)."""

    keys: list[MessageKey]
    tools: str
    segment: LLMSession
    sampled: bool


class ConversationRecorder:
    """The segments of one session's conversation, all on one backend (pinned at the first call, as a
    job's are, under `job_id`).

    `sampling_params` are the trainer's; a harness's sampling field is used only when it is in
    `harness_params`. Tool calls are parsed and rendered in `tool_format` (None: `--tool-call-format auto`,
    the family of the pinned backend's chat template, decided when the first segment starts). Calls are
    recorded one at a time, in arrival order.
    """

    def __init__(
        self,
        job_id: str,
        pool: BackendPool,
        sampling_params: dict[str, Any],
        harness_params: frozenset[str],
        *,
        max_segments: int,
        max_failovers: int = 3,
        dispatch: DispatchPolicy | None = None,
        data_source: str = "",
        tool_format: ToolCallFormat | None = None,
    ) -> None:
        self.job_id = job_id
        self.tool_format = tool_format
        self.pool = pool
        self.sampling_params = dict(sampling_params)
        self.harness_params = harness_params
        self.max_segments = max_segments
        self.max_failovers = max_failovers
        self.dispatch = dispatch
        self.data_source = data_source
        self.segments: list[LLMSession] = []
        self.rewrites = 0
        self.calls = 0
        self.failed_calls = 0
        self._cursor: _Cursor | None = None
        self._closed = False
        self._sampled: OrderedDict[MessageKey, str] = OrderedDict()  # reply key -> the text the model sampled
        self._lock = asyncio.Lock()

    async def complete(self, request: ChatCompletionRequest) -> RecordedCall:
        """Sample the reply to `request` and record it; raises a GatewayError (4xx) for bad input and the
        session's LLMError when the backends fail."""
        check_messages(request.messages)
        if request.tool_choice not in (None, "auto", "none"):
            raise bad_request(
                "tool_choice 'required' or a named function is not supported: the gateway does not constrain "
                "decoding, so that the recorded trajectory is what the model sampled; use 'auto' or 'none'",
                param="tool_choice",
            )
        if request.n not in (None, 1):
            raise bad_request("n must be 1: a session records one conversation", param="n")
        parse_calls = bool(request.tools) and request.tool_choice != "none"
        tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools else None
        tools_key = json.dumps(tools, sort_keys=True) if tools else ""
        keys = [message_key(m) for m in request.messages]
        overrides = {k: v for k, v in request.harness_sampling().items() if k in self.harness_params}
        async with self._lock:
            try:
                turn_session = await self._place(request, keys, tools, tools_key)
                markers = keep_call_markers(turn_session.sampling_params) if parse_calls else {}
                turn = await turn_session.generate(**{**markers, **overrides})
            except GatewayError:  # bad input: no call was made
                raise
            except BaseException:
                self.failed_calls += 1
                raise
            assert self.tool_format is not None  # decided when the first segment started
            reply = reply_of(turn.text, parse_calls, self.tool_format, tools)
            reply_k = reply_key(reply)
            self._remember(reply_k, turn.text)
            self._cursor = _Cursor([*keys, reply_k], tools_key, turn_session, sampled=True)
            self.calls += 1
        finish = "tool_calls" if reply.tool_calls else (turn.finish_reason or "stop")
        return RecordedCall(reply, finish, turn.prompt_len, len(turn.output_ids), turn.stop_sequence)

    def trajectories(self) -> list[Trajectory]:
        """A consistent copy of every segment with at least one sampled turn, in order."""
        copies = [segment.tokens.snapshot() for segment in self.segments]
        return [copy for copy in copies if copy.turns]

    def close(self) -> None:
        """Unpin the session for good; a later call raises SessionFinished."""
        self._closed = True
        for segment in self.segments:
            segment.finish()

    # internals ----------------------------------------------------------------------------------

    async def _place(
        self,
        request: ChatCompletionRequest,
        keys: list[MessageKey],
        tools: list[dict[str, Any]] | None,
        tools_key: str,
    ) -> LLMSession:
        """The segment this call's turn is sampled in, its new messages appended."""
        cursor = self._cursor
        if cursor is not None and cursor.tools == tools_key:
            if cursor.sampled and len(keys) > len(cursor.keys) and keys[: len(cursor.keys)] == cursor.keys:
                new = request.messages[len(cursor.keys) :]
                await cursor.segment.add_messages(
                    [self._template(m, k) for m, k in zip(new, keys[len(cursor.keys) :], strict=True)]
                )
                self._cursor = _Cursor(keys, tools_key, cursor.segment, sampled=False)
                return cursor.segment
            if not cursor.sampled and keys == cursor.keys:
                return cursor.segment  # a retry: the messages are already in the segment
        if len(self.segments) >= self.max_segments:
            raise bad_request(
                f"this session already has {self.max_segments} segments (the server's --gateway-max-segments): "
                "close it and open a new one",
                code="too_many_segments",
            )
        if self._closed:
            raise SessionFinished(f"session {self.job_id} is closed")
        segment = self._new_segment()
        if self.tool_format is None:  # auto: the family of the backend the session is pinned to now
            self.tool_format = backend_format("auto", await segment.chat_template())
        await segment.start([self._template(m, k) for m, k in zip(request.messages, keys, strict=True)], tools)
        if self._closed:  # closed meanwhile: this segment must not pin the backend again
            segment.finish()
            raise SessionFinished(f"session {self.job_id} is closed")
        if self.calls:  # a history that does not continue an answered call
            self.rewrites += 1
        self.segments.append(segment)
        self._cursor = _Cursor(keys, tools_key, segment, sampled=False)
        return segment

    def _new_segment(self) -> LLMSession:
        return LLMSession(
            self.job_id,
            self.pool,
            Trajectory(),
            self.sampling_params,
            max_failovers=self.max_failovers,
            client=self.pool.client,
            data_source=self.data_source,
            dispatch=self.dispatch,
        )

    def _template(self, message: Any, key: MessageKey) -> dict[str, Any]:
        assert self.tool_format is not None  # decided before any message is templated
        return template_message(message, self._sampled.get(key), self.tool_format)

    def _remember(self, key: MessageKey, text: str) -> None:
        self._sampled[key] = text
        if len(self._sampled) > MAX_REMEMBERED_REPLIES:
            self._sampled.popitem(last=False)
