"""Deferred decode runs at the cluster level (``Cluster.defer_runs``, ``Engine.pending_to``): a
fast-forwarded decode run crosses routing points uncut and is applied when its replica next has
to act. The results must equal those of the replicas stepped to every routing point bit for bit:
a constructed instance with the load signals the router sees at each routing point worked out by
hand, and a property over random workloads, routers, policies, refresh intervals and KV sizes."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baselines.routers import make_router
from llmsched_gym.core.cluster import Cluster, Replica, Router
from llmsched_gym.core.engine import EngineConfig
from llmsched_gym.core.latency import make_latency
from llmsched_gym.core.request import Workload
from llmsched_gym.sim import make_policy


class Recorder(Router):
    """Request 0 to replica 0, the others to replica 1; records what it sees at each arrival."""

    name = "recorder"

    def reset(self, n_replicas, rng) -> None:
        super().reset(n_replicas, rng)
        self.seen: list[tuple] = []

    def route(self, rid, view):
        self.seen.append((rid, view.now, view.waiting.tolist(), view.running.tolist(), view.kv_used.tolist(),
                          view.waiting_tokens.tolist()))
        return 0 if rid == 0 else 1


class Counting:
    """Wraps a policy, counting its ``schedule`` calls (one per decision the engine asks for)."""

    def __init__(self, policy) -> None:
        self.policy, self.calls = policy, 0

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def schedule(self, view):
        self.calls += 1
        return self.policy.schedule(view)


def _cluster(wl, n, router, defer, policy="fcfs", refresh_s=0.1, cap=100_000, latency="linear:d0=0.0625,d1=0",
             noise=0.0, horizon=None, prefix=True) -> Cluster:
    reps = [Replica(EngineConfig(kv_capacity_tokens=cap, block_size=16, overflow="preempt_lifo_recompute",
                                 latency_noise_cv=noise, horizon_s=horizon, prefix_cache=prefix),
                    make_latency(latency), make_policy(policy)) for _ in range(n)]
    c = Cluster(wl, reps, router, seed=0, refresh_s=refresh_s)
    c.defer_runs = defer
    return c


def _same(a: Cluster, b: Cluster) -> None:
    sa, sb = a.summary(), b.summary()
    assert sa == sb
    ta, tb = a.request_table(), b.request_table()
    assert ta.keys() == tb.keys()
    for k in ta:
        assert np.array_equal(ta[k], tb[k], equal_nan=True), k
    la, lb = a.iteration_log(), b.iteration_log()
    for k in la:
        assert np.array_equal(la[k], lb[k]), k
    for ea, eb in zip(a.engines, b.engines, strict=True):
        assert ea.kv.used_blocks == eb.kv.used_blocks and ea.kv.evicted_blocks == eb.kv.evicted_blocks
        assert ea.pending is None and eb.pending is None


# Request 0 (112 prompt, 64 output tokens) on replica 0; iterations take 1/16 s (exact in binary):
# prefill [0, 1/16) emits token 1 (113 KV tokens: 8 blocks of 16), then 63 decode steps, done at
# 64/16 = 4.0. Requests 1-6 (16 + 2 tokens) go to replica 1 at 0.15, 0.35, ..., so the routing
# points (0.1 s windows) are 0.0, 0.1, 0.3, 0.6, 0.8, 1.1, 1.3. The stepped replica 0 runs to its
# first boundary at or after each point (0.125, 0.3125, 0.625, 0.8125, 1.125, 1.3125) and shows
# the state at the start of its last iteration (a fast-forwarded piece counting as one): at 1.1
# that is 0.8125, 12 steps, 125 tokens in 8 blocks (128), though by 1.0625 the request held 129
# tokens in 9 blocks; at 1.3 it is 1.125, 17 steps, 130 tokens: 144.
ARRIVALS = [0.0, 0.15, 0.35, 0.65, 0.85, 1.15, 1.35]


def test_a_decode_run_crosses_routing_points_with_the_stepped_signals() -> None:
    wl = Workload(np.array(ARRIVALS), np.array([112] + [16] * 6), np.array([64] + [2] * 6))
    runs = {}
    for defer in (False, True):
        router = Recorder()
        c = _cluster(wl, 2, router, defer)
        counting = Counting(c.engines[0].scheduler)
        c.engines[0].scheduler = counting
        c.run()
        runs[defer] = (c, router.seen, counting.calls)
    (eager, seen_e, calls_e), (lazy, seen_l, calls_l) = runs[False], runs[True]
    assert seen_l == seen_e
    assert [round(s[1], 9) for s in seen_l] == [0.0, 0.1, 0.3, 0.6, 0.8, 1.1, 1.3]
    assert [s[4][0] for s in seen_l] == [0, 128, 128, 128, 128, 128, 144]
    assert [s[3][0] for s in seen_l] == [0, 1, 1, 1, 1, 1, 1]
    # stepped: prefill and one decode step by 0.1, a piece per later routing point, the rest at the end
    assert calls_e == 8
    assert calls_l == 2  # deferred: the prefill, then one decode run to the completion
    _same(eager, lazy)
    t = lazy.request_table()
    assert t["completion_s"][0] == 4.0 and t["first_token_s"][0] == 0.0625
    log0 = lazy.engines[0].iteration_log()
    assert log0["t_start"].tolist() == [k / 16 for k in range(64)]
    assert log0["kv_used"].tolist() == [16 * -(-(113 + k) // 16) for k in range(64)]


def test_a_run_stopping_exactly_on_a_routing_point_shows_its_state_there() -> None:
    """0.25 s windows and 1/16 s iterations: the stepped replica stops exactly on each point and
    shows its state there (not the state at the start of its last piece)."""
    wl = Workload(np.array([0.0, 0.3, 0.55, 0.8, 1.05]), np.array([112] + [16] * 4), np.array([64] + [2] * 4))
    seen = {}
    for defer in (False, True):
        router = Recorder()
        c = _cluster(wl, 2, router, defer, refresh_s=0.25)
        c.run()
        seen[defer] = (c, router.seen)
    assert seen[True][1] == seen[False][1]
    # at 0.25: 3 steps after the prefill (116 tokens, 8 blocks); at 1.0: 15 steps (128: 8 blocks)
    assert [s[4][0] for s in seen[True][1]] == [0, 128, 128, 128, 128]
    _same(seen[False][0], seen[True][0])


def test_a_request_routed_to_a_busy_replica_ends_its_run_at_the_arrival() -> None:
    """Request 1 joins replica 0 at 0.65 in the middle of request 0's decode run: the run ends at
    the first boundary at or after 0.65 (0.6875), where request 1 is admitted, as stepped."""

    class Both(Recorder):
        def route(self, rid, view):
            super().route(rid, view)
            return 0

    class Counted:
        """The batch-time model, counting the iterations it times."""

        def __init__(self, latency) -> None:
            self.latency, self.calls = latency, 0

        def __getattr__(self, name):
            return getattr(self.latency, name)

        def batch_time(self, *args):
            self.calls += 1
            return self.latency.batch_time(*args)

    wl = Workload(np.array([0.0, 0.65]), np.array([112, 16]), np.array([64, 2]))
    cs, timed = {}, {}
    for defer in (False, True):
        c = _cluster(wl, 2, Both(), defer)
        e = c.engines[0]
        e.latency = counted = Counted(e.latency)
        c.run()
        cs[defer], timed[defer] = c, counted.calls
    _same(cs[False], cs[True])
    assert cs[True].request_table()["first_scheduled_s"].tolist() == [0.0, 0.6875]
    # the deferred run is computed only as far as it is read: to 0.6875 (10 steps), not to the
    # completion at 4.0 it would reach without the arrival; no more iterations timed than stepped
    assert cs[True].engines[0].counters.n_iterations == cs[False].engines[0].counters.n_iterations
    assert timed[True] <= timed[False] < cs[True].engines[0].counters.n_iterations + 20


class PrefixProbe(Router):
    """Requests 0 and 1 to replica 0, the others (probes) to replica 1; records replica 0's prefix
    hit for each probe (what llm-d's precise scorer reads)."""

    name = "prefix-probe"

    def reset(self, n_replicas, rng) -> None:
        super().reset(n_replicas, rng)
        self.hits: list[int] = []

    def route(self, rid, view):
        if rid < 2:
            return 0
        self.hits.append(int(view.prefix_hit(rid)[0]))
        return 1


def test_a_deferred_run_evicts_cached_blocks_as_the_stepped_one_by_each_routing_point() -> None:
    """Replica 0 (18 blocks of 16 tokens) keeps request 0's 10 prompt blocks cached (idle) after it
    completes at 0.125; request 1 (96 + 100 tokens, arriving at 0.25) then decodes from 0.3125, one
    step every 1/16 s, holding 7 blocks, 8 from step 16 and 9 from step 32 (ending at 37/16): that
    block evicts one cached block (request 0's last: released last, least recently used). Probes
    sharing request 0's 160-token prefix arrive at 2.15, 2.35 and 2.55: the stepped replica stands
    at 2.125 (step 29), 2.3125 (step 32) and 2.5625 (step 36) at their routing points, so the
    probes see 10, 9 and 9 cached blocks; the deferred run must evict by then too."""
    pre = [((7, 160),), ((8, 96),)] + [((7, 160), (100 + i, 16)) for i in range(3)]
    wl = Workload(np.array([0.0, 0.25, 2.15, 2.35, 2.55]), np.array([160, 96, 176, 176, 176]),
                  np.array([2, 100, 2, 2, 2]), prefix=pre)
    cs = {}
    for defer in (False, True):
        router = PrefixProbe()
        c = _cluster(wl, 2, router, defer, cap=18 * 16)
        c.run()
        cs[defer] = (c, router.hits)
    assert cs[False][1] == [160, 144, 144]
    assert cs[True][1] == cs[False][1]
    _same(cs[False][0], cs[True][0])


ROUTERS = ["lor", "jsq", "token-jsq", "power-of-two", "llm-d", "llm-d-approx", "sglang-cache-aware", "llumnix"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 40), k=st.integers(2, 4), seed=st.integers(0, 2**16), router=st.sampled_from(ROUTERS),
       refresh=st.sampled_from([0.0, 0.05, 0.1, 0.25]), policy=st.sampled_from(["fcfs", "vllm-v1", "sarathi"]),
       cap=st.sampled_from([1500, 4000, 100_000]), long_out=st.booleans(), noise=st.sampled_from([0.0, 0.2]),
       horizon=st.sampled_from([None, 3.0]), grid=st.booleans())
