"""Operations on collections of intervals."""

from __future__ import annotations

from collections.abc import Iterable

from intervals.interval import Interval


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of `intervals` as sorted, disjoint intervals (overlapping or touching ones are joined)."""
    merged: list[Interval] = []
    for interval in sorted(intervals):
        if merged and interval.start < merged[-1].end:
            last = merged.pop()
            merged.append(Interval(last.start, max(last.end, interval.end)))
        else:
            merged.append(interval)
    return merged


def total_length(intervals: Iterable[Interval]) -> float:
    """The length of the union of `intervals` (overlaps are counted once)."""
    return sum(interval.length for interval in merge(intervals))


def gaps(intervals: Iterable[Interval], within: Interval) -> list[Interval]:
    """The parts of `within` that none of `intervals` covers, in order."""
    result: list[Interval] = []
    cursor = within.start
    for interval in merge(intervals):
        if interval.end <= cursor:
            continue
        if interval.start >= within.end:
            break
        if interval.start > cursor:
            result.append(Interval(cursor, interval.start))
        cursor = max(cursor, interval.end)
    if cursor < within.end:
        result.append(Interval(cursor, within.end))
    return result
