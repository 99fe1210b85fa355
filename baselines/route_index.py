"""An approximate prefix index per replica, built from the router's own routing history (the
"approximate radix tree" of SGLang's cache-aware router and llm-d's approximate prefix scorer).

A prompt is cut into blocks of ``block`` tokens, each keyed by a hash chained over every token
before it (:meth:`ClusterView.block_hashes`), so one key stands for a whole prefix path of a
radix tree: a request matches a replica for as many leading blocks as the replica's index holds.
Routing a request inserts its blocks into the chosen replica's index, most recently used last;
the index forgets least recently used blocks beyond its size (at once, or when :meth:`trim` is
called, as SGLang's periodic eviction does). Only the prompt's shareable head (its prefix
segments) is indexed: the unique tail can never match another request.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixIndex:
    """One replica's index: LRU-ordered block keys, at most ``capacity`` blocks (0 = unbounded)."""

    __slots__ = ("keys", "capacity")

    def __init__(self, capacity: int = 0) -> None:
        self.keys: OrderedDict[int, None] = OrderedDict()
        self.capacity = capacity

    def __len__(self) -> int:
        return len(self.keys)

    def match(self, hashes: list[int]) -> int:
        """Leading blocks of ``hashes`` the index holds."""
        keys, n = self.keys, 0
        for h in hashes:
            if h not in keys:
                break
            n += 1
        return n

    def insert(self, hashes: list[int], evict: bool = True) -> None:
        """Record the blocks as just used; with ``evict``, forget the least recently used beyond
        ``capacity``."""
        keys = self.keys
        for h in hashes:
            if h in keys:
                keys.move_to_end(h)
            else:
                keys[h] = None
        if evict:
            self.trim()

    def trim(self) -> None:
        keys, cap = self.keys, self.capacity
        if cap:
            while len(keys) > cap:
                keys.popitem(last=False)
