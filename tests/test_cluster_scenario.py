"""A scenario's ``cluster:`` section (config.check_cluster, cluster_sim.cluster_settings), the
``sessions`` prefix workload and the cluster scenarios mooncake-conv-8 and prefix-groups-8."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from llmsched_gym.cluster_sim import cluster_settings, make_cluster, simulate_cluster
from llmsched_gym.config import ConfigError, check_cluster
from llmsched_gym.core.scenarios import get_scenario
from llmsched_gym.core.sessions import prefix_groups
from llmsched_gym.core.workload import build_workload
from llmsched_gym.sim import simulate

SMALL = {"workload.n_requests": 40}


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as e:
        fn(*args, **kwargs)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# ---------------------------------------------------------------------------------------------
# the schema


def test_check_cluster_merges_integer_and_digit_keys_of_one_replica():
    out = check_cluster({"n_replicas": 3, "replicas": {2: {"latency": "unit"}, "2": {"policy": "sjf"},
                                                       "0": {"engine": {"kv_capacity_tokens": 1e4}}}})
    assert out == {"n_replicas": 3, "replicas": {0: {"engine": {"kv_capacity_tokens": 10000}},
                                                 2: {"latency": "unit", "policy": "sjf"}}}


@pytest.mark.parametrize("section, message", [
    ({"n_replicas": 0}, "cluster.n_replicas: expected an integer in [1, 4,096], got 0"),
    ({"n_replicas": 2.5}, "cluster.n_replicas: expected an integer in [1, 4,096], got 2.5"),
    ({"routr": "lor"}, "cluster.routr: unknown field; allowed: n_replicas, router, router_params, refresh_s, replicas, migration, pools, transfer, decider"),
    ({"refresh_s": -1}, "cluster.refresh_s: expected a number >= 0, got -1"),
    ({"n_replicas": 2, "replicas": {2: {}}}, "cluster.replicas.2: not a replica index; allowed: 0 .. 1 "
                                             "(cluster.n_replicas is 2)"),
    ({"replicas": {"x": {}}}, "cluster.replicas.x: not a replica index; allowed: 0 .. 0 (cluster.n_replicas is 1)"),
    ({"n_replicas": 2, "replicas": {1: {"gpu": "a100"}}},
     "cluster.replicas.1.gpu: unknown field; allowed: policy, latency, engine"),
    ({"n_replicas": 2, "replicas": {1: {"engine": {"block_size": 0}}}},
     "cluster.replicas.1.engine.block_size: expected an integer >= 1, got 0"),
    ("eight", "cluster: expected a mapping of n_replicas, router, router_params, refresh_s, replicas, migration, "
     "pools, transfer, decider, got 'eight'"),
])
def test_bad_cluster_section_is_one_line_naming_the_field(section, message):
    assert _message(check_cluster, section) == message


def test_a_scenario_override_reaches_the_cluster_section():
    spec = get_scenario("mooncake-conv-8", {"cluster.n_replicas": 4, "cluster.replicas.3.latency": "unit"})
    assert spec["cluster"] == {"n_replicas": 4, "router": "llm-d", "refresh_s": 0.1, "replicas": {3: {"latency": "unit"}}}
    assert _message(get_scenario, "mooncake-conv-8", {"cluster.n_replicas": "many"}).startswith(
        "cluster.n_replicas: expected an integer")


# ---------------------------------------------------------------------------------------------
# what a run builds from it


def test_arguments_override_the_section_and_a_router_spec_carries_its_parameters():
    spec = get_scenario("mooncake-conv-8")
    c = cluster_settings(spec)
    assert (c["n_replicas"], c["router"], c["router_params"], c["refresh_s"]) == (8, "llm-d", {}, 0.1)
    c = cluster_settings(spec, router="llm-d:prefix=approximate,w_queue=2", n_replicas=3, refresh_s=0,
                         router_params={"w_kv": 0.5})
    assert (c["n_replicas"], c["router"], c["refresh_s"]) == (3, "llm-d", 0)
    assert c["router_params"] == {"prefix": "approximate", "w_queue": 2, "w_kv": 0.5}
    # a router given as an argument replaces the scenario's parameters with its own
    spec2 = get_scenario("mooncake-conv-8", {"cluster.router_params": {"w_queue": 3.0}})
    assert cluster_settings(spec2)["router_params"] == {"w_queue": 3.0}
    assert cluster_settings(spec2, router="lor")["router_params"] == {}
    assert cluster_settings(get_scenario("jaillet-low"))["n_replicas"] == 1  # no section: one replica


def test_router_errors_name_the_scenario_field():
    over = {**SMALL, "cluster.router": "llm-d:w_queue=heavy"}
    assert _message(make_cluster, "mooncake-conv-8", overrides=over) == \
        "cluster.router.w_queue: expected a number, got 'heavy'"
    over = {**SMALL, "cluster.router": "nearest"}
    assert _message(make_cluster, "mooncake-conv-8", overrides=over).startswith(
        "cluster.router: unknown 'nearest'; allowed: random, round-robin, lor")
    over = {**SMALL, "cluster.router_params": {"depth": 3}}
    assert _message(make_cluster, "mooncake-conv-8", overrides=over).startswith(
        "cluster.router.depth: unknown parameter of 'llm-d'")


def test_the_section_builds_the_cluster_it_declares():
    over = {**SMALL, "cluster.router": "llm-d:prefix=approximate", "cluster.n_replicas": 3,
            "cluster.replicas": {1: {"engine": {"kv_capacity_tokens": 200000}, "latency": "roofline:llama-3.1-8b/a100",
                                     "policy": "sarathi"}}}
    cluster, spec = make_cluster("mooncake-conv-8", overrides=over)
    assert len(cluster.engines) == 3 and cluster.router.name == "llm-d" and cluster.router.prefix == "approximate"
    caps = [e.config.kv_capacity_tokens for e in cluster.engines]
    assert caps == [447952, 200000, 447952]
    assert [e.latency.name for e in cluster.engines] == ["roofline:llama-3.1-8b/h100", "roofline:llama-3.1-8b/a100-80gb",
                                                         "roofline:llama-3.1-8b/h100"]
    assert [e.scheduler.name for e in cluster.engines] == ["vllm-v1", "sarathi", "vllm-v1"]
    assert cluster.refresh_s == 0.1 and spec["cluster"]["n_replicas"] == 3


def test_one_replica_section_is_the_plain_engine():
    over = {"workload.n_requests": 120, "cluster.n_replicas": 1, "cluster.router": "lor"}
    plain = simulate("jaillet-low", "sarathi", 3, {"workload.n_requests": 120}).summary
    one = simulate("jaillet-low", "sarathi", 3, over).summary  # n_replicas 1: the one-engine paths run it
    clus = simulate_cluster("jaillet-low", "sarathi", seed=3, overrides=over).summary
    for s in (one, clus):
        assert {k: v for k, v in s.items() if k not in ("wall_time_s", "cluster")} == \
            {k: v for k, v in plain.items() if k != "wall_time_s"}
    assert clus["cluster"]["n_replicas"] == 1 and clus["cluster"]["router"] == "lor"


def test_one_engine_paths_refuse_a_cluster_scenario():
    msg = _message(simulate, "mooncake-conv-8", overrides=SMALL)
    assert msg.startswith("cluster.n_replicas: this scenario declares a cluster of 8 replicas")
    assert "llmsched cluster run" in msg
    import gymnasium as gym

    with pytest.raises(ConfigError, match="^cluster.n_replicas: "):
        gym.make("llmsched_gym:LLMSched-v1", scenario="prefix-groups-8", overrides=SMALL).reset(seed=0)
    # one replica with an override of its own is not the scenario's engine either
    over = {**SMALL, "cluster.n_replicas": 1, "cluster.replicas": {0: {"latency": "unit"}}}
    assert _message(simulate, "mooncake-conv-8", overrides=over).startswith("cluster.n_replicas:")


# ---------------------------------------------------------------------------------------------
# the sessions workload and the scenarios


def test_sessions_prefix_is_prefix_groups_with_the_builders_stream():
    spec = {"n_requests": 50, "arrival": {"type": "poisson", "rate": 4.0},
            "prefix": {"type": "sessions", "groups": 5, "tokens": 300, "question_tokens": 40, "output_tokens": 12,
                       "turns": 3, "think_s": 2.0, "length_cv": 0.5}}
    wl = build_workload(spec, 7)
    ref = prefix_groups(50, 4.0, 5, 300, 40, 12, turns=3, think_s=2.0, length_cv=0.5,
                        rng=np.random.default_rng([7, zlib.crc32(b"prefix")]))
    for f in ("arrival_s", "prompt_tokens", "output_tokens"):
        np.testing.assert_array_equal(getattr(wl, f), getattr(ref, f))
    assert wl.prefix == ref.prefix
    # the first turn of every session starts with one of the 5 system prompts, ids 0..4
    assert {p[0] for p in wl.prefix} <= {(g, 300) for g in range(5)}
    cut = build_workload({**spec, "horizon_s": 5.0}, 7)
    assert len(cut) == int((wl.arrival_s < 5.0).sum())


@pytest.mark.parametrize("extra, message", [
    ({"arrival": {"type": "gamma", "rate": 4.0, "cv": 2.0}},
     "arrival.type: prefix type 'sessions' starts sessions as a Poisson process; allowed: poisson, got 'gamma'"),
    ({"prompt": {"type": "fixed", "value": 10}},
     "prompt: not allowed with prefix type 'sessions' (question_tokens and output_tokens set the lengths)"),
    ({"n_requests": None}, "n_requests: required with prefix type 'sessions'"),
    ({"prefix": {"type": "sessions", "groups": 0, "tokens": 1, "question_tokens": 1, "output_tokens": 1}},
     "prefix.groups: expected an integer >= 1, got 0"),
    ({"prefix": {"type": "sessions", "groups": 2, "tokens": 1, "question_tokens": 1}},
     "prefix.output_tokens: required for type 'sessions'"),
])
def test_bad_sessions_spec_is_one_line(extra, message):
    from llmsched_gym.core.request import WorkloadError

    spec = {"n_requests": 10, "arrival": {"type": "poisson", "rate": 4.0},
            "prefix": {"type": "sessions", "groups": 2, "tokens": 30, "question_tokens": 4, "output_tokens": 2}}
    spec = {k: v for k, v in {**spec, **extra}.items() if v is not None}
    with pytest.raises(WorkloadError) as e:
        build_workload(spec, 0)
    assert str(e.value) == message


def test_prefix_groups_8_reproduces_llmd_ordering_on_a_small_cut():
    """llm-d's published ordering on its benchmark's shape (P90 TTFT 0.54 s precise vs 93-95 s
    load-aware or random at 60 QPS): precise prefix scoring keeps each group on few pods."""
    res = {r: simulate_cluster("prefix-groups-8", router=r, overrides={"workload.n_requests": 600}).summary
           for r in ("llm-d", "random")}
    assert res["llm-d"]["ttft_s"]["p90"] < 0.25 * res["random"]["ttft_s"]["p90"]
    assert res["llm-d"]["cluster"]["prefix_hit_rate"] > 2 * res["random"]["cluster"]["prefix_hit_rate"]
    assert all(s["n_completed"] == 600 and s["cluster"]["n_replicas"] == 8 for s in res.values())


# ---------------------------------------------------------------------------------------------
# docs/cluster.md agrees with the code


def _doc() -> str:
    from pathlib import Path

    return (Path(__file__).resolve().parents[1] / "docs" / "cluster.md").read_text()


def test_the_router_table_lists_every_router_with_its_defaults():
    from baselines.routers import ROUTERS, make_router

    rows = [line.split("|") for line in _doc().splitlines() if line.startswith("| `")]
    names = [r[1].strip().strip("`") for r in rows]
    assert names == list(ROUTERS)
    for r in rows:
        router = make_router(r[1].strip().strip("`"))
        for item in filter(None, (x.strip() for x in r[4].strip().strip("`").split(","))):
            key, value = (x.strip() for x in item.split("="))
            assert str(getattr(router, key)) in (value, value + ".0"), (router.name, key)


def test_the_documented_cluster_section_and_sessions_workload_check():
    from llmsched_gym.config import yaml_load

    blocks = _doc().split("```yaml\n")[1:3]
    section = yaml_load(blocks[0].split("```")[0])["cluster"]
    assert check_cluster(section)["replicas"][7]["policy"] == "sarathi"
    wl = build_workload({**yaml_load(blocks[1].split("```")[0])["workload"], "n_requests": 30}, 0)
    assert len(wl) == 30 and {p[0][1] for p in wl.prefix} == {6000}


def test_the_migration_key_passes_llumnix_migration_to_the_cluster():
    from llmsched_gym.core.cluster import Migration

    over = {"workload.n_requests": 200, "cluster.n_replicas": 4, "cluster.router": "llumnix"}
    mig = {"interval_s": 0.05, "threshold": 10}
    a = simulate_cluster("prefix-groups-8", overrides={**over, "cluster.migration": mig})
    b = simulate_cluster("prefix-groups-8", overrides=over, migration=Migration(**mig))
    assert a.summary["cluster"]["migration"]["migrations"] == b.summary["cluster"]["migration"]["migrations"] > 0
    assert {k: v for k, v in a.summary.items() if k != "wall_time_s"} == \
        {k: v for k, v in b.summary.items() if k != "wall_time_s"}
    c, _ = make_cluster("prefix-groups-8", overrides={**over, "cluster.migration": None})
    assert c.migration is None  # null: none, as without the key
    assert check_cluster({"migration": None}) == {"migration": None}
    assert _message(make_cluster, "prefix-groups-8", overrides={**over, "cluster.migration.every": 1}).startswith(
        "cluster.migration.every: unknown setting (allowed: interval_s, threshold")
