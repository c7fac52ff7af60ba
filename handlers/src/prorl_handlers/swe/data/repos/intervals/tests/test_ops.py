from intervals import Interval, gaps, merge, total_length


def test_merge_joins_overlapping_intervals():
    assert merge([Interval(5, 8), Interval(1, 3), Interval(2, 4)]) == [Interval(1, 4), Interval(5, 8)]


def test_merge_keeps_disjoint_intervals():
    assert merge([Interval(1, 2), Interval(3, 4)]) == [Interval(1, 2), Interval(3, 4)]


def test_merge_of_nothing():
    assert merge([]) == []


def test_total_length_counts_overlaps_once():
    assert total_length([Interval(0, 10), Interval(5, 15)]) == 15


def test_gaps():
    assert gaps([Interval(2, 3), Interval(5, 6)], Interval(0, 10)) == [
        Interval(0, 2),
        Interval(3, 5),
        Interval(6, 10),
    ]
