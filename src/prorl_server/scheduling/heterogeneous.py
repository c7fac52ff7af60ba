"""Heterogeneous workers (Heddle section 6): placement over workers with different profiles, and the
sort-initialised simulated annealing that chooses the workers' model-parallel degrees.

**Mapping.** The presorted order (longest predicted trajectory first) is a strong prior: the longest group
should go to the lowest-latency worker. `worker_order` sorts workers by per-token time at batch size 1
(lowest first; Heddle sorts by model-parallel degree, highest first, which is the same order when a higher
degree is faster), and `place_on_workers` solves the presorted DP with group k bound to the k-th worker of
that order and that worker's own profile I_k:

    f_k(j) = min over 0 <= i <= j of max(f_{k-1}(i), T_k(l_(i+1) .. l_j))

with T_k the draining group time on worker k's profile (`Profile.group_seconds`, plus the group's extra
seconds if given), which is `partition.place` when all profiles are equal. With non-decreasing profiles the best i is found
by a sweeping pointer, O(n B); otherwise O(n^2 B).

**Resource allocation.** Given a budget of G GPUs and the profile of each model-parallel degree d (measured
per degree, or `parallel_profile` from a degree-1 profile), `anneal_allocation` searches the multisets of
degrees summing to G (sorted descending: the sort-initialised mapping) by simulated annealing, each state
scored by `place_on_workers` on the predicted lengths. It starts from a random sorted allocation, at a
temperature equal to that state's makespan, perturbs by redistribution (move GPUs between two workers,
keeping both valid degrees), split (one worker into two of half its degree) or merge (two workers of one
degree into one of twice it), accepts a better state always and a worse one with probability
exp(-increase / temperature), cools geometrically and stops below `min_temperature` times the start
(Heddle's Algorithm 2). The best state seen is returned.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from prorl_server.scheduling.partition import check_lengths, group_timer, min_max_bounds
from prorl_server.scheduling.profile import Profile

DEFAULT_PARALLEL_EFFICIENCY = 0.8
"""Speed-up kept per doubling of the model-parallel degree in `parallel_profile` (an assumption)."""


@dataclass(frozen=True, slots=True)
class WorkerPlacement:
    """Groups of trajectory indices: `groups[k]` goes to worker `order[k]` (the k-th lowest latency, which
    gets the k-th longest contiguous run of the sorted trajectories); and the makespan."""

    order: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...]
    makespan: float

    @property
    def sizes(self) -> tuple[int, ...]:
        """How many trajectories each position of `order` got."""
        return tuple(len(group) for group in self.groups)

    def worker_of(self) -> dict[int, int]:
        """Trajectory index -> worker index."""
        return {index: self.order[k] for k, group in enumerate(self.groups) for index in group}


def worker_order(profiles: Sequence[Profile]) -> tuple[int, ...]:
    """Worker indices by per-token time at batch size 1, lowest first (ties by index): the sort-initialised
    mapping."""
    return tuple(sorted(range(len(profiles)), key=lambda w: (profiles[w].seconds_per_token(1), w)))


def place_on_workers(
    lengths: Sequence[float], profiles: Sequence[Profile], extra_s: Sequence[float] | None = None
) -> WorkerPlacement:
    """The presorted DP over heterogeneous workers, the longest group on the lowest-latency worker (group times
    and `extra_s` as in `partition.place`)."""
    if not profiles:
        raise ValueError("placement needs at least one worker")
    check_lengths(lengths, extra_s)
    order = worker_order(profiles)
    n = len(lengths)
    ranked = sorted(range(n), key=lambda i: (-lengths[i], i))
    ordered = [lengths[i] for i in ranked]
    extras = [extra_s[i] for i in ranked] if extra_s else None
    timers: dict[Profile, Callable[[int, int], float]] = {}
    for w in order:
        if profiles[w] not in timers:
            timers[profiles[w]] = group_timer(profiles[w], ordered, extras)
    group_times = [timers[profiles[w]] for w in order]
    bounds, makespan = min_max_bounds(group_times, n, all(profiles[w].nondecreasing for w in order))
    groups = tuple(tuple(ranked[a:b]) for a, b in itertools.pairwise(bounds))
    return WorkerPlacement(order=order, groups=groups, makespan=makespan)


def parallel_profile(
    base: Profile, degree: int, efficiency: float = DEFAULT_PARALLEL_EFFICIENCY, batch_limit: int | None = None
) -> Profile:
    """A worker of model-parallel `degree` derived from a degree-1 profile: per-token time divided by
    degree x efficiency^log2(degree) at every batch size (so per GPU it is slower, per trajectory faster),
    and `batch_limit` requests at once. An assumed scaling: measure each degree where you can."""
    if degree < 1 or not 0 < efficiency <= 1:
        raise ValueError(f"degree must be >= 1 and efficiency in (0, 1], got {degree}, {efficiency}")
    speedup = degree * efficiency ** math.log2(degree)
    return Profile(base.batch_sizes, tuple(s / speedup for s in base.seconds), batch_limit)


@dataclass(frozen=True, slots=True)
class Allocation:
    """The chosen model-parallel degrees (descending), the placement on them, and the search's cost."""

    degrees: tuple[int, ...]
    placement: WorkerPlacement
    evaluated: int  # DP solves


