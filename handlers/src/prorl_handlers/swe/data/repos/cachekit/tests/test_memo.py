from cachekit import memoize


def test_results_are_cached():
    calls = []

    @memoize()
    def square(x):
        calls.append(x)
        return x * x

    assert square(3) == 9 and square(3) == 9
    assert calls == [3]


def test_different_arguments_are_different_entries():
    @memoize()
    def add(a, b=0):
        return a + b

    assert add(1, b=2) == 3
    assert add(1, b=3) == 4


def test_maxsize_bounds_the_cache():
    @memoize(maxsize=2)
    def ident(x):
        return x

    for i in range(5):
        ident(i)
    assert len(ident.cache) == 2
