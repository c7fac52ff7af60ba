"""Durations written like "1h30m" or "2d 4h"."""

from __future__ import annotations

import re

UNITS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_PART = re.compile(r"(\d+)\s*([wdhms])")


def parse_duration(text: str) -> int:
    """Seconds in a duration made of number-unit parts (w, d, h, m, s), e.g. "1h30m" or "2d 4h".

    Raises ValueError for anything else.
    """
    parts = _PART.findall(text.lower())
    if not parts:
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(number) * UNITS[unit] for number, unit in parts)


def format_duration(seconds: int) -> str:
    """The shortest "1d 2h 3m 4s"-style text for a number of seconds ("0s" for zero)."""
    if seconds < 0:
        raise ValueError("seconds must not be negative")
    parts = []
    for unit, size in UNITS.items():
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return " ".join(parts) or "0s"
