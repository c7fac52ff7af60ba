"""ConversationRecorder: a harness's chat completions recorded token-exact, as chains of segments.

Each segment is an `LLMSession` with its own trajectory (prompt ids, response ids, mask, logprobs); each
chain is a list of segments (`gateway.chains` decides which chain a call joins, and how). A call that
continues a chain's tip is sampled in its last segment: the stored ids are reused and only the new messages
are tokenized (the session's chat-template delta), so the segment holds exactly the ids the engine sampled,
whatever other chains did in between. A rollback to an earlier turn starts a new segment from the ids that
turn was sampled from; a rewrite (same head, another history) starts one from the chat template of all its
messages and counts as a rewrite of its chain; a call sharing nothing starts a new chain.

The turn's `max_tokens` (the harness's, when `harness_params` allows it, else the trainer's) is cut to what
the pinned backend's context (`max_model_len`) leaves after the prompt; a prompt that leaves no room is
refused with ContextLengthExceeded (a 400 each dialect words as its vendor does), and nothing is sampled.

A call that failed after its new messages were appended leaves them in the segment: the same messages
sent again (a retry) sample the turn there. A segment without a sampled turn is left out of the result,
and so is a chain without one.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from prorl_server.gateway.chains import Chain, Digest, Move, digest, head_of, place
from prorl_server.gateway.errors import ContextLengthExceeded, GatewayError, bad_request
from prorl_server.gateway.messages import check_messages, message_key, reply_key, reply_of, template_message
from prorl_server.gateway.protocol import AssistantReply, ChatCompletionRequest
from prorl_server.llm import BackendPool, LLMSession, SessionFinished
from prorl_server.protocol import ChainRecord, Trajectory
from prorl_server.scheduling import DispatchPolicy
from prorl_server.tool_call_formats import ToolCallFormat, backend_format, keep_call_markers

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


class ConversationRecorder:
    """The chains of one session's calls, all on one backend (pinned at the first call, as a job's are,
    under `job_id`).

    `sampling_params` are the trainer's; a harness's sampling field is used only when it is in
    `harness_params`. Tool calls are parsed and rendered in `tool_format` (None: `--tool-call-format auto`,
    the family of the pinned backend's chat template, decided when the first segment starts). Calls are
    recorded one at a time, in arrival order; at most `max_segments` segments in at most `max_chains` chains.
    """

    def __init__(
        self,
        job_id: str,
        pool: BackendPool,
        sampling_params: dict[str, Any],
        harness_params: frozenset[str],
        *,
        max_segments: int,
        max_chains: int,
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
        self.max_chains = max_chains
        self.max_failovers = max_failovers
        self.dispatch = dispatch
        self.data_source = data_source
        self.chains: list[Chain] = []
        self.segments: list[LLMSession] = []  # of every chain, in the order they started
        self.rewrites = 0
        self.calls = 0
        self.side_calls = 0
        self.failed_calls = 0
        self._closed = False
        self._sampled: OrderedDict[Digest, str] = OrderedDict()  # reply digest -> the text the model sampled
        self._lock = asyncio.Lock()

    async def complete(self, request: ChatCompletionRequest, *, side_call: bool = False) -> RecordedCall:
        """Sample the reply to `request` and record it (`side_call`: under another model name than the
        session's, in that name's own chains); raises a GatewayError (4xx) for bad input and the session's
        LLMError when the backends fail."""
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
        tools_key = digest(json.dumps(tools, sort_keys=True)) if tools else b""
        keys = [digest(message_key(m)) for m in request.messages]
        overrides = {k: v for k, v in request.harness_sampling().items() if k in self.harness_params}
        async with self._lock:
            try:
                chain = await self._place(request, keys, tools, tools_key, side_call)
                segment = chain.segments[-1]
                markers = keep_call_markers(segment.sampling_params) if parse_calls else {}
                fitted = await _fit_context(segment, overrides)
                turn = await segment.generate(**{**markers, **fitted})
            except GatewayError:  # bad input: no call was made
                raise
            except BaseException:
                self.failed_calls += 1
                raise
            assert self.tool_format is not None  # decided when the first segment started
            reply = reply_of(turn.text, parse_calls, self.tool_format, tools)
            reply_k = digest(reply_key(reply))
            self._remember(reply_k, turn.text)
            chain.turn_starts.append((len(keys), turn.prompt_len))
            chain.keys, chain.sampled = [*keys, reply_k], True
            chain.calls += 1
            self.calls += 1
            self.side_calls += int(side_call)
        finish = "tool_calls" if reply.tool_calls else (turn.finish_reason or "stop")
        return RecordedCall(reply, finish, turn.prompt_len, len(turn.output_ids), turn.stop_sequence)

    def recording(self) -> tuple[list[Trajectory], list[ChainRecord]]:
        """A consistent copy of every segment with a sampled turn, in the order they started, and of every
        chain with one (its segments in order)."""
        copies = {id(segment): segment.tokens.snapshot() for segment in self.segments}
        segments = [copies[id(s)] for s in self.segments if copies[id(s)].turns]
        chains = []
        for chain in self.chains:
            kept = [copies[id(s)] for s in chain.segments if copies[id(s)].turns]
            if kept:
                chains.append(
                    ChainRecord(
                        id=chain.id,
                        model=chain.model,
                        side_call=chain.side_call,
                        segments=kept,
                        calls=chain.calls,
                        rewrites=chain.rewrites,
                        sampled_tokens=sum(sum(s.response_mask) for s in kept),
                    )
                )
        return segments, chains

    def close(self) -> None:
        """Unpin the session for good; a later call raises SessionFinished."""
        self._closed = True
        for segment in self.segments:
            segment.finish()

    # internals ----------------------------------------------------------------------------------

    async def _place(
        self,
        request: ChatCompletionRequest,
        keys: list[Digest],
        tools: list[dict[str, Any]] | None,
        tools_key: Digest,
        side_call: bool,
    ) -> Chain:
        """The chain this call's turn is sampled in (in its last segment), its new messages appended."""
        head = head_of(request.messages, keys)
        where = place(self.chains, request.model if side_call else None, keys, head, tools_key)
        chain = where.chain
        if where.move is Move.RETRY:  # the messages are already in the segment
            assert chain is not None
            chain.last_used = self.calls
            return chain
        if where.move is Move.CONTINUE:
            assert chain is not None
            new = range(len(chain.keys), len(keys))
            await chain.segments[-1].add_messages([self._template(request.messages[i], keys[i]) for i in new])
            chain.keys, chain.sampled, chain.last_used = keys, False, self.calls
            return chain
        if len(self.segments) >= self.max_segments:
            raise bad_request(
                f"this session already has {self.max_segments} segments (the server's --gateway-max-segments): "
                "close it and open a new one",
                code="too_many_segments",
            )
        if where.move is Move.NEW and len(self.chains) >= self.max_chains:
            raise bad_request(
                f"this session already has {self.max_chains} chains (the server's --gateway-max-chains): this "
                "call continues none of them and shares no chain's first messages; close the session and open "
                "a new one",
                code="too_many_chains",
            )
        if self._closed:
            raise SessionFinished(f"session {self.job_id} is closed")
        segment = self._new_segment()
        if self.tool_format is None:  # auto: the family of the backend the session is pinned to now
            self.tool_format = backend_format("auto", await segment.chat_template())
        messages = [self._template(m, k) for m, k in zip(request.messages, keys, strict=True)]
        if where.move is Move.ROLLBACK:  # the prompt that turn was sampled from, as the engine saw it
            assert chain is not None
            await segment.start_from_ids(chain.segments[-1].token_ids[: where.prompt_len], messages)
        else:
            await segment.start(messages, tools)
        if self._closed:  # closed meanwhile: this segment must not pin the backend again
            segment.finish()
            raise SessionFinished(f"session {self.job_id} is closed")
        if chain is None:
            chain = Chain(len(self.chains), request.model, side_call, head)
            self.chains.append(chain)
        elif chain.calls:  # a history that does not continue the chain's answered calls
            chain.rewrites += 1
            self.rewrites += 1
        chain.segments.append(segment)
        self.segments.append(segment)
        chain.keys, chain.tools, chain.sampled, chain.turn_starts = keys, tools_key, False, []
        chain.last_used = self.calls
        return chain

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

    def _template(self, message: Any, key: Digest) -> dict[str, Any]:
        assert self.tool_format is not None  # decided before any message is templated
        return template_message(message, self._sampled.get(key), self.tool_format)

    def _remember(self, key: Digest, text: str) -> None:
        self._sampled[key] = text
        if len(self._sampled) > MAX_REMEMBERED_REPLIES:
            self._sampled.popitem(last=False)


async def _fit_context(segment: LLMSession, overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` with the turn's `max_tokens` (the override, else the segment's own) cut to the room its
    backend's context leaves after the prompt; ContextLengthExceeded when it leaves none. Unchanged when the
    backend does not tell its context length."""
    limit = await segment.context_limit()
    if limit is None:
        return overrides
    prompt_tokens = len(segment.token_ids)
    if prompt_tokens >= limit:
        raise ContextLengthExceeded(prompt_tokens, limit)
    room = limit - prompt_tokens
    requested = overrides.get("max_tokens", segment.sampling_params.get("max_tokens"))
    if isinstance(requested, int) and requested > room:
        return {**overrides, "max_tokens": room}
    return overrides
