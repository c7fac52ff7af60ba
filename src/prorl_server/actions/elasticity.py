"""How an action's duration scales with its degree of parallelism (DoP), learned online per action kind.

Amdahl's law: with `m` cores an action takes `T(m) = T1 * (s + (1 - s) / m)`, where `T1` is its duration on one
core and `s` its serial fraction. `AmdahlModel` fits `T(m) = a + b / m` (so `T1 = a + b`, `s = a / (a + b)`) by
least squares over its recent observations, weighting older ones down (`decay`). Until it has seen at least
two DoPs it keeps `prior_serial` and scales `T1` from what it saw.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

DEFAULT_PRIOR_SERIAL = 0.5
"""Serial fraction assumed for an action kind until observations at two DoPs say otherwise."""
DEFAULT_DECAY = 0.95
"""Weight kept by the older observations at each new one (an effective memory of about 20 actions)."""


@dataclass
class _Sums:
    """Exponentially weighted sums of x = 1/m and y = seconds."""

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0


class AmdahlModel:
    """Duration by DoP of one action kind (see the module). Thread-safe."""

    def __init__(self, prior_serial: float = DEFAULT_PRIOR_SERIAL, decay: float = DEFAULT_DECAY) -> None:
        if not 0.0 <= prior_serial <= 1.0:
            raise ValueError(f"prior_serial must be within [0, 1], got {prior_serial}")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be within (0, 1], got {decay}")
        self.prior_serial = prior_serial
        self.decay = decay
        self._sums = _Sums()
        self._lock = threading.Lock()
        self.observations = 0

    def observe(self, dop: int, seconds: float) -> None:
        """An action of this kind took `seconds` with `dop` cores."""
        if dop < 1 or not seconds >= 0.0:  # `not >=` also refuses NaN
            return
        x = 1.0 / dop
        with self._lock:
            s = self._sums
            for name in ("w", "x", "y", "xx", "xy"):
                setattr(s, name, getattr(s, name) * self.decay)
            s.w += 1.0
            s.x += x
            s.y += seconds
            s.xx += x * x
            s.xy += x * seconds
            self.observations += 1

    def fit(self) -> tuple[float, float] | None:
        """(T1, serial fraction), or None before any observation."""
        with self._lock:
            s = _Sums(**vars(self._sums))
        if s.w <= 0.0:
            return None
        mean_x, mean_y = s.x / s.w, s.y / s.w
        var_x = s.xx / s.w - mean_x * mean_x
        if var_x > 1e-9:  # two DoPs or more: fit a + b/m
            b = max(0.0, (s.xy / s.w - mean_x * mean_y) / var_x)
            a = max(0.0, mean_y - b * mean_x)
            if a + b > 0.0:
                return a + b, a / (a + b)
        # one DoP only: T = T1 * (p + (1 - p) x) at the mean x, with the prior p
        p = self.prior_serial
        return mean_y / (p + (1.0 - p) * mean_x), p

    def duration(self, dop: int) -> float | None:
        """Predicted seconds with `dop` cores; None before any observation."""
        fitted = self.fit()
        if fitted is None:
            return None
        t1, serial = fitted
        return t1 * (serial + (1.0 - serial) / max(1, dop))


class ElasticityModels:
    """An AmdahlModel per action kind, made on first use."""

    def __init__(self, prior_serial: float = DEFAULT_PRIOR_SERIAL, decay: float = DEFAULT_DECAY) -> None:
        self._prior_serial = prior_serial
        self._decay = decay
        self._models: dict[str, AmdahlModel] = {}
        self._lock = threading.Lock()

    def __getitem__(self, kind: str) -> AmdahlModel:
        with self._lock:
            model = self._models.get(kind)
            if model is None:
                model = self._models[kind] = AmdahlModel(self._prior_serial, self._decay)
            return model

    def kinds(self) -> list[str]:
        """The action kinds seen so far."""
        with self._lock:
            return sorted(self._models)
