"""The KV cache (``llmsched_gym.core.kv.KVCache``): block rounding, the prefix cache (hash chains
over prompt segments, references, idle blocks, the ``prompt - 1`` cap), LRU and priority
eviction. Constructed workloads with the exact blocks expected, and a hypothesis test of the
reference bookkeeping under random admissions, completions and allocations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsched_gym.core.kv import KVCache
from llmsched_gym.core.request import Workload


def workload(prompts, prefix) -> Workload:
    n = len(prompts)
    return Workload(arrival_s=np.zeros(n), prompt_tokens=prompts, output_tokens=np.ones(n, int), prefix=prefix)


def test_capacity_is_whole_blocks():
    kv = KVCache(70, 16, workload([5], None))
    assert (kv.capacity_blocks, kv.capacity_tokens, kv.used_tokens) == (4, 64, 0)
    assert [kv.blocks(t) for t in (0, 1, 16, 17, 64)] == [0, 1, 1, 2, 4]
    assert not kv.enabled  # no request has shareable segments
    assert KVCache(7, 1, workload([5], None)).capacity_tokens == 7  # token level


def test_the_prefix_cache_shares_full_head_blocks():
    # prompts of 20 tokens; 0 and 1 share an 8-token head (2 blocks of 4), 2 has another
    kv = KVCache(64, 4, workload([20, 20, 20], [((1, 8),), ((1, 8),), ((2, 8),)]))
    assert kv.enabled and len(kv.block_hashes(0)) == 2 and kv.block_hashes(0) == kv.block_hashes(1)
    assert kv.block_hashes(2)[0] != kv.block_hashes(0)[0]
    assert kv.match_blocks(1) == 0 and kv.acquire_prefix(0) == 0  # nothing cached yet
    kv.used_blocks = 6  # the engine allocates 0's prompt: 20 tokens + token 1
    kv.publish_prefix(0, 20)
    assert int(kv.shared[0]) == 2 and kv.used_blocks == 6
    assert (kv.match_blocks(1), kv.match_tokens(1), kv.match_blocks(2)) == (2, 8, 0)
    assert kv.match_detail(1) == (2, 0)  # both referenced: none idle
    assert kv.acquire_prefix(1) == 8 and kv.hit_tokens == 8 and int(kv.shared[1]) == 2
    assert kv.used_blocks == 6  # referenced blocks were already counted
    assert [kv.references(h) for h in kv.block_hashes(0)] == [2, 2]
    kv.release_prefix(0)
    assert kv.used_blocks == 6 and kv.idle_blocks == 0 and int(kv.shared[0]) == 0  # 1 still holds them
    kv.release_prefix(1)
    assert (kv.used_blocks, kv.idle_blocks) == (4, 2)  # unreferenced: cached, counted free
    assert kv.match_detail(1) == (2, 2)
    assert kv.acquire_prefix(1) == 8 and (kv.used_blocks, kv.idle_blocks) == (6, 0)  # idle blocks become used


def test_a_hit_covers_at_most_the_prompt_less_one_token():
    wl = workload([8, 8], [((1, 8),), ((1, 8),)])
    for cap, expected in ((True, 1), (False, 2)):  # (8 - 1) // 4 = 1 block, or both
        kv = KVCache(64, 4, wl, cap_prompt_minus_one=cap)
        kv.publish_prefix(0, 8)
        assert kv.match_blocks(1) == expected and kv.match_detail(1)[0] == expected


def test_a_prefix_computed_twice_at_once_keeps_one_copy():
    kv = KVCache(64, 4, workload([12, 12], [((1, 8),), ((1, 8),)]))
    kv.used_blocks = 8  # both prefilled their 12 + 1 tokens without a hit: 4 blocks each
    kv.publish_prefix(0, 12)
    kv.publish_prefix(1, 12)  # the same 2 head blocks: 1 shares 0's and drops its own copies
    assert kv.used_blocks == 6 and [kv.references(h) for h in kv.block_hashes(0)] == [2, 2]


def test_lru_evicts_the_least_recently_released_deeper_blocks_first():
    kv = KVCache(24, 4, workload([12, 12], [((1, 8),), ((2, 8),)]))  # 6 blocks
    kv.used_blocks = 4  # the two requests' head blocks (their tails are left out here)
    for rid in (0, 1):
        kv.publish_prefix(rid, 12)
    kv.release_prefix(0)  # 0's blocks go idle first (deeper block first), then 1's
    kv.release_prefix(1)
    h0, h1 = kv.block_hashes(0), kv.block_hashes(1)
    assert kv.next_evictions(4) == [h0[1], h0[0], h1[1], h1[0]]
    kv.make_room(3)  # 0 used + 4 idle + 3 > 6: evict one
    assert kv.evicted_blocks == 1 and kv.next_evictions(4) == [h0[0], h1[1], h1[0]]
    assert kv.match_blocks(0) == 1 and kv.match_blocks(1) == 2  # 0's chain now ends after its first block


def test_priority_eviction_takes_the_lowest_priority_first():
    kv = KVCache(24, 4, workload([12, 12], [((1, 8),), ((2, 8),)]))
    kv.used_blocks = 4
    for rid in (0, 1):
        kv.publish_prefix(rid, 12)
    h0, h1 = kv.block_hashes(0), kv.block_hashes(1)
    prio = {h0[0]: 5.0, h0[1]: 5.0, h1[0]: 1.0, h1[1]: 2.0}
    kv.set_eviction_priority(prio.__getitem__)
    kv.release_prefix(0)
    kv.release_prefix(1)
    assert kv.idle_below(2.0) == 1 and kv.idle_below(5.0) == 2 and kv.idle_below(6.0) == 4
    kv.make_room(4)  # 4 idle + 4 > 6: evict the two lowest
    assert kv.evicted_blocks == 2 and kv.match_blocks(1) == 0 and kv.match_blocks(0) == 2
    prio[h0[1]] = 0.5  # 0's deeper block becomes the cheapest
    kv.reprioritize([h0[1]])
    kv.make_room(5)
    assert kv.match_blocks(0) == 1


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([1, 4, 16]),
       st.lists(st.tuples(st.sampled_from(["admit", "finish", "alloc"]), st.integers(0, 11)), max_size=60))
def test_references_idle_blocks_and_evictions_stay_consistent(seed, bs, ops):
    """Random admissions (hit, then publish), completions and allocations: every cached block's
    reference count is the number of requests holding it, the idle blocks are exactly the
    unreferenced cached ones, a request holds a head of its own hash chain, and hits never exceed
    the ``prompt - 1`` cap."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(2, 60, 12)
    prefix = [((int(rng.integers(0, 3)), int(rng.integers(1, p + 1))),) if rng.random() < 0.8 else None
              for p in prompts]
    kv = KVCache(int(rng.integers(40, 200)), bs, workload(prompts, prefix))
    running: set[int] = set()
    for op, rid in ops:
        if op == "admit" and rid not in running:
            hit = kv.acquire_prefix(rid)
            assert hit <= max(int(prompts[rid]) - 1, 0) and hit % bs == 0
            kv.publish_prefix(rid, int(prompts[rid]))
            running.add(rid)
        elif op == "finish" and rid in running:
            kv.release_prefix(rid)
            running.discard(rid)
        elif op == "alloc":
            kv.make_room(rid)
        cached = set(kv.cached_hashes())
        for h in cached:
            holders = sum(1 for r in running if h in kv.block_hashes(r)[: int(kv.shared[r])])
            assert kv.references(h) == holders
        assert kv.idle_blocks == sum(1 for h in cached if kv.references(h) == 0)
        for r in range(len(prompts)):
            held = int(kv.shared[r])
            assert held == 0 or r in running
            assert set(kv.block_hashes(r)[:held]) <= cached
            # plain LRU: a chain's cached blocks are a head of it
            flags = [h in cached for h in kv.block_hashes(r)]
            assert flags == sorted(flags, reverse=True)


