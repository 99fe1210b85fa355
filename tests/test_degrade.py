"""Valid configurations never abort: a registered policy whose plan would overflow under ``forbid``
degrades (fewer admissions, then LIFO preemption) instead of ending the run with a PlanError, and a
request that cannot fit even alone is rejected with its reason.

* The configurations reported to abort run to the end with every request accounted for and the KV
  within capacity at every iteration.
* The ledger's ``shortfall``, which the plan repair asks, is tested against the engine in
  ``tests/test_ledger.py``.
* A plan that fits passes unchanged (the same object), so runs that never overflow are unchanged.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from llmsched_gym.sim import simulate

ABORTED = [  # (scenario, policy, seed, overrides): each ended in a PlanError before
    ("jaillet-high", "fcfs", 0, {"workload.n_requests": 500}),
    ("jaillet-low", "fcfs", 0, {"workload.n_requests": 2400, "engine.kv_capacity_tokens": 1000}),
    ("azure-conv", "echo-bs-e", 692495, {"workload.n_requests": 121, "engine.kv_capacity_tokens": 5939,
                                         "engine.block_size": 32, "engine.preempt_mode": "swap"}),
    ("jaillet-noisy", "vtc-oracle", 23526, {"workload.n_requests": 236, "engine.kv_capacity_tokens": 8246,
                                            "engine.overflow": "forbid",  # vtc-oracle needs the true lengths
                                            "workload.predictor": {"type": "oracle"}}),
]


@pytest.mark.parametrize("scenario, policy, seed, overrides", ABORTED)
def test_configurations_that_aborted_run_to_the_end(scenario, policy, seed, overrides):
    r = simulate(scenario, policy, seed, overrides)
    s = r.summary
    assert not s["non_terminating"]
    assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] == overrides["workload.n_requests"]
    assert r.engine.config.overflow == "forbid"
    assert (r.iterations["kv_used"] <= r.iterations["kv_capacity"]).all()
    assert set(r.engine.reject_reason) == set(np.flatnonzero(r.engine.state == 4).tolist())


def test_oversize_requests_are_rejected_with_the_reason_and_the_rest_served():
    r = simulate("jaillet-low", "fcfs", 0, {"workload.n_requests": 2400, "engine.kv_capacity_tokens": 1000})
    e = r.engine
    assert r.summary["n_rejected"] == 14
    for rid, why in e.reject_reason.items():
        need = int(e.workload.prompt_tokens[rid] + e.workload.output_tokens[rid])
        assert need > 1000 and why.startswith(f"needs {need} tokens of KV")


def test_a_tiny_capacity_serves_the_requests_that_fit_and_rejects_the_rest(capsys, tmp_path):
    from llmsched_gym.cli import main

    out = tmp_path / "s.json"
    assert main(["run", "--scenario", "jaillet-low", "--set", "engine.kv_capacity_tokens=50", "--set",
                 "workload.n_requests=100", "--quiet", "--json", str(out)]) == 0
    s = json.loads(out.read_text())
    assert s["n_arrived"] == 100 == s["n_rejected"] + s["n_completed"] and s["n_rejected"] > 0 < s["n_completed"]
    assert not s["non_terminating"]


@pytest.mark.parametrize("policy, params", [("fcfs", {"admission": "reserve"}), ("lpm", {}), ("k-lpm", {}),
                                            ("sglang-lpm", {}), ("lpm", {"max_batch": 2})])
def test_an_idle_engine_starts_a_head_whose_reservation_exceeds_the_capacity(policy, params):
    """Predicted outputs longer than the true ones: requests 14 and 43 fit (112 and 108 of 119
    tokens) but reserve 130; with nothing running they waited forever (found by the fuzzer)."""
    r = simulate("jaillet-noisy", policy, 247, {"workload.n_requests": 63, "engine.kv_capacity_tokens": 119,
                                                 "engine.latency_noise_cv": 0.3, "engine.stall_iterations": 3000},
                 policy_params=params)
    s = r.summary
    assert not s["non_terminating"] and s["n_unfinished"] == 0
    assert s["n_completed"] == 42 and s["n_rejected"] == 21
    assert (r.iterations["kv_used"] <= r.iterations["kv_capacity"]).all()
