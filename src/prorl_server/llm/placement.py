"""Placement policies: which backend a job's calls go to.

A policy chooses among placeable candidates (`choose`). A sticky policy is asked only when a job needs a
backend (its first call, or after its backend left placement) and the pool keeps the job's later calls
there; a policy that is not sticky (`least_loaded`) is asked at every call. A trajectory-aware policy
(`presorted_dp`) is also told of each completion before it starts (`before_completion`), with the job's
view: it places the job at its first completion and may move it at a tool-call boundary (the start of a
later completion), which the pool counts as a migration.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from prorl_server.llm.backend import Backend
from prorl_server.scheduling import (
    DEFAULT_PROFILE,
    LatencyProfile,
    LengthPredictor,
    Profile,
    TrajectoryPlacer,
    TrajectoryView,
    is_profile_path,
    make_predictor,
    read_profile_file,
)

DEFAULT_PREFILL_S_PER_TOKEN = 1e-4
"""Prefix recompute cost a migration is charged per context token (the simulator's default prefill time)."""


class PlacementPolicy(Protocol):
    """Chooses a backend among placeable candidates (never empty) and records the assignment."""

    name: str
    sticky: bool

    def choose(self, candidates: Sequence[Backend]) -> Backend: ...


@runtime_checkable
class TrajectoryAwarePolicy(Protocol):
    """A placement policy that also sees each completion's trajectory before it starts."""

    def before_completion(
        self, job_id: str, view: TrajectoryView, pinned: Backend | None, candidates: Sequence[Backend]
    ) -> Backend | None:
        """The backend the job's completion should go to when not `pinned` (None: stay)."""
        ...

    def forget(self, job_id: str) -> None:
        """The job released its backend."""
        ...


def backend_profiles(entries: Sequence[str]) -> dict[str, Profile]:
    """`ADDRESS=PROFILE` entries (`--backend-profile`) -> profile by backend address (trailing `/` dropped, as
    the pool registers addresses); ValueError for a malformed entry, an address given twice or a bad profile."""
    profiles: dict[str, Profile] = {}
    for entry in entries:
        address, sep, value = entry.partition("=")
        address = address.strip().rstrip("/")
        if not sep or not address or not value.strip():
            raise ValueError(
                f"--backend-profile {entry!r}: ADDRESS=PROFILE expected (a profile file or batch:seconds,...)"
            )
        if address in profiles:
            raise ValueError(f"--backend-profile: {address} is given twice")
        profiles[address] = interference_profile(value.strip())
    return profiles


def interference_profile(text: str) -> Profile:
    """A `Profile` from `batch:seconds,...` text (the simulator's latency-profile syntax) or the path of a
    profile file (`scheduling/profile_file.py`, as `prorl-server profile-backend` writes)."""
    if is_profile_path(text):
        return read_profile_file(text).profile()
    return Profile.from_points(LatencyProfile.parse(text).points)


class MinHeapPolicy:
    """ProRL's policy: a min-heap of assignment counters, incremented once per job.

    Selection is argmin of jobs ever assigned since registration; ties go to the earliest registered.
    Entries of removed or unhealthy backends are skipped and kept for when they return.
    """

    name = "min_heap"
    sticky = True

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, str]] = []

    def choose(self, candidates: Sequence[Backend]) -> Backend:
        by_address = {b.address: b for b in candidates}
        known = {entry[2] for entry in self._heap}
        for backend in candidates:
            if backend.address not in known:
                heapq.heappush(self._heap, (backend.assigned, backend.order, backend.address))
        skipped: list[tuple[int, int, str]] = []
        chosen: Backend | None = None
        while self._heap:
            count, order, address = heapq.heappop(self._heap)
            backend = by_address.get(address)
            if backend is None or backend.order != order:
                skipped.append((count, order, address))
                continue
            if count != backend.assigned:  # stale entry (backend re-registered)
                heapq.heappush(self._heap, (backend.assigned, backend.order, address))
                continue
            chosen = backend
            break
        for entry in skipped:
            heapq.heappush(self._heap, entry)
        assert chosen is not None, "candidates is never empty"
        chosen.assigned += 1
        heapq.heappush(self._heap, (chosen.assigned, chosen.order, chosen.address))
        return chosen


