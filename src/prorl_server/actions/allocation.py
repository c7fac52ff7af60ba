"""Which waiting actions start now, and with how many cores: ARL-Tangram's elastic scheduling (its section
4.2, Algorithms 1 and 2), for one node's CPU pool.

Pure and synchronous: `plan()` takes the waiting queue (first come, first served), the free cores and memory,
and the expected completions of the running actions, and returns the actions to start with their cores.

- Candidates are the longest prefix of the queue whose minimum needs fit (cores and memory).
- A candidate that cannot scale (a fixed number of cores, or a duration model not known yet) starts with its
  minimum.
- The scalable candidates share the cores left (`arrange`: each gets its minimum, then each further core goes
  where it shortens the sum of durations most, which is optimal for convex durations such as Amdahl's law).
  Then the last scalable candidate is evicted back to the queue, and its cores are shared among the rest,
  for as long as that lowers the approximated sum of action completion times (ACT = queueing + execution):
  the candidates' ACTs exactly, plus the ACTs of the actions left waiting, estimated by starting each, with
  its minimum cores, when the completions of the running and started actions free enough cores (the first
  `DEPTH` scalable ones also try all the cores free then, and the better estimate counts).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Duration = Callable[[int], float]
"""Seconds an action takes with a given number of cores."""

HORIZON = 64
"""Waiting actions past the candidates whose ACT the objective estimates, at most."""
DEPTH = 2
"""Scalable actions at the head of the estimate that also try all the cores free when they start (the paper's
`depth`: 2 or 3 is enough, it says)."""


@dataclass(frozen=True, eq=False)
class Pending:
    """A waiting action as the allocator sees it. `duration` is None while its kind's durations are unknown."""

    cpu_min: int
    cpu_max: int
    memory_mb: int
    arrival: float
    duration: Duration | None

    @property
    def scalable(self) -> bool:
        """Whether more cores than its minimum would shorten it (a range, and a known duration model)."""
        return self.cpu_max > self.cpu_min and self.duration is not None


@dataclass(frozen=True)
class Running:
    """A started action: when it is expected to end, and the cores it holds."""

    finish: float
    cpu: int


def plan(
    waiting: Sequence[Pending],
    free_cpu: int,
    free_memory_mb: int,
    running: Sequence[Running],
    now: float,
    unknown_s: float = 1.0,
) -> list[tuple[Pending, int]]:
    """The actions of `waiting` to start now, each with its cores (see the module). `unknown_s`: the duration
    assumed, in the estimate, for an action whose duration model is not known yet."""
    candidates: list[Pending] = []
    cpu, memory = free_cpu, free_memory_mb
    for action in waiting:
        if action.cpu_min > cpu or action.memory_mb > memory:
            break
        candidates.append(action)
        cpu -= action.cpu_min
        memory -= action.memory_mb
    if not candidates:
        return []
    fixed = [a for a in candidates if not a.scalable]
    scalable = [a for a in candidates if a.scalable]
    started = [(a, a.cpu_min) for a in fixed]
    if not scalable:
        return started
    cores = free_cpu - sum(a.cpu_min for a in fixed)
    busy = [Running(now + _seconds(a, a.cpu_min, unknown_s), a.cpu_min) for a in fixed]
    busy += running
    later = list(waiting[len(candidates) : len(candidates) + HORIZON])

    def objective(chosen: list[Pending], cores_of: dict[Pending, int]) -> float:
        starting = [Running(now + _seconds(a, cores_of[a], unknown_s), cores_of[a]) for a in chosen]
        exact = sum(now - a.arrival + _seconds(a, cores_of[a], unknown_s) for a in chosen)
        left = cores - sum(cores_of.values())
        evicted = scalable[len(chosen) :]
        return exact + _estimate([*evicted, *later], left, [*busy, *starting], now, unknown_s)

    chosen = list(scalable)
    cores_of = arrange(chosen, cores)
    best = objective(chosen, cores_of)
    while len(chosen) > 1:
        fewer = chosen[:-1]
        fewer_cores = arrange(fewer, cores)
        value = objective(fewer, fewer_cores)
        if value >= best:
            break
        chosen, cores_of, best = fewer, fewer_cores, value
    return started + [(a, cores_of[a]) for a in chosen]


def arrange(actions: Sequence[Pending], cores: int) -> dict[Pending, int]:
    """Cores per action: its minimum, then each further core (up to `cores` in all, each action up to its
    maximum) to the action whose duration it shortens most."""
    cores_of = {a: a.cpu_min for a in actions}
    left = cores - sum(cores_of.values())
    gains = [(-_gain(a, a.cpu_min), i) for i, a in enumerate(actions) if a.cpu_max > a.cpu_min]
    heapq.heapify(gains)
    while left > 0 and gains:
        negative_gain, i = heapq.heappop(gains)
        if negative_gain >= 0.0:
            break
        action = actions[i]
        cores_of[action] += 1
        left -= 1
        if cores_of[action] < action.cpu_max:
            heapq.heappush(gains, (-_gain(action, cores_of[action]), i))
    return cores_of


def _gain(action: Pending, cores: int) -> float:
    assert action.duration is not None
    return action.duration(cores) - action.duration(cores + 1)


def _seconds(action: Pending, cores: int, unknown_s: float) -> float:
    return action.duration(cores) if action.duration is not None else unknown_s


def _estimate(
    queue: Sequence[Pending], free: int, busy: Sequence[Running], now: float, unknown_s: float, depth: int = DEPTH
) -> float:
    """Approximate ACTs of `queue` started in order as completions free cores: each with its minimum, but the
    first `depth` scalable ones also try all the cores free when they start (the lower total counts)."""
    heap = [(r.finish, r.cpu) for r in busy]
    heapq.heapify(heap)
    return _simulate(list(queue), 0, free, heap, now, unknown_s, depth)


def _simulate(
    queue: list[Pending],
    index: int,
    free: int,
    heap: list[tuple[float, int]],
    clock: float,
    unknown_s: float,
    depth: int,
) -> float:
    total = 0.0
    while index < len(queue):
        action = queue[index]
        while free < action.cpu_min and heap:
            finish, cpu = heapq.heappop(heap)
            clock, free = max(clock, finish), free + cpu
        if free < action.cpu_min:  # never fits: the scheduler refuses such actions before they queue
            break
        choices = [action.cpu_min]
        if depth > 0 and action.scalable and min(free, action.cpu_max) > action.cpu_min:
            choices.append(min(free, action.cpu_max))
        if len(choices) == 1:
            seconds = _seconds(action, action.cpu_min, unknown_s)
            total += clock - action.arrival + seconds
            heapq.heappush(heap, (clock + seconds, action.cpu_min))
            free -= action.cpu_min
            index += 1
            continue
        best = float("inf")
        for cores in choices:
            seconds = _seconds(action, cores, unknown_s)
            branch = [*heap, (clock + seconds, cores)]
            heapq.heapify(branch)
            rest = _simulate(queue, index + 1, free - cores, branch, clock, unknown_s, depth - 1)
            best = min(best, clock - action.arrival + seconds + rest)
        return total + best
    return total