def test_deferred_runs_equal_the_stepped_replicas(n, k, seed, router, refresh, policy, cap, long_out, noise,
                                                  horizon, grid) -> None:
    """Every router's results (summary, request table, iteration log, the signals it saw) are the
    same with decode runs deferred as with every replica stepped to each routing point."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.exponential(0.08, n).cumsum())
    if grid:  # arrivals on multiples of 1/16 s: boundaries fall exactly on window edges
        t = np.round(t * 16) / 16
    out = rng.integers(1, 400 if long_out else 60, n)
    prefix = [((int(g), 256), (1000 + i, 64)) for i, g in enumerate(rng.integers(0, 3, n))]
    wl = Workload(t, 320 + rng.integers(1, 400, n), out, prefix=prefix)
    results = []
    for defer in (False, True):
        r = make_router(router)
        seen: list = []
        route = r.route

        def recording(rid, view, route=route, seen=seen):
            seen.append((rid, view.waiting.tolist(), view.running.tolist(), view.kv_used.tolist(),
                         view.waiting_tokens.tolist()))
            return route(rid, view)

        r.route = recording
        c = _cluster(wl, k, r, defer, policy, refresh, cap, "linear:d0=0.01,d1=1e-6", noise, horizon)
        c.run()
        results.append((c, seen))
    (eager, seen_e), (lazy, seen_l) = results
    assert seen_l == seen_e
    _same(eager, lazy)
