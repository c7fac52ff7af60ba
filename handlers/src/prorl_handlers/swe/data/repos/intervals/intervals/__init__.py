"""Closed numeric intervals: membership, intersection, merging and gaps."""

from intervals.interval import Interval
from intervals.ops import gaps, merge, total_length

__all__ = ["Interval", "gaps", "merge", "total_length"]
