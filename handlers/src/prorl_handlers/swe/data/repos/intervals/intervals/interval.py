"""The Interval type."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Interval:
    """The closed interval [start, end]; `start <= end`. A single point has start == end."""

    start: float
    end: float

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"interval end {self.end} is before its start {self.start}")

    @property
    def length(self) -> float:
        """end - start."""
        return self.end - self.start

    def __contains__(self, value: float) -> bool:
        return self.start <= value < self.end

    def overlaps(self, other: Interval) -> bool:
        """True when the two intervals share at least one point."""
        return self.start <= other.end and other.start <= self.end

    def intersection(self, other: Interval) -> Interval | None:
        """The points both intervals contain, or None when they are disjoint."""
        return Interval(max(self.start, other.start), min(self.end, other.end))

    def shift(self, offset: float) -> Interval:
        """The same interval moved by `offset`."""
        return Interval(self.start + offset, self.end + offset)