class StickyLeastLoadedPolicy:
    """Default: the backend with the fewest in-flight jobs; ties by fewest ever assigned, then age.

    Unlike a pure assignment counter it follows the actual load, so a backend whose jobs are long
    does not keep receiving its "share" of new ones.
    """

    name = "sticky_least_loaded"
    sticky = True

    def choose(self, candidates: Sequence[Backend]) -> Backend:
        chosen = min(candidates, key=lambda b: (b.in_flight, b.assigned, b.order))
        chosen.assigned += 1
        return chosen


class LeastLoadedPolicy:
    """The step-centric baseline: every call to the backend with the fewest calls in flight (ties: fewest jobs
    pinned, fewest ever chosen, then age). Not sticky, so a job's prefix cache is lost when it changes backend."""

    name = "least_loaded"
    sticky = False

    def choose(self, candidates: Sequence[Backend]) -> Backend:
        chosen = min(candidates, key=lambda b: (b.calls_in_flight, b.in_flight, b.assigned, b.order))
        chosen.assigned += 1
        return chosen


class PresortedDPPolicy:
    """Heddle's placement (`scheduling.placement_runtime`): a job is placed at its first completion by the
    presorted DP over the live jobs' predicted lengths, stays there, and moves at a tool-call boundary when
    the rescaled group sizes send it elsewhere and the gain beats recomputing its prefix. Calls before the
    first completion (tokenize) and re-placements after a backend left go to the fewest jobs in flight."""

    name = "presorted_dp"
    sticky = True

    def __init__(
        self,
        predictor: LengthPredictor | None = None,
        profile: Profile | None = None,
        prefill_s_per_token: float = DEFAULT_PREFILL_S_PER_TOKEN,
        backend_profiles: Mapping[str, Profile] | None = None,
    ) -> None:
        self.placer = TrajectoryPlacer(
            predictor if predictor is not None else make_predictor("online"),
            profile if profile is not None else interference_profile(DEFAULT_PROFILE),
            prefill_s_per_token,
            backend_profiles,
        )

    def choose(self, candidates: Sequence[Backend]) -> Backend:
        chosen = min(candidates, key=lambda b: (b.in_flight, b.assigned, b.order))
        chosen.assigned += 1
        return chosen

    def before_completion(
        self, job_id: str, view: TrajectoryView, pinned: Backend | None, candidates: Sequence[Backend]
    ) -> Backend | None:
        by_address = {b.address: b for b in candidates}
        if job_id not in self.placer:
            chosen = by_address[self.placer.place_new(job_id, view, list(by_address))]
            if chosen is not pinned:
                chosen.assigned += 1
            return chosen
        if pinned is None or view.turns == 0:  # no answered turn yet: not at a tool-call boundary
            return None
        target = self.placer.at_boundary(job_id, view, pinned.address, list(by_address))
        if target is None:
            return None
        moved = by_address[target]
        moved.migrations += 1
        return moved

    def forget(self, job_id: str) -> None:
        self.placer.forget(job_id)


POLICIES: dict[str, type[PlacementPolicy]] = {
    MinHeapPolicy.name: MinHeapPolicy,
    StickyLeastLoadedPolicy.name: StickyLeastLoadedPolicy,
    LeastLoadedPolicy.name: LeastLoadedPolicy,
    PresortedDPPolicy.name: PresortedDPPolicy,
}


def make_policy(
    name: str,
    *,
    predictor: LengthPredictor | None = None,
    profile: Profile | None = None,
    prefill_s_per_token: float = DEFAULT_PREFILL_S_PER_TOKEN,
    backend_profiles: Mapping[str, Profile] | None = None,
) -> PlacementPolicy:
    """Instantiate a policy by its config name; `presorted_dp` uses the predictor, profile (and backends' own
    profiles, by address) and prefill cost."""
    if name == PresortedDPPolicy.name:
        return PresortedDPPolicy(predictor, profile, prefill_s_per_token, backend_profiles)
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; choose one of {sorted(POLICIES)}") from None
