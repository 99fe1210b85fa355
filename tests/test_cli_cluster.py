"""``llmsched cluster run|compare|sweep`` through the CLI's ``main`` (tiny workloads), and the
sweep helpers of cluster_sim (load scaling, one cell)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from llmsched_gym.cli import main
from llmsched_gym.cluster_sim import cluster_cell, load_overrides, simulate_cluster
from llmsched_gym.config import ConfigError
from llmsched_gym.core.scenarios import get_scenario

TINY = ["--scenario", "prefix-groups-8", "--set", "workload.n_requests=40"]


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _without_wall(s: dict) -> dict:
    return {k: v for k, v in s.items() if k != "wall_time_s"}


def test_run_json_is_the_cluster_summary_with_per_replica_serving_metrics(capsys):
    rc, out, _ = _cli(capsys, "cluster", "run", *TINY, "-o", "json")
    assert rc == 0
    got = json.loads(out)
    ref = simulate_cluster("prefix-groups-8", overrides={"workload.n_requests": 40}).summary
    assert _without_wall(got) == json.loads(json.dumps(_without_wall(ref), default=float))
    c = got["cluster"]
    assert (c["n_replicas"], c["router"], c["refresh_s"]) == (8, "llm-d", 0.1)
    assert sum(c["routed"]) == 40 and len(c["replicas"]) == 8
    # every replica carries the vllm bench serve set; their completions add up to the cluster's
    assert sum(r["serving"]["completed"] for r in c["replicas"]) == got["serving"]["completed"] == 40


def test_run_flags_replace_the_scenarios_cluster(capsys, tmp_path):
    path = tmp_path / "s.json"
    rc, out, _ = _cli(capsys, "cluster", "run", *TINY, "--router", "round-robin", "--replicas", "3",
                      "--refresh-s", "0", "--json", str(path))
    assert rc == 0
    c = json.loads(path.read_text())["cluster"]
    assert (c["router"], c["n_replicas"], c["refresh_s"], c["routed"]) == ("round-robin", 3, 0.0, [14, 13, 13])
    assert c["load_imbalance"] == pytest.approx(14 / (40 / 3))
    # the table: the cluster's figures and one row per replica
    assert "TTFT P90 (ms)" in out and "per replica" in out and "load imbalance" in out
    rows = [line for line in out.splitlines() if line.startswith("│") and line.split("│")[1].strip() in "012"]
    assert [line.split("│")[2].strip() for line in rows] == ["14", "13", "13"]


@pytest.mark.parametrize("argv, message", [
    (["--router", "nearest"], "error: --router: unknown 'nearest'; allowed: random, round-robin, lor"),
    (["--router", "llm-d:w_kv=much"], "error: --router.w_kv: expected a number, got 'much'"),
    (["--replicas", "0"], "error: cluster.n_replicas: expected an integer in [1, 4,096], got 0"),
    (["--set", "cluster.refresh_s=-2"], "error: cluster.refresh_s: expected a number >= 0, got -2"),
    (["--refresh-s", "nan"], "error: --refresh-s: expected a number of seconds >= 0, got nan"),
    (["--set", "cluster.replicas.9.latency=unit"], "error: cluster.replicas.9: not a replica index; allowed: 0 .. 7"),
    (["--policy", "vtc:nope=1"], "error: --policy 'vtc:nope=1': policy.nope: unknown parameter"),
])
def test_run_bad_input_is_one_line_exit_2(capsys, argv, message):
    rc, _, err = _cli(capsys, "cluster", "run", *TINY, *argv)
    assert rc == 2 and err.startswith(message) and err.count("\n") == 1


def test_compare_pairs_routers_over_seeds(capsys):
    rc, out, _ = _cli(capsys, "cluster", "compare", *TINY, "--router", "llm-d", "--router", "random",
                      "--seeds", "0-1", "-o", "json")
    assert rc == 0
    rep = json.loads(out)
    for router in ("llm-d", "random"):
        want = [simulate_cluster("prefix-groups-8", router=router, seed=s,
                                 overrides={"workload.n_requests": 40}).summary["serving"]["p90_ttft_ms"] for s in (0, 1)]
        assert rep["routers"][router]["serving.p90_ttft_ms"]["values"] == pytest.approx(want)
        assert rep["routers"][router]["serving.p90_ttft_ms"]["mean"] == pytest.approx(np.mean(want))
    best = rep["best"]
    other = "random" if best == "llm-d" else "llm-d"
    vals = {r: rep["routers"][r]["serving.p90_ttft_ms"]["values"] for r in ("llm-d", "random")}
    assert np.mean(vals[best]) <= np.mean(vals[other])
    assert rep["routers"][best]["vs_best"]["rel"] == 0
    rel = np.mean([(x - y) / y for x, y in zip(vals[other], vals[best], strict=True)])
    assert rep["routers"][other]["vs_best"]["rel"] == pytest.approx(rel)


def test_compare_needs_two_routers_and_distinct_ones(capsys):
    rc, _, err = _cli(capsys, "cluster", "compare", *TINY, "--router", "lor")
    assert rc == 2 and err.startswith("error: --router: compare needs at least two routers")
    rc, _, err = _cli(capsys, "cluster", "compare", *TINY, "--router", "lor", "--router", "lor")
    assert rc == 2 and err.startswith("error: --router: 'lor' is given twice")


def test_load_overrides_scale_a_rate_or_a_trace():
    assert load_overrides(get_scenario("prefix-groups-8"), 2.0) == {"workload.arrival.rate": 60.0}
    assert load_overrides(get_scenario("mooncake-conv-8"), 2.0) == {"workload.trace.time_scale": 0.5}
    assert load_overrides(get_scenario("mooncake-conv-8", {"workload.trace.time_scale": 3}), 1.5) == \
        {"workload.trace.time_scale": 2.0}
    assert load_overrides(get_scenario("prefix-groups-8"), 1) == {}
    with pytest.raises(ConfigError, match=r"^loads: scenario 'klpm-toy' has no workload.arrival.rate or trace"):
        load_overrides(get_scenario("klpm-toy"), 2.0)
    with pytest.raises(ConfigError, match="^loads: expected numbers > 0"):
        load_overrides(get_scenario("prefix-groups-8"), -1.0)


def test_a_sweep_cell_is_the_cluster_run_at_that_load():
    row = cluster_cell(("prefix-groups-8", None, "lor", 2, 0.0, 0.5, 3, {"workload.n_requests": 30}))
    s = simulate_cluster("prefix-groups-8", router="lor", n_replicas=2, seed=3, refresh_s=0.0,
                         overrides={"workload.n_requests": 30, "workload.arrival.rate": 15.0}).summary
    assert (row["router"], row["n_replicas"], row["load"], row["seed"]) == ("lor", 2, 0.5, 3)
    assert row["serving.p90_ttft_ms"] == s["serving"]["p90_ttft_ms"]
    assert row["cluster.prefix_hit_rate"] == s["cluster"]["prefix_hit_rate"]


def _sweep(capsys, tmp_path, *extra: str) -> list[dict]:
    out = tmp_path / "sweep"
    rc, text, _ = _cli(capsys, "cluster", "sweep", *TINY, "--router", "round-robin", "--router", "llm-d",
                       "--replicas", "1,2", "--loads", "0.5,1", "--seeds", "4", "--out", str(out), *extra)
    assert rc == 0 and "cluster sweep on prefix-groups-8" in text
    rows = list(csv.DictReader((out / "sweep.csv").open()))
    assert json.loads((out / "sweep.json").read_text())["routers"] == ["round-robin", "llm-d"]
    return rows


def test_sweep_local_covers_every_combination(capsys, tmp_path):
    rows = _sweep(capsys, tmp_path)
    assert [(r["n_replicas"], r["router"], r["load"]) for r in rows] == [
        (n, rt, load) for n in ("1", "2") for rt in ("round-robin", "llm-d") for load in ("0.5", "1.0")]
    one = [r for r in rows if r["n_replicas"] == "1"]  # one replica: the router has no choice
    assert one[0]["serving.p90_ttft_ms"] == one[2]["serving.p90_ttft_ms"]
    assert all(r["n_completed"] == "40" for r in rows)


def test_sweep_on_ray_gives_the_local_rows(capsys, tmp_path, ray_local):
    local = _sweep(capsys, tmp_path / "local")
    ray = _sweep(capsys, tmp_path / "ray", "--backend", "ray")
    assert ray == local