def _reference_hashes(segs: tuple, bs: int) -> list[int]:
    """Block ``b``'s key, token by token: a 128-bit base from the segment chain before the segment
    holding the block's last token (each earlier nonempty segment's id and length, chained) and
    that segment's id, plus the block's end offset in it."""
    tokens = [(i, seg, off) for i, (seg, n) in enumerate(segs) for off in range(n)]
    out = []
    for b in range(len(tokens) // bs):
        i, seg, off = tokens[(b + 1) * bs - 1]
        chain = 0
        for s, n in segs[:i]:
            if n:
                chain = hash((chain, s, n))
        out.append((hash((chain, seg)) << 64 | hash((seg, chain, 1)) & (1 << 64) - 1) + off + 1)
    return out


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([1, 3, 4, 16]), st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=4), min_size=1,
                                                 max_size=12))
def test_prompts_extending_a_cached_head_hash_as_from_scratch(bs, paths):
    """Prompts built from a small pool of segments (so they share heads: a group's system prompt,
    a session's earlier turns), hashed in turn through one cache: every chain equals the one
    computed token by token, and blocks wholly inside a shared head are the same objects."""
    seg_len = {0: 7, 1: 16, 2: 1, 3: 20, 4: 5, 5: 33, 6: 0, 7: 64}  # 0: an empty segment
    prefix = [tuple((s, seg_len[s]) for s in p) for p in paths]
    prompts = [sum(n for _, n in p) + 1 for p in prefix]
    kv = KVCache(10_000, bs, workload(prompts, prefix))
    for rid, segs in enumerate(prefix):
        assert kv.block_hashes(rid) == _reference_hashes(segs, bs)
    for a in range(len(prefix)):
        for b in range(a):
            k = 0
            while k < min(len(prefix[a]), len(prefix[b])) and prefix[a][k] == prefix[b][k]:
                k += 1
            whole = sum(n for _, n in prefix[a][:k]) // bs  # blocks inside the common head
            ha, hb = kv.block_hashes(a), kv.block_hashes(b)
            assert all(ha[i] is hb[i] for i in range(whole))


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([1, 2, 4, 16]), st.lists(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40)),
                                                         min_size=1, max_size=4), min_size=2, max_size=8))
