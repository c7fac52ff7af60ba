"""DARTS' variance-based adaptive redundancy: how many members an `adaptive` group launches.

DARTS (seeds/004, section 4.2 and appendix C) keeps, per prompt, a moving average of the standard deviation
of its response lengths, `s`, and gives prompts whose lengths spread more a larger exploration budget `M'`
between `n` and `M_up`, by minimising `sum_i w_i / M'_i` with `w_i = Norm(s_i)` (min-max over the prompts)
under a total budget; its Algorithm 1 solves this greedily, one member at a time. The server sees prompts one
group at a time rather than as a batch, so it solves the same problem in closed form over the prompts it
remembers: the optimum is water-filling,

    M'_i = clip(c * sqrt(w_i), n, max_launch)

with the one `c` that makes the budgets of the remembered prompts sum to `n * redundancy` each on average
(what the greedy allocation gives, to rounding). A prompt with no history yet gets `round(n * redundancy)`,
and so does every prompt while all remembered prompts have the same spread.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import OrderedDict

EMA_DECAY = 0.5
"""Weight of the previous estimate when a prompt's group finishes (the new group's spread gets the rest)."""

MAX_PROMPTS = 10_000
"""Prompts remembered (the least recently seen are forgotten first)."""


class LengthHistory:
    """Per prompt, a moving average of the standard deviation of its groups' response lengths; and the
    adaptive budget that follows from it."""

    def __init__(self, decay: float = EMA_DECAY, max_prompts: int = MAX_PROMPTS) -> None:
        self.decay = decay
        self.max_prompts = max_prompts
        self._spread: OrderedDict[str, float] = OrderedDict()
        self._roots: dict[str, float] = {}  # sqrt(Norm(s)) per prompt; empty when stale
        self._sorted_roots: list[float] = []
        self._prefix: list[float] = []  # prefix sums of _sorted_roots
        self._scales: dict[tuple[float, float], float] = {}  # c / n per (redundancy, max_launch / n)

    def __len__(self) -> int:
        return len(self._spread)

    def spread(self, key: str) -> float | None:
        """The prompt's smoothed length standard deviation, or None if no group of it finished yet."""
        return self._spread.get(key)

    def record(self, key: str, lengths: list[int]) -> None:
        """Fold in the response lengths of a finished group's usable members (needs two to have a spread)."""
        if len(lengths) < 2:
            return
        spread = statistics.pstdev(lengths)
        previous = self._spread.pop(key, None)
        self._spread[key] = spread if previous is None else self.decay * previous + (1 - self.decay) * spread
        while len(self._spread) > self.max_prompts:
            self._spread.popitem(last=False)
        self._roots = {}

    def budget(self, key: str, n: int, redundancy: float, max_launch: int) -> int:
        """Members to launch for a group of `n` of this prompt (see the module docstring)."""
        self._refresh()
        root = self._roots.get(key)
        if root is None or not self._sorted_roots or self._sorted_roots[-1] == 0.0:
            wanted = n * redundancy
        else:
            wanted = n * self._scale(redundancy, max_launch / n) * root
        return max(n, min(max_launch, round(wanted)))

    def _refresh(self) -> None:
        if self._roots or not self._spread:
            return
        low, high = min(self._spread.values()), max(self._spread.values())
        span = high - low
        self._roots = {key: math.sqrt((s - low) / span) if span > 0 else 0.0 for key, s in self._spread.items()}
        self._sorted_roots = sorted(self._roots.values())
        self._prefix = [0.0, *itertools.accumulate(self._sorted_roots)]
        self._scales = {}

    def _scale(self, redundancy: float, cap: float) -> float:
        """The `c / n` at which `sum_j clip(c / n * root_j, 1, cap)` equals `redundancy` per prompt."""
        cached = self._scales.get((redundancy, cap))
        if cached is not None:
            return cached
        roots, count = self._sorted_roots, len(self._sorted_roots)
        target = redundancy * count

        def total(scale: float) -> float:
            floor = bisect.bisect_left(roots, 1 / scale)  # these stay at 1
            ceiling = bisect.bisect_right(roots, cap / scale)  # from here on, at the cap
            middle = scale * (self._prefix[ceiling] - self._prefix[floor]) if ceiling > floor else 0.0
            return floor + middle + cap * (count - max(ceiling, floor))

        low, high = 1e-9, cap / min(r for r in roots if r > 0)  # at `high` every prompt with a spread is capped
        if total(high) <= target:
            scale = high
        else:
            for _ in range(60):
                middle = (low + high) / 2
                low, high = (middle, high) if total(middle) < target else (low, middle)
            scale = high
        self._scales[(redundancy, cap)] = scale
        return scale
