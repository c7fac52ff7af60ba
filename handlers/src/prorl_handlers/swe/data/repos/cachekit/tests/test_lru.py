import pytest

from cachekit import LRUCache


def test_put_and_get():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("b", "none") == "none"


def test_evicts_the_oldest_entry_when_full():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert "a" not in cache and "b" in cache and "c" in cache


def test_put_refreshes_a_key():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    assert "b" not in cache and cache.get("a") == 10


def test_statistics():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.get("a")
    cache.get("x")
    assert (cache.hits, cache.misses) == (1, 1)


def test_negative_maxsize_is_refused():
    with pytest.raises(ValueError):
        LRUCache(-1)