def test_two_blocks_share_a_key_exactly_when_their_prompts_agree_up_to_their_end(bs, prompts_segs):
    """What a key means, independent of how it is computed: block ``i`` of one prompt and block
    ``j`` of another (or the same) have equal keys exactly when ``i == j`` and the two prompts'
    tokens (segment, offset), empty segments aside, agree up to the block's end. A segment id
    names content, so the same id with two lengths shares its first tokens."""
    prefix = [tuple(p) for p in prompts_segs]
    prompts = [sum(n for _, n in p) + 1 for p in prefix]
    kv = KVCache(10_000, bs, workload(prompts, prefix))
    tokens = [[(seg, off) for seg, n in p for off in range(n)] for p in prefix]
    keys = [kv.block_hashes(r) for r in range(len(prefix))]
    for a in range(len(prefix)):
        assert len(keys[a]) == len(tokens[a]) // bs
        for b in range(len(prefix)):
            for i, ka in enumerate(keys[a]):
                for j, kb in enumerate(keys[b]):
                    same = i == j and tokens[a][:(i + 1) * bs] == tokens[b][:(j + 1) * bs]
                    assert (ka == kb) == same, (a, i, b, j)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 2, 4, 16]), st.integers(2, 5),
       st.lists(st.tuples(st.integers(0, 3), st.integers(0, 90)), min_size=1, max_size=5))
def test_a_key_names_the_prompt_up_to_its_end_whatever_the_block_size(bs, k, segs):
    """Blocks of ``k * bs`` tokens have the keys of every k-th block of ``bs`` tokens (the
    cluster's approximate indexes of coarser blocks take them from the replicas' keys)."""
    segs = tuple(segs)
    prompt = sum(n for _, n in segs) + 1
    fine = KVCache(10_000, bs, workload([prompt], [segs])).block_hashes(0)
    coarse = KVCache(10_000, k * bs, workload([prompt], [segs])).block_hashes(0)
    assert coarse == fine[k - 1::k]


