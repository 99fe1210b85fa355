"""KV-cache memory: token-level or paged blocks, with an optional prefix cache.

Memory is counted in blocks of ``block_size`` tokens; ``block_size = 1`` is the papers'
token-level model. A running request holds ``ceil(kv_tokens / block_size)`` blocks, of which its
first ``shared`` blocks may be prefix-cache blocks shared with other requests (counted once;
``KVCache.shared`` is indexed by request id, with rows to spare once requests come at run time).

Prefix cache (vLLM's automatic prefix caching; Wang et al. 2025 and Dexter et al. 2025): a request's shareable prompt head
(its ``prefix`` segments, see :mod:`llmsched_gym.core.request`) is cut into full blocks; block
``b`` is identified by a hash chained over the segments covering tokens ``[0, (b+1)*bs)``. When a
request's prefill completes, its full head blocks enter the cache; while referenced they count
as used, and when unreferenced they stay cached (reclaimable, so counted as free for admission)
until allocation pressure evicts them, least recently used first. Hits skip prefill work.

Eviction order is pluggable (Echo's task-aware manager, Wang et al. 2025, section 4.2): a scheduler may install
``set_eviction_priority(fn)``; idle blocks are then evicted lowest ``fn(block_hash)`` first, least
recently released first among equal priorities (deeper blocks first on a tie, as in vLLM), and the
scheduler calls ``reprioritize`` when priorities of cached blocks change. Without it the order is
plain LRU.

Representation: under plain LRU the cached blocks are closed under chain ancestors, a tree of hash
chains, kept as runs of blocks that change state together (a radix tree, as SGLang's RadixAttention
keeps its cache: Zheng et al., "SGLang: Efficient Execution of Structured Language Model Programs",
NeurIPS 2024, section 3), so that admitting or releasing a request costs O(runs on its chain) rather
than O(blocks). Installing a priority order switches the cache, with its state, to one entry per
block. Both forms give the same results (``tests/test_kv.py`` runs them side by side).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np

from llmsched_gym.core.buffers import resized

if TYPE_CHECKING:
    from llmsched_gym.core.request import Workload


_SHARED_PREFIXES = 512
"""Prompt heads (by their segment chain) whose hash-chain state is kept (:func:`_chain_hashes`: the most
recently used ones; older ones are recomputed when asked, with equal values)."""

_LOW64 = (1 << 64) - 1

_LRU_SLACK = 16384
"""Entries the LRU list may hold beyond twice the idle blocks before it is compacted (and a
quarter of it: consumed entries before its head is trimmed)."""


def _chain_hashes(cache: OrderedDict, segs: tuple, bs: int) -> list[int]:
    """The chained block hashes of a prompt whose shareable head is ``segs`` (``(segment id,
    tokens)`` pairs), O(blocks + segments).

    The segment chain of a head is the hash of the previous head's chain and the segment's id and
    length (0 for no segment; an empty segment adds nothing). A block's key is a 128-bit base
    drawn from the chain before the segment holding the block's last token and that segment's
    id (two 64-bit hashes), plus the block's end offset in the segment. So two blocks have equal
    keys exactly when their prompts agree up to the blocks' ends (given the segments; two bases
    within a segment's length of each other, below 2^-100 a pair, would break it), as vLLM's
    chained block hashes name a block by its tokens and all before them; and a segment's keys
    are one ``range`` (no hashing, no Python loop a block).

    ``cache`` (the :data:`_SHARED_PREFIXES` most recently used entries) maps a head's segment chain
    to the state after it: ``(list, n, tokens)``, the list's first ``n`` keys being the head's
    blocks. A prompt with the same segments gets the same (read-only) list; one that extends a
    cached head (a group's system prompt, a session's earlier turns) hashes only its own segments,
    and its list holds the same int objects for the head's blocks."""
    chains = []
    chain = 0
    for seg_id, n_tok in segs:
        if n_tok:
            chain = hash((chain, seg_id, n_tok))
        chains.append(chain)
    k = len(segs)
    state = None
    while k > 0:  # the longest cached head
        state = cache.get(chains[k - 1])
        if state is not None:
            cache.move_to_end(chains[k - 1])
            break
        k -= 1
    if state is not None:
        base, n, t = state
        if k == len(segs):
            return base if n == len(base) else base[:n]
        h, chain = base[:n], chains[k - 1]
    else:
        h, chain, t = [], 0, 0
    for i in range(k, len(segs)):
        seg_id, n_tok = segs[i]
        if n_tok:  # the blocks ending in this segment: end offsets bs - t % bs, + bs, ... up to n_tok
            base = hash((chain, seg_id)) << 64 | hash((seg_id, chain, 1)) & _LOW64
            h.extend(range(base + bs - t % bs, base + n_tok + 1, bs))
            t += n_tok
        chain = chains[i]
        if chain not in cache:
            cache[chain] = (h, len(h), t)
    while len(cache) > _SHARED_PREFIXES:
        cache.popitem(last=False)
    return h


