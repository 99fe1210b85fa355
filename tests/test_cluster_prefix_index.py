"""The cluster's index of cached chain roots (``Cluster.prefix_roots``: which replica caches which
prompt's first block, kept by each KV cache's ``watch`` hook) lets ``ClusterView.prefix_hit`` ask
only those replicas, and it answers as every replica's own cache does, through admissions,
completions and evictions."""

from __future__ import annotations

import numpy as np
from _routers import Scripted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baselines.routers import make_router
from llmsched_gym.core.cluster import Cluster, Replica, Router
from llmsched_gym.core.engine import EngineConfig
from llmsched_gym.core.latency import make_latency
from llmsched_gym.core.request import Workload
from llmsched_gym.sim import make_policy


def _walk(view, rid: int) -> list[int]:
    """Per replica, the prompt tokens its cache holds, walked replica by replica."""
    out = []
    cap = int(view.prompt_tokens[rid]) - 1
    for e in view._c.engines:
        kv = e.kv
        m = kv.match_hashes(view.block_hashes(rid, kv.block_size)) * kv.block_size if kv.enabled else 0
        out.append(min(m, cap) if kv.cap_prompt_minus_one else m)
    return out


class Checking(Router):
    """Routes as ``inner`` does, checking the indexed prefix hits against the walk at every arrival."""

    name = "checking"

    def __init__(self, inner: Router) -> None:
        super().__init__()
        self.inner = inner

    def reset(self, n_replicas, rng) -> None:
        super().reset(n_replicas, rng)
        self.inner.reset(n_replicas, rng)
        self.hits: list[list[int]] = []

    def route(self, rid, view):
        got = view.prefix_hit(rid).tolist()
        assert got == _walk(view, rid), rid
        self.hits.append(got)
        return self.inner.route(rid, view)


def _cluster(wl, router, caps, block_sizes=None, cap_minus_one: bool | None = True, refresh_s=0.05) -> Cluster:
    """Replicas of vllm-v1 with KV ``caps``; ``cap_minus_one=None``: replica r caps hits at the prompt less one
    token when r is even (a mix)."""
    block_sizes = block_sizes or [16] * len(caps)
    capped = [cap_minus_one] * len(caps) if cap_minus_one is not None else [r % 2 == 0 for r in range(len(caps))]
    reps = [Replica(EngineConfig(kv_capacity_tokens=cap, block_size=bs, overflow="preempt_lifo_recompute",
                                 prefix_cap_prompt_minus_one=c),
                    make_latency("linear:d0=0.01,d1=1e-6"), make_policy("vllm-v1"))
            for cap, bs, c in zip(caps, block_sizes, capped, strict=True)]
    return Cluster(wl, reps, router, seed=0, refresh_s=refresh_s)


def test_a_block_evicted_on_one_replica_stays_held_on_the_other() -> None:
    """Two requests with one 160-token prefix, one per replica, then a third sharing it after
    replica 0 evicted the prefix for an unrelated long request: replica 0 holds none of it, replica
    1 all ten blocks (capped at the prompt less one token: 10 blocks of 16 < 175)."""

    pre = [((7, 160),), ((7, 160),), ((9, 256),), ((7, 160), (50, 15))]
    wl = Workload(np.array([0.0, 0.0, 1.0, 3.0]), np.array([160, 160, 256, 175]), np.array([2, 2, 60, 2]),
                  prefix=pre)
    r = Scripted([0, 1, 0, 0].__getitem__, lambda rid, view: view.prefix_hit(rid).tolist())
    c = _cluster(wl, r, [20 * 16, 20 * 16])  # replica 0: the third request grows to 316 tokens (20 blocks), evicting all ten
    c.run()
    assert r.seen == [[0, 0], [0, 0], [0, 0], [0, 160]]
    assert c.engines[0].kv.evicted_blocks >= 10


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 50), k=st.integers(2, 5), seed=st.integers(0, 2**16),
       router=st.sampled_from(["llm-d", "random", "sglang-cache-aware", "lor"]),
       cap=st.sampled_from([600, 1500, 5000]), cap_minus_one=st.sampled_from([True, False, None]), mixed=st.booleans(),
       refresh=st.sampled_from([0.0, 0.05]))
