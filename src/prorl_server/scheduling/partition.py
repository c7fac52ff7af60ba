"""Presorted dynamic-programming placement of trajectories on backends (Heddle sections 5.1-5.2).

Given predicted lengths l and B backends, find groups G_1..G_B (some possibly empty) minimising the makespan
max_g I(|G_g|) * max_{x in G_g} l(x), where I(n) is the per-token time at batch size n (a `Profile`, which
folds Heddle's base per-token time into the interference factor). Because I depends on the group's size only,
swapping a longer trajectory out of a group for a shorter one never raises the makespan, so some optimal
partition is contiguous in the order of decreasing length (Heddle's Lemma 5.1). Sorting once and solving the
linear partition problem over that order is therefore optimal:

    f_k(j) = min over 0 <= i <= j of max(f_{k-1}(i), I(j - i) * l_(i+1))     (i = j: backend k left empty)

with f_1(j) = I(j) * l_(1) and l_(1) >= l_(2) >= ... the sorted lengths. That is O(n^2 B). When the profile
is non-decreasing, f_{k-1}(i) is non-decreasing in i and I(j - i) * l_(i+1) non-increasing, so the best i is
where the two cross: a binary search makes it O(n B log n). Not implemented: Heddle's aggregation of short
trajectories below a threshold. Heterogeneous backends (section 6) are `heterogeneous.py`.
"""

from __future__ import annotations

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


def partition_makespan(groups: Sequence[Sequence[int]], lengths: Sequence[float], profile: Profile) -> float:
    """Makespan of any partition: the slowest group's per-token time at its size times its longest length."""
    return max(
        (profile.seconds_per_token(len(group)) * max(lengths[i] for i in group) for group in groups if group),
        default=0.0,
    )


def place(lengths: Sequence[float], backends: int, profile: Profile) -> Placement:
    """The makespan-optimal placement of trajectories with these predicted lengths on `backends` backends."""
    if backends < 1:
        raise ValueError(f"placement needs at least one backend, got {backends}")
    if any(length < 0 for length in lengths):
        raise ValueError("predicted lengths cannot be negative")
    n = len(lengths)
    order = sorted(range(n), key=lambda i: (-lengths[i], i))
    ordered = [lengths[i] for i in order]
    per_token = [0.0] + [profile.seconds_per_token(size) for size in range(1, n + 1)]

    def group_time(i: int, j: int) -> float:  # trajectories i..j-1 of the sorted order
        return per_token[j - i] * ordered[i] if j > i else 0.0

    best = [group_time(0, j) for j in range(n + 1)]
    splits: list[list[int]] = [[0] * (n + 1)]
    monotone = profile.nondecreasing
    for _ in range(1, backends):
        previous, best, split = best, [0.0] * (n + 1), list(range(n + 1))
        for j in range(1, n + 1):
            candidates = _crossing(previous, group_time, j) if monotone else range(j)
            best[j] = previous[j]  # i = j: this backend stays empty
            for i in candidates:
                cost = max(previous[i], group_time(i, j))
                if cost < best[j]:
                    best[j], split[j] = cost, i
        splits.append(split)
    groups = contiguous_groups(splits, order)
    groups.sort(key=lambda group: (not group, -lengths[group[0]] if group else 0.0))
    return Placement(groups=tuple(groups), makespan=best[n])


def contiguous_groups(splits: Sequence[Sequence[int]], items: Sequence[int]) -> list[tuple[int, ...]]:
    """The DP's groups, read back from its split points: `splits[k][j]` is where the group of backend k
    starts when the first j items go to backends 0..k; the groups cut `items` into consecutive runs."""
    groups: list[tuple[int, ...]] = []
    j = len(items)
    for split in reversed(splits):
        i = split[j]
        groups.append(tuple(items[i:j]))
        j = i
    groups.reverse()
    return groups


def _crossing(previous: list[float], group_time: Callable[[int, int], float], j: int) -> tuple[int, ...]:
    """The two split points around where non-decreasing previous[i] meets non-increasing group_time(i, j)."""
    low, high = 0, j  # the first i in [0, j) with previous[i] >= group_time(i, j), or j if none
    while low < high:
        mid = (low + high) // 2
        if previous[mid] >= group_time(mid, j):
            high = mid
        else:
            low = mid + 1
    return tuple(i for i in (low - 1, low) if 0 <= i < j)
