"""Presorted dynamic-programming placement of trajectories on backends (Heddle sections 5.1-5.2).

Given predicted lengths l and B backends, find groups G_1..G_B (some possibly empty) minimising the makespan
max_g T(G_g), where T is the group's time on a backend of per-token time I(n) at batch size n (a `Profile`,
which folds Heddle's base per-token time into the interference factor). Heddle's formula 2 takes
T(G) = I(|G|) * max_{x in G} l(x); here T is the draining group time `Profile.group_seconds`
(sum over k of l_k * (I(k) - I(k - 1)), the members sorted longest first: each leaves the batch when done),
which is never more and, unlike Heddle's, sees that a group of one long and many short trajectories runs
mostly at a small batch. Optionally each trajectory carries extra seconds that delay every member of its group
(`extra_s`: the prefill of the prompts and observations still to come, which a backend computes inside the
steps of everyone running there), added to T. Heddle's Lemma 5.1 (swapping a longer trajectory out of a group
for a shorter one never raises the makespan, so some optimal partition is contiguous in the order of
decreasing length) holds for formula 2 but not exactly for the draining time: the group that receives the
longer one drains longer, even when it is not its longest (a group with a long member can take one medium one
more cheaply than a group of shorts can). The DP below is therefore optimal among contiguous partitions, the
search space Heddle uses; the tests check it against an exhaustive search over those:

    f_k(j) = min over 0 <= i <= j of max(f_{k-1}(i), T(l_(i+1) .. l_j))     (i = j: backend k left empty)

with f_1(j) = T(l_(1) .. l_j) and l_(1) >= l_(2) >= ... the sorted lengths. A group time is a handful of
prefix-sum differences (one per run of equal increments of I, `Profile.interference_steps`), so that is
O(n^2 B). When the profile is non-decreasing, f_{k-1}(i) is non-decreasing in i and T(l_(i+1) .. l_j)
non-increasing, so the best i is where the two cross, and that crossing only moves right as j grows: one
pointer sweeps it, O(n B) (times the lexicographic refinement's solves, `min_max_bounds`). Not implemented:
Heddle's aggregation of short trajectories below a threshold. Heterogeneous backends (section 6) are
`heterogeneous.py`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prorl_server.scheduling.profile import Profile


@dataclass(frozen=True, slots=True)
class Placement:
    """Groups of trajectory indices, one per backend, the longest-running group first; and the makespan."""

    groups: tuple[tuple[int, ...], ...]
    makespan: float

    @property
    def sizes(self) -> tuple[int, ...]:
        """How many trajectories each backend got."""
        return tuple(len(group) for group in self.groups)

    def backend_of(self) -> dict[int, int]:
        """Trajectory index -> backend index."""
        return {index: backend for backend, group in enumerate(self.groups) for index in group}


def partition_makespan(
    groups: Sequence[Sequence[int]],
    lengths: Sequence[float],
    profile: Profile,
    extra_s: Sequence[float] | None = None,
) -> float:
    """Makespan of any partition: the slowest group's time (`Profile.group_seconds`, plus its extras)."""
    return max(
        (
            profile.group_seconds([lengths[i] for i in group]) + (sum(extra_s[i] for i in group) if extra_s else 0.0)
            for group in groups
            if group
        ),
        default=0.0,
    )


def place(
    lengths: Sequence[float], backends: int, profile: Profile, extra_s: Sequence[float] | None = None
) -> Placement:
    """The makespan-optimal placement of trajectories with these predicted lengths (and extra seconds each,
    module docstring) on `backends` backends."""
    if backends < 1:
        raise ValueError(f"placement needs at least one backend, got {backends}")
    check_lengths(lengths, extra_s)
    n = len(lengths)
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    group_time = group_timer(profile, [lengths[i] for i in order], [extra_s[i] for i in order] if extra_s else None)

    bounds, makespan = min_max_bounds([group_time] * backends, n, profile.nondecreasing)
    groups = [tuple(order[a:b]) for a, b in itertools.pairwise(bounds)]
    groups.sort(key=lambda group: (not group, -lengths[group[0]] if group else 0.0))
    return Placement(groups=tuple(groups), makespan=makespan)


