"""The cluster level (llmsched_gym.core.cluster): one replica is the plain engine bit for bit,
routing decisions on constructed instances, conservation, and the property that a load-blind
router's replicas equal plain engines run on the requests they received."""

from __future__ import annotations

import copy
from unittest import mock

import numpy as np
import pytest
from golden.summaries import CUTS, _clean, load
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baselines.routers import ROUTERS, make_router
from llmsched_gym.cluster_sim import make_cluster, simulate_cluster
from llmsched_gym.config import ConfigError
from llmsched_gym.core.cluster import Cluster, Replica, _replica_seed
from llmsched_gym.core.engine import Engine, EngineConfig
from llmsched_gym.core.latency import make_latency
from llmsched_gym.core.metrics import summarize
from llmsched_gym.core.request import Workload
from llmsched_gym.sim import make_policy

GOLDEN = load()


def _no_default_traces():
    from llmsched_gym import data
    from llmsched_gym.core.traces import DEFAULT_FILES

    resolve = data.resolve_data
    return (mock.patch.object(data, "resolve_data", lambda n: None if str(n) in DEFAULT_FILES.values() else resolve(n)),
            mock.patch.object(data, "notify_fallback"))


@pytest.mark.parametrize("scenario", sorted(GOLDEN))
def test_one_replica_is_the_golden_engine(scenario: str) -> None:
    """For every golden scenario, one replica behind a router gives the recorded summary of the
    scenario's policy (or of fcfs when the scenario's own policy is not recorded)."""
    from llmsched_gym.core.scenarios import get_scenario

    pol = get_scenario(scenario).get("policy", "fcfs")
    pol = pol if isinstance(pol, str) and pol in GOLDEN[scenario] else "fcfs"
    want = GOLDEN[scenario][pol]
    p1, p2 = _no_default_traces()
    with p1, p2:
        r = simulate_cluster(scenario, pol, "round-robin", 1, seed=0, overrides=CUTS[scenario])
    s = dict(r.summary)
    s.pop("wall_time_s"), s.pop("latency_model"), s.pop("cluster")
    assert _clean(s) == want


def _wl(arrival, prompt, output, prefix=None) -> Workload:
    return Workload(np.array(arrival, dtype=float), np.array(prompt), np.array(output), prefix=prefix)


def _cluster(wl: Workload, n: int, router, policy: str = "fcfs", refresh_s: float = 0.0, cap: int = 100_000,
             latency: str = "linear:d0=0.01,d1=1e-6") -> Cluster:
    reps = [Replica(EngineConfig(kv_capacity_tokens=cap, block_size=16, overflow="preempt_lifo_recompute"),
                    make_latency(latency), make_policy(policy)) for _ in range(n)]
    return Cluster(wl, reps, make_router(router) if isinstance(router, str) else router, seed=0, refresh_s=refresh_s)


def test_round_robin_places_request_i_on_i_mod_4() -> None:
    wl = _wl(np.arange(10) * 0.05, [100] * 10, [20] * 10)
    c = _cluster(wl, 4, "round-robin")
    c.run()
    assert c.placement.tolist() == [i % 4 for i in range(10)]
    s = c.summary()
    assert s["cluster"]["routed"] == [3, 3, 2, 2]
    assert s["cluster"]["load_imbalance"] == pytest.approx(3 / 2.5)
    assert s["n_completed"] == 10


