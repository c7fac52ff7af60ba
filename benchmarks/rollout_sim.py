"""A discrete-event simulation of an agentic rollout on LLM workers, in simulated time (for bench_heddle.py).

Each worker runs as `sim-llm` does (docs/simllm.md), without the HTTP: discrete decode steps, each lasting the
worker's per-token time at the running batch size plus the prefill of the requests admitted in it; at most
`profile.batch_limit` requests run, the others wait in priority order (lower first, then arrival); no
preemption. Calls of the same instant share the first step; calls arriving during a step join at the next. A worker's prefix cache holds, per trajectory, the context it computed last (no capacity limit,
no KV memory limit): a turn on the worker that ran the trajectory's previous turn recomputes only the new
observation, a turn elsewhere recomputes the whole context. A trajectory is a plan of turns (output tokens,
then tool seconds and observation tokens before the next turn); all are submitted at time 0.

A policy decides, for each LLM call, the worker (`route`) and the priority (`priority`), and hears when a
trajectory ends (`finished`). The trajectory-aware policy uses the server's own `TrajectoryPlacer` and
length predictor, so what runs here is the code `presorted_dp` runs.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prorl_server.scheduling.placement_runtime import RESOLVE_FRACTION, TrajectoryPlacer
from prorl_server.scheduling.predictor import LengthPredictor
from prorl_server.scheduling.profile import Profile
from prorl_server.scheduling.view import Prediction, TrajectoryView


@dataclass(frozen=True)
class Plan:
    """One trajectory: its prompt, each turn's output tokens, and the tool time and observation after each
    turn but the last."""

    key: str
    data_source: str
    prompt_key: str
    prompt_len: int
    tokens: tuple[int, ...]
    tool_s: tuple[float, ...]
    observations: tuple[int, ...]

    @property
    def output_tokens(self) -> int:
        """All its output tokens."""
        return sum(self.tokens)


@dataclass
class Trajectory:
    """A trajectory's progress."""

    plan: Plan
    turn: int = 0
    context: int = 0  # tokens of its context at its next call
    worker: int | None = None  # where its last turn ran
    finished_s: float | None = None
    moves: int = 0

    def view(self) -> TrajectoryView:
        """What a policy sees between turns."""
        plan = self.plan
        return TrajectoryView(
            data_source=plan.data_source,
            prompt_key=plan.prompt_key,
            prompt_len=plan.prompt_len,
            turns=self.turn,
            model_tokens=sum(plan.tokens[: self.turn]),
            observation_tokens=sum(plan.observations[: self.turn]),
            finished=self.turn == len(plan.tokens),
        )


@dataclass
class Worker:
    """A worker: its profile (batch limit included) and prefill cost, its running and waiting requests."""

    profile: Profile
    prefill_s_per_token: float
    step: int = 0
    busy: bool = False
    running: dict[str, int] = field(default_factory=dict)  # key -> the step count at which its turn ends
    ends: list[tuple[int, str]] = field(default_factory=list)  # heap of (end step, key)
    waiting: list[tuple[int, int, str]] = field(default_factory=list)  # heap of (priority, arrival, key)
    cached: dict[str, int] = field(default_factory=dict)  # key -> context tokens in its prefix cache
    prefill_tokens: int = 0
    context_tokens: int = 0  # of every admitted call (the prefix cache's queries)

    @property
    def limit(self) -> int:
        """Most requests running at once."""
        return self.profile.batch_limit or 1 << 30

    @property
    def load(self) -> int:
        """Requests running or waiting."""
        return len(self.running) + len(self.waiting)


class Policy(Protocol):
    """Where each call runs and in what order."""

    name: str

    def route(self, t: Trajectory, workers: Sequence[Worker]) -> int: ...

    def priority(self, t: Trajectory, call_seq: int) -> int: ...

    def finished(self, t: Trajectory) -> None: ...