def anneal_allocation(
    lengths: Sequence[float],
    gpus: int,
    degree_profiles: Mapping[int, Profile],
    *,
    seed: int = 0,
    cooling: float = 0.9,
    min_temperature: float = 1e-3,
    steps_per_temperature: int = 4,
) -> Allocation:
    """Heddle's sort-initialised simulated annealing over allocations of `gpus` GPUs to workers of the
    degrees in `degree_profiles` (module docstring)."""
    degrees = sorted(degree_profiles, reverse=True)
    if not degrees or any(d < 1 for d in degrees) or gpus < min(degrees):
        raise ValueError(f"need degrees >= 1 and at least {min(degrees, default=1)} GPUs, got {degrees}, {gpus}")
    if not 0 < cooling < 1 or not 0 < min_temperature < 1:
        raise ValueError("cooling and min_temperature must be in (0, 1)")
    rng = random.Random(seed)
    cache: dict[tuple[int, ...], WorkerPlacement] = {}

    def score(state: tuple[int, ...]) -> float:
        if state not in cache:
            cache[state] = place_on_workers(lengths, [degree_profiles[d] for d in state])
        return cache[state].makespan

    state = _random_allocation(gpus, degrees, rng)
    current = score(state)
    best_state, best = state, current
    start = temperature = max(current, 1e-12)
    while temperature > min_temperature * start:
        for _ in range(steps_per_temperature):
            proposal = _perturb(state, degrees, rng)
            if proposal is None:
                continue
            cost = score(proposal)
            if cost <= current or rng.random() < math.exp((current - cost) / temperature):
                state, current = proposal, cost
                if cost < best:
                    best_state, best = proposal, cost
        temperature *= cooling
    return Allocation(degrees=best_state, placement=cache[best_state], evaluated=len(cache))


def _random_allocation(gpus: int, degrees: list[int], rng: random.Random) -> tuple[int, ...]:
    """Random degrees until the budget is spent (the smallest degree fills what is left), sorted descending."""
    chosen: list[int] = []
    left = gpus
    while left >= degrees[-1]:
        fitting = [d for d in degrees if d <= left]
        pick = rng.choice(fitting)
        chosen.append(pick)
        left -= pick
    return tuple(sorted(chosen, reverse=True))


def _perturb(state: tuple[int, ...], degrees: list[int], rng: random.Random) -> tuple[int, ...] | None:
    """One of Heddle's three transitions (redistribution, split, merge), or None when it does not apply."""
    allowed = set(degrees)
    workers = list(state)
    move = rng.choice(("redistribute", "split", "merge"))
    if move == "split":
        splittable = [i for i, d in enumerate(workers) if d % 2 == 0 and d // 2 in allowed]
        if not splittable:
            return None
        d = workers.pop(rng.choice(splittable))
        workers += [d // 2, d // 2]
    elif move == "merge":
        pairs = [d for d in set(workers) if workers.count(d) >= 2 and 2 * d in allowed]
        if not pairs:
            return None
        d = rng.choice(sorted(pairs))
        workers.remove(d)
        workers.remove(d)
        workers.append(2 * d)
    else:
        if len(workers) < 2:
            return None
        a, b = rng.sample(range(len(workers)), 2)
        options = [
            (x, y)
            for x in allowed
            for y in allowed
            if x + y == workers[a] + workers[b] and (x, y) != (workers[a], workers[b])
        ]
        if not options:
            return None
        workers[a], workers[b] = rng.choice(sorted(options))
    return tuple(sorted(workers, reverse=True))
