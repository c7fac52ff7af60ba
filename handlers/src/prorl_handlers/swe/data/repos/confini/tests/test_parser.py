import pytest

from confini import ConfigError, parse


def test_sections_and_keys():
    assert parse("[a]\nx = 1\n[b]\ny=2") == {"a": {"x": "1"}, "b": {"y": "2"}}


def test_comments_and_blank_lines_are_skipped():
    assert parse("; top\n\n[a]\n# note\nx = 1\n") == {"a": {"x": "1"}}


def test_values_may_contain_equals_signs():
    assert parse("[a]\nurl = http://x/?q=1")["a"]["url"] == "http://x/?q=1"


def test_key_outside_a_section_is_an_error():
    with pytest.raises(ConfigError, match="line 1"):
        parse("x = 1")


def test_line_without_equals_is_an_error():
    with pytest.raises(ConfigError, match="line 2"):
        parse("[a]\njust words")
