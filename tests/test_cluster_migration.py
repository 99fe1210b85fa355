"""Live migration between replicas (Llumnix; llmsched_gym.core.cluster.Migration): a constructed
instance with exact migration count, transfer and finish times, bad settings, and a property:
every request finishes exactly once, with all its tokens, and no replica's KV exceeds its capacity
or leaks."""

from __future__ import annotations

import numpy as np
import pytest
from _routers import Scripted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baselines.routers import make_router
from llmsched_gym.cluster_sim import simulate_cluster
from llmsched_gym.config import ConfigError
from llmsched_gym.core.cluster import Cluster, Migration, Replica, Router
from llmsched_gym.core.engine import EngineConfig
from llmsched_gym.core.latency import make_latency
from llmsched_gym.core.request import Workload
from llmsched_gym.sim import make_policy


class ToZero(Router):
    """Everything to replica 0 (the load a migration has to undo)."""

    name = "to-zero"

    def route(self, rid, view):
        return 0


def _wl(arrival, prompt, output) -> Workload:
    return Workload(np.array(arrival, dtype=float), np.array(prompt), np.array(output))


def _cluster(wl, n, router, migration, cap=100_000, policy="fcfs", refresh_s=0.0, kv_bytes=1_953_125,
             latency="linear:d0=0.0625,d1=0") -> Cluster:
    reps = [Replica(EngineConfig(kv_capacity_tokens=cap, block_size=16, kv_bytes_per_token=kv_bytes,
                                 overflow="preempt_lifo_recompute"), make_latency(latency), make_policy(policy))
            for _ in range(n)]
    return Cluster(wl, reps, router, seed=0, refresh_s=refresh_s, migration=migration)


# Two requests of 112 prompt and 64 output tokens on replica 0 of two; every iteration takes 1/16 s
# (exact in binary). Prefill at [0, 1/16) emits token 1, then one token per iteration. At the
# migration round at t = 1.0 (16 iterations: 16 tokens each, 112 + 16 = 128 KV tokens) replica 0
# has freeness (100,000 - 2 x 128) / 2 = 49,872 and idle replica 1 100,000: the gap exceeds the
# threshold, so request 0 (the first of equal KV) moves. Its 128 tokens x 1,953,125 bytes =
# 250 MB take exactly 0.5 s at 0.5 GB/s (no base latency): it joins replica 1 at t = 1.5 and
# decodes its last 48 tokens there alone, done at 1.5 + 48/16 = 4.5; request 1 stays and is done
# at 64/16 = 4.0. At t = 2.0 both replicas run one request of equal KV: no gap, no migration.
MIG = {"interval_s": 1.0, "threshold": 100.0, "bandwidth_gb_s": 0.5, "base_s": 0.0}


def test_one_request_migrates_with_its_transfer_time_charged() -> None:
    c = _cluster(_wl([0.0, 0.0], [112, 112], [64, 64]), 2, ToZero(), MIG)
    c.run()
    assert c.migrations.tolist() == [1, 0]
    assert c.placement.tolist() == [1, 0]
    assert c.migration_log == [(1.0, 0, 0, 1, 0.5)]
    t = c.request_table()
    assert t["completion_s"].tolist() == [4.5, 4.0]
    assert t["first_token_s"].tolist() == [0.0625, 0.0625]  # the first token stays the source's
    assert t["generated"].tolist() == [64, 64]
    assert t["replica"].tolist() == [1, 0]
    assert t["migrations"].tolist() == [1, 0]
    s = c.summary()
    assert s["n_completed"] == 2
    m = s["cluster"]["migration"]
    assert (m["migrations"], m["migrated_requests"], m["transfer_s_total"]) == (1, 1, 0.5)
    assert [(r["migrated_out"], r["migrated_in"]) for r in s["cluster"]["replicas"]] == [(1, 0), (0, 1)]
    # replica 1 logs its 48 decode iterations from t = 1.5 (the request arrives running: no prefill)
    log1 = c.engines[1].iteration_log()
    assert len(log1["t_start"]) == 48 and log1["t_start"][0] == 1.5
    assert int(log1["n_prefill_tokens"].sum()) == 0
    for e in c.engines:
        assert e.kv.used_blocks == 0


def test_without_migration_both_finish_on_the_loaded_replica() -> None:
    c = _cluster(_wl([0.0, 0.0], [112, 112], [64, 64]), 2, ToZero(), None)
    c.run()
    assert c.request_table()["completion_s"].tolist() == [4.0, 4.0]
    assert c.migrations.tolist() == [0, 0] and c.migration_log == []
    assert "migration" not in c.summary()["cluster"]


def test_destination_holds_the_kv_during_the_transfer() -> None:
    """A request routed at t = 1.2, during the transfer (1.0 to 1.5), sees the destination's KV
    already holding the migrating request's 128 tokens (8 blocks of 16) though nothing runs there;
    it arrives first and the migrated request joins behind it, in arrival order."""
    rt = Scripted(lambda rid: 0 if rid < 2 else 1,  # requests 0 and 1 to replica 0, later ones to 1
                  lambda rid, view: (view.now, view.kv_used.tolist(), view.running.tolist()))
    c = _cluster(_wl([0.0, 0.0, 1.2], [112, 112, 16], [64, 64, 8]), 2, rt, MIG)
    c.run()
    assert rt.seen[2][0] == 1.2
    assert rt.seen[2][1][1] == 128 and rt.seen[2][2][1] == 0
    assert c.migration_log == [(1.0, 0, 0, 1, 0.5)]
    assert c.ids[1].tolist() == [2, 0]
    assert c.request_table()["state"].tolist() == [3, 3, 3]


