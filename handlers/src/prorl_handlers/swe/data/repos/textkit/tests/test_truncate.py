import pytest

from textkit import truncate


def test_short_text_is_unchanged():
    assert truncate("hello", 10) == "hello"


def test_text_of_exactly_the_limit_is_unchanged():
    assert truncate("hello", 5) == "hello"


def test_long_text_ends_with_the_suffix():
    assert truncate("hello world", 8).endswith("...")


def test_negative_limit_is_refused():
    with pytest.raises(ValueError):
        truncate("hello", -1)
