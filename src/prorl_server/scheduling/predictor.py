"""Length predictors: how many more tokens and turns a live trajectory will take (Heddle section 4.1).

A predictor has two methods: `predict(view)` between turns, and `observe_finished(view)` with a finished
trajectory's final view to learn from. They are chosen by name from `PREDICTORS`:

- "online" (`OnlinePredictor`, the default): progressive and history-based. Heddle's observation is that a
  prompt's earlier samples are the strongest signal, and that the estimate should be refined after every step.
  The predictor keeps bounded histories of final lengths (response tokens and turns) at four levels, from
  coarse to fine: all trajectories, the data source, the data source with the prompt's length (log2 bucket),
  and the prompt itself. Given t tokens after k turns, each level answers E[L - t | L >= t] (and
  E[T - k | T >= k] for turns) over its samples, with n the number of its samples with L >= t; the levels
  are blended coarse to fine by sample counts, est = (n * mean + s * est_parent) / (n + s) with
  s = `shrinkage` pseudo-samples, so a prompt with many samples speaks for itself and an unseen prompt falls
  back to its data source, then to everything. Conditioning on "already has t tokens" refines the estimate
  as the trajectory grows: shorter samples stop counting, and a trajectory that has outgrown its prompt's
  history falls back to the longer samples of its data source. After k >= 1 turns the trajectory's own pace
  counts too (Heddle: the first step is a strong indicator): remaining tokens = remaining turns * a rate that
  blends its tokens per turn so far, t / k with weight k, with the history's (t + est_tokens) / (k + est_turns)
  with weight `rate_shrinkage`. With no sample at least as long (nothing learnt yet, or longer than anything
  seen), it predicts max(`prior_tokens`, t) more tokens (as much again as it has) and max(`prior_turns`, k)
  more turns. Heddle fine-tunes a small LLM on the trajectory's context instead; this uses counts only.
- "source_mean": the baseline: the data source's mean final length (everything's mean for an unseen data
  source), minus what the trajectory already has, never below 0.
- "none": no prediction (0 remaining for every trajectory, so all tie).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prorl_server.scheduling.history import BoundedMap, LengthHistory
from prorl_server.scheduling.view import Prediction, TrajectoryView


class LengthPredictor(Protocol):
    """Predicts what a live trajectory still has to generate; learns from finished ones."""

    name: str

    def predict(self, view: TrajectoryView) -> Prediction: ...

    def observe_finished(self, view: TrajectoryView) -> None: ...


def _require_finished(view: TrajectoryView) -> None:
    if not view.finished:
        raise ValueError("observe_finished needs the final view of a finished trajectory (finished=True)")


@dataclass(slots=True)
class _Histories:
    """Final tokens and final turns of one level's trajectories."""

    tokens: LengthHistory
    turns: LengthHistory

    def add(self, view: TrajectoryView) -> None:
        self.tokens.add(view.tokens)
        self.turns.add(view.turns)


def _histories(capacity: int) -> Callable[[], _Histories]:
    return lambda: _Histories(LengthHistory(capacity), LengthHistory(capacity))


