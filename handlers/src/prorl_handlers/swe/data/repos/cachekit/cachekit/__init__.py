"""In-memory caches: LRU, TTL and a memoizing decorator."""

from cachekit.lru import LRUCache
from cachekit.memo import memoize
from cachekit.ttl import TTLCache

__all__ = ["LRUCache", "TTLCache", "memoize"]
