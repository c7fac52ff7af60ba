from datetime import date

import pytest

from datekit import add_months, days_in_month, is_leap_year


def test_leap_years():
    assert is_leap_year(2024)
    assert not is_leap_year(2023)
    assert not is_leap_year(1900)


def test_days_in_month():
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2023, 4) == 30
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29


def test_days_in_month_refuses_bad_months():
    with pytest.raises(ValueError):
        days_in_month(2023, 13)


def test_add_months_keeps_the_day():
    assert add_months(date(2023, 1, 15), 1) == date(2023, 2, 15)


def test_add_months_across_years():
    assert add_months(date(2023, 11, 10), 3) == date(2024, 2, 10)
    assert add_months(date(2023, 1, 10), -2) == date(2022, 11, 10)