def test_jsq_and_lor_pick_the_least_loaded() -> None:
    """Request 0 decodes 1,000 tokens on replica 0 (10 s at 10 ms an iteration); request 1 is short
    and done by t = 5, when request 2 arrives: jsq (requests on the replica) picks replica 1 where
    round-robin picks 0. Three simultaneous arrivals at t = 6 go to the shortest queue in turn."""
    wl = _wl([0.0, 0.001, 5.0, 6.0, 6.0, 6.0], [10] * 6, [1000, 1, 1, 1, 1, 1])
    c = _cluster(wl, 2, "jsq")
    c.run()
    assert c.placement.tolist()[:3] == [0, 1, 1]
    # at t = 6 replica 0 still runs request 0 and replica 1 is empty: 1, then a tie (0), then 1
    assert c.placement.tolist()[3:] == [1, 0, 1]
    rr = _cluster(wl, 2, "round-robin")
    rr.run()
    assert rr.placement.tolist()[:3] == [0, 1, 0]
    # lor counts queued requests (Vidur's pending): at t = 5 nothing is queued anywhere, and the
    # tie goes to the replica with fewer requests on it (replica 0 still runs request 0)
    lor = _cluster(wl, 2, "lor")
    lor.run()
    assert lor.placement.tolist()[:3] == [0, 1, 1]
    # three simultaneous arrivals: 1 (empty), 0 (shorter queue: request 0 runs, not queued), then
    # queues [1, 1] and requests on the replicas [2, 1]: replica 1
    assert lor.placement.tolist()[3:] == [1, 0, 1]


def test_cache_aware_sends_a_shared_prefix_to_the_replica_holding_it() -> None:
    """Groups A (segment 1) and B (segment 2) of 2,048-token system prompts plus 64 unique tokens:
    every later request follows the first of its group (llm-d breaks its first ties at random)."""
    groups = [1, 2, 1, 2, 1, 1]
    prefix = [((g, 2048),) for g in groups]
    wl = _wl(np.arange(6) * 0.5, [2112] * 6, [4] * 6, prefix)
    for router in ("sglang-cache-aware", "llm-d", "llm-d-approx"):
        c = _cluster(wl, 3, router)
        c.run()
        place = c.placement.tolist()
        if router == "sglang-cache-aware":  # no match: the smallest tree, so B avoids A's replica
            assert place[:2] == [0, 1]
        assert [place[i] for i in (2, 4, 5)] == [place[0]] * 3, router
        assert place[3] == place[1], router
        # the later requests of each group hit the cache: 4 x 2,048 tokens
        assert c.summary()["cluster"]["prefix_hit_tokens"] == 4 * 2048, router


def test_llm_d_precise_reads_the_replicas_caches() -> None:
    """Request 0 (group 7) runs on replica X; a long request 1 goes to the other, Y (queue score);
    a 20,000-token request 2 at t = 1 goes to X (KV score: X is empty again). At t = 3 request 3 of
    group 7 finds its prefix cached on X, busier: precise llm-d follows the cache, llm-d-load the load."""
    prefix = [((7, 4096),), None, None, ((7, 4096),)]
    wl = _wl([0.0, 0.0, 1.0, 3.0], [4160, 100, 20_000, 4160], [2, 2000, 2000, 2], prefix)
    c = _cluster(wl, 2, "llm-d")
    c.run()
    x, y, p2, p3 = c.placement.tolist()
    assert y == 1 - x and p2 == x and p3 == x
    assert c.view.prefix_hit(3)[x] == 4096 and c.view.prefix_hit(3)[y] == 0
    load = _cluster(wl, 2, "llm-d-load")
    load.run()
    xl, yl, p2l, p3l = load.placement.tolist()
    assert p2l == xl and p3l == yl


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 70), data=st.data())
def test_lor_takes_the_fewest_queued_then_the_fewest_outstanding(n: int, data) -> None:
    """LOR's pick is the first replica of least (waiting, outstanding), the documented order: the
    same index as ``argmin(waiting * (max outstanding + 1) + outstanding)`` and as Python's ``min``
    over the pairs, on loads with many ties and large loads."""
    hi = data.draw(st.sampled_from([2, 5, 2**20]))
    waiting = np.array(data.draw(st.lists(st.integers(0, hi), min_size=n, max_size=n)), dtype=np.int64)
    running = np.array(data.draw(st.lists(st.integers(0, hi), min_size=n, max_size=n)), dtype=np.int64)
    wl = _wl([0.0], [100], [10])
    c = _cluster(wl, n, "lor")
    c.view.waiting[:] = waiting
    c.view.outstanding[:] = waiting + running
    pairs = list(zip(waiting.tolist(), (waiting + running).tolist(), strict=True))
    want = min(range(n), key=pairs.__getitem__)
    out = waiting + running
    assert c.router.route(0, c.view) == want == int(np.argmin(waiting * (int(out.max()) + 1) + out))


