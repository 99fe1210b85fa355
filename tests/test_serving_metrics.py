"""``summary["serving"]``: the run's figures under ``vllm bench serve``'s names and units."""
from __future__ import annotations

import math

import numpy as np
import pytest

from baselines import make_policy
from llmsched_gym.core.engine import Engine, EngineConfig
from llmsched_gym.core.latency import UnitLatency
from llmsched_gym.core.metrics import SERVING_LATENCIES, _ms_stats, summarize
from llmsched_gym.core.request import Workload
from llmsched_gym.sim import simulate


def test_unit_latency_instance_gives_exact_figures():
    # two requests at t=0, prompts 4 and 6, outputs 3 and 5; every iteration takes 1 s and memory
    # never binds, so both start together and every gap between two tokens is one iteration
    wl = Workload(arrival_s=[0.0, 0.0], prompt_tokens=[4, 6], output_tokens=[3, 5])
    e = Engine(wl, EngineConfig(kv_capacity_tokens=1000), UnitLatency(), make_policy("fcfs"), seed=0)
    e.run()
    s = summarize(e, "t", "fcfs")
    v = s["serving"]
    ttft = e.first_token_s - wl.arrival_s
    e2e = e.completion_s - wl.arrival_s
    assert v["completed"] == 2 and v["total_input_tokens"] == 10 and v["total_output_tokens"] == 8
    assert v["duration"] == pytest.approx(e.clock)
    assert v["request_throughput"] == pytest.approx(2 / e.clock)
    assert v["output_throughput"] == pytest.approx(8 / e.clock)
    assert v["total_token_throughput"] == pytest.approx(18 / e.clock)
    assert v["mean_ttft_ms"] == pytest.approx(1e3 * ttft.mean())
    assert v["mean_e2el_ms"] == pytest.approx(1e3 * e2e.mean())
    assert v["median_e2el_ms"] == pytest.approx(1e3 * np.median(e2e))
    assert v["std_e2el_ms"] == pytest.approx(1e3 * e2e.std())
    # one token per one-second iteration after the first: TPOT and every ITL are exactly 1,000 ms
    for k in ("mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms"):
        assert v[k] == pytest.approx(1000.0), k
    assert v["std_itl_ms"] == pytest.approx(0.0) and v["std_tpot_ms"] == pytest.approx(0.0)
    assert "request_goodput" not in v  # no SLOs in this workload


def test_mean_itl_is_the_decode_time_over_the_gaps():
    wl = Workload(arrival_s=[0.0, 0.0], prompt_tokens=[10, 10], output_tokens=[5, 5])
    e = Engine(wl, EngineConfig(kv_capacity_tokens=1000), UnitLatency(), make_policy("fcfs"), seed=0)
    e.run()
    v = summarize(e)["serving"]
    decode = (e.completion_s - e.first_token_s).sum()
    assert v["mean_itl_ms"] == pytest.approx(1e3 * decode / 8)


def test_weighted_percentiles_count_each_value_its_weight():
    x = np.array([0.003, 0.001, 0.002])
    w = np.array([1, 97, 2])  # 97 gaps of 1 ms, 2 of 2 ms, 1 of 3 ms
    r = _ms_stats("itl", x, w)
    assert r["median_itl_ms"] == pytest.approx(1.0)
    assert r["p99_itl_ms"] == pytest.approx(2.0)
    assert r["mean_itl_ms"] == pytest.approx((97 * 1 + 2 * 2 + 3) / 100)
    assert math.isnan(_ms_stats("itl", np.array([]))["mean_itl_ms"])


@pytest.mark.parametrize("scenario", ["azure-conv", "jaillet-low", "echo-hybrid"])
def test_serving_block_agrees_with_the_summary(scenario):
    over = {"workload.n_requests": 60}
    if scenario == "echo-hybrid":
        over.update({"workload.classes.offline.n_requests": 60, "engine.horizon_s": 10.0})
    s = simulate(scenario, "fcfs", 1, over).summary
    v = s["serving"]
    for ours, theirs in (("e2e_s", "e2el"), ("ttft_s", "ttft"), ("tpot_s", "tpot")):
        assert v[f"mean_{theirs}_ms"] == pytest.approx(1e3 * s[ours]["mean"])
        assert v[f"median_{theirs}_ms"] == pytest.approx(1e3 * s[ours]["p50"])
        assert v[f"p99_{theirs}_ms"] == pytest.approx(1e3 * s[ours]["p99"])
    assert v["completed"] == s["n_completed"]
    assert set(SERVING_LATENCIES) == {"ttft", "tpot", "itl", "e2el"}
    if "goodput_requests_per_s" in s:
        assert v["request_goodput"] == s["goodput_requests_per_s"]
