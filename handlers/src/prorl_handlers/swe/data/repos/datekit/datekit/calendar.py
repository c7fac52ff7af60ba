"""Gregorian calendar arithmetic."""

from __future__ import annotations

from datetime import date


def is_leap_year(year: int) -> bool:
    """True for years with a February 29th in the Gregorian calendar."""
    return year % 4 == 0 and year % 100 != 0


def days_in_month(year: int, month: int) -> int:
    """Number of days of `month` (1-12) in `year`."""
    if not 1 <= month <= 12:
        raise ValueError(f"month must be in 1..12, not {month}")
    if month == 2:
        return 29 if is_leap_year(year) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def add_months(day: date, months: int) -> date:
    """`day` moved by `months` calendar months (negative moves back).

    The day of the month is kept, or clamped to the last day of a shorter month
    (January 31st plus one month is the last day of February).
    """
    total = day.year * 12 + (day.month - 1) + months
    year, month = divmod(total, 12)
    return day.replace(year=year, month=month + 1)