class RouterPolicy:
    """The baselines. `least_load` (the verl-like one, as SGLang's router and Heddle's section 7.3 baseline):
    each call to the worker holding the trajectory's prefix unless the loads are skewed (the most loaded has
    more than `abs_threshold` requests more than the least and more than `rel_threshold` times as many), then
    to the least loaded. `cache_affine` (slime-like): each call to the worker holding its prefix, whatever the
    load; a first call to the least loaded. Both dispatch in call order (round robin over trajectories)."""

    def __init__(self, name: str, *, cache_affine: bool, abs_threshold: int = 32, rel_threshold: float = 1.5):
        self.name = name
        self.cache_affine = cache_affine
        self.abs_threshold = abs_threshold
        self.rel_threshold = rel_threshold

    def route(self, t: Trajectory, workers: Sequence[Worker]) -> int:
        loads = [w.load for w in workers]
        least = min(range(len(workers)), key=lambda i: (loads[i], i))
        if t.worker is None:
            return least
        if self.cache_affine:
            return t.worker
        skewed = max(loads) - min(loads) > self.abs_threshold and max(loads) > self.rel_threshold * min(loads)
        return least if skewed else t.worker

    def priority(self, t: Trajectory, call_seq: int) -> int:
        return call_seq

    def finished(self, t: Trajectory) -> None:
        pass


class HeddlePolicy:
    """Progressive priority (longest predicted remaining first) and the server's `TrajectoryPlacer`: the
    presorted DP at a trajectory's first call (heterogeneous workers: the sort-initialised mapping), sticky,
    migration at tool-call boundaries; the predictor learns each finished trajectory."""

    name = "heddle"

    def __init__(
        self,
        predictor: LengthPredictor,
        workers: Sequence[Worker],
        prefill_s_per_token: float,
        resolve_fraction: float = RESOLVE_FRACTION,
        history: Sequence[TrajectoryView] = (),
    ) -> None:
        self.predictor = predictor
        self.names = [f"w{i}" for i in range(len(workers))]
        profiles = {name: w.profile for name, w in zip(self.names, workers, strict=True)}
        self.placer = TrajectoryPlacer(
            predictor, workers[0].profile, prefill_s_per_token, profiles, resolve_fraction=resolve_fraction
        )
        for view in history:  # finished trajectories of an earlier epoch, as the predictor learnt them
            self.placer.learn(view)

    def route(self, t: Trajectory, workers: Sequence[Worker]) -> int:
        key = t.plan.key
        if key not in self.placer:
            return self.names.index(self.placer.place_new(key, t.view(), self.names))
        assert t.worker is not None
        target = self.placer.at_boundary(key, t.view(), self.names[t.worker], self.names)
        return t.worker if target is None else self.names.index(target)

    def priority(self, t: Trajectory, call_seq: int) -> int:
        return -round(self.predictor.predict(t.view()).remaining_tokens)

    def finished(self, t: Trajectory) -> None:
        self.placer.forget(t.plan.key)
        self.placer.learn(t.view())
        self.predictor.observe_finished(t.view())


class Clairvoyant:
    """A length predictor that knows each trajectory's plan (not a real one: the reference of what the same
    placement and priorities would do with exact predictions). `ClairvoyantPolicy` points it at the trajectory
    asked about before each decision."""

    name = "clairvoyant"

    def __init__(self) -> None:
        self.plan: Plan | None = None

    def predict(self, view: TrajectoryView) -> Prediction:
        """The exact remaining response tokens (model and observation) and turns of the current plan."""
        plan = self.plan
        assert plan is not None
        turns = view.turns
        tokens = sum(plan.tokens[turns:]) + sum(plan.observations[turns:])
        return Prediction(float(tokens), float(len(plan.tokens) - turns))

    def observe_finished(self, view: TrajectoryView) -> None:
        """Nothing to learn."""