def test_can_take_all_is_can_take_on_every_replica() -> None:
    """Capacities 4,000 / 4,010 / 8,000 tokens in blocks of 16: whole blocks hold 4,000 / 4,000 /
    8,000, so a request of prompt + output = 4,000 fits all three, 4,001 only the third."""
    wl = _wl([0.0, 0.0, 0.0, 0.0], [3000, 3000, 16, 100], [1000, 1001, 1, 8000])
    reps = [Replica(EngineConfig(kv_capacity_tokens=cap, block_size=16), make_latency("linear:d0=0.01,d1=1e-6"),
                    make_policy("fcfs")) for cap in (4000, 4010, 8000)]
    view = Cluster(wl, reps, make_router("lor"), seed=0).view
    assert [view.can_take(r).tolist() for r in range(4)] == [[True] * 3, [False, False, True], [True] * 3,
                                                             [False, False, False]]
    assert [view.can_take_all(r) for r in range(4)] == [True, False, True, False]


def test_llm_d_scores_are_the_weighted_sum_with_the_filter() -> None:
    """llm-d's scores equal the documented sum 2 prefix + queue + kv, term by term, where every
    replica can take the request; where only some can, the rest score -inf; and the KV term follows
    the view when its KV signals change between two calls (it is kept per routing point)."""
    wl = _wl([0.0] * 3, [500, 500, 500], [100, 3600, 100])
    reps = [Replica(EngineConfig(kv_capacity_tokens=cap, block_size=16), make_latency("linear:d0=0.01,d1=1e-6"),
                    make_policy("fcfs")) for cap in (4000, 8000, 8000)]
    c = Cluster(wl, reps, make_router("llm-d"), seed=0)
    router, view = c.router, c.view
    router.reset(3, np.random.default_rng(0))
    view.waiting[:] = [2, 0, 1]
    view.kv_used[:] = [1000, 2000, 0]
    queue = np.array([0.0, 1.0, 0.5])
    kv = np.array([0.75, 0.75, 1.0])
    assert router.scores(0, view).tolist() == (queue + kv).tolist()  # nothing cached: prefix 0
    assert router.scores(1, view).tolist() == [-np.inf, 1.75, 1.5]  # 4,100 tokens do not fit replica 0
    view.kv_used[:] = [3000, 0, 0]
    assert router.scores(2, view).tolist() == (queue + np.array([0.25, 1.0, 1.0])).tolist()


def test_llm_d_breaks_ties_at_random_among_the_best_only() -> None:
    """Replicas 1 and 3 share the best score: the router draws one of them as ``rng.choice`` over
    the tied indices does; with a single best it takes it without a draw."""
    wl = _wl([0.0] * 2, [500, 500], [100, 100])
    c = _cluster(wl, 4, "llm-d")
    router, view = c.router, c.view
    picks, want = [], []
    for seed in range(12):
        router.reset(4, np.random.default_rng(seed))
        view.waiting[:] = [3, 0, 2, 0]
        picks.append(router.route(0, view))
        want.append(int(np.random.default_rng(seed).choice([1, 3])))
    assert picks == want and set(picks) == {1, 3}
    router.reset(4, np.random.default_rng(0))
    view.waiting[:] = [3, 2, 2, 0]
    assert router.route(1, view) == 3
    assert router.rng.bit_generator.state == np.random.default_rng(0).bit_generator.state  # no draw


def test_llumnix_dispatches_to_the_freest() -> None:
    wl = _wl([0.0, 0.0, 0.5], [5000, 100, 100], [400, 400, 10])
    c = _cluster(wl, 2, "llumnix", cap=20_000)
    c.run()
    # request 0 takes 5,000 prompt tokens of replica 0's freeness; request 1 goes to replica 1;
    # at 0.5 s replica 0 holds ~5,050 KV tokens for one request, replica 1 ~150: replica 1 again
    assert c.placement.tolist() == [0, 1, 1]


