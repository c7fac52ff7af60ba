"""Heddle's trajectory-aware placement over the live trajectories of a running server (section 5).

`TrajectoryPlacer` keeps, per live trajectory, the backend it is on, its last predicted remaining tokens and
the prefill it will still cost (its prompt if it has not run, an observation before each remaining turn: the
observation tokens per turn are a running mean over the views it `learn`s, every boundary's and, if the caller
passes them, finished trajectories'). A trajectory's first completion places it: the presorted DP
(`partition.place`: draining group times plus those prefills) is solved over the live trajectories'
predictions plus the new one, its groups are matched to backends (greedily, the group and backend sharing the
most members first, ties to the least loaded backend, so a backend keeps the group it has been filling), and
the new trajectory goes to its group's backend; the others stay where they are (sticky). The DP's group sizes
are kept. The DP is solved again only when the backends changed, the new trajectory is predicted longer than
every live one, or more than `resolve_fraction` (a quarter) of the live count arrived since the last solve (so
always while fewer than 4 are live); in between a new trajectory goes to the group its rank by predicted
length falls in, the kept sizes scaled to the live count (migration's rule), so the DP's O(n B) to O(n B^2) is
paid once per n / 4 arrivals. At a tool-call boundary (the start of a trajectory's next completion) its
prediction is refreshed and migration's rule (`migration.py`: rank in the rescaled group sizes, then the
makespan gain against the prefix recompute) decides whether it moves, for this one trajectory: sorted lists
of the live predictions (overall and per backend) and each backend's group time kept until its members change
make that O(B + log n) plus list inserts (each backend's draining group time is updated at each insert and
removal in O(runs of its profile's increments)), not the O(n log n) of `plan_migrations`. Backends with profiles
of their own (`backend_profiles`, heterogeneous workers) are placed by `heterogeneous.place_on_workers`
instead: the DP's groups, longest first, go to the backends in order of per-token time at batch size 1,
lowest first (Heddle's sort-initialised mapping), and migration weighs each backend with its own profile.
Backends are named by address; the class is not thread-safe (the backend pool calls it under its lock).
"""

from __future__ import annotations

import bisect
import itertools
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
    extra_s: float  # the prefill it will still cost its backend (`_extra_s`)