def min_max_bounds(
    group_times: Sequence[Callable[[int, int], float]], n: int, monotone: bool
) -> tuple[list[int], float]:
    """Cut the sorted items 0..n-1 into len(group_times) consecutive runs, run k timed by group_times[k], the
    slowest run as fast as possible (the DP of the module docstring); returns the B + 1 cut points and the
    makespan. The DP only minimises the slowest run, so the others are as good as any below it, and a run
    that could be far shorter may be filled up to the makespan (which a wrong prediction then overruns);
    so the cut is then refined lexicographically: the runs up to the slowest are kept and the items after
    them are cut again over the remaining backends, minimising their slowest run, until every backend is cut.
    At most B solves, O(n B^2) with a monotone profile (usually a few: the slowest is mostly the first run)."""
    backends = len(group_times)
    bounds, first, makespan = [0], 0, 0.0
    while first < backends:
        start = bounds[-1]
        cuts = _solve_suffix(group_times[first:], start, n, monotone)
        times = [group_times[first + k](a, b) for k, (a, b) in enumerate(itertools.pairwise(cuts))]
        slowest = max(range(len(times)), key=lambda k: (times[k], -k))
        makespan = max(makespan, times[slowest])
        bounds += cuts[1 : slowest + 2]
        first += slowest + 1
        if bounds[-1] == n:
            bounds += [n] * (backends - first)
            break
    return bounds, makespan


def _solve_suffix(group_times: Sequence[Callable[[int, int], float]], start: int, n: int, monotone: bool) -> list[int]:
    """The min-max cut of items start..n-1 into len(group_times) consecutive runs: the cut points. With a
    monotone profile the best split of the first j items is where non-decreasing f_{k-1}(i) meets
    non-increasing T(i, j); that crossing only moves right as j grows (T(i, j) grows with j), so one pointer
    sweeps it in O(n) per backend (amortised) instead of a binary search per j."""
    size = n - start + 1  # positions start..n, stored at index position - start
    first = group_times[0]
    best = [first(start, start + j) for j in range(size)]
    splits: list[list[int]] = [[start] * size]
    for group_time in group_times[1:]:
        previous, best, split = best, [0.0] * size, list(range(start, n + 1))
        low = start  # the first i with previous[i] >= group_time(i, j), or j if none
        for j in range(start, n + 1):
            best_j, split_j = previous[j - start], j  # i = j: this backend stays empty
            if monotone:
                low = max(low, start)
                while low < j and previous[low - start] < group_time(low, j):
                    low += 1
                candidates: Sequence[int] = [i for i in (low - 1, low) if start <= i < j]
            else:
                candidates = range(start, j)
            for i in candidates:
                cost = max(previous[i - start], group_time(i, j))
                if cost < best_j:
                    best_j, split_j = cost, i
            best[j - start], split[j - start] = best_j, split_j
        splits.append(split)
    cuts, j = [n], n
    for split in reversed(splits):
        j = split[j - start]
        cuts.append(j)
    cuts.reverse()
    return cuts


def check_lengths(lengths: Sequence[float], extra_s: Sequence[float] | None) -> None:
    """Predicted lengths and extras must be non-negative, one extra per length."""
    if any(length < 0 for length in lengths):
        raise ValueError("predicted lengths cannot be negative")
    if extra_s is not None and (len(extra_s) != len(lengths) or any(x < 0 for x in extra_s)):
        raise ValueError("extra seconds must be one non-negative value per trajectory")


def group_timer(
    profile: Profile, ordered: Sequence[float], extra_s: Sequence[float] | None = None
) -> Callable[[int, int], float]:
    """group_time(i, j): the time of the trajectories i..j-1 of `ordered` (sorted longest first) as one group,
    `Profile.group_seconds` plus their extras, from prefix sums: O(runs of `interference_steps`)."""
    runs = profile.interference_steps(len(ordered))
    prefix = list(itertools.accumulate(ordered, initial=0.0))
    extras = list(itertools.accumulate(extra_s, initial=0.0)) if extra_s else None

    def group_time(i: int, j: int) -> float:
        total = extras[j] - extras[i] if extras else 0.0
        for start, end, step in runs:
            first = i + start
            if first >= j:
                break
            total += step * (prefix[min(j, i + end)] - prefix[first])
        return total

    return group_time