@pytest.mark.parametrize("refresh", [0.0, 0.1])
def test_conservation_and_log(refresh: float) -> None:
    rng = np.random.default_rng(3)
    n = 400
    wl = _wl(np.sort(rng.exponential(0.02, n).cumsum()), rng.integers(10, 3000, n), rng.integers(1, 300, n))
    c = _cluster(wl, 5, "power-of-two", "vllm-v1", refresh_s=refresh, cap=4000)
    c.run()
    s = c.summary()
    assert (c.placement >= 0).all()
    rec = c.records()
    done, rej, unfinished = (rec.state == 3), (rec.state == 4), (rec.state == 1) | (rec.state == 2)
    assert int(done.sum() + rej.sum() + unfinished.sum()) == n == s["n_arrived"]
    assert set(rec.reject_reason) == set(np.flatnonzero(rej).tolist())  # every rejection has its reason
    assert rej.sum() == np.count_nonzero(wl.prompt_tokens + wl.output_tokens > 4000)
    assert sum(r["n_arrived"] for r in s["cluster"]["replicas"]) == n
    log = c.iteration_log()
    assert set(np.unique(log["replica"]).tolist()) <= set(range(5))
    assert len(log["t_start"]) == s["iterations"] == sum(e.n_iterations for e in c.engines)
    assert np.all(np.diff(log["t_start"]) >= 0)
    t = c.request_table()
    assert np.array_equal(t["replica"], c.placement[t["id"]])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 60), k=st.integers(2, 4), seed=st.integers(0, 2**16), refresh=st.sampled_from([0.0, 0.05, 0.5]),
       router=st.sampled_from(["round-robin", "random"]), policy=st.sampled_from(["fcfs", "vllm-v1", "sarathi"]),
       grid=st.booleans())
