"""Placement policies: which backend a new job is pinned to.

A policy has one method. The pool keeps jobs sticky (all turns of a job on one backend) and calls
the policy only when a job needs a backend: on its first generation, or after its backend died.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Protocol

from prorl_server.llm.backend import Backend


class PlacementPolicy(Protocol):
    """Chooses a backend among healthy candidates (never empty) and records the assignment."""

    name: str

    def choose(self, candidates: Sequence[Backend]) -> Backend: ...


class MinHeapPolicy:
    """ProRL's policy: a min-heap of assignment counters, incremented once per job.

    Selection is argmin of jobs ever assigned since registration; ties go to the earliest registered.
    Entries of removed or unhealthy backends are skipped and kept for when they return.
    """

    name = "min_heap"

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

    def choose(self, candidates: Sequence[Backend]) -> Backend:
        chosen = min(candidates, key=lambda b: (b.in_flight, b.assigned, b.order))
        chosen.assigned += 1
        return chosen


POLICIES: dict[str, type[MinHeapPolicy] | type[StickyLeastLoadedPolicy]] = {
    MinHeapPolicy.name: MinHeapPolicy,
    StickyLeastLoadedPolicy.name: StickyLeastLoadedPolicy,
}


def make_policy(name: str) -> PlacementPolicy:
    """Instantiate a policy by its config name."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown placement policy {name!r}; choose one of {sorted(POLICIES)}") from None