@pytest.mark.parametrize("blocks", [90, 5000])
def test_lru_order_matches_an_ordered_dict_over_a_long_run(blocks, monkeypatch):
    """Thousands of admissions, releases and allocations, with evictions (90 blocks: the LRU
    list's consumed head is trimmed many times) or without (5,000: the list is compacted many
    times): the idle blocks and their eviction order are those of a plain model (reference
    counts and an OrderedDict in release order, deeper blocks first), and a chain's cached blocks
    are always a head of it."""
    from collections import OrderedDict

    from llmsched_gym.core import kv as kv_mod

    monkeypatch.setattr(kv_mod, "_LRU_SLACK", 64)
    compactions = []
    real = KVCache._compact
    monkeypatch.setattr(KVCache, "_compact", lambda self: compactions.append(1) or real(self))
    rng = np.random.default_rng(11)
    n, bs = 400, 4
    prefix = [((int(rng.integers(0, 6)), 4 * int(rng.integers(1, 4))), (100 + i, int(rng.integers(1, 12))))
              for i in range(n)]
    prompts = [sum(x for _, x in p) + 1 for p in prefix]
    kv = KVCache(4 * blocks, bs, workload(prompts, prefix))
    ref: dict[int, int] = {}
    idle: OrderedDict[int, None] = OrderedDict()
    held: dict[int, list[int]] = {}
    trims = 0
    for step in range(6000):
        rid = int(rng.integers(0, n))
        if rid in held:  # finish it
            kv.release_prefix(rid)
            for h in reversed(held.pop(rid)):
                ref[h] -= 1
                if ref[h] == 0:
                    idle[h] = None
        else:  # admit it: hit, make room for the rest of its prompt, prefill, publish
            hashes = kv.block_hashes(rid)
            m = 0
            while m < min(len(hashes), (prompts[rid] - 1) // bs) and hashes[m] in ref:
                m += 1
            assert kv.acquire_prefix(rid) == m * bs
            for h in hashes[:m]:
                if ref[h] == 0:
                    del idle[h]
                ref[h] += 1
            need = kv.blocks(prompts[rid] + 1) - m
            base = kv._base
            kv.make_room(need)
            trims += kv._base != base
            excess = kv.used_blocks + len(idle) + need - kv.capacity_blocks
            while excess > 0 and idle:
                del ref[idle.popitem(last=False)[0]]
                excess -= 1
            kv.used_blocks += need
            kv.publish_prefix(rid, prompts[rid])
            mine = hashes[:min(len(hashes), prompts[rid] // bs)]
            for h in mine[m:]:
                if h not in ref:
                    ref[h] = 1
                else:
                    if ref[h] == 0:
                        del idle[h]
                    ref[h] += 1
            held[rid] = mine
        if step % 50 == 0 or step > 5900:
            assert kv.next_evictions(10**6) == list(idle)
            assert set(kv.cached_hashes()) == set(ref) and kv.idle_blocks == len(idle)
            assert all(kv.references(h) == r for h, r in ref.items())
            for r in range(n):
                flags = [h in ref for h in kv.block_hashes(r)]
                assert flags == sorted(flags, reverse=True)
    if blocks == 90:
        assert kv.evicted_blocks > 1000 and trims > 10
    else:
        assert kv.evicted_blocks == 0 and len(compactions) >= 5


def _state(kv: KVCache, n: int) -> tuple:
    """Everything a caller can observe of a cache (its idle order in full, every request's match)."""
    return (kv.used_blocks, kv.idle_blocks, kv.evicted_blocks, kv.hit_tokens, sorted(kv.cached_hashes()),
            kv.next_evictions(10**6), kv.shared.tolist(), [kv.match_blocks(r) for r in range(n)],
            [kv.match_detail(r) for r in range(n)], [kv.references(h) for h in sorted(kv.cached_hashes())],
            [kv.match_hashes(kv.block_hashes(r)) for r in range(n)],
            [kv.chain_references(kv.block_hashes(r)) for r in range(n)], sorted(kv.cached_roots()))


class _RootWatch:
    """A cache's ``watch``: the chain roots (prompts' first blocks) it was told are cached."""

    def __init__(self) -> None:
        self.roots: set[int] = set()

    def rooted(self, h: int) -> None:
        assert h not in self.roots
        self.roots.add(h)

    def unrooted(self, h: int) -> None:
        self.roots.remove(h)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([1, 2, 4]), st.booleans(), st.integers(0, 90),
       st.lists(st.tuples(st.sampled_from(["admit", "chunk", "finish", "alloc", "whatif"]), st.integers(0, 14)),
                max_size=80))
def test_runs_behave_as_one_entry_per_block(seed, bs, cap, switch, ops):
    """The cache keeps plain LRU's blocks as runs (:class:`~llmsched_gym.core.kv._Run`): under
    random admissions (hits, then the prompt published whole or chunk by chunk, some computed by
    two requests at once), completions, allocations with evictions and the ledger's what-ifs,
    it is observably the cache with one entry per block; installing a priority order part way
    (``switch``) turns it into that cache with the same state, and both go on identically."""
    from llmsched_gym.core.kv import _BlockKVCache

    rng = np.random.default_rng(seed)
    n = 15
    heads = [((0, int(rng.integers(1, 12))),), ((0, 11), (1, int(rng.integers(1, 9)))), ((2, 7),), ((0, 11), (1, 8))]
    prefix = [heads[int(rng.integers(0, 4))] + ((100 + i, int(rng.integers(0, 6))),) if rng.random() < 0.9 else None
              for i in range(n)]
    prompts = [sum(x for _, x in p) + int(rng.integers(0, 3)) if p else int(rng.integers(1, 20)) for p in prefix]
    prompts = [max(p, 1) for p in prompts]
    cap_tokens = int(rng.integers(20, 120))
    a = KVCache(cap_tokens, bs, workload(prompts, prefix), cap_prompt_minus_one=cap)
    b = _BlockKVCache(cap_tokens, bs, workload(prompts, prefix), cap_prompt_minus_one=cap)
    assert type(a) is KVCache
    a.watch, b.watch = _RootWatch(), _RootWatch()
    prio = {}

    def priority(h: int) -> float:
        return prio.setdefault(h, float(rng.integers(0, 3)))

    progress: dict[int, int] = {}
    for step, (op, rid) in enumerate(ops):
        if step == switch:
            for kv in (a, b):
                kv.set_eviction_priority(priority)
            assert type(a) is _BlockKVCache
        for kv in (a, b):
            if op == "admit" and rid not in progress:
                kv.acquire_prefix(rid)
            elif op == "chunk" and rid in progress:
                kv.publish_prefix(rid, progress[rid] + 2 * bs + 1)
            elif op == "finish" and rid in progress:
                kv.publish_prefix(rid, prompts[rid])
                kv.release_prefix(rid)
            elif op == "alloc":
                kv.make_room(rid)
            elif op == "whatif":
                running = sorted(progress)
                freed = [h for r in running[:1] for h in reversed(kv.block_hashes(r)[:int(kv.shared[r])])]
                kv.whatif = kv.eviction_victims(rid, freed, lambda h: h % 3 == 0)
        if op == "admit" and rid not in progress:
            progress[rid] = int(a.shared[rid]) * bs
        elif op == "chunk" and rid in progress:
            progress[rid] += 2 * bs + 1
        elif op == "finish":
            progress.pop(rid, None)
        if op == "whatif":
            assert a.whatif == b.whatif
        assert _state(a, n) == _state(b, n)
        # the roots: the cached first blocks of the prompts, as each cache told its watch
        firsts = {h[0] for h in (a.block_hashes(r) for r in range(n)) if h}
        assert a.watch.roots == b.watch.roots == set(a.cached_roots()) == firsts & set(a.cached_hashes())
