"""Heddle's trajectory-aware placement over the live trajectories of a running server (section 5).

`TrajectoryPlacer` keeps, per live trajectory, the backend it is on and its last predicted remaining tokens.
A trajectory's first completion places it: the presorted DP (`partition.place`) is solved over the live
trajectories' predictions plus the new one, its groups are matched to backends (each group, longest first,
to the free backend already holding most of its members, else the least loaded), and the new trajectory goes
to its group's backend; the others stay where they are (sticky). The DP's group sizes are kept. The DP is
solved again only when the backends changed, the new trajectory is predicted longer than every live one, or
more than `resolve_fraction` (a quarter) of the live count arrived since the last solve (so always while
fewer than 4 are live); in between a new trajectory goes to the group its rank by predicted length falls in,
the kept sizes scaled to the live count (migration's rule), so the DP's O(n B log n) is paid once per n / 4
arrivals. At a tool-call boundary (the start of a trajectory's next completion) its prediction is refreshed
and migration's rule (`migration.py`: rank in the rescaled group sizes, then the makespan gain against the
prefix recompute) decides whether it moves, for this one trajectory: sorted lists of the live predictions
(overall and per backend) make that O(B + log n) plus list inserts, not the O(n log n) of
`plan_migrations`. Backends with profiles of their own
(`backend_profiles`, heterogeneous workers) are placed by `heterogeneous.place_on_workers` instead: the DP's
groups, longest first, go to the backends in order of per-token time at batch size 1, lowest first (Heddle's
sort-initialised mapping), and migration weighs each backend with its own profile. Backends are named by
address; the class is not thread-safe (the backend pool calls it under its lock).
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prorl_server.scheduling.heterogeneous import place_on_workers
from prorl_server.scheduling.migration import scaled_bounds, target_of_rank, worth_moving
from prorl_server.scheduling.partition import place
from prorl_server.scheduling.predictor import LengthPredictor
from prorl_server.scheduling.profile import Profile
from prorl_server.scheduling.view import Prediction, TrajectoryView


class SharedPredictor:
    """A length predictor behind a lock, for sharing one between the dispatch policy and the placement."""

    def __init__(self, predictor: LengthPredictor) -> None:
        self.name = predictor.name
        self._predictor = predictor
        self._lock = threading.Lock()

    def predict(self, view: TrajectoryView) -> Prediction:
        """The wrapped predictor's prediction."""
        with self._lock:
            return self._predictor.predict(view)

    def observe_finished(self, final_view: TrajectoryView) -> None:
        """Teach the wrapped predictor a finished trajectory."""
        with self._lock:
            self._predictor.observe_finished(final_view)


@dataclass(slots=True)
class _Placed:
    backend: str
    remaining: float


RESOLVE_FRACTION = 0.25
"""The DP is solved again once more than this share of the live trajectories arrived since the last solve."""


