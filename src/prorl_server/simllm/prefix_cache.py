"""A block-wise prefix cache as vLLM keeps one: full blocks of tokens keyed by a hash chain, LRU-evicted.

A block's key hashes its parent's key, its tokens and, for the first block, the request's `cache_salt`, so
a prefix is shared only between requests with the same salt (no salt is a namespace of its own), as in vLLM.
Only whole blocks are cached, and a lookup leaves at least the prompt's last token to compute, as vLLM does.
The capacity bounds the blocks kept for reuse; it is not a KV memory limit on running requests.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence


class PrefixCache:
    """LRU set of block keys with lookups and insertions of token prefixes."""

    def __init__(self, block_size: int, capacity: int) -> None:
        self.block_size = block_size
        self.capacity = capacity
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def _keys(self, tokens: Sequence[int], salt: str | None, n_blocks: int) -> list[bytes]:
        keys: list[bytes] = []
        parent = hashlib.blake2b(repr(("salt", salt)).encode(), digest_size=16).digest()
        size = self.block_size
        for i in range(n_blocks):
            block = ",".join(map(str, tokens[i * size : (i + 1) * size])).encode()
            parent = hashlib.blake2b(parent + block, digest_size=16).digest()
            keys.append(parent)
        return keys

    def lookup(self, prompt: Sequence[int], salt: str | None) -> int:
        """Prompt tokens whose blocks are cached (whole blocks from the start, the last token excluded);
        the blocks hit become the most recently used."""
        if self.capacity == 0:
            return 0
        hit = 0
        for key in self._keys(prompt, salt, (len(prompt) - 1) // self.block_size):
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            hit += 1
        return hit * self.block_size

    def insert(self, tokens: Sequence[int], salt: str | None) -> None:
        """Cache every whole block of `tokens`, evicting the least recently used blocks beyond the capacity."""
        if self.capacity == 0:
            return
        for key in self._keys(tokens, salt, len(tokens) // self.block_size):
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
