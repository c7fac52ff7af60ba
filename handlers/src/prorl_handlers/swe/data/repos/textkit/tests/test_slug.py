from textkit import slugify


def test_lowercases_and_joins_words():
    assert slugify("Hello World") == "hello-world"


def test_punctuation_runs_become_one_separator():
    assert slugify("Hello, World!!  Again") == "hello-world-again"


def test_accents_are_removed():
    assert slugify("Crème brûlée") == "creme-brulee"


def test_custom_separator():
    assert slugify("a b c", separator="_") == "a_b_c"


def test_max_length_cuts_long_slugs():
    assert slugify("abcdefghij", max_length=4) == "abcd"
