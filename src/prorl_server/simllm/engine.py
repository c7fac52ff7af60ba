"""The simulated engine: a discrete-step loop timing synthetic completions as a vLLM engine would run them.

Each step decodes one token for every running request; it lasts the profile's per-token time at the running
batch size, plus the prefill of the requests admitted in that step (their uncached prompt tokens times the
prefill cost per token; a request's first token comes at the end of its admission step). At most
`max_num_seqs` requests run; the others wait, lower `priority` first, then first come first served. When
the batch is full and a waiting request has a strictly lower priority value than the worst running one
(highest value, latest arrival), that one is preempted back to the queue: its KV is dropped, and on resume
its prompt and the tokens it already generated are computed again (counted as prefill).

Time: the simulated clock advances by the step durations while requests run, and at `time_scale`
simulated seconds per wall second while idle; each step sleeps its duration divided by `time_scale` (on
the event loop, catching up after late wake-ups). Requests arriving during a step join at the next one.
Each finished request reports its simulated queue, prefill and decode seconds (`SimTiming`).

Keep pause (`pause`, `resume`): the step loop stops between two steps, every request stays where it is,
and simulated time follows the wall clock until the resume. Each token is labelled with the weight-version
label set when its step began (`set_label`; `devllm.keep_pause`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from prorl_server.devllm import DEFAULT_LABEL, EngineStats, Generation, SamplingParams, check_model, track
from prorl_server.simllm.config import SimLLMSettings
from prorl_server.simllm.outputs import request_rng, synthesize
from prorl_server.simllm.prefix_cache import PrefixCache
from prorl_server.simllm.tokenizer import SimTokenizer

MAX_LAG_S = 1.0  # wall seconds the step loop may fall behind and then run faster to catch up


class SimTiming(BaseModel):
    """Simulated seconds of one request (the `sim` field of a completion): `arrived_s` and `finished_s` on the
    engine's clock (0 at start); `queue_s` + `prefill_s` + `decode_s` = `finished_s` - `arrived_s`. `prefill_s` is
    the request's own prefill; `decode_s` the rest of the steps it ran in, so it includes the prefill of
    requests admitted beside it (which stalls the batch, as without chunked prefill)."""

    arrived_s: float
    finished_s: float = 0.0
    queue_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    cached_tokens: int = Field(default=0, description="prompt tokens found in the prefix cache at first admission")
    prefill_tokens: int = Field(default=0, description="tokens computed in prefill, recomputed ones included")
    preemptions: int = 0


@dataclass(eq=False)
class SimRequest:
    """A request in the engine: its synthetic completion and how far it got."""

    gen: Generation
    priority: int
    order: int
    timing: SimTiming
    done: asyncio.Future[tuple[Generation, SimTiming]]
    waiting_since: float
    generated: int = 0
    admitted_before: bool = False
    running_s: float = 0.0  # simulated time of the steps it ran in

    def rank(self) -> tuple[int, int]:
        """Scheduling order: lower runs first, and is preempted last."""
        return self.priority, self.order


@dataclass
class Clock:
    """The simulated clock: advanced by step durations while busy, by scaled wall time while idle."""

    scale: float
    now_s: float = 0.0
    anchor_wall: float = field(default_factory=time.monotonic)
    cap_s: float | None = None  # while busy: the end of the running step (or now, between steps)

    def read(self) -> float:
        """Simulated now: the anchor plus scaled wall time, within the running step while busy."""
        now = self.now_s + (time.monotonic() - self.anchor_wall) * self.scale
        return now if self.cap_s is None else min(now, self.cap_s)

    def go_idle(self) -> None:
        """From now on, simulated time follows wall time."""
        self.anchor_wall, self.cap_s = time.monotonic(), None

    def resume(self, at: float) -> None:
        """Busy again from simulated time `at` (the latest arrival)."""
        self.now_s, self.anchor_wall, self.cap_s = at, time.monotonic(), at

    def begin_step(self, duration: float) -> None:
        """A step of `duration` simulated seconds starts now."""
        self.anchor_wall, self.cap_s = time.monotonic(), self.now_s + duration

    def end_step(self) -> None:
        """The running step is over: the clock is at its end."""
        assert self.cap_s is not None
        self.now_s, self.anchor_wall = self.cap_s, time.monotonic()


class SimEngine:
    """Schedules and times requests; `run` is its step loop (started by the app on its event loop)."""

    def __init__(self, settings: SimLLMSettings) -> None:
        self.settings = settings
        self.model_name = settings.model_name
        self.max_model_len = settings.max_model_len
        self._profile = settings.step_profile  # per decode step, model-parallel degree applied
        self.tokenizer = SimTokenizer()
        self.n_vocab = self.tokenizer.n_vocab
        self.cache = PrefixCache(settings.block_size, settings.cache_blocks)
        self.stats = EngineStats()
        self.preemptions = 0
        self.clock = Clock(settings.time_scale)
        self._running: list[SimRequest] = []
        self._waiting: list[tuple[tuple[int, int], SimRequest]] = []
        self._arrivals = itertools.count()
        self._wakeup = asyncio.Event()
        self._last_arrival = 0.0
        self.label = DEFAULT_LABEL  # the weight-version label of the tokens of the next steps
        self._paused = False
        self._resumed = asyncio.Event()
        self._parked = asyncio.Event()  # set while the step loop waits for the resume

    @property
    def paused(self) -> bool:
        """A keep pause holds the step loop."""
        return self._paused

    async def pause(self) -> None:
        """Stop stepping (the requests stay); returns once the running step is over."""
        self._paused = True
        self._resumed.clear()
        self._wakeup.set()
        await self._parked.wait()

    def resume(self) -> None:
        """Step again after `pause`."""
        self._paused = False
        self._resumed.set()

    def set_label(self, label: str) -> None:
        """Label the tokens of the steps that begin from now on."""
        self.label = label

    @property
    def num_running(self) -> int:
        """Requests in the decode batch."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests queued (new or preempted)."""
        return len(self._waiting)

    @property
    def decoded_in_flight(self) -> int:
        """Tokens decoded so far by the requests not finished yet (running, preempted or frozen)."""
        return sum(r.generated for r in self._running) + sum(entry[1].generated for entry in self._waiting)

    def check_model(self, model: str | None) -> None:
        """A request naming another model gets vLLM's 404."""
        check_model(model, self.model_name)

    async def generate(
        self,
        request_id: str,
        prompt: list[int],
        params: SamplingParams,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
    ) -> tuple[Generation, SimTiming]:
        """Run one validated request to its end; cancelling the awaiting task aborts it (queued or running)."""
        order = next(self._arrivals)
        rng = request_rng(self.settings.seed, params, order, prompt)
        gen = synthesize(
            request_id,
            prompt,
            params,
            rng,
            self.tokenizer,
            median=self.settings.output_len_median,
            sigma=self.settings.output_len_sigma,
            cache_salt=cache_salt,
        )
        arrived = self.clock.read()
        self._last_arrival = max(self._last_arrival, arrived)
        done: asyncio.Future[tuple[Generation, SimTiming]] = asyncio.get_running_loop().create_future()
        request = SimRequest(gen, priority, order, SimTiming(arrived_s=arrived), done, waiting_since=arrived)
        heapq.heappush(self._waiting, (request.rank(), request))
        self._wakeup.set()
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            self._abort(request)
            raise

    def _abort(self, request: SimRequest) -> None:
        if request.done.done():
            return
        request.done.cancel()
        if request in self._running:
            self._running.remove(request)
        else:
            self._waiting = [entry for entry in self._waiting if entry[1] is not request]
            heapq.heapify(self._waiting)
        self.stats.generation_tokens += request.generated
        self.stats.finished["abort"] += 1

    async def run(self) -> None:
        """The step loop: runs until cancelled; should it fail, the requests in it fail with its error."""
        try:
            await self._steps()
        except Exception as exc:
            for request in [*self._running, *(entry[1] for entry in self._waiting)]:
                if not request.done.done():
                    request.done.set_exception(exc)
            raise

    async def _steps(self) -> None:
        clock = self.clock
        deadline = time.monotonic()
        while True:
            if self._paused:
                clock.go_idle()
                self._parked.set()
                await self._resumed.wait()
                self._parked.clear()
                clock.resume(clock.read())
                deadline = time.monotonic()
                continue
            if not self._running and not self._waiting:
                clock.go_idle()
                self._wakeup.clear()
                await self._wakeup.wait()
                clock.resume(max(clock.now_s, self._last_arrival))
                deadline = time.monotonic()
                continue
            label = self.label
            duration = self._schedule(clock.now_s)  # the admitted requests' prefill
            duration += self._profile.seconds_per_token(len(self._running))
            clock.begin_step(duration)
            deadline = max(deadline, time.monotonic() - MAX_LAG_S) + duration / clock.scale
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            clock.end_step()
            for request in list(self._running):
                track(request.gen.version_starts, label, request.generated)
                request.generated += 1
                request.running_s += duration
                if request.generated == len(request.gen.output_ids):
                    self._finish(request)

    def _schedule(self, now: float) -> float:
        """Admit waiting requests (preempting where priority says so); returns the step's prefill seconds."""
        prefill_s = 0.0
        limit = self.settings.max_num_seqs
        while self._waiting:
            best = self._waiting[0][1]
            if len(self._running) >= limit:
                worst = max(self._running, key=SimRequest.rank)
                if best.priority >= worst.priority:
                    break
                self._preempt(worst, now)
            heapq.heappop(self._waiting)
            prefill_s += self._admit(best, now)
        return prefill_s

    def _preempt(self, request: SimRequest, now: float) -> None:
        self._running.remove(request)
        request.waiting_since = now
        request.timing.preemptions += 1
        self.preemptions += 1
        heapq.heappush(self._waiting, (request.rank(), request))

    def _admit(self, request: SimRequest, now: float) -> float:
        """Put `request` in the batch; returns its prefill seconds."""
        timing, prompt, salt = request.timing, request.gen.prompt_ids, request.gen.cache_salt
        timing.queue_s += now - request.waiting_since
        if request.admitted_before:  # resumed after preemption: recompute everything it had
            tokens = len(prompt) + request.generated
        else:
            cached = self.cache.lookup(prompt, salt)
            self.cache.insert(prompt, salt)
            timing.cached_tokens = request.gen.reused_prefix = cached
            self.stats.prompt_tokens += len(prompt)
            self.stats.prefix_cache_queries += len(prompt)
            self.stats.prefix_cache_hits += cached
            tokens = len(prompt) - cached
            request.admitted_before = True
        prefill_s = tokens * self.settings.prefill_s_per_token
        timing.prefill_tokens += tokens
        timing.prefill_s += prefill_s
        self._running.append(request)
        return prefill_s

    def _finish(self, request: SimRequest) -> None:
        self._running.remove(request)
        gen, timing = request.gen, request.timing
        self.cache.insert(gen.prompt_ids + gen.output_ids, gen.cache_salt)
        timing.finished_s = self.clock.now_s
        timing.decode_s = request.running_s - timing.prefill_s
        self.stats.generation_tokens += len(gen.output_ids)
        self.stats.finished[gen.finish_reason] += 1
        request.done.set_result((gen, timing))
