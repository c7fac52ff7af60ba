import pytest

from semverlite import Version


def test_parse_and_str_round_trip():
    for text in ["1.2.3", "1.0.0-rc.1", "2.0.0+build.7", "1.0.0-alpha.1+sha.5114f85"]:
        assert str(Version.parse(text)) == text


def test_invalid_versions_are_refused():
    for text in ["1.2", "01.2.3", "1.2.3-", "v1.2.3"]:
        with pytest.raises(ValueError):
            Version.parse(text)


def test_numeric_ordering():
    assert Version.parse("1.2.3") < Version.parse("1.10.0") < Version.parse("2.0.0")


def test_build_metadata_is_ignored_in_comparisons():
    assert Version.parse("1.0.0+a") == Version.parse("1.0.0+b")


def test_prereleases_order_alphabetically():
    assert Version.parse("1.0.0-alpha") < Version.parse("1.0.0-beta")


def test_bump_major():
    assert Version.parse("1.4.2").bump("major") == Version(2, 0, 0)


def test_bump_patch():
    assert Version.parse("1.4.2").bump("patch") == Version(1, 4, 3)


def test_bump_unknown_part():
    with pytest.raises(ValueError):
        Version(1, 0, 0).bump("micro")
