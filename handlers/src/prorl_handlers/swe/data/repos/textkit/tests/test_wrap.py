import pytest

from textkit import wrap


def test_short_text_is_one_line():
    assert wrap("hello world", 40) == ["hello world"]


def test_wraps_on_word_boundaries():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_long_word_gets_its_own_line():
    assert wrap("a extraordinarily b", 5) == ["a", "extraordinarily", "b"]


def test_empty_text_has_no_lines():
    assert wrap("   ", 10) == []


def test_width_must_be_positive():
    with pytest.raises(ValueError):
        wrap("x", 0)