def test_blind_router_replicas_equal_plain_engines(n, k, seed, refresh, router, policy, grid) -> None:
    """A router that ignores load places requests independently of the run, so each replica must
    equal a plain engine given the requests it received from the start (bit for bit: every
    completion time)."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.exponential(0.05, n).cumsum())
    if grid:  # arrivals on multiples of 0.01 s, on window edges (float rounding at the boundaries)
        t = np.round(t / 0.01) * 0.01
    wl = _wl(t, rng.integers(1, 600, n), rng.integers(1, 80, n))
    c = _cluster(wl, k, router, policy, refresh_s=refresh, cap=2000)
    c.run()
    for r, e in enumerate(c.engines):
        sub = wl.take(c.ids[r])
        cfg = copy.deepcopy(c.replicas[r].config)
        plain = Engine(sub, cfg, make_latency("linear:d0=0.01,d1=1e-6"), make_policy(policy), seed=_replica_seed(0, r))
        plain.run()
        for f in ("completion_s", "first_token_s", "first_scheduled_s", "state", "preemptions"):
            assert np.array_equal(getattr(plain, f), getattr(e, f), equal_nan=True), f
        assert summarize(plain) == summarize(e)


def test_every_router_runs_and_conserves() -> None:
    """Arrivals every 0.02 s in 0.05 s windows: 0.3 / 0.05 rounds below 6, so the window holding
    t = 0.3 must still be found (an endless loop once)."""
    prefix = [((i % 3, 512),) for i in range(60)]
    wl = _wl(np.arange(60) * 0.02, [600] * 60, [30] * 60, prefix)
    for name in ROUTERS:
        c = _cluster(wl, 3, name, "vllm-v1", refresh_s=0.05)
        c.run()
        s = c.summary()
        assert s["n_completed"] == 60, name
        assert sum(s["cluster"]["routed"]) == 60, name


def test_bad_input_is_one_line() -> None:
    wl = _wl([0.0], [10], [1])
    with pytest.raises(ConfigError, match=r"router: unknown 'nope'"):
        make_router("nope")
    with pytest.raises(ConfigError, match=r"router\.x: unknown parameter"):
        make_router("lor", x=1)
    with pytest.raises(ConfigError, match=r"router\.prefix: unknown value"):
        make_router("llm-d", prefix="psychic")
    with pytest.raises(ConfigError, match=r"cluster\.refresh_s"):
        _cluster(wl, 2, "lor", refresh_s=-1.0)
    with pytest.raises(ConfigError, match=r"cluster\.n_replicas"):
        make_cluster("jaillet-low", n_replicas=0)

    class Bad:
        name = "bad"

        def reset(self, n, rng):
            pass

        def route(self, rid, view):
            return 7

    with pytest.raises(ConfigError, match=r"route\(0\) returned 7"):
        _cluster(wl, 2, Bad()).run()
    for bad in (True, 1.0, "1", -1):  # a bool, a float or a string is no replica index
        Bad.route = lambda self, rid, view, bad=bad: bad
        with pytest.raises(ConfigError, match=r"route\(0\) returned .*not a replica in 0\.\.1"):
            _cluster(wl, 2, Bad()).run()
    Bad.route = lambda self, rid, view: np.int64(1)  # a NumPy integer is one
    c = _cluster(wl, 2, Bad())
    c.run()
    assert (c.placement[c.placement >= 0] == 1).all()


def test_simulate_cluster_runs_make_clusters_cluster_with_its_parameters() -> None:
    """One parameter list: simulate_cluster takes exactly make_cluster's parameters (documented in
    its docstring), by position or by name, and runs the cluster make_cluster builds."""
    import inspect

    build, run = inspect.signature(make_cluster), inspect.signature(simulate_cluster)
    assert list(run.parameters.values()) == list(build.parameters.values())
    assert run.return_annotation == "ClusterResult"
    assert all(f":param {name}:" in simulate_cluster.__doc__ for name in build.parameters)
    over = {"workload.n_requests": 40}
    by_position = simulate_cluster("jaillet-low", "fcfs", "lor", 3, 5, over)
    by_name = simulate_cluster(scenario="jaillet-low", policy="fcfs", router="lor", n_replicas=3, seed=5,
                               overrides=over)
    cluster, _ = make_cluster("jaillet-low", "fcfs", "lor", 3, 5, over)
    cluster.run()
    for got in (by_position.requests, by_name.requests):
        assert got.keys() == cluster.request_table().keys()
        for k, v in cluster.request_table().items():
            np.testing.assert_array_equal(got[k], v)
    assert by_position.summary["n_completed"] == 40
    with pytest.raises(TypeError, match="nope"):
        simulate_cluster("jaillet-low", nope=1)


def test_heterogeneous_replicas() -> None:
    """A slower GPU on replica 1: with round-robin its requests take longer."""
    r = simulate_cluster("jaillet-low", "fcfs", "round-robin", 2, seed=0, overrides={"workload.n_requests": 200},
                         refresh_s=0.0, replica_overrides={1: {"latency": "linear:d0=0.05,d1=1e-6"}})
    t = r.requests
    e2e = [float(np.mean(t["e2e_s"][t["replica"] == k])) for k in (0, 1)]
    assert e2e[1] > e2e[0]
    assert r.cluster.engines[1].latency.name.startswith("linear:d0=0.05")


@pytest.mark.parametrize("router", ["round-robin", "random"])
def test_load_blind_shortcut_equals_the_windowed_run(router: str) -> None:
    """run() routes a load-blind router's requests at once and runs each replica alone; driving
    the window-by-window generator with the same router gives the same run, request for request."""
    rng = np.random.default_rng(3)
    wl = _wl(np.sort(rng.uniform(0, 20, 300)), rng.integers(10, 2000, 300), rng.integers(1, 300, 300))
    fast = _cluster(wl, 5, router, "vllm-v1", refresh_s=0.1, cap=6_000)
    fast.run()
    slow = _cluster(wl, 5, router, "vllm-v1", refresh_s=0.1, cap=6_000)
    steps, route = slow.decisions(), slow.router.route
    try:
        rid = next(steps)
        while True:
            rid = steps.send(route(rid, slow.view))
    except StopIteration:
        pass
    a, b = fast.request_table(), slow.request_table()
    assert fast.summary()["preemptions"] > 0  # memory pressure: the replicas' runs are not trivial
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=a[k].dtype.kind == "f"), k
