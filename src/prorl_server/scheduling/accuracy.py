"""Predictor accuracy as Heddle reports it (section 7.2): recall of the longest trajectories and Pearson
correlation between predicted and true lengths, after the k-th step.

A trajectory is given as its views in order: `views[0]` before the first turn, `views[k]` after k turns, the
last one finished (its tokens are the true total). "After step k" uses `views[k]`, or the final view of a
trajectory that ended in fewer turns (predicted total = true total for it, as a scheduler would know). The
predicted total is the tokens so far plus the predicted remaining tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from prorl_server.scheduling.predictor import LengthPredictor
from prorl_server.scheduling.view import TrajectoryView


@dataclass(frozen=True, slots=True)
class Accuracy:
    """Recall of the true top `fraction` longest among the predicted top, and Pearson's r, at one step."""

    step: int
    trajectories: int
    fraction: float
    recall: float
    pearson: float


def top_indices(values: Sequence[float], count: int) -> set[int]:
    """Indices of the `count` largest values (ties: the earlier index first)."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    return set(order[:count])


def recall_at_top(predicted: Sequence[float], actual: Sequence[float], fraction: float = 0.1) -> float:
    """Share of the true top `fraction` (at least one) that is also in the predicted top `fraction`."""
    if len(predicted) != len(actual) or not actual:
        raise ValueError("recall needs as many predictions as true values, and at least one")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    count = max(1, round(fraction * len(actual)))
    return len(top_indices(predicted, count) & top_indices(actual, count)) / count


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson's correlation coefficient; NaN when either side is constant."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("Pearson's r needs two sequences of the same length, at least 2")
    mean_x, mean_y = math.fsum(xs) / len(xs), math.fsum(ys) / len(ys)
    cov = math.fsum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    var_x = math.fsum((x - mean_x) ** 2 for x in xs)
    var_y = math.fsum((y - mean_y) ** 2 for y in ys)
    if var_x == 0 or var_y == 0:
        return math.nan
    return cov / math.sqrt(var_x * var_y)


def accuracy_at_step(
    predictor: LengthPredictor,
    trajectories: Sequence[Sequence[TrajectoryView]],
    step: int,
    fraction: float = 0.1,
) -> Accuracy:
    """Recall@top-`fraction` and Pearson's r of predicted against true total tokens after `step` turns."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    predicted: list[float] = []
    actual: list[float] = []
    for views in trajectories:
        if not views or not views[-1].finished:
            raise ValueError("each trajectory needs its views up to a finished one")
        view = views[min(step, len(views) - 1)]
        predicted.append(view.tokens + predictor.predict(view).remaining_tokens)
        actual.append(views[-1].tokens)
    return Accuracy(
        step=step,
        trajectories=len(actual),
        fraction=fraction,
        recall=recall_at_top(predicted, actual, fraction),
        pearson=pearson(predicted, actual),
    )


def replay(
    predictor: LengthPredictor,
    epochs: Sequence[Sequence[Sequence[TrajectoryView]]],
    steps: Sequence[int],
    warmup: int = 1,
    fraction: float = 0.1,
) -> dict[int, list[Accuracy]]:
    """Replay epochs of trajectories in order: the predictor learns every epoch's finished trajectories, and
    each epoch after the first `warmup` is scored at each step before it is learnt. Returns step -> one
    `Accuracy` per scored epoch."""
    scores: dict[int, list[Accuracy]] = {step: [] for step in steps}
    for index, epoch in enumerate(epochs):
        if index >= warmup:
            for step in steps:
                scores[step].append(accuracy_at_step(predictor, epoch, step, fraction))
        for views in epoch:
            predictor.observe_finished(views[-1])
    return scores