@dataclass(slots=True)
class _Backend:
    """A backend's live trajectories: their remaining lengths sorted ascending, the (remaining, key) pairs in
    the same order, the sum of their extras, and their draining group time (kept up to date by each insert
    and removal in O(runs of the profile's increments), `_inserted_s` and `_removed_s`)."""

    lengths: list[float] = field(default_factory=list)
    keys: list[tuple[float, str]] = field(default_factory=list)
    extra_s: float = 0.0
    decode_s: float = 0.0

    @property
    def finish_s(self) -> float:
        return self.decode_s + self.extra_s


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
        self._on: dict[str, _Backend] = {}
        self._observation_per_turn = 0.0  # running mean over the views learnt (`learn`), for `_extra_s`
        self._learnt = 0
        self._steps: dict[Profile, list[tuple[int, int, float]]] = {}  # interference_steps, grown by doubling
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

    def _add(self, key: str, backend: str, remaining: float, extra_s: float) -> None:
        self._live[key] = _Placed(backend, remaining, extra_s)
        bisect.insort(self._by_length, (-remaining, key))
        on = self._on.setdefault(backend, _Backend())
        index = bisect.bisect_left(on.keys, (remaining, key))
        on.decode_s = self._inserted_s(backend, on, index, remaining)
        on.keys.insert(index, (remaining, key))
        on.lengths.insert(index, remaining)
        on.extra_s += extra_s

    def _remove(self, key: str) -> _Placed | None:
        placed = self._live.pop(key, None)
        if placed is not None:
            _discard(self._by_length, (-placed.remaining, key))
            on = self._on[placed.backend]
            index = bisect.bisect_left(on.keys, (placed.remaining, key))
            if index < len(on.keys) and on.keys[index] == (placed.remaining, key):
                on.decode_s = self._removed_s(placed.backend, on, index) if len(on.keys) > 1 else 0.0
                del on.keys[index], on.lengths[index]
            on.extra_s = max(0.0, on.extra_s - placed.extra_s) if on.keys else 0.0
        return placed

    def _extra_s(self, view: TrajectoryView, remaining_turns: float) -> float:
        """The prefill a trajectory will still cost its backend: its prompt if it has not run yet, and an
        observation (the running mean per turn) before each remaining turn but the first one's."""
        if view.turns == 0:
            tokens = view.prompt_len + max(0.0, remaining_turns - 1) * self._observation_per_turn
        else:
            tokens = remaining_turns * self._observation_per_turn
        return self.prefill_s_per_token * tokens

    def learn(self, view: TrajectoryView) -> None:
        """Learn the observation tokens per turn (for the prefill still to come) from a view: every
        boundary's, and a finished trajectory's if the caller has it (a running mean over the last ~1,024)."""
        turns = view.turns - 1 if view.finished else view.turns  # an observation after each turn but the last
        if turns > 0:
            self._learnt += 1
            per_turn = view.observation_tokens / turns
            self._observation_per_turn += (per_turn - self._observation_per_turn) / min(self._learnt, 1024)

    def _runs(self, backend: str, size: int) -> list[tuple[int, int, float]]:
        """`Profile.interference_steps` of the backend's profile, covering at least `size` (grown by doubling)."""
        profile = self.profile_of(backend)
        steps = self._steps.get(profile)
        if steps is None or steps[-1][1] < size:
            steps = profile.interference_steps(max(64, 2 * size))
            self._steps[profile] = steps
        return steps

    def _inserted_s(self, backend: str, on: _Backend, index: int, length: float) -> float:
        """The draining group time once `length` is inserted at ascending `index`: it takes descending rank
        q = n + 1 - index (1-based) and adds length * dI(q); each shorter one moves a rank down, which changes
        its increment only where a run of equal increments ends (`Profile.group_seconds`)."""
        lengths, n = on.lengths, len(on.lengths)
        runs = self._runs(backend, n + 1)
        rank = n + 1 - index
        total = on.decode_s
        for (_, last, step), (_, _, following) in itertools.pairwise(runs):
            if last > n:
                break
            if last >= rank:  # the one at rank `last` moves to `last + 1`, into the next run
                total += lengths[n - last] * (following - step)
        return total + length * _increment(runs, rank)

    def _removed_s(self, backend: str, on: _Backend, index: int) -> float:
        """The draining group time once the one at ascending `index` leaves (the inverse of `_inserted_s`)."""
        lengths, n = on.lengths, len(on.lengths)
        runs = self._runs(backend, n)
        rank = n - index
        total = on.decode_s - lengths[index] * _increment(runs, rank)
        for (_, last, step), (_, _, following) in itertools.pairwise(runs):
            if last + 1 > n:
                break
            if last + 1 > rank:  # the one at rank `last + 1` moves up to `last`, into the previous run
                total += lengths[n - last - 1] * (step - following)
        return total

    def _finish_s(self, backend: str) -> float:
        return self._on[backend].finish_s

    def _target(self, key: str, remaining: float, live: int) -> str:
        """The backend of the DP group that this trajectory's rank among the live ones falls in, the group sizes
        scaled to `live` trajectories."""
        rank = bisect.bisect_left(self._by_length, (-remaining, key))
        return self._ranked[target_of_rank(rank, scaled_bounds(self._sizes, live))]

    def place_new(self, key: str, view: TrajectoryView, backends: Sequence[str]) -> str:
        """The backend (one of `backends`, never empty) of a new trajectory: by a fresh DP when the backends
        changed or enough trajectories arrived since the last one, else by its rank in the kept group sizes."""
        prediction = self.predictor.predict(view)
        remaining, extra_s = prediction.remaining_tokens, self._extra_s(view, prediction.remaining_turns)
        self._remove(key)
        if (
            set(self._ranked) != set(backends)
            or not any(self._sizes)
            or self._arrivals + 1 > self.resolve_fraction * len(self._live)
            or not self._by_length
            or remaining > -self._by_length[0][0]  # a new longest: the groups' shape changes
        ):
            address = self._solve(key, remaining, extra_s, backends)
        else:
            self._arrivals += 1
            address = self._target(key, remaining, len(self._by_length) + 1)
        self._add(key, address, remaining, extra_s)
        return address

    def _solve(self, key: str, remaining: float, extra_s: float, backends: Sequence[str]) -> str:
        """Solve the DP over the live trajectories on `backends` and the new one; keep its group sizes."""
        self.solves += 1
        self._arrivals = 0
        others = [k for k, p in self._live.items() if p.backend in backends]
        lengths = [self._live[k].remaining for k in others] + [remaining]
        extras = [self._live[k].extra_s for k in others] + [extra_s]
        profiles = [self.profile_of(b) for b in backends]
        if len(set(profiles)) > 1:  # heterogeneous: the longest group to the lowest-latency backend
            workers = place_on_workers(lengths, profiles, extras)
            self._ranked = tuple(backends[w] for w in workers.order)
            self._sizes = workers.sizes
            return backends[workers.worker_of()[len(others)]]
        placement = place(lengths, len(backends), profiles[0], extras)
        load = Counter(self._live[k].backend for k in others)
        pairs = []
        for g, group in enumerate(placement.groups):
            hosts = Counter(self._live[others[i]].backend for i in group if i < len(others))
            pairs += [(-hosts[b], load[b], g, index) for index, b in enumerate(backends)]
        pairs.sort()
        chosen: dict[int, str] = {}
        for _, _, g, index in pairs:  # the group and backend sharing the most members first
            if g not in chosen and backends[index] not in chosen.values():
                chosen[g] = backends[index]
        self._ranked, self._sizes = tuple(chosen[g] for g in range(len(placement.groups))), placement.sizes
        return self._ranked[placement.backend_of()[len(others)]]

    def at_boundary(self, key: str, view: TrajectoryView, current: str, backends: Sequence[str]) -> str | None:
        """At a tool-call boundary of a placed trajectory now on `current`: the backend it should move to (one
        of `backends`), or None to stay. O(B + log n) besides the prediction (`migration`'s rule for the one
        trajectory at its boundary; the others keep their stored predictions)."""
        self.learn(view)
        prediction = self.predictor.predict(view)
        remaining, extra_s = prediction.remaining_tokens, self._extra_s(view, prediction.remaining_turns)
        self._remove(key)
        self._add(key, current, remaining, extra_s)
        if current not in self._ranked or not any(self._sizes):
            return None
        target = self._target(key, remaining, len(self._by_length))
        if target == current or target not in backends:
            return None
        before = max(self._finish_s(b) for b in self._on if b in self._ranked)
        source, destination = self._on[current], self._on.setdefault(target, _Backend())
        index = bisect.bisect_left(source.keys, (remaining, key))
        cost = self.prefill_s_per_token * (view.prompt_len + view.tokens)
        finish = {b: self._finish_s(b) for b in self._on if b in self._ranked}
        finish[current] = (self._removed_s(current, source, index) if len(source.keys) > 1 else 0.0) + max(
            0.0, source.extra_s - extra_s
        )
        arriving = bisect.bisect_left(destination.lengths, remaining)
        finish[target] = self._inserted_s(target, destination, arriving, remaining) + destination.extra_s + extra_s
        if not worth_moving(before, max(finish.values()), cost):
            return None
        self._remove(key)
        self._add(key, target, remaining, extra_s)
        return target

    def forget(self, key: str) -> None:
        """The trajectory ended (idempotent)."""
        self._remove(key)


def _increment(runs: list[tuple[int, int, float]], rank: int) -> float:
    """I(rank) - I(rank - 1) from the runs of `Profile.interference_steps` (rank 1-based, covered by them)."""
    for _, last, step in runs:
        if rank <= last:
            return step
    return runs[-1][2]


def _discard(items: list[tuple[float, str]], item: tuple[float, str]) -> None:
    """Remove `item` from the sorted list `items` (binary search; O(n) memmove, no scan)."""
    index = bisect.bisect_left(items, item)
    if index < len(items) and items[index] == item:
        del items[index]