class TrajectoryPlacer:
    """Places new trajectories by the presorted DP and moves them at tool-call boundaries (module docstring)."""

    def __init__(
        self,
        predictor: LengthPredictor,
        profile: Profile,
        prefill_s_per_token: float,
        backend_profiles: Mapping[str, Profile] | None = None,
        resolve_fraction: float = RESOLVE_FRACTION,
    ) -> None:
        self.predictor = predictor
        self.profile = profile
        self.backend_profiles = dict(backend_profiles or {})
        self.prefill_s_per_token = prefill_s_per_token
        self.resolve_fraction = resolve_fraction
        self.solves = 0  # DP solves so far
        self._live: dict[str, _Placed] = {}
        self._by_length: list[tuple[float, str]] = []  # (-remaining, key) of every live trajectory, sorted
        self._on: dict[str, list[tuple[float, str]]] = {}  # backend -> (remaining, key) of its trajectories, sorted
        self._ranked: tuple[str, ...] = ()  # the backend of each DP group, longest-running group first
        self._sizes: tuple[int, ...] = ()  # the DP's group sizes, in the same order
        self._arrivals = 0  # trajectories placed since the last solve

    def __contains__(self, key: str) -> bool:
        return key in self._live

    def __len__(self) -> int:
        return len(self._live)

    def profile_of(self, backend: str) -> Profile:
        """The backend's own profile (`backend_profiles`), else the common one."""
        return self.backend_profiles.get(backend, self.profile)

    def _add(self, key: str, backend: str, remaining: float) -> None:
        self._live[key] = _Placed(backend, remaining)
        bisect.insort(self._by_length, (-remaining, key))
        bisect.insort(self._on.setdefault(backend, []), (remaining, key))

    def _remove(self, key: str) -> _Placed | None:
        placed = self._live.pop(key, None)
        if placed is not None:
            _discard(self._by_length, (-placed.remaining, key))
            _discard(self._on[placed.backend], (placed.remaining, key))
        return placed

    def _finish_s(self, backend: str, size: int, longest: float) -> float:
        return self.profile_of(backend).seconds_per_token(size) * longest if size else 0.0

    def _target(self, key: str, remaining: float, live: int) -> str:
        """The backend of the DP group that this trajectory's rank among the live ones falls in, the group sizes
        scaled to `live` trajectories."""
        rank = bisect.bisect_left(self._by_length, (-remaining, key))
        return self._ranked[target_of_rank(rank, scaled_bounds(self._sizes, live))]

    def place_new(self, key: str, view: TrajectoryView, backends: Sequence[str]) -> str:
        """The backend (one of `backends`, never empty) of a new trajectory: by a fresh DP when the backends
        changed or enough trajectories arrived since the last one, else by its rank in the kept group sizes."""
        remaining = self.predictor.predict(view).remaining_tokens
        self._remove(key)
        if (
            set(self._ranked) != set(backends)
            or not any(self._sizes)
            or self._arrivals + 1 > self.resolve_fraction * len(self._live)
            or not self._by_length
            or remaining > -self._by_length[0][0]  # a new longest: the groups' shape changes
        ):
            address = self._solve(key, remaining, backends)
        else:
            self._arrivals += 1
            address = self._target(key, remaining, len(self._by_length) + 1)
        self._add(key, address, remaining)
        return address

    def _solve(self, key: str, remaining: float, backends: Sequence[str]) -> str:
        """Solve the DP over the live trajectories on `backends` and the new one; keep its group sizes."""
        self.solves += 1
        self._arrivals = 0
        others = [k for k, p in self._live.items() if p.backend in backends]
        lengths = [self._live[k].remaining for k in others] + [remaining]
        profiles = [self.profile_of(b) for b in backends]
        if len(set(profiles)) > 1:  # heterogeneous: the longest group to the lowest-latency backend
            workers = place_on_workers(lengths, profiles)
            self._ranked = tuple(backends[w] for w in workers.order)
            self._sizes = workers.sizes
            return backends[workers.worker_of()[len(others)]]
        placement = place(lengths, len(backends), profiles[0])
        load = Counter(self._live[k].backend for k in others)
        free = list(backends)
        ranked: list[str] = []
        for group in placement.groups:
            hosts = Counter(self._live[others[i]].backend for i in group if i < len(others))
            best = max(free, key=lambda b: (hosts[b], -load[b], -free.index(b)))
            ranked.append(best)
            free.remove(best)
        self._ranked, self._sizes = tuple(ranked), placement.sizes
        return ranked[placement.backend_of()[len(others)]]

    def at_boundary(self, key: str, view: TrajectoryView, current: str, backends: Sequence[str]) -> str | None:
        """At a tool-call boundary of a placed trajectory now on `current`: the backend it should move to (one
        of `backends`), or None to stay. O(B + log n) besides the prediction (`migration`'s rule for the one
        trajectory at its boundary; the others keep their stored predictions)."""
        remaining = self.predictor.predict(view).remaining_tokens
        self._remove(key)
        self._add(key, current, remaining)
        if current not in self._ranked or not any(self._sizes):
            return None
        target = self._target(key, remaining, len(self._by_length))
        if target == current or target not in backends:
            return None
        finish = {
            b: self._finish_s(b, len(m), m[-1][0] if m else 0.0) for b, m in self._on.items() if b in self._ranked
        }
        before = max(finish.values())
        source, destination = self._on[current], self._on.get(target, [])
        stays = [item for item in source[-2:] if item[1] != key]  # the source's longest once this one left
        finish[current] = self._finish_s(current, len(source) - 1, stays[-1][0] if stays else 0.0)
        longest = max(remaining, destination[-1][0] if destination else 0.0)
        finish[target] = self._finish_s(target, len(destination) + 1, longest)
        cost = self.prefill_s_per_token * (view.prompt_len + view.tokens)
        if not worth_moving(before, max(finish.values()), cost):
            return None
        self._remove(key)
        self._add(key, target, remaining)
        return target

    def forget(self, key: str) -> None:
        """The trajectory ended (idempotent)."""
        self._remove(key)


def _discard(items: list[tuple[float, str]], item: tuple[float, str]) -> None:
    """Remove `item` from the sorted list `items` (binary search; O(n) memmove, no scan)."""
    index = bisect.bisect_left(items, item)
    if index < len(items) and items[index] == item:
        del items[index]
