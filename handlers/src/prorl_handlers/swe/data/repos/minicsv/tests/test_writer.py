from minicsv import format_row, format_rows


def test_plain_row():
    assert format_row(["a", 1, 2.5]) == "a,1,2.5"


def test_none_is_empty():
    assert format_row(["a", None]) == "a,"


def test_quoting():
    assert format_row(["a,b", 'say "hi"']) == '"a,b","say ""hi"""'


def test_rows():
    assert format_rows([["a", "b"], ["1", "2"]]) == "a,b\n1,2"
