"""An approximate prefix index per replica, built from the router's own routing history (the
"approximate radix tree" of SGLang's cache-aware router and llm-d's approximate prefix scorer).

A prompt is cut into blocks of ``block`` tokens, each keyed by a hash chained over every token
before it (:meth:`ClusterView.block_hashes`), so one key stands for a whole prefix path of a
radix tree: a request matches a replica for as many leading blocks as the replica's index holds.
Routing a request inserts its blocks into the chosen replica's index, most recently used last;
the index forgets least recently used blocks beyond its size (at once, or when :meth:`trim` is
called, as SGLang's periodic eviction does). Only the prompt's shareable head (its prefix
segments) is indexed: the unique tail can never match another request.

The replicas' indexes share an inverted map (block key -> replicas holding it), so one walk down
a prompt's keys gives every replica's match: the work per arrival follows the prompt's blocks and
the replicas that hold them, not the number of replicas (SGLang keeps one radix tree whose nodes
record their tenant workers for the same reason).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from llmsched_gym.core.cluster import mask_bits


class PrefixIndexes:
    """One LRU index per replica (``capacity`` blocks each, 0 = unbounded) and the inverted map
    ``owners`` (block key -> the replicas whose index holds it, as a bit mask: bit ``r`` for
    replica ``r``)."""

    def __init__(self, n: int, capacity: int = 0) -> None:
        self.keys: list[OrderedDict] = [OrderedDict() for _ in range(n)]
        self.capacity = capacity
        self.owners: dict = {}
        self.sizes = np.zeros(n, dtype=np.int64)
        """Blocks in each replica's index."""

    def match(self, hashes: list) -> np.ndarray:
        """Per replica: the leading blocks of ``hashes`` its index holds."""
        out = np.zeros(len(self.keys), dtype=np.int64)
        get = self.owners.get
        alive, depth = (1 << len(self.keys)) - 1, 0
        for h in hashes:
            nxt = alive & get(h, 0)
            if nxt != alive:
                if depth:  # the replicas whose match ends here
                    out[list(mask_bits(alive & ~nxt))] = depth
                alive = nxt
                if not alive:
                    return out
            depth += 1
        if depth:
            out[list(mask_bits(alive))] = depth
        return out

    def insert(self, r: int, hashes: list, evict: bool = True) -> None:
        """Record the blocks as just used by replica ``r``; with ``evict``, forget its least
        recently used beyond ``capacity``."""
        keys, owners, bit = self.keys[r], self.owners, 1 << r
        for h in hashes:
            if h in keys:
                keys.move_to_end(h)
            else:
                keys[h] = None
                owners[h] = owners.get(h, 0) | bit
        self.sizes[r] = len(keys)
        if evict:
            self.trim(r)

    def trim(self, r: int) -> None:
        """Forget replica ``r``'s least recently used blocks beyond ``capacity``."""
        keys, cap, owners, keep = self.keys[r], self.capacity, self.owners, ~(1 << r)
        if cap:
            while len(keys) > cap:
                h, _ = keys.popitem(last=False)
                v = owners[h] & keep
                if v:
                    owners[h] = v
                else:
                    del owners[h]
            self.sizes[r] = len(keys)