def test_a_gap_below_the_threshold_moves_nothing() -> None:
    c = _cluster(_wl([0.0, 0.0], [112, 112], [64, 64]), 2, ToZero(), {**MIG, "threshold": 60_000.0})
    c.run()
    assert c.migration_log == []
    assert c.request_table()["completion_s"].tolist() == [4.0, 4.0]


def test_migration_settings_are_checked_in_one_line() -> None:
    wl = _wl([0.0], [10], [5])
    for bad, field in (({"interval_s": 0}, "interval_s"), ({"bandwidth_gb_s": -1.0}, "bandwidth_gb_s"),
                       ({"base_s": -1e-3}, "base_s"), ({"tp": 0}, "tp"), ({"threshold": "x"}, "threshold"),
                       ({"speed": 1}, "speed")):
        with pytest.raises(ConfigError, match=rf"^cluster\.migration\.{field}: "):
            _cluster(wl, 2, ToZero(), bad)
    with pytest.raises(ConfigError, match=r"^cluster\.migration: expected a mapping"):
        _cluster(wl, 2, ToZero(), 3)
    assert Migration.of({"interval_s": 0.5}).threshold == Migration.threshold


def test_simulate_cluster_takes_migration() -> None:
    r = simulate_cluster("jaillet-low", "fcfs", "round-robin", 2, seed=0, overrides={"workload.n_requests": 40},
                         migration={"interval_s": 0.5, "threshold": -1e9})
    assert r.summary["n_completed"] == 40
    assert r.summary["cluster"]["migration"]["migrations"] == len(r.cluster.migration_log) > 0
    assert int(r.requests["migrations"].sum()) == len(r.cluster.migration_log)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 25), k=st.integers(2, 4), seed=st.integers(0, 10_000),
       router=st.sampled_from(["round-robin", "lor", "random", "llumnix"]),
       refresh=st.sampled_from([0.0, 0.05]), interval=st.sampled_from([0.03, 0.1, 0.25]),
       threshold=st.sampled_from([-1e9, 0.0, 200.0]), cap=st.sampled_from([800, 3_000, 100_000]),
       policy=st.sampled_from(["fcfs", "vllm-v1"]))
def test_migration_conserves_requests_and_memory(n, k, seed, router, refresh, interval, threshold, cap, policy):
    rng = np.random.default_rng(seed)
    wl = _wl(np.sort(rng.uniform(0, 2.0, n)), rng.integers(1, 300, n), rng.integers(1, 120, n))
    mig = {"interval_s": interval, "threshold": threshold, "bandwidth_gb_s": 2.0, "base_s": 1e-3}
    c = _cluster(wl, k, make_router(router), mig, cap=cap, policy=policy, refresh_s=refresh, kv_bytes=65_536,
                 latency="linear:d0=0.01,d1=1e-6")
    c.run()
    t = c.request_table()
    done, rejected = t["state"] == 3, t["state"] == 4
    assert int(done.sum() + rejected.sum()) == n  # each request ends once: completed or rejected
    assert (t["generated"][done] == wl.output_tokens[done]).all()
    # every request has exactly one leg that is not MIGRATED, on its final replica
    legs = np.zeros(n, dtype=np.int64)
    moved = np.zeros(n, dtype=np.int64)
    for r, (e, ids) in enumerate(zip(c.engines, c.ids, strict=True)):
        live = e.state != 5
        np.add.at(legs, ids[live], 1)
        np.add.at(moved, ids[~live], 1)
        assert (c.placement[ids[live]] == r).all()
        assert e.kv.used_blocks == 0  # nothing leaked: reservations became requests that ended
        assert (e.iteration_log()["kv_used"] <= e.kv.capacity_tokens).all()
    assert (legs == 1).all()
    assert (moved == c.migrations).all()
    assert len(c.migration_log) == int(c.migrations.sum())
    last = {}
    for t0, g, s, d, dur in c.migration_log:
        assert s != d and dur > 1e-3
        assert last.get(g, s) == s and t0 >= 0  # a request leaves the replica it last went to
        last[g] = d
    for g, d in last.items():
        assert c.placement[g] == d


def test_no_request_moves_to_a_replica_past_the_horizon() -> None:
    """Replica 1 stops at its horizon (t = 0.5, before the first round at 1.0): the loaded replica
    keeps its requests, and they finish there."""
    wl = _wl([0.0, 0.0], [112, 112], [64, 64])
    reps = [Replica(EngineConfig(kv_capacity_tokens=100_000, block_size=16, kv_bytes_per_token=1_953_125,
                                 horizon_s=h), make_latency("linear:d0=0.0625,d1=0"), make_policy("fcfs"))
            for h in (None, 0.5)]
    c = Cluster(wl, reps, ToZero(), seed=0, refresh_s=0.0, migration=MIG)
    c.run()
    assert c.migration_log == []
    assert c.request_table()["completion_s"].tolist() == [4.0, 4.0]
