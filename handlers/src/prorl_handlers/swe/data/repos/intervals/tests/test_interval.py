import pytest

from intervals import Interval


def test_end_before_start_is_refused():
    with pytest.raises(ValueError):
        Interval(3, 1)


def test_length():
    assert Interval(2, 7).length == 5


def test_interior_points_are_contained():
    assert 2.5 in Interval(2, 3)
    assert 4 not in Interval(2, 3)


def test_overlaps():
    assert Interval(1, 3).overlaps(Interval(2, 4))
    assert not Interval(1, 2).overlaps(Interval(3, 4))


def test_intersection_of_overlapping_intervals():
    assert Interval(1, 5).intersection(Interval(3, 8)) == Interval(3, 5)


def test_shift():
    assert Interval(1, 2).shift(10) == Interval(11, 12)
