from semverlite import satisfies


def test_comparison_operators():
    assert satisfies("1.2.3", ">=1.2.0")
    assert not satisfies("1.2.3", "<1.2.3")
    assert satisfies("1.2.3", "=1.2.3")


def test_several_terms_must_all_hold():
    assert satisfies("1.5.0", ">=1.0.0 <2.0.0")
    assert not satisfies("2.1.0", ">=1.0.0 <2.0.0")


def test_caret_allows_minor_and_patch_updates():
    assert satisfies("1.9.9", "^1.2.3")
    assert not satisfies("2.0.0", "^1.2.3")
    assert not satisfies("1.2.2", "^1.2.3")


def test_tilde_allows_patch_updates():
    assert satisfies("1.2.9", "~1.2.3")
    assert not satisfies("1.3.0", "~1.2.3")