class OnlinePredictor:
    """Progressive, history-based: E[L - t | L >= t] blended over prompt, prompt-length bucket, data
    source and global histories by sample counts, paced by the trajectory's own tokens per turn (see the
    module docstring)."""

    name = "online"

    def __init__(
        self,
        *,
        shrinkage: float = 2.0,
        rate_shrinkage: float = 1.0,
        prior_tokens: float = 1024.0,
        prior_turns: float = 2.0,
        samples_per_prompt: int = 64,
        samples_per_source: int = 4096,
        global_samples: int = 8192,
        max_prompts: int = 100_000,
        max_sources: int = 1024,
    ) -> None:
        if shrinkage < 0 or rate_shrinkage < 0:
            raise ValueError(f"shrinkages must be >= 0, got {shrinkage} and {rate_shrinkage}")
        self._shrinkage = shrinkage
        self._rate_shrinkage = rate_shrinkage
        self._prior_tokens = prior_tokens
        self._prior_turns = prior_turns
        self._global = _histories(global_samples)()
        self._sources: BoundedMap[str, _Histories] = BoundedMap(max_sources, _histories(samples_per_source))
        self._buckets: BoundedMap[tuple[str, int], _Histories] = BoundedMap(
            max_sources * 32, _histories(samples_per_source)
        )
        self._prompts: BoundedMap[str, _Histories] = BoundedMap(max_prompts, _histories(samples_per_prompt))

    def predict(self, view: TrajectoryView) -> Prediction:
        """Expected remaining tokens and turns given what the view has so far."""
        if view.finished:
            return Prediction(0.0, 0.0)
        levels = [self._global, *self._finer_levels(view, create=False)]
        tokens = self._blend([level.tokens for level in levels], view.tokens)
        turns = self._blend([level.turns for level in levels], view.turns)
        if tokens is None:
            tokens = max(self._prior_tokens, view.tokens)
        if turns is None:
            turns = max(self._prior_turns, view.turns)
        if view.turns == 0:
            return Prediction(tokens, turns)
        history_rate = (view.tokens + tokens) / (view.turns + turns)
        rate = (view.tokens + self._rate_shrinkage * history_rate) / (view.turns + self._rate_shrinkage)
        return Prediction(rate * turns, turns)

    def observe_finished(self, view: TrajectoryView) -> None:
        """Learn a finished trajectory's final length at every level."""
        _require_finished(view)
        self._global.add(view)
        for level in self._finer_levels(view, create=True):
            level.add(view)

    def _finer_levels(self, view: TrajectoryView, *, create: bool) -> list[_Histories]:
        """The data source, prompt-length bucket and prompt histories of a view, coarse to fine."""
        keys: list[tuple[BoundedMap, object]] = [
            (self._sources, view.data_source),
            (self._buckets, (view.data_source, view.prompt_len.bit_length())),
            (self._prompts, view.prompt_key),
        ]
        found = [table.setdefault(key) if create else table.get(key) for table, key in keys]
        return [level for level in found if level is not None]

    def _blend(self, histories: list[LengthHistory], so_far: int) -> float | None:
        estimate: float | None = None
        for history in histories:
            mean, count = history.remaining_past(so_far)
            if count == 0:
                continue
            if estimate is None:
                estimate = mean
            else:
                estimate = (count * mean + self._shrinkage * estimate) / (count + self._shrinkage)
        return estimate


class SourceMeanPredictor:
    """Baseline: the data source's mean final length minus what the trajectory has (at least 0)."""

    name = "source_mean"

    def __init__(self, *, samples_per_source: int = 4096, global_samples: int = 8192, max_sources: int = 1024):
        self._global = _histories(global_samples)()
        self._sources: BoundedMap[str, _Histories] = BoundedMap(max_sources, _histories(samples_per_source))

    def predict(self, view: TrajectoryView) -> Prediction:
        """Mean final tokens and turns of the view's data source (else of everything) minus its counts."""
        if view.finished:
            return Prediction(0.0, 0.0)
        level = self._sources.get(view.data_source) or self._global
        mean_tokens, _ = level.tokens.remaining_past(0)
        mean_turns, _ = level.turns.remaining_past(0)
        return Prediction(max(mean_tokens - view.tokens, 0.0), max(mean_turns - view.turns, 0.0))

    def observe_finished(self, view: TrajectoryView) -> None:
        """Learn a finished trajectory's final length for its data source."""
        _require_finished(view)
        self._global.add(view)
        self._sources.setdefault(view.data_source).add(view)


class NoPredictor:
    """No prediction: 0 remaining for every trajectory."""

    name = "none"

    def predict(self, view: TrajectoryView) -> Prediction:
        """Always 0 remaining tokens and turns."""
        return Prediction(0.0, 0.0)

    def observe_finished(self, view: TrajectoryView) -> None:
        """Nothing to learn."""
        _require_finished(view)


PREDICTORS: dict[str, Callable[[], LengthPredictor]] = {
    OnlinePredictor.name: OnlinePredictor,
    SourceMeanPredictor.name: SourceMeanPredictor,
    NoPredictor.name: NoPredictor,
}


def make_predictor(name: str) -> LengthPredictor:
    """A predictor by its config name, with default settings."""
    try:
        return PREDICTORS[name]()
    except KeyError:
        raise ValueError(f"unknown length predictor {name!r}; choose one of {sorted(PREDICTORS)}") from None