class ClairvoyantPolicy(HeddlePolicy):
    """`HeddlePolicy` with the `Clairvoyant` predictor."""

    name = "heddle-clairvoyant"

    def __init__(self, workers: Sequence[Worker], prefill_s_per_token: float, **kwargs: object) -> None:
        self.oracle = Clairvoyant()
        super().__init__(self.oracle, workers, prefill_s_per_token, **kwargs)  # type: ignore[arg-type]

    def route(self, t: Trajectory, workers: Sequence[Worker]) -> int:
        self.oracle.plan = t.plan
        return super().route(t, workers)

    def priority(self, t: Trajectory, call_seq: int) -> int:
        self.oracle.plan = t.plan
        return super().priority(t, call_seq)


@dataclass
class Outcome:
    """What a simulated rollout gives."""

    makespan_s: float
    output_tokens: int
    cache_hit_rate: float
    migrations: int
    finish_s: dict[str, float]

    @property
    def throughput_tok_s(self) -> float:
        """Output tokens per simulated second."""
        return self.output_tokens / self.makespan_s


def simulate(plans: Sequence[Plan], workers: list[Worker], policy: Policy) -> Outcome:
    """Run every plan to its end (all submitted at time 0)."""
    events: list[tuple[float, int, str, object]] = []
    order = itertools.count()
    calls = itertools.count()
    trajectories = {p.key: Trajectory(p, context=p.prompt_len) for p in plans}

    def call(now: float, t: Trajectory) -> None:
        index = policy.route(t, workers)
        if t.worker is not None and index != t.worker:
            t.moves += 1
            workers[t.worker].cached.pop(t.plan.key, None)
        worker = workers[index]
        t.worker = index
        heapq.heappush(worker.waiting, (policy.priority(t, next(calls)), next(order), t.plan.key))
        if not worker.busy:  # start once every call of this instant is in (they share the first step)
            worker.busy = True
            heapq.heappush(events, (now, next(order), "start", index))

    def start_step(now: float, index: int) -> None:
        worker = workers[index]
        prefill = 0
        while worker.waiting and len(worker.running) < worker.limit:
            _, _, key = heapq.heappop(worker.waiting)
            t = trajectories[key]
            cached = min(worker.cached.get(key, 0), t.context - 1)
            prefill += t.context - cached
            worker.context_tokens += t.context
            end = worker.step + t.plan.tokens[t.turn]
            worker.running[key] = end
            heapq.heappush(worker.ends, (end, key))
        worker.prefill_tokens += prefill
        if not worker.running:
            worker.busy = False
            return
        worker.busy = True
        duration = worker.profile.seconds_per_token(len(worker.running)) + prefill * worker.prefill_s_per_token
        heapq.heappush(events, (now + duration, next(order), "step", index))

    def step_end(now: float, index: int) -> None:
        worker = workers[index]
        worker.step += 1
        while worker.ends and worker.ends[0][0] <= worker.step:
            _, key = heapq.heappop(worker.ends)
            del worker.running[key]
            t = trajectories[key]
            t.context += t.plan.tokens[t.turn]
            worker.cached[key] = t.context
            t.turn += 1
            if t.turn == len(t.plan.tokens):
                t.finished_s = now
                worker.cached.pop(key, None)
                policy.finished(t)
            else:
                t.context += t.plan.observations[t.turn - 1]
                heapq.heappush(events, (now + t.plan.tool_s[t.turn - 1], next(order), "call", t))
        start_step(now, index)

    for t in trajectories.values():
        heapq.heappush(events, (0.0, next(order), "call", t))
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "step":
            step_end(now, payload)  # type: ignore[arg-type]
        elif kind == "start":
            start_step(now, payload)  # type: ignore[arg-type]
        else:
            call(now, payload)  # type: ignore[arg-type]
    queried = sum(w.context_tokens for w in workers)
    computed = sum(w.prefill_tokens for w in workers)
    return Outcome(
        makespan_s=max(t.finished_s or 0.0 for t in trajectories.values()),
        output_tokens=sum(p.output_tokens for p in plans),
        cache_hit_rate=1 - computed / queried if queried else 0.0,
        migrations=sum(t.moves for t in trajectories.values()),
        finish_s={k: t.finished_s or 0.0 for k, t in trajectories.items()},
    )
