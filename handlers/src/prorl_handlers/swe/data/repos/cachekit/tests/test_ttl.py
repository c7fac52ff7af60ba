from cachekit import TTLCache


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_value_is_returned_before_expiry():
    clock = FakeClock()
    cache = TTLCache(10, clock=clock)
    cache.set("k", "v")
    clock.now += 5
    assert cache.get("k") == "v"


def test_value_is_gone_after_expiry():
    clock = FakeClock()
    cache = TTLCache(10, clock=clock)
    cache.set("k", "v")
    clock.now += 11
    assert cache.get("k", "gone") == "gone"
    assert len(cache) == 0
