"""Heddle's trajectory-aware placement over the live trajectories of a running server (section 5).

`TrajectoryPlacer` keeps, per live trajectory, the backend it is on and its last predicted remaining tokens.
A trajectory's first completion places it: the presorted DP (`partition.place`) is solved once over the live
trajectories' predictions plus the new one, its groups are matched to backends (each group, longest first,
to the free backend already holding most of its members, else the least loaded), and the new trajectory goes
to its group's backend; the others stay where they are (sticky). The DP's group sizes are kept. At a
tool-call boundary (the start of a trajectory's next completion) its prediction is refreshed and
`migration.plan_migrations` decides, by the kept group sizes rescaled to the live trajectories, whether it
moves and whether the gain beats recomputing its prefix. Backends with profiles of their own
(`backend_profiles`, heterogeneous workers) are placed by `heterogeneous.place_on_workers` instead: the DP's
groups, longest first, go to the backends in order of per-token time at batch size 1, lowest first (Heddle's
sort-initialised mapping), and migration weighs each backend with its own profile. Backends are named by
address; the class is not thread-safe (the backend pool calls it under its lock).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prorl_server.scheduling.heterogeneous import place_on_workers
from prorl_server.scheduling.migration import LiveTrajectory, plan_migrations
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


class TrajectoryPlacer:
    """Places new trajectories by the presorted DP and moves them at tool-call boundaries (module docstring)."""

    def __init__(
        self,
        predictor: LengthPredictor,
        profile: Profile,
        prefill_s_per_token: float,
        backend_profiles: Mapping[str, Profile] | None = None,
    ) -> None:
        self.predictor = predictor
        self.profile = profile
        self.backend_profiles = dict(backend_profiles or {})
        self.prefill_s_per_token = prefill_s_per_token
        self._live: dict[str, _Placed] = {}
        self._ranked: tuple[str, ...] = ()  # the backend of each DP group, longest-running group first
        self._sizes: tuple[int, ...] = ()  # the DP's group sizes, in the same order

    def __contains__(self, key: str) -> bool:
        return key in self._live

    def profile_of(self, backend: str) -> Profile:
        """The backend's own profile (`backend_profiles`), else the common one."""
        return self.backend_profiles.get(backend, self.profile)

    def place_new(self, key: str, view: TrajectoryView, backends: Sequence[str]) -> str:
        """The backend (one of `backends`, never empty) of a new trajectory; solves the DP once."""
        remaining = self.predictor.predict(view).remaining_tokens
        others = [k for k, p in self._live.items() if p.backend in backends and k != key]
        lengths = [self._live[k].remaining for k in others] + [remaining]
        profiles = [self.profile_of(b) for b in backends]
        if len(set(profiles)) > 1:  # heterogeneous: the longest group to the lowest-latency backend
            workers = place_on_workers(lengths, profiles)
            self._ranked = tuple(backends[w] for w in workers.order)
            self._sizes = workers.sizes
            address = backends[workers.worker_of()[len(others)]]
            self._live[key] = _Placed(address, remaining)
            return address
        placement = place(lengths, len(backends), self.profile_of(backends[0]))
        load = Counter(self._live[k].backend for k in others)
        free = list(backends)
        ranked: list[str] = []
        for group in placement.groups:
            hosts = Counter(self._live[others[i]].backend for i in group if i < len(others))
            best = max(free, key=lambda b: (hosts[b], -load[b], -free.index(b)))
            ranked.append(best)
            free.remove(best)
        self._ranked, self._sizes = tuple(ranked), placement.sizes
        address = ranked[placement.backend_of()[len(others)]]
        self._live[key] = _Placed(address, remaining)
        return address

    def at_boundary(self, key: str, view: TrajectoryView, current: str, backends: Sequence[str]) -> str | None:
        """At a tool-call boundary of a placed trajectory now on `current`: the backend it should move to (one
        of `backends`), or None to stay."""
        placed = self._live[key]
        placed.backend = current
        placed.remaining = self.predictor.predict(view).remaining_tokens
        index = {address: i for i, address in enumerate(self._ranked)}
        if current not in index or not self._sizes:
            return None
        live = [
            LiveTrajectory(
                key=k,
                backend=index[p.backend],
                remaining_tokens=p.remaining,
                context_tokens=view.prompt_len + view.tokens if k == key else 0,
                at_tool_boundary=k == key,
            )
            for k, p in self._live.items()
            if p.backend in index
        ]
        profiles = [self.profile_of(address) for address in self._ranked]
        for move in plan_migrations(live, self._sizes, profiles, self.prefill_s_per_token):
            target = self._ranked[move.target]
            if move.key == key and target in backends:
                placed.backend = target
                return target
        return None

    def forget(self, key: str) -> None:
        """The trajectory ended (idempotent)."""
        self._live.pop(key, None)