def test_indexed_prefix_hits_equal_each_replicas_cache(n, k, seed, router, cap, cap_minus_one, mixed, refresh) -> None:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.exponential(0.05, n).cumsum())
    groups = rng.integers(0, 4, n)
    heads = rng.choice([64, 200, 333], n)
    prefix = [((int(g), int(h)), (100 + i, 16)) for i, (g, h) in enumerate(zip(groups, heads, strict=True))]
    wl = Workload(t, heads + 16 + rng.integers(0, 40, n), rng.integers(1, 40, n), prefix=prefix)
    sizes = [16] * k if not mixed else [16] + [32] * (k - 1)  # mixed block sizes: the per-replica walk
    r = Checking(make_router(router))
    c = _cluster(wl, r, [cap] * k, sizes, cap_minus_one, refresh)
    c.run()
    assert len(r.hits) == n
    assert (c.prefix_roots() is None) == mixed
    if not mixed:  # the index holds exactly the prompts' first blocks the replicas cache at the end
        firsts = {h[0] for h in (c.view.block_hashes(rid) for rid in range(n)) if h}
        want: dict[int, int] = {}
        for i, e in enumerate(c.engines):
            assert set(e.kv.cached_roots()) == firsts & set(e.kv.cached_hashes())
            for h in e.kv.cached_roots():
                want[h] = want.get(h, 0) | (1 << i)
        assert c.prefix_roots().roots == want


def test_the_replicas_reuse_the_hashes_the_router_computed() -> None:
    """llm-d reads every prompt's block hashes to route it; the replica it picks takes that list
    instead of hashing the prompt again (each prompt is hashed once, by the router), and the run
    is the one where each replica hashes its prompts itself."""
    from unittest import mock

    from llmsched_gym.core import kv as kv_mod
    from llmsched_gym.core.kv import KVCache

    rng = np.random.default_rng(5)
    n = 40
    prefix = [((int(g), 200), (100 + i, 16)) for i, g in enumerate(rng.integers(0, 3, n))]
    wl = Workload(np.sort(rng.exponential(0.05, n).cumsum()), 216 + rng.integers(0, 30, n), rng.integers(1, 30, n),
                  prefix=prefix)
    real = kv_mod._chain_hashes
    runs = []
    for adopt in (True, False):
        c = _cluster(wl, make_router("llm-d"), [3000] * 3)
        calls: list[tuple] = []

        def counted(cache, segs, bs, calls=calls):
            calls.append(segs)
            return real(cache, segs, bs)

        with mock.patch.object(kv_mod, "_chain_hashes", counted):
            if adopt:
                c.run()
                assert len(calls) == n  # the router's, one per prompt; no replica hashed one again
            else:
                for r, e in enumerate(c.engines):  # each replica on its own, hashing what it serves
                    e.kv.share_head_hashes(KVCache(0, e.kv.block_size, c._rows[r].workload))
                with mock.patch.object(KVCache, "adopt_hashes", lambda self, rid, hashes: None):
                    c.run()
                assert len(calls) == n + sum(len(ids) for ids in c.ids)
        runs.append(c)
    assert runs[0].summary() == runs[1].summary()
    assert runs[0].placement.tolist() == runs[1].placement.tolist()


def test_a_replica_with_priority_eviction_keeps_its_hits_exact() -> None:
    """A cache evicting by priority (Echo's task-aware order) keeps one entry per block and may drop
    a block's ancestors first; it tells the index of its chain roots as the LRU caches do, and the
    hits stay each replica's own, at every arrival."""
    rng = np.random.default_rng(3)
    n = 40
    prefix = [((int(g), 200), (100 + i, 16)) for i, g in enumerate(rng.integers(0, 3, n))]
    wl = Workload(np.sort(rng.exponential(0.05, n).cumsum()), 216 + rng.integers(0, 30, n), rng.integers(1, 30, n),
                  prefix=prefix)
    r = Checking(make_router("llm-d"))
    reps = [Replica(EngineConfig(kv_capacity_tokens=1500, block_size=16, overflow="preempt_lifo_recompute"),
                    make_latency("linear:d0=0.01,d1=1e-6"), make_policy(p)) for p in ("vllm-v1", "vllm-v1", "echo")]
    c = Cluster(wl, reps, r, seed=0, refresh_s=0.05)
    c.run()
    assert len(r.hits) == n and any(r.hits[i][2] for i in range(n))
    assert type(c.engines[2].kv).__name__ == "_BlockKVCache"  # Echo installed its order
    firsts = {h[0] for h in (c.view.block_hashes(rid) for rid in range(n)) if h}
    assert set(c.engines[2].kv.cached_roots()) == firsts & set(c.engines[2].kv.cached_hashes())
