import pytest

from datekit import format_duration, parse_duration


def test_parse_single_units():
    assert parse_duration("45s") == 45
    assert parse_duration("2h") == 7200


def test_parse_combined_units():
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2d 4h") == 2 * 86400 + 4 * 3600


def test_parse_is_case_insensitive():
    assert parse_duration("1H") == 3600


def test_parse_refuses_text_without_parts():
    with pytest.raises(ValueError):
        parse_duration("soon")


def test_format():
    assert format_duration(5400) == "1h 30m"
    assert format_duration(0) == "0s"
    assert format_duration(90061) == "1d 1h 1m 1s"
