"""LLMSession: one job's conversation with the backends, kept as token ids.

The model's output is never decoded and re-encoded: the next prompt is the previous prompt plus the
sampled ids plus the ids of the new messages. Those ids are the chat-template delta,
`template(base + new, add_generation_prompt=True)` minus `template(base)`, computed on a fixed
two-message base (so each turn tokenizes a few small messages, not the whole history): in the server when
the pool verified a local tokenizer for the backend (`BackendPool.local_tokenizer`, no request), else by
the backend's `/tokenize`. When the sampled ids do not end with the tokens the template
puts after an assistant message (for example the newline after `<|im_end|>`, or the whole end-of-turn
marker when generation stopped on length), the missing ones are inserted as observation tokens, so the
stream equals what the template would give for the same messages.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from prorl_server.llm.backend import Backend
from prorl_server.llm.backend_pool import BackendPool, Lease
from prorl_server.llm.errors import (
    ChatTemplateError,
    LLMError,
    SessionFinished,
)
from prorl_server.llm.failover import CallClock, Failover
from prorl_server.llm.local_tokenizer import ChatTokenizer
from prorl_server.llm.response_limits import requested_tokens
from prorl_server.llm.template_shape import TemplateShape
from prorl_server.llm.token_stream import TokenStream
from prorl_server.llm.tokenizer_check import BASE as _BASE
from prorl_server.llm.tokenizer_check import BASE_OTHER as _BASE_OTHER
from prorl_server.llm.vllm_client import VLLMClient
from prorl_server.llm.vllm_parsing import Completion
from prorl_server.llm.weight_pause_gate import PauseClock, Ticket
from prorl_server.protocol import ErrorKind, Trajectory, TurnRecord, WeightSpan
from prorl_server.scheduling import DispatchPolicy, TrajectoryTelemetry, TrajectoryView, prompt_key_of

T = TypeVar("T")

# The session sets these itself; a trainer's sampling_params cannot override them.
RESERVED_SAMPLING_KEYS = frozenset({"prompt", "model", "return_token_ids", "logprobs", "stream", "n", "echo"})


class StaleRollout(LLMError):
    """The job's oldest turn is more weight versions behind the weights of its next turn than it may be
    (`max_staleness`, policy "end"): the turn is not sampled and the job ends with status `stale`."""

    error_kind = ErrorKind.STALE_ROLLOUT


def missing_turn_close(output_ids: list[int], turn_close: list[int]) -> list[int]:
    """The part of `turn_close` that `output_ids` does not already end with."""
    for k in range(min(len(turn_close), len(output_ids)), 0, -1):
        if output_ids[-k:] == turn_close[:k]:
            return turn_close[k:]
    return list(turn_close)


def versioned_cache_salt(params: dict[str, Any], version: str | int | None) -> dict[str, Any]:
    """`params` with vLLM's `cache_salt` naming the weight version (`w{version}`, after the trainer's own
    salt: `{salt}:w{version}`), so no prefix cached under other weights is reused; unchanged without a
    version."""
    if version is None:
        return params
    salt = params.get("cache_salt")
    return {**params, "cache_salt": f"{salt}:w{version}" if salt else f"w{version}"}


@dataclass(frozen=True)
class SentCompletion:
    """One answered completion call and the weight version of the backend it was sent to, read as it was sent
    (updates happen only while no call is in flight, and a call aborted for one is sent again)."""

    completion: Completion
    weight_version: str | int | None


def turn_record(sent: SentCompletion, backend: str, *, prompt_len: int, clock: CallClock, llm_s: float) -> TurnRecord:
    """The record of a sampled turn: the call's output, the backend that answered it, and the weight version
    it was sampled under (with the versions it was resumed under after keep pauses, and their spans)."""
    completion, version, resumed = sent.completion, sent.weight_version, clock.resumed_under
    return TurnRecord(
        backend=backend,
        weight_version=version,
        resumed_under=resumed,
        weight_spans=weight_spans(completion.weight_spans, version, resumed, len(completion.output_ids))
        if resumed
        else None,
        finish_reason=completion.finish_reason,
        stop_sequence=completion.stop_reason if isinstance(completion.stop_reason, str) else None,
        prompt_len=prompt_len,
        output_ids=completion.output_ids,
        logprobs=completion.logprobs,
        text=completion.text,
        llm_s=llm_s,
        queue_s=clock.queue_s,
    )


def weight_spans(
    engine_spans: list[tuple[str, int, int]] | None,
    own: str | int | None,
    resumed: list[str | int],
    n_tokens: int,
) -> list[WeightSpan] | None:
    """Which output tokens of a kept turn each version sampled, from the engine's labelled spans: a span
    labelled with the text of a version the turn was `resumed` under is that version's (in their order),
    the spans before the first of them are the turn's `own` version (whatever the engine's label: the server
    labels an engine only around a keep pause). None unless the spans are well formed: contiguous from 0 to
    `n_tokens`."""
    if not engine_spans or own is None:
        return None
    labels = [str(v) for v in resumed]
    spans: list[WeightSpan] = []
    at, index = 0, -1  # index: the last resumed version seen
    for label, start, end in engine_spans:
        if start != at or end <= start:
            return None
        if label in labels[max(index, 0) :]:
            index = labels.index(label, max(index, 0))
            version = resumed[index]
        elif index >= 0:
            return None  # an unknown label after a resumed version's
        else:
            version = own
        if spans and spans[-1].version == version and type(spans[-1].version) is type(version):
            spans[-1].end = end
        else:
            spans.append(WeightSpan(version=version, start=start, end=end))
        at = end
    return spans if at == n_tokens else None


class LLMSession:
    """Token-in/token-out conversation of one job, pinned to one backend (re-placed if it fails).

    A call whose backend fails (unreachable, server error, stalled, malformed answer) is retried with
    backoff, on another backend when there is one, for at most `max_failovers` failed requests and the
    pool's retry budget; while no backend can take it, it waits within the same budget (`failover.py`).

    Bounded staleness: with `max_staleness` set, each sampled turn is first checked against the job's
    turns so far: when the version it would be sampled under (its backend's, read after the weight-pause gate,
    so after any weight update) is more than `max_staleness` versions ahead of the oldest recorded turn's
    version (`WeightVersions.distance`), policy "end" raises StaleRollout and leaves its message in
    `stale` (this and every later call raises), and "continue" samples it anyway. A group's refill also
    counts from `group_versions`, the versions its group's finished members were sampled under.

    `pause_clock` (the job's budget timer) is held while a call waits at a weight-update pause. `client`
    sends the requests (default: the pool's). Every write to `trajectory` goes through `tokens`.

    Dispatch: with the pool's `max_inflight_per_backend`, each completion waits for an admission slot of its
    backend (`admission.py`) in the order of `dispatch` (a `scheduling.DispatchPolicy`; arrival order without
    one), which may also send that order as vLLM's `priority` field (a `priority` in the trainer's sampling
    params is sent as it is). `telemetry` keeps the job's LLM, admission-queue and tool time; `view()` is what
    a scheduling policy sees of the trajectory.
    """

    def __init__(
        self,
        job_id: str,
        pool: BackendPool,
        trajectory: Trajectory,
        sampling_params: dict[str, Any] | None = None,
        *,
        max_failovers: int = 3,
        max_staleness: int | None = None,
        stale_policy: Literal["end", "continue"] = "end",
        pause_clock: PauseClock | None = None,
        client: VLLMClient | None = None,
        data_source: str = "",
        dispatch: DispatchPolicy | None = None,
        group_versions: tuple[str | int, ...] = (),
    ) -> None:
        self.job_id = job_id
        self.data_source = data_source
        self.dispatch = dispatch
        self.telemetry = TrajectoryTelemetry()
        self._trajectory_seq = dispatch.new_trajectory() if dispatch is not None else 0
        self._prompt_key: str | None = None
        self.pool = pool
        self.client = client if client is not None else pool.client
        self.trajectory = trajectory
        self.tokens = TokenStream(trajectory)
        self.sampling_params = {k: v for k, v in (sampling_params or {}).items() if k not in RESERVED_SAMPLING_KEYS}
        self.max_staleness = max_staleness
        self.stale_policy = stale_policy
        self.group_versions = group_versions
        self.stale: str | None = None  # why the job ended stale (policy "end"), once it did
        self._turn_open = False
        self._finished = False
        self._lock = threading.Lock()
        self._local_shapes: dict[ChatTokenizer, TemplateShape] = {}
        self._failover = Failover(pool, self._acquire, max_failovers=max_failovers, pause_clock=pause_clock)

    # public API ---------------------------------------------------------------------------------

    @property
    def max_failovers(self) -> int:
        return self._failover.max_failovers

    @property
    def pause_clock(self) -> PauseClock | None:
        return self._failover.pause_clock

    @property
    def token_ids(self) -> list[int]:
        """The whole context so far: prompt ids followed by response ids."""
        return self.tokens.token_ids

    def view(self) -> TrajectoryView:
        """The trajectory as a scheduling policy sees it now (turns, and model and observation tokens)."""
        if self._prompt_key is None:
            self._prompt_key = prompt_key_of(self.trajectory.prompt_ids)  # set once, before the first turn
        prompt_len, turns, model_tokens, observation_tokens = self.tokens.counts()
        return TrajectoryView(
            data_source=self.data_source,
            prompt_key=self._prompt_key,
            prompt_len=prompt_len,
            turns=turns,
            model_tokens=model_tokens,
            observation_tokens=observation_tokens,
        )

    async def start(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Set the prompt: the chat template of `messages` with the generation prompt; returns its ids."""
        if self.tokens.started:
            raise RuntimeError("LLMSession.start() was already called for this job")
        ids = await self._chat_ids(messages, True, tools)
        self.tokens.set_prompt(ids, messages)
        return ids

    async def start_from_ids(self, prompt_ids: list[int], messages: list[dict[str, Any]] | None = None) -> None:
        """Set the prompt from token ids the caller already has (kept for the record: `messages`)."""
        if self.tokens.started:
            raise RuntimeError("LLMSession.start() was already called for this job")
        self.tokens.set_prompt(prompt_ids, messages or [])

    async def generate(self, **sampling_overrides: Any) -> TurnRecord:
        """Sample one assistant turn from the current context and append it (mask 1)."""
        if not self.trajectory.prompt_ids:
            raise RuntimeError("call LLMSession.start(messages) before generate()")
        params = {**self.sampling_params, **sampling_overrides}
        for key in RESERVED_SAMPLING_KEYS & params.keys():
            del params[key]
        prompt = self.token_ids
        self.telemetry.call_started()
        priority = self.dispatch.priority(self._trajectory_seq, self.view) if self.dispatch is not None else 0
        if self.dispatch is not None and self.dispatch.sends_priority:
            params.setdefault("priority", priority)  # the trainer's own priority is sent as it is

        async def complete(backend: Backend) -> SentCompletion:
            # the weights this request was sent to: updates happen only while no call is in flight (the
            # weight-pause gate), and a call aborted for an update is sent again, reading the new version
            version = backend.weight_version
            self._check_staleness(version)
            max_new = requested_tokens(params, len(prompt), backend.max_model_len)
            started = time.monotonic()
            completion = await self.client.complete(
                backend.address,
                backend.model,
                prompt,
                versioned_cache_salt(params, version),
                max_new_tokens=max_new,
                vocab_size=backend.vocab_size,
                timeout_s=self.pool.completion_timeout(backend, max_new),
                job_id=self.job_id,
            )
            elapsed = time.monotonic() - started
            self.pool.observe_completion(backend, len(prompt), len(completion.output_ids), elapsed)
            return SentCompletion(completion, version)

        if not self._finished:  # placement, or a move at a tool-call boundary (no call of the job is running)
            self.pool.before_completion(self.job_id, self.view)
        clock = CallClock()
        started = time.monotonic()
        try:
            sent, backend = await self._failover.run(complete, priority, clock)
        except BaseException:
            self.telemetry.call_ended(self._llm_seconds(started, clock), clock.queue_s, answered=False)
            raise
        llm_s = self._llm_seconds(started, clock)
        self.telemetry.call_ended(llm_s, clock.queue_s, answered=True)
        if clock.resumed_under:
            self._check_staleness(clock.resumed_under[-1], also=sent.weight_version, kept=True)
        turn = turn_record(sent, backend.address, prompt_len=len(prompt), clock=clock, llm_s=llm_s)
        completion = sent.completion
        self.tokens.append_sampled(
            completion.output_ids, completion.logprobs, turn, {"role": "assistant", "content": completion.text}
        )
        self._turn_open = True
        return turn

    async def add_messages(self, messages: list[dict[str, Any]]) -> list[int]:
        """Append observation messages (tool results, user turns) as template-delta ids (mask 0)."""
        if not messages:
            return []
        if not self._turn_open:
            raise RuntimeError(
                "add_messages() appends observations after a generated turn; put the first messages in start(messages)"
            )
        shape = await self._template_shape()
        full = await self._chat_ids([*_BASE, *messages], True)
        if full[: len(shape.base_ids)] != shape.base_ids:
            raise ChatTemplateError(
                "the backend's chat template renders earlier messages differently once new ones are "
                "added, so observation tokens cannot be appended incrementally"
            )
        last_output = self.trajectory.turns[-1].output_ids
        delta = missing_turn_close(last_output, shape.turn_close) + full[len(shape.base_ids) :]
        self.tokens.append_observation(delta, messages)
        self._turn_open = False
        return delta

    async def context_limit(self) -> int | None:
        """The pinned backend's context length (`max_model_len` of `/v1/models`), None if it does not say."""

        async def limit(backend: Backend) -> int | None:
            return backend.max_model_len

        return await self._with_backend(limit)

    async def chat_template(self) -> str | None:
        """The pinned backend's chat template when the server tokenizes its chats (None: not known here)."""

        async def template(backend: Backend) -> str | None:
            return backend.chat_tokenizer.chat_template if backend.chat_tokenizer is not None else None

        return await self._with_backend(template)

    async def tokenize(self, text: str) -> list[int]:
        """Token ids of plain text, from the pinned backend's tokenizer."""
        return await self._with_backend(
            lambda b: self.client.tokenize_text(
                b.address, b.model, text, vocab_size=b.vocab_size, timeout_s=self.pool.short_call_timeout
            )
        )

    async def detokenize(self, ids: list[int]) -> str:
        """Text of token ids, from the pinned backend's tokenizer."""
        return await self._with_backend(
            lambda b: self.client.detokenize(b.address, b.model, ids, timeout_s=self.pool.short_call_timeout)
        )

    def close(self) -> None:
        """Unpin the job from its backend (idempotent); a later call pins it again."""
        self.pool.release(self.job_id)

    def finish(self) -> None:
        """Unpin for good: the job is terminal, and any later call raises SessionFinished."""
        with self._lock:
            self._finished = True
            self.pool.release(self.job_id)

    def _acquire(self, avoid: Collection[str], ticket: Ticket | None = None) -> Lease:
        with self._lock:
            self._check_open()
            return self.pool.acquire(self.job_id, avoid, ticket)

    def _local_tokenizer(self) -> ChatTokenizer | None:
        """The tokenizer to tokenize this job's chats with in the server (`BackendPool.local_tokenizer`);
        raises as a call to the backend would once the session is finished or stale."""
        with self._lock:
            self._check_open()
        return self.pool.local_tokenizer(self.job_id)

    def _check_open(self) -> None:
        if self._finished:
            raise SessionFinished(f"job {self.job_id} has already ended; its LLM session is closed")
        if self.stale is not None:
            raise StaleRollout(self.stale)

    def _check_staleness(self, version: str | int | None, *, also: str | int | None = None, kept: bool = False) -> None:
        """Raise StaleRollout (policy "end") when a turn sampled under `version` would be more than
        `max_staleness` versions ahead of the oldest turn so far (the group's too, for a refill; and `also`,
        the first version of a `kept` turn, which is then dropped)."""
        if self.max_staleness is None or self.stale_policy != "end" or version is None:
            return
        sampled = [(old, "the job's oldest turn") for old in self.trajectory.weight_versions]
        sampled += [(old, "the oldest turn of the group it refills") for old in self.group_versions]
        if also is not None:
            sampled.append((also, "the start of the turn a keep pause resumed"))
        worst: tuple[int, str | int, str] | None = None
        for old, whose in sampled:
            distance = self.pool.versions.distance(old, version)
            if distance is not None and (worst is None or distance > worst[0]):
                worst = (distance, old, whose)
        if worst is None or worst[0] <= self.max_staleness:
            return
        distance, old, whose = worst
        n = len(self.trajectory.turns)
        if kept:
            newest = f"version {version!r} that a keep pause resumed turn {n + 1} under"
            what = f"turn {n + 1} was dropped"
        else:
            newest = f"version {version!r} that its next turn would be sampled under"
            what = f"turn {n + 1} was not sampled"
        self.stale = (
            f"{whose} was sampled under weight version {old!r}, {distance} version(s) behind {newest}; "
            f"max_staleness is {self.max_staleness} ({what}; the {n} before are kept)"
        )
        raise StaleRollout(self.stale)

    # internals ----------------------------------------------------------------------------------

    @staticmethod
    def _llm_seconds(started: float, clock: CallClock) -> float:
        """A call's time since `started` less its admission and weight-pause waits."""
        return max(0.0, time.monotonic() - started - clock.queue_s - clock.pause_s)

    async def _template_shape(self) -> TemplateShape:
        local = self._local_tokenizer()
        if local is not None:
            shape = self._local_shapes.get(local)
            if shape is None:
                base = local.encode_chat(_BASE, add_generation_prompt=False)
                other = local.encode_chat(_BASE_OTHER, add_generation_prompt=False)
                shape = self._local_shapes[local] = TemplateShape.from_ids(base, other)
            return shape

        async def probe(backend: Backend) -> TemplateShape:
            shape = self.pool.notes(backend).template_shape
            if shape is None:
                base = await self._tokenize_messages(backend, _BASE, False)
                other = await self._tokenize_messages(backend, _BASE_OTHER, False)
                shape = TemplateShape.from_ids(base, other)
                self.pool.notes(backend).template_shape = shape
            return shape

        return await self._with_backend(probe)

    async def _chat_ids(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: list[dict[str, Any]] | None = None
    ) -> list[int]:
        """The chat template of `messages` as ids: in the server with the job's local tokenizer (no request),
        else from the backend's /tokenize (also for messages the local path does not prepare, or that its
        template refuses: the backend then says why)."""
        local = self._local_tokenizer()
        if local is not None and local.accepts(messages):
            with contextlib.suppress(Exception):  # the backend renders them again and reports the problem
                return local.encode_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        return await self._with_backend(lambda b: self._tokenize_messages(b, messages, add_generation_prompt, tools))

    def _tokenize_messages(
        self,
        backend: Backend,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> Awaitable[list[int]]:
        """The backend's chat template of `messages`, as ids checked against its vocabulary."""
        return self.pool.tokenize_chat(backend, messages, add_generation_prompt, tools, self.client)

    async def _with_backend(self, call: Callable[[Backend], Awaitable[T]]) -> T:
        """Run `call` on the job's backend, failing over when it fails (`Failover.run`)."""
        result, _ = await self._failover.run(call)
        return result
