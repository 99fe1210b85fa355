"""KV-cache memory: token-level or paged blocks, with an optional prefix cache.

Memory is counted in blocks of ``block_size`` tokens; ``block_size = 1`` is the papers'
token-level model. A running request holds ``ceil(kv_tokens / block_size)`` blocks, of which its
first ``shared`` blocks may be prefix-cache blocks shared with other requests (counted once).

Prefix cache (vLLM's automatic prefix caching, seed 001/004): a request's shareable prompt head
(its ``prefix`` segments, see :mod:`llmsched_gym.core.request`) is cut into full blocks; block
``b`` is identified by a hash chained over the segments covering tokens ``[0, (b+1)*bs)``. When a
request's prefill completes, its full head blocks enter the cache; while referenced they count
as used, and when unreferenced they stay cached (reclaimable, so counted as free for admission)
until allocation pressure evicts them, least recently used first. Hits skip prefill work.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from llmsched_gym.core.engine import Engine
    from llmsched_gym.core.request import Workload


class KVCache:
    """Block accounting for one worker.

    :param capacity_tokens: KV capacity in tokens (rounded down to whole blocks).
    :param block_size: tokens per block (1 = token-level).
    :param workload: the workload, for prefix segments (prefix caching is on only when it has any).
    :param prefix_cache: enable the prefix cache.
    :param cap_prompt_minus_one: cap a hit at ``prompt - 1`` tokens (vLLM must compute at least one
        prompt token to produce logits).
    """

    def __init__(
        self,
        capacity_tokens: int,
        block_size: int,
        workload: Workload,
        prefix_cache: bool = True,
        cap_prompt_minus_one: bool = True,
    ) -> None:
        self.block_size = int(block_size)
        self.capacity_blocks = int(capacity_tokens) // self.block_size
        self.capacity_tokens = self.capacity_blocks * self.block_size
        self.used_blocks = 0
        n = len(workload)
        self.shared = np.zeros(n, dtype=np.int64)
        self.enabled = bool(prefix_cache and workload.has_prefix)
        self.cap_prompt_minus_one = cap_prompt_minus_one
        self._prefix = workload.prefix
        self._prompt = workload.prompt_tokens
        self._hashes: dict[int, list[int]] = {}
        self._ref: dict[int, int] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()
        self._held: dict[int, list[int]] = {}
        self.hit_tokens = 0
        self.evicted_blocks = 0

    @property
    def used_tokens(self) -> int:
        return self.used_blocks * self.block_size

    @property
    def idle_blocks(self) -> int:
        """Unreferenced cached blocks (reclaimable)."""
        return len(self._idle)

    def blocks(self, kv_tokens: int) -> int:
        return -(-kv_tokens // self.block_size)

    # ---- prefix cache -------------------------------------------------------------------
    def _block_hashes(self, rid: int) -> list[int]:
        h = self._hashes.get(rid)
        if h is None:
            h = []
            segs = self._prefix[rid] if self._prefix is not None else None
            if segs:
                bs = self.block_size
                pieces: list[tuple[int, int]] = []
                pos = 0
                for seg_id, n_tok in segs:
                    pieces.append((seg_id, n_tok))
                    pos += n_tok
                head = pos
                prev = 0
                for b in range(head // bs):
                    end = (b + 1) * bs
                    covered = []
                    acc = 0
                    for seg_id, n_tok in pieces:
                        if acc >= end:
                            break
                        covered.append((seg_id, min(n_tok, end - acc)))
                        acc += n_tok
                    prev = hash((prev, tuple(covered)))
                    h.append(prev)
            self._hashes[rid] = h
        return h

    def match_blocks(self, rid: int) -> int:
        if not self.enabled:
            return 0
        hashes = self._block_hashes(rid)
        n = 0
        for hsh in hashes:
            if hsh in self._ref:
                n += 1
            else:
                break
        if self.cap_prompt_minus_one:
            n = min(n, (int(self._prompt[rid]) - 1) // self.block_size)
        return n

    def match_tokens(self, engine: Engine, rid: int) -> int:
        return self.match_blocks(rid) * self.block_size

    def acquire_prefix(self, rid: int) -> int:
        """Reference the cached head blocks of ``rid``; returns the number of hit tokens."""
        m = self.match_blocks(rid)
        if m == 0:
            return 0
        hashes = self._block_hashes(rid)[:m]
        newly_used = 0
        for hsh in hashes:
            r = self._ref[hsh]
            if r == 0:
                del self._idle[hsh]
                newly_used += 1
            self._ref[hsh] = r + 1
        self.used_blocks += newly_used
        self._held[rid] = list(hashes)
        self.shared[rid] = m
        self.hit_tokens += m * self.block_size
        return m * self.block_size

    def publish_prefix(self, rid: int, prefilled_tokens: int) -> None:
        """After prefill, the request's full head blocks become shareable cache entries."""
        if not self.enabled:
            return
        hashes = self._block_hashes(rid)
        held = self._held.setdefault(rid, [])
        upto = min(len(hashes), prefilled_tokens // self.block_size)
        for hsh in hashes[len(held):upto]:
            r = self._ref.get(hsh)
            if r is None:
                self._ref[hsh] = 1
            else:
                # computed twice concurrently: share the existing block, drop our copy
                if r == 0:
                    del self._idle[hsh]
                else:
                    self.used_blocks -= 1
                self._ref[hsh] = r + 1
            held.append(hsh)
        self.shared[rid] = len(held)

    def release_prefix(self, rid: int) -> None:
        """Drop ``rid``'s references; unreferenced blocks stay cached (LRU order)."""
        held = self._held.pop(rid, None)
        if not held:
            return
        for hsh in reversed(held):
            r = self._ref[hsh] - 1
            self._ref[hsh] = r
            if r == 0:
                self._idle[hsh] = None
                self.used_blocks -= 1
        self.shared[rid] = 0

    def make_room(self, n_blocks: int) -> None:
        """Evict idle cached blocks (LRU first) so ``n_blocks`` more can be allocated."""
        excess = self.used_blocks + len(self._idle) + n_blocks - self.capacity_blocks
        while excess > 0 and self._idle:
            hsh, _ = self._idle.popitem(last=False)
            del self._ref[hsh]
            self.evicted_blocks += 1
            excess -= 1