class _Run:
    """A run of cached blocks of one hash chain that always change state together: the blocks
    ``hashes`` (in chain order) at block positions ``start ..`` of every prompt that has them,
    referenced by ``ref`` running requests (each holds whole runs: a request's held blocks end at
    a run's end), idle when ``ref == 0`` and then at position ``pos`` of the LRU list (-1: none)."""

    __slots__ = ("hashes", "start", "ref", "pos")

    def __init__(self, hashes: list[int], start: int, ref: int) -> None:
        self.hashes, self.start, self.ref, self.pos = hashes, start, ref, -1


class KVCache:
    """Block accounting for one worker.

    :param capacity_tokens: KV capacity in tokens (rounded down to whole blocks).
    :param block_size: tokens per block (1 = token-level).
    :param workload: the workload, for prefix segments (prefix caching is on only when it has any).
    :param prefix_cache: enable the prefix cache.
    :param cap_prompt_minus_one: cap a hit at ``prompt - 1`` tokens (vLLM must compute at least one
        prompt token to produce logits).
    """

    # the attributes as slots: a cluster touches each replica's cache once per routing point, when
    # it is out of the CPU caches, and a slot costs one memory line where an entry of a large
    # instance dict costs two (other attributes go to ``__dict__``)
    __slots__ = ("_base", "_by_segments", "_count", "_entry", "_hashes", "_head", "_heap", "_held", "_lru", "_matched",
                 "_matched_ver", "_n", "_n_idle", "_n_idle_runs", "_prefix", "_priority", "_prompt", "_ref", "_roots", "_runs",
                 "_seq", "_shared_buf", "_ver", "_want_prefix", "block_size", "cap_prompt_minus_one", "capacity_blocks",
                 "capacity_tokens", "enabled", "evicted_blocks", "hit_tokens", "shared", "used_blocks",
                 "watch", "__dict__", "__weakref__")

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
        self.shared = self._shared_buf = np.zeros(n, dtype=np.int64)
        self._n = n  # requests followed (see extend)
        self._want_prefix = bool(prefix_cache)
        self.enabled = bool(prefix_cache and workload.has_prefix)
        self.cap_prompt_minus_one = cap_prompt_minus_one
        self._prefix = workload.prefix
        self._prompt = workload.prompt_tokens
        self._hashes: dict[int, list[int]] = {}  # live requests' block hashes (dropped by forget)
        self._by_segments: OrderedDict[int, tuple] = OrderedDict()  # recent prompt heads (_chain_hashes)
        self._init_store()
        self._ver = 0  # bumped when a block enters or leaves the cache (match results change)
        self._matched: dict[int, int] = {}  # rid -> match_blocks at version _matched_ver
        self._matched_ver = 0
        self.hit_tokens = 0
        self.evicted_blocks = 0
        self.watch: Any = None
        """Told when a chain's first block (a prompt's block 0) enters the cache
        (``watch.rooted(hash)``) and when it leaves (``watch.unrooted(hash)``): the cluster's index
        of which replica may hit which prompt (``None``: nobody)."""
        # priority eviction (None = LRU): idle hash -> (priority, release seq); lazy-deletion heap
        self._priority: Callable[[int], float] | None = None
        self._entry: dict[int, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, int]] = []
        self._seq = 0
        self._count: dict[float, int] = {}

    def extend(self, workload: Workload, prompt_tokens: np.ndarray | None = None, n: int | None = None) -> None:
        """The engine's workload grew (requests placed at run time): follow it. The prefix cache
        turns on with the first request that has prefix segments (when ``prefix_cache``).
        ``prompt_tokens``: the prompt lengths to read by request id (default the workload's; an
        array longer than the workload, as the engine's buffers, serves as well); ``n``: the
        workload's length, if the caller has it. :attr:`shared` becomes a buffer with rows to
        spare (read and written by request id)."""
        buf = self._shared_buf
        if n is None:
            n = len(workload)
        if n > len(buf):
            self.shared = self._shared_buf = resized(buf, max(n, 2 * len(buf), 64))
        prefix = workload.prefix
        self._prefix, self._prompt = prefix, workload.prompt_tokens if prompt_tokens is None else prompt_tokens
        if self._want_prefix and not self.enabled and prefix is not None:
            self.enabled = any(p for p in prefix[self._n:n])
        self._n = n

    @property
    def used_tokens(self) -> int:
        return self.used_blocks * self.block_size

    @property
    def idle_blocks(self) -> int:
        """Unreferenced cached blocks (reclaimable)."""
        return self._n_idle

    def blocks(self, kv_tokens: int) -> int:
        return -(-kv_tokens // self.block_size)

    # ---- prefix cache -------------------------------------------------------------------
    def _block_hashes(self, rid: int) -> list[int]:
        h = self._hashes.get(rid)
        if h is None:
            segs = self._prefix[rid] if self._prefix is not None else None
            if segs and not isinstance(segs, tuple):
                segs = tuple(tuple(x) for x in segs)
            h = _chain_hashes(self._by_segments, segs, self.block_size) if segs else []
            self._hashes[rid] = h
        return h

    def forget(self, rid: int) -> list[int] | None:
        """``rid`` has ended: drop its block-hash list (memory then follows the live requests;
        asked again, the list is recomputed, equal). Returns the list if it was computed."""
        return self._hashes.pop(rid, None)

    def adopt_hashes(self, rid: int, hashes: list[int]) -> None:
        """Use ``hashes``, computed elsewhere for the same prompt segments and block size (a
        cluster's router-side index), as ``rid``'s block hashes instead of computing them again."""
        self._hashes[rid] = hashes

    def share_head_hashes(self, other: KVCache) -> None:
        """Keep prompt-head hash states (:func:`_chain_hashes`) in ``other``'s cache of them, so that
        equal prompt heads hash to the same int objects in both (a cluster's replicas share the
        router-side hasher's: their prefix dicts are then keyed by the same objects)."""
        self._by_segments = other._by_segments

    def block_hashes(self, rid: int) -> list[int]:
        """Hashes of ``rid``'s full shareable head blocks, in prompt order."""
        return self._block_hashes(rid)

    def match_tokens(self, rid: int) -> int:
        return self.match_blocks(rid) * self.block_size

    # ---- plain LRU: the cached blocks as runs ----------------------------------------------
    # Under plain LRU the cached blocks form a tree of hash chains (prefix closed): the blocks are
    # kept as runs (:class:`_Run`) cut where requests' held heads end or chains branch, so that
    # admitting a request or releasing it costs O(runs on its chain) rather than O(blocks); a
    # priority eviction order (:meth:`set_eviction_priority`) switches the cache to one entry per
    # block (:class:`_BlockKVCache`). Both give the same results.

    def _init_store(self) -> None:
        self._runs: dict[int, _Run] = {}  # every cached run, by the hash of its first block
        # the idle runs in release order (oldest first from index ``_head``; a run's ``pos`` is
        # ``_base`` + its index), ``None`` where a run left the list; each run's blocks are queued
        # deepest first (a request's blocks are released tail first)
        self._lru: list[_Run | None] = []
        self._head = 0
        self._base = 0
        self._n_idle = 0  # idle blocks
        self._n_idle_runs = 0
        self._held: dict[int, int] = {}  # rid -> blocks it references: the first ones of its hashes

    def _common(self, run: _Run, hashes: list[int], b: int, n: int) -> int:
        """How many leading blocks of ``run`` (which holds ``hashes[b]`` as its first block) equal
        ``hashes[b:n]``: chained hashes are equal up to some block and differ after it."""
        rh = run.hashes
        end = b + len(rh)
        if end <= n and rh[-1] == hashes[end - 1]:
            return len(rh)
        lo, hi = 1, min(len(rh), n - b)
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if rh[mid - 1] == hashes[b + mid - 1]:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _walk(self, hashes: list[int], n: int) -> int:
        """Leading blocks of ``hashes[:n]`` cached (used or idle): O(runs). A run that holds block
        ``b`` of a chain starts there when ``b`` is 0 or the end of the chain's previous run."""
        node, b = self._runs, 0
        while b < n:
            run = node.get(hashes[b])
            if run is None:
                break
            k = self._common(run, hashes, b, n)
            b += k
            if k < len(run.hashes):
                break
        return b

    def _split(self, run: _Run, k: int) -> None:
        """Cut ``run`` after its first ``k`` blocks; the rest becomes a run of its own (taking the
        run's place in the LRU list when idle: the caller references the first part)."""
        rh = run.hashes
        tail = _Run(rh[k:], run.start + k, run.ref)
        del rh[k:]
        self._runs[tail.hashes[0]] = tail
        if run.pos >= 0:
            tail.pos = run.pos
            self._lru[run.pos - self._base] = tail
            run.pos = -1
            self._n_idle_runs += 1  # the first part is counted again when the caller takes it

    def _take(self, run: _Run) -> int:
        """Reference ``run`` once more; returns its blocks if it was idle (they become used)."""
        r = run.ref
        run.ref = r + 1
        if r:
            return 0
        if run.pos >= 0:
            self._lru[run.pos - self._base] = None
            run.pos = -1
        self._n_idle_runs -= 1
        return len(run.hashes)

    def _path(self, hashes: list[int], m: int) -> list[_Run]:
        """The runs that hold ``hashes[:m]`` (cached), from the chain's first block."""
        node, b, path = self._runs, 0, []
        while b < m:
            run = node[hashes[b]]
            path.append(run)
            b += len(run.hashes)
        return path

    def match_blocks(self, rid: int) -> int:
        if not self.enabled:
            return 0
        memo = self._matched
        if self._matched_ver != self._ver:
            memo.clear()
            self._matched_ver = self._ver
        else:
            n = memo.get(rid)
            if n is not None:
                return n
        hashes = self._block_hashes(rid)
        n = len(hashes)
        if self.cap_prompt_minus_one:
            n = min(n, (int(self._prompt[rid]) - 1) // self.block_size)
        n = self._walk(hashes, n) if n > 0 else 0
        if len(memo) >= 64:
            memo.clear()
        memo[rid] = n
        return n

    def acquire_prefix(self, rid: int) -> int:
        """Reference the cached head blocks of ``rid``; returns the number of hit tokens."""
        m = self.match_blocks(rid)
        if m == 0:
            return 0
        path = self._path(self._block_hashes(rid), m)
        run = path[-1]
        if run.start + len(run.hashes) > m:
            self._split(run, m - run.start)
        newly_used = 0
        for run in path:
            newly_used += self._take(run)
        if newly_used:
            self.used_blocks += newly_used
            self._n_idle -= newly_used
        self._held[rid] = m
        self.shared[rid] = m
        self.hit_tokens += m * self.block_size
        return m * self.block_size

    def publish_prefix(self, rid: int, prefilled_tokens: int) -> None:
        """After prefill, the request's full head blocks become shareable cache entries."""
        if not self.enabled:
            return
        hashes = self._block_hashes(rid)
        held = self._held.get(rid, 0)
        upto = min(len(hashes), prefilled_tokens // self.block_size)
        b, node = held, self._runs
        while b < upto:  # blocks another request computed at the same time: share them
            run = node.get(hashes[b])
            if run is None:
                break
            k = self._common(run, hashes, b, upto)
            if k < len(run.hashes):
                self._split(run, k)
            idle = self._take(run)
            if idle:  # idle: our copy is dropped, the cached one becomes used
                self._n_idle -= idle
            else:  # in use: our copy is dropped
                self.used_blocks -= k
            b += k
        if b < upto:
            node[hashes[b]] = _Run(hashes[b:upto], b, 1)
            if b == 0 and self.watch is not None:
                self.watch.rooted(hashes[0])
            self._ver += 1
        if upto > held:
            self._held[rid] = held = upto
        self.shared[rid] = held

    def release_prefix(self, rid: int) -> None:
        """Drop ``rid``'s references; unreferenced blocks stay cached (LRU order)."""
        held = self._held.pop(rid, 0)
        if not held:
            return
        lru = self._lru
        n0 = len(lru)
        freed = 0
        for run in reversed(self._path(self._block_hashes(rid), held)):
            r = run.ref - 1
            run.ref = r
            if not r:
                run.pos = self._base + len(lru)
                lru.append(run)
                freed += len(run.hashes)
        self._n_idle_runs += len(lru) - n0
        self.used_blocks -= freed
        self._n_idle += freed
        self.shared[rid] = 0
        if len(lru) - self._head > 2 * self._n_idle_runs + _LRU_SLACK:
            self._compact()

    def make_room(self, n_blocks: int) -> None:
        """Evict idle cached blocks (LRU first, or by priority) so ``n_blocks`` more can be allocated."""
        excess = self.used_blocks + self._n_idle + n_blocks - self.capacity_blocks
        if excess <= 0 or not self._n_idle:
            return
        self._ver += 1
        lru, watch = self._lru, self.watch
        while excess > 0 and self._n_idle:
            i = self._head
            run = lru[i]
            while run is None:  # runs that left the list
                i += 1
                run = lru[i]
            rh = run.hashes
            k = min(excess, len(rh))
            first = rh[0]
            if watch is not None and k == len(rh) and run.start == 0:  # the chain's first block goes
                watch.unrooted(first)
            del rh[-k:]
            self._n_idle -= k
            self.evicted_blocks += k
            excess -= k
            if rh:
                self._head = i
            else:
                del self._runs[first]
                lru[i] = None
                run.pos = -1
                self._n_idle_runs -= 1
                self._head = i + 1
        self._trim_consumed()

    def _trim_consumed(self) -> None:
        """Drop the LRU list's consumed head entries once they are many and most of the list
        (positions stay absolute: ``_base`` grows by what is dropped)."""
        head, lru = self._head, self._lru
        if head > _LRU_SLACK // 4 and 2 * head > len(lru):
            del lru[:head]
            self._base += head
            self._head = 0

    # ---- queries for schedulers ----------------------------------------------------------
    def match_detail(self, rid: int) -> tuple[int, int]:
        """``(matched, idle)``: the head blocks ``rid`` would reuse now (:meth:`match_blocks`) and
        how many of them are idle, i.e. become used (not newly allocated) when it is admitted."""
        if not self.enabled:
            return 0, 0
        hashes = self._block_hashes(rid)
        n = len(hashes)
        if self.cap_prompt_minus_one:
            n = min(n, max((int(self._prompt[rid]) - 1) // self.block_size, 0))
        node, b, idle = self._runs, 0, 0
        while b < n:
            run = node.get(hashes[b])
            if run is None:
                break
            k = self._common(run, hashes, b, n)
            if not run.ref:
                idle += k
            b += k
            if k < len(run.hashes):
                break
        return b, idle

    def match_hashes(self, hashes: list[int]) -> int:
        """How many leading blocks of ``hashes`` (a prompt's chained block hashes, e.g. of a
        request not placed here yet) the cache holds, used or idle."""
        return self._walk(hashes, len(hashes))

    def cached_hashes(self) -> list[int]:
        """Every block cached now (used or idle), by hash."""
        return [h for run in self._runs.values() for h in run.hashes]

    def cached_roots(self) -> list[int]:
        """The cached blocks that are a chain's first (a prompt's block 0), by hash."""
        return [h for h, run in self._runs.items() if run.start == 0]

    def references(self, hsh: int) -> int:
        """Running requests holding cached block ``hsh`` (0: idle, or not cached); O(cached blocks):
        along a prompt's chain, :meth:`chain_references` is O(runs)."""
        for run in self._runs.values():
            if hsh in run.hashes:
                return run.ref
        return 0

    def chain_references(self, hashes: list[int]) -> list[int]:
        """:meth:`references` of each block of ``hashes`` (a prompt's chained block hashes)."""
        out: list[int] = []
        node, b, n = self._runs, 0, len(hashes)
        while b < n:
            run = node.get(hashes[b])
            if run is None:
                break
            k = self._common(run, hashes, b, n)
            out += [run.ref] * k
            b += k
            if k < len(run.hashes):
                break
        return out + [0] * (n - b)

    def next_evictions(self, k: int) -> list[int]:
        """The next ``k`` idle blocks plain LRU would evict (LRU mode only)."""
        return list(islice(self._idle_order(), k))

    def eviction_victims(self, k: int, freed: list[int], skip: Callable[[int], bool]) -> list[int]:
        """The ``k`` blocks :meth:`make_room` would evict if ``freed`` became idle first (in that
        order) and the blocks for which ``skip`` is true were idle no longer: a what-if for the
        memory ledger, which replays a plan without changing the cache."""
        if k <= 0:
            return []
        out: list[int] = []
        for hsh in (*self._idle_order(), *freed):  # the idle order, then the blocks freed after it
            if not skip(hsh):
                out.append(hsh)
                if len(out) == k:
                    break
        return out

    def idle_below(self, priority: float) -> int:
        """Idle blocks whose eviction priority is below ``priority`` (priority mode only)."""
        return 0

    def set_eviction_priority(self, priority: Callable[[int], float] | None) -> None:
        """Evict idle blocks lowest ``priority(block_hash)`` first (LRU among equals); ``None``
        restores plain LRU. Blocks already idle keep their LRU rank."""
        if priority is None:
            return
        _BlockKVCache.of_runs(self)
        self.set_eviction_priority(priority)

    def reprioritize(self, hashes: Iterable[int]) -> None:
        """The priorities of ``hashes`` changed; idle ones are re-ranked (their LRU rank kept)."""

    def _idle_order(self) -> Iterator[int]:
        """The idle blocks, least recently released first."""
        return (h for run in islice(self._lru, self._head, None) if run is not None for h in reversed(run.hashes))

    def _compact(self) -> None:
        """Drop the ``None`` entries of the LRU list (amortised O(1) per run leaving it)."""
        lru = self._lru = [run for run in islice(self._lru, self._head, None) if run is not None]
        self._head = self._base = 0
        for i, run in enumerate(lru):
            run.pos = i


class _BlockKVCache(KVCache):
    """The cache with one entry per block, for any eviction order: what a :class:`KVCache` becomes
    when a priority eviction order is installed (:meth:`of_runs`)."""

    __slots__ = ()  # the same layout as KVCache (its instances change class)

    def _init_store(self) -> None:
        # every cached block: ``_ref[hash]`` is its reference count (> 0) while running requests
        # hold it, and ``-1 - p`` while it is idle, ``p`` its position in the LRU list: ``_lru``
        # holds the idle blocks in release order (oldest first from index ``_head``; ``p`` is
        # ``_base`` + the index), ``None`` where a block left it (referenced again, or evicted by
        # priority). One dict for both: a block's transitions touch one hash-table entry.
        self._ref: dict[int, int] = {}
        self._n_idle = 0
        self._lru: list[int | None] = []
        self._head = 0
        self._base = 0
        self._held: dict[int, int] = {}  # rid -> blocks it references: the first ones of its hashes
        self._roots: set[int] = set()  # the cached blocks that are a chain's first (cached_roots)

    def chain_references(self, hashes: list[int]) -> list[int]:
        """:meth:`references` of each block of ``hashes``."""
        return [self.references(h) for h in hashes]

    @classmethod
    def of_runs(cls, kv: KVCache) -> None:
        """Turn ``kv`` (kept as runs, plain LRU) into this form in place, with the same state."""
        ref = {h: run.ref for run in kv._runs.values() for h in run.hashes}
        lru = list(kv._idle_order())
        for i, h in enumerate(lru):
            ref[h] = -1 - i
        roots = set(kv.cached_roots())
        del kv._runs, kv._n_idle_runs
        kv.__class__ = cls
        kv._ref, kv._lru, kv._head, kv._base, kv._roots = ref, lru, 0, 0, roots


    def match_blocks(self, rid: int) -> int:
        if not self.enabled:
            return 0
        memo = self._matched
        if self._matched_ver != self._ver:
            memo.clear()
            self._matched_ver = self._ver
        else:
            n = memo.get(rid)
            if n is not None:
                return n
        hashes = self._block_hashes(rid)
        ref, n = self._ref, 0
        for hsh in hashes:
            if hsh in ref:
                n += 1
            else:
                break
        if self.cap_prompt_minus_one:
            n = min(n, (int(self._prompt[rid]) - 1) // self.block_size)
        if len(memo) >= 64:
            memo.clear()
        memo[rid] = n
        return n

    def acquire_prefix(self, rid: int) -> int:
        """Reference the cached head blocks of ``rid``; returns the number of hit tokens."""
        m = self.match_blocks(rid)
        if m == 0:
            return 0
        hashes = self._block_hashes(rid)
        ref, lru, base, newly_used = self._ref, self._lru, self._base, 0
        for hsh in (hashes if m == len(hashes) else hashes[:m]):
            r = ref[hsh]
            if r < 0:  # idle: it leaves the LRU list
                lru[-1 - r - base] = None
                ref[hsh] = 1
                newly_used += 1
            else:
                ref[hsh] = r + 1
        if newly_used:
            self.used_blocks += newly_used
            self._unidled(hashes, m, newly_used)
        self._held[rid] = m
        self.shared[rid] = m
        self.hit_tokens += m * self.block_size
        return m * self.block_size

    def publish_prefix(self, rid: int, prefilled_tokens: int) -> None:
        """After prefill, the request's full head blocks become shareable cache entries."""
        if not self.enabled:
            return
        hashes = self._block_hashes(rid)
        held = self._held.get(rid, 0)
        upto = min(len(hashes), prefilled_tokens // self.block_size)
        ref = self._ref
        for hsh in hashes[held:upto]:
            r = ref.get(hsh)
            if r is None:
                ref[hsh] = 1
                self._ver += 1
                if hsh is hashes[0]:  # the chain's first block
                    self._roots.add(hsh)
                    if self.watch is not None:
                        self.watch.rooted(hsh)
            elif r < 0:  # computed twice concurrently: share the existing block (idle), drop our copy
                self._lru[-1 - r - self._base] = None
                ref[hsh] = 1
                self._unidled([hsh], 1, 1)
            else:  # the same, the block in use
                self.used_blocks -= 1
                ref[hsh] = r + 1
        held = self._held[rid] = max(held, upto)
        self.shared[rid] = held

    def release_prefix(self, rid: int) -> None:
        """Drop ``rid``'s references; unreferenced blocks stay cached (LRU order)."""
        held = self._held.pop(rid, 0)
        if not held:
            return
        hashes = self._block_hashes(rid)
        ref, lru, prio = self._ref, self._lru, self._priority
        n0 = len(lru)
        p = -1 - self._base - n0  # the entry of the next block to go idle
        for hsh in reversed(hashes if held == len(hashes) else hashes[:held]):
            r = ref[hsh]
            if r == 1:
                ref[hsh] = p
                p -= 1
                lru.append(hsh)
                if prio is not None:
                    self._push(hsh)
            else:
                ref[hsh] = r - 1
        freed = len(lru) - n0
        self.used_blocks -= freed
        self._n_idle += freed
        self.shared[rid] = 0
        if len(lru) - self._head > 2 * self._n_idle + _LRU_SLACK:
            self._compact()

    def make_room(self, n_blocks: int) -> None:
        """Evict idle cached blocks (LRU first, or by priority) so ``n_blocks`` more can be allocated."""
        excess = self.used_blocks + self._n_idle + n_blocks - self.capacity_blocks
        if excess <= 0 or not self._n_idle:
            return
        self._ver += 1
        ref, lru = self._ref, self._lru
        while excess > 0 and self._n_idle:
            if self._priority is None:
                i = self._head
                hsh = lru[i]
                while hsh is None:  # blocks that left the list
                    i += 1
                    hsh = lru[i]
                self._head = i + 1
            else:
                hsh = self._pop_lowest()
                lru[-1 - ref[hsh] - self._base] = None
            self._n_idle -= 1
            del ref[hsh]
            if hsh in self._roots:  # a chain's first block
                self._roots.discard(hsh)
                if self.watch is not None:
                    self.watch.unrooted(hsh)
            self.evicted_blocks += 1
            excess -= 1
        self._trim_consumed()

    def match_detail(self, rid: int) -> tuple[int, int]:
        """``(matched, idle)``: the head blocks ``rid`` would reuse now (:meth:`match_blocks`) and
        how many of them are idle, i.e. become used (not newly allocated) when it is admitted."""
        if not self.enabled:
            return 0, 0
        limit = (int(self._prompt[rid]) - 1) // self.block_size if self.cap_prompt_minus_one else -1
        ref = self._ref
        m = idle = 0
        for hsh in self._block_hashes(rid):
            if m == limit:
                break
            r = ref.get(hsh)
            if r is None:
                break
            m += 1
            if r < 0:
                idle += 1
        return m, idle

    def match_hashes(self, hashes: list[int]) -> int:
        """How many leading blocks of ``hashes`` (a prompt's chained block hashes, e.g. of a
        request not placed here yet) the cache holds, used or idle."""
        ref, n = self._ref, 0
        for hsh in hashes:
            if hsh not in ref:
                break
            n += 1
        return n

    def cached_hashes(self) -> list[int]:
        """Every block cached now (used or idle), by hash."""
        return list(self._ref)

    def cached_roots(self) -> list[int]:
        """The cached blocks that are a chain's first (a prompt's block 0), by hash."""
        return list(self._roots)

    def references(self, hsh: int) -> int:
        """Running requests holding cached block ``hsh`` (0: idle, or not cached)."""
        r = self._ref.get(hsh, 0)
        return r if r > 0 else 0

    def next_evictions(self, k: int) -> list[int]:
        """The next ``k`` idle blocks plain LRU would evict (LRU mode only)."""
        return list(islice(self._idle_order(), k))

    def eviction_victims(self, k: int, freed: list[int], skip: Callable[[int], bool]) -> list[int]:
        """The ``k`` blocks :meth:`make_room` would evict if ``freed`` became idle first (in that
        order) and the blocks for which ``skip`` is true were idle no longer: a what-if for the
        memory ledger, which replays a plan without changing the cache."""
        if k <= 0:
            return []
        if self._priority is None:  # LRU: the idle order, then the blocks freed after it
            out: list[int] = []
            for hsh in (*self._idle_order(), *freed):
                if not skip(hsh):
                    out.append(hsh)
                    if len(out) == k:
                        break
            return out
        keyed = [(p, seq, hsh) for hsh, (p, seq) in self._entry.items() if not skip(hsh)]
        keyed += [(self._priority(hsh), self._seq + i + 1, hsh) for i, hsh in enumerate(freed) if not skip(hsh)]
        return [hsh for _, _, hsh in heapq.nsmallest(k, keyed)]

    def idle_below(self, priority: float) -> int:
        """Idle blocks whose eviction priority is below ``priority`` (priority mode only)."""
        return sum(n for p, n in self._count.items() if p < priority)

    def set_eviction_priority(self, priority: Callable[[int], float] | None) -> None:
        """Evict idle blocks lowest ``priority(block_hash)`` first (LRU among equals); ``None``
        restores plain LRU. Blocks already idle keep their LRU rank."""
        self._priority = priority
        self._entry, self._heap, self._count = {}, [], {}
        if priority is not None:
            for hsh in self._idle_order():
                self._push(hsh)

    def reprioritize(self, hashes: Iterable[int]) -> None:
        """The priorities of ``hashes`` changed; idle ones are re-ranked (their LRU rank kept)."""
        if self._priority is None:
            return
        entry = self._entry
        for hsh in hashes:
            old = entry.get(hsh)
            if old is not None:
                p = self._priority(hsh)
                if p != old[0]:
                    self._uncount(old[0])
                    self._insert(hsh, p, old[1])

    def _push(self, hsh: int) -> None:
        self._seq += 1
        self._insert(hsh, self._priority(hsh), self._seq)  # type: ignore[misc]

    def _insert(self, hsh: int, p: float, seq: int) -> None:
        self._entry[hsh] = (p, seq)
        self._count[p] = self._count.get(p, 0) + 1
        heapq.heappush(self._heap, (p, seq, hsh))
        if len(self._heap) > 4 * len(self._entry) + 1024:
            self._heap = [(q, s, h) for h, (q, s) in self._entry.items()]
            heapq.heapify(self._heap)

    def _uncount(self, p: float) -> None:
        n = self._count[p] - 1
        if n:
            self._count[p] = n
        else:
            del self._count[p]

    def _idle_order(self) -> Iterator[int]:
        """The idle blocks, least recently released first."""
        return (h for h in islice(self._lru, self._head, None) if h is not None)

    def _compact(self) -> None:
        """Drop the ``None`` entries of the LRU list (amortised O(1) per block leaving it)."""
        lru = self._lru = list(self._idle_order())
        self._head = self._base = 0
        ref = self._ref
        for i, h in enumerate(lru):
            ref[h] = -1 - i

    def _unidled(self, hashes: list[int], m: int, k: int) -> None:
        """``k`` of the blocks ``hashes[:m]`` were idle and are referenced now."""
        self._n_idle -= k
        if self._priority is not None:
            entry = self._entry
            for hsh in hashes[:m]:
                e = entry.pop(hsh, None)
                if e is not None:
                    self._uncount(e[0])

    def _pop_lowest(self) -> int:
        heap, entry = self._heap, self._entry
        while True:
            p, seq, hsh = heapq.heappop(heap)
            if entry.get(hsh) == (p, seq):
                del entry[hsh]
                self._uncount(p)
                return hsh
