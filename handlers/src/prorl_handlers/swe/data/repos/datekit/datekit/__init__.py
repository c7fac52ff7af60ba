"""Calendar arithmetic and human-readable durations."""

from datekit.calendar import add_months, days_in_month, is_leap_year
from datekit.duration import format_duration, parse_duration

__all__ = ["add_months", "days_in_month", "format_duration", "is_leap_year", "parse_duration"]
