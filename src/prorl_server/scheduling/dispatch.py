"""Dispatch policies: the order in which LLM calls waiting for a backend's admission slot go (Heddle section 4.2).

A policy turns a call into one integer, its priority (lower = sooner); waiting calls are admitted in
(priority, arrival) order, and the same integer can be sent as vLLM's `priority` request field:

- "fcfs": trajectories in arrival order: every call of a trajectory carries the number of the trajectory's
  first call, so a trajectory that started earlier goes first at every turn.
- "round_robin": the step-centric baseline: every call carries its own arrival number, so a trajectory's
  next turn queues behind the calls already waiting.
- "progressive": Heddle's progressive priority: longest predicted remaining tokens first, predicted anew at
  every call from the trajectory's view so far (-round(remaining tokens)).
- "srpt": the reverse, shortest predicted remaining first, as Autellix (round(remaining tokens)).

The predictor learns from every completed trajectory (`observe_finished`). Thread-safe: calls come from the
stage pools' threads.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from prorl_server.scheduling.predictor import LengthPredictor
from prorl_server.scheduling.view import TrajectoryView


def _fcfs(trajectory_seq: int, call_seq: int, remaining: Callable[[], float]) -> int:
    return trajectory_seq


def _round_robin(trajectory_seq: int, call_seq: int, remaining: Callable[[], float]) -> int:
    return call_seq


def _progressive(trajectory_seq: int, call_seq: int, remaining: Callable[[], float]) -> int:
    return -round(remaining())


def _srpt(trajectory_seq: int, call_seq: int, remaining: Callable[[], float]) -> int:
    return round(remaining())


_ORDERS: dict[str, Callable[[int, int, Callable[[], float]], int]] = {
    "fcfs": _fcfs,
    "round_robin": _round_robin,
    "progressive": _progressive,
    "srpt": _srpt,
}
DISPATCH_POLICIES: tuple[str, ...] = tuple(_ORDERS)
"""The dispatch policies by name."""


class DispatchPolicy:
    """Gives each LLM call its priority (lower = sooner) and feeds finished trajectories to the predictor."""

    def __init__(self, name: str, predictor: LengthPredictor, *, vllm_priority: bool = False) -> None:
        if name not in _ORDERS:
            raise ValueError(f"unknown dispatch policy {name!r}; choose one of {sorted(_ORDERS)}")
        self.name = name
        self.predictor = predictor
        self.vllm_priority = vllm_priority
        self._order = _ORDERS[name]
        self._lock = threading.Lock()
        self._calls = itertools.count()
        self._trajectories = itertools.count()

    @property
    def sends_priority(self) -> bool:
        """Whether calls carry their priority as vLLM's `priority` field: when asked to (`vllm_priority`),
        and never for fcfs, which is vLLM's own order."""
        return self.vllm_priority and self.name != "fcfs"

    def new_trajectory(self) -> int:
        """The arrival number of a new trajectory (fcfs orders by it)."""
        with self._lock:
            return next(self._trajectories)

    def priority(self, trajectory_seq: int, view: Callable[[], TrajectoryView]) -> int:
        """The priority of a trajectory's next call; `view` gives its view so far (asked only by the policies
        that predict)."""
        with self._lock:
            call_seq = next(self._calls)
            return self._order(trajectory_seq, call_seq, lambda: self.predictor.predict(view()).remaining_tokens)

    def observe_finished(self, view: TrajectoryView) -> None:
        """Learn a finished trajectory's final view."""
        with self._lock:
            self.predictor.observe_finished(view)
