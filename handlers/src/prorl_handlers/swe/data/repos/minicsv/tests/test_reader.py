import pytest

from minicsv import parse, parse_line, read_dicts


def test_plain_fields():
    assert parse_line("a,b,c") == ["a", "b", "c"]


def test_empty_fields():
    assert parse_line("a,,c,") == ["a", "", "c", ""]


def test_quoted_field_with_delimiter():
    assert parse_line('"a,b",c') == ["a,b", "c"]


def test_other_delimiter():
    assert parse_line("a;b", delimiter=";") == ["a", "b"]


def test_unterminated_quote_is_an_error():
    with pytest.raises(ValueError):
        parse_line('"abc')


def test_parse_rows():
    assert parse("a,b\n1,2") == [["a", "b"], ["1", "2"]]


def test_read_dicts():
    assert read_dicts("name,age\nAda,36\nAlan,41") == [
        {"name": "Ada", "age": "36"},
        {"name": "Alan", "age": "41"},
    ]
