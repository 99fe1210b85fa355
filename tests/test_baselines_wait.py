"""Ao et al. 2025: FCFS-greedy-LIFO, WAIT and Nested WAIT (sections 2.4, 4 and 5)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from baselines import PolicyError, make_policy
from baselines.nested_wait import segment_boundaries
from llmsched_gym.core.scheduler import BatchPlan
from llmsched_gym.reproduce.wait import (
    EXAMPLE2_LATENCY,
    completions_per_iteration,
    example2,
    paper_start,
    poisson,
)
from llmsched_gym.sim import make_engine, simulate


def run_plans(scenario: dict, policy):
    engine, _ = make_engine(scenario, policy, seed=0, log_batches=True)
    sched, view = engine.scheduler, engine.view
    steps: list[tuple[float, BatchPlan]] = []
    while engine.poll():
        plan = sched.schedule(view)
        steps.append((engine.clock, plan))
        engine.execute(plan)
    return engine, steps


# ---- Example 2: FCFS-greedy-LIFO vs WAIT ------------------------------------------------------
def test_fcfs_greedy_lifo_replays_example2_and_loses_12_to_25_percent():
    r = simulate(paper_start(300.0), "fcfs-greedy-lifo", seed=0)
    per = completions_per_iteration(r)
    # engine iteration 0 prefills the 3 "stage 1" prompts; the paper's iterations 1, 2, 3 follow
    assert per[1:4].tolist() == [3, 4, 3]
    assert np.all(per[4:-1] == 3)  # the eviction-restart cycle persists
    loss = 1 - per[1:-1].mean() / 4
    assert 0.12 <= loss <= 0.25
    assert r.summary["preemptions"] > 200


def test_fcfs_greedy_lifo_evicts_the_two_newest_decode_prompts_in_iteration_2():
    _, steps = run_plans(paper_start(5.0), "fcfs-greedy-lifo")
    # paper iteration 2 (t = 1.55): 4 new prompts prefill, 2 of the 6 decode prompts are evicted,
    # the most recently admitted ones (ids 7 and 8 of the 6 admitted in iteration 1: 3..8)
    t, plan = next((t, p) for t, p in steps if p.preempt)
    assert t == pytest.approx(1.55)
    assert plan.preempt == [8, 7]
    assert sorted(plan.prefill) == [9, 10, 11, 12]


def test_fcfs_greedy_lifo_loses_throughput_under_poisson_arrivals():
    for seed in (0, 1):
        r = simulate(poisson(1000.0), "fcfs-greedy-lifo", seed=seed)
        s = r.summary
        per_iteration = s["n_completed"] / s["iterations"]
        assert per_iteration < 0.88 * 4  # at least 12 % below the equilibrium
        assert s["preemptions"] > 0 and s["n_unfinished"] > 100  # the backlog grows


def test_wait_at_the_equilibrium_thresholds_loses_no_throughput_in_example2():
    r = simulate(paper_start(300.0), {"name": "wait", "thresholds": [4]}, seed=0)
    per = completions_per_iteration(r)
    assert np.all(per[1:-1] == 4)
    assert r.summary["preemptions"] == 0 and r.summary["overflow_events"] == 0
    for seed in (0, 1):
        r = simulate(poisson(2000.0), {"name": "wait", "thresholds": [4]}, seed=seed)
        s = r.summary
        assert s["preemptions"] == 0 and s["kv_peak_frac"] <= 1.0
        assert s["n_completed"] / s["iterations"] >= 3.99
        assert s["n_completed"] >= 0.98 * s["n_arrived"]  # zero drift: O(sqrt T) backlog only


def wait_peak(types, n, emits: bool) -> int:
    """M^pi in the engine's accounting: n_j prompts at every stage, each holding its KV after
    the iteration (prompt + tokens produced), summed over the stages of each type."""
    total = 0
    for (_, prompt, lp), nj in zip(types, n, strict=True):
        stages = range(1, lp + 1) if emits else range(0, lp + 1)
        total += nj * sum(prompt + s for s in stages)
    return total


@given(
    st.lists(st.tuples(st.integers(1, 8), st.integers(1, 6), st.integers(1, 6), st.integers(1, 3)),
             min_size=1, max_size=3),
    st.booleans(),
    st.integers(0, 5),
)
def test_wait_never_evicts_when_m_pi_is_at_most_c(spec, emits, seed):
    types = [(rate, prompt, lp) for rate, prompt, lp, _ in spec]
    n = [nj for *_, nj in spec]
    cap = wait_peak(types, n, emits)
    sc = {"name": "h", "workload": {"types": [{"rate": r, "prompt": p, "output": lp} for r, p, lp in types],
                                    "n_requests": 40},
          "engine": {"kv_capacity_tokens": cap, "block_size": 1, "prefill_emits_token": emits},
          "latency": EXAMPLE2_LATENCY}
    r = simulate(sc, {"name": "wait", "thresholds": n}, seed=seed)
    s = r.summary
    assert s["preemptions"] == 0
    assert s["n_completed"] == s["n_arrived"] == 40
    assert s["kv_peak_frac"] * s["kv_capacity_tokens"] <= cap


# ---- WAIT threshold recipes ------------------------------------------------------------------
def thresholds(scenario, policy: dict, overrides=None) -> list[int]:
    engine, _ = make_engine(scenario, policy, seed=0, overrides=overrides)
    return engine.scheduler.thresholds_for(engine.view)


def test_wait_fluid_recipe_gives_the_equilibrium_thresholds_on_example2():
    sc = poisson(50.0)
    assert thresholds(sc, {"name": "wait", "rates": [4.0]}) == [4]  # c = DeltaT* = 1, n = c lambda
    assert thresholds(sc, {"name": "wait", "rates": [4.0], "c": 1.5}) == [6]


def test_wait_fluid_recipe_fills_the_memory_when_overloaded():
    # wait-high: C = 483,328 < M* (d1 A >> 1 on the A100 roofline): c = C / A, n = floor(c lambda),
    # A counting the partly filled last 16-token block of every prompt at every stage:
    # A = 6000 (101 * 70 + 15 * 101) + 4000 (201 * 120 + 15 * 201) + 2000 (301 * 170 + 15 * 301)
    n = thresholds("wait-high", {"name": "wait", "rates": [6000, 4000, 2000]}, {"workload.n_requests": 50})
    assert n == [10, 7, 3]
    # token-level KV: the paper's A = 2.4124e8, c = 0.0020035
    n = thresholds("wait-high", {"name": "wait", "rates": [6000, 4000, 2000]},
                   {"workload.n_requests": 50, "engine.block_size": 1})
    assert n == [12, 8, 4]


def test_wait_practical_rules_follow_section_6_1():
    sc = example2({"types": [{"rate": 1000, "prompt": 10, "output": 10}, {"rate": 1000, "prompt": 10, "output": 20}],
                   "n_requests": 50})
    sc["engine"]["kv_capacity_tokens"] = 10_000
    common = {"name": "wait", "rates": [1000, 1000], "batch_size": 600}
    # companion code: B lambda_j / sum lambda (l' + 1) = 600 * 1000 / 32000 = 18.75
    assert thresholds(sc, {**common, "rule": "practical"}) == [18, 18]
    # the paper's formula as printed: B rho_j / (l'_j + 1) = 300 / 11, 300 / 21
    assert thresholds(sc, {**common, "rule": "practical_literal"}) == [27, 14]


# ---- Nested WAIT ----------------------------------------------------------------------------
FIG6 = {"name": "fig6", "workload": {"explicit": {
    "arrival_s": [0, 0, 1, 5, 5, 7, 7, 14, 14], "prompt_tokens": [1] * 9,
    "output_tokens": [1, 1, 2, 1, 2, 2, 1, 1, 1]}},
    "engine": {"kv_capacity_tokens": 100, "block_size": 1, "prefill_emits_token": True, "overflow": "forbid"},
    "latency": "unit"}


def test_nested_wait_reproduces_the_fig6_walkthrough():
    # segment 1 = the prefill (threshold 3), segment 2 = token 2 (threshold 2); "Hi" / "Hi there!"
    engine, steps = run_plans(FIG6, {"name": "nested-wait", "thresholds": [3, 2], "boundaries": [1, 2]})
    batches = {float(t): b for t, b in zip(engine.iteration_log()["t_start"], engine.batches, strict=True)}
    assert sorted(batches) == [1.0, 7.0, 14.0, 15.0]
    # below segment 1's threshold nothing runs (t = 0, 5 and after each batch), not even P3
    assert [t for t, p in steps if p.idle] == [0.0, 2.0, 5.0, 8.0]
    # t = 1: P1-P3 arrive -> segment 1 runs
    assert [r for r, _, _ in batches[1.0]["prefill"]] == [0, 1, 2] and batches[1.0]["decode"] == []
    # t = 7: segment 1 runs (P4-P6); P3 is in segment 2 but alone, below its threshold: paused
    assert [r for r, _, _ in batches[7.0]["prefill"]] == [3, 4, 5] and batches[7.0]["decode"] == []
    assert 2 in steps[[t for t, _ in steps].index(7.0)][1].pause
    # t = 14: segment 2 holds P3, P5, P6 -> both segments run
    assert [r for r, _, _ in batches[14.0]["prefill"]] == [6, 7, 8]
    assert [r for r, _ in batches[14.0]["decode"]] == [2, 4]
    # then the queue drains (no arrival left): P6 finishes, nothing is dropped
    assert [r for r, _ in batches[15.0]["decode"]] == [5]
    assert engine.n_completed == 9


def test_nested_wait_classifies_by_tokens_generated_not_by_predictions():
    wl = dict(FIG6["workload"]["explicit"])
    blind = {**FIG6, "workload": {"explicit": {**wl, "predicted_output": [1] * 9}}}
    policy = {"name": "nested-wait", "thresholds": [3, 2], "boundaries": [1, 2]}
    a = simulate(FIG6, policy, seed=0).requests["completion_s"]
    b = simulate(blind, policy, seed=0).requests["completion_s"]
    assert np.array_equal(a, b)


def test_nested_wait_ratio_thresholds_follow_the_tail_rates_on_synth4():
    engine, _ = make_engine("nested-synth4", {"name": "nested-wait", "batch_size": 0}, seed=0,
                            overrides={"workload.n_requests": 4000})
    pol = engine.scheduler
    pol.setup(engine.view)
    assert pol.bounds == [20, 40, 80, 160]
    ratios = np.array(pol.n) / pol.n[0]
    assert np.allclose(ratios, np.array([15, 14, 12, 8]) / 15, atol=0.04)  # the paper's 15:14:12:8
    assert pol.m_pi(pol.n) <= engine.view.kv_capacity
    assert pol.memory_requirement == float("inf")  # gamma = 1: zero drift, theta_k = 0
    # companion code's scale: ceil(B Lambda_k / sum_k S_k Lambda_k) with S = (21, 20, 40, 80)
    engine, _ = make_engine("nested-synth4", {"name": "nested-wait", "batch_size": 128}, seed=0,
                            overrides={"workload.n_requests": 4000})
    pol = engine.scheduler
    pol.setup(engine.view)
    lam = np.array(pol.tail_rates)
    expect = np.ceil(128 * lam / np.sum(np.array([21, 20, 40, 80]) * lam)).astype(int)
    assert pol.n == expect.tolist()


def test_nested_wait_safety_buffer_is_finite_with_strict_drift():
    engine, _ = make_engine("nested-synth4", {"name": "nested-wait", "batch_size": 0, "gamma": 1.05}, seed=0,
                            overrides={"workload.n_requests": 4000})
    pol = engine.scheduler
    pol.setup(engine.view)
    n = pol.n
    assert all(b < a for a, b in zip(n, n[1:], strict=False))  # descending (Lemma 8)
    assert pol.m_pi(n) < pol.memory_requirement < 1.2 * engine.view.kv_capacity


def test_nested_wait_groups_types_into_l_segments():
    assert segment_boundaries(list(range(1, 11)), 3) == [4, 7, 10]
    assert segment_boundaries([50, 100, 150, 200], 0) == [50, 100, 150, 200]
    n = 60
    rng = np.random.default_rng(0)
    out = rng.integers(1, 11, n).tolist()
    sc = {"name": "t", "workload": {"explicit": {"arrival_s": np.sort(rng.random(n) * 10).tolist(),
                                                 "prompt_tokens": [2] * n, "output_tokens": out,
                                                 "type_id": [o - 1 for o in out]}},
          "engine": {"kv_capacity_tokens": 400, "block_size": 1, "prefill_emits_token": False},
          "latency": EXAMPLE2_LATENCY}
    engine, _ = make_engine(sc, {"name": "nested-wait", "segments": 3, "batch_size": 8}, seed=0)
    engine.scheduler.setup(engine.view)
    assert engine.scheduler.bounds == [4, 7, 10]
    r = simulate(sc, {"name": "nested-wait", "segments": 3, "batch_size": 8}, seed=0)
    assert r.summary["n_completed"] == n


def test_nested_wait_drains_the_queue_instead_of_dropping_it():
    r = simulate(FIG6, {"name": "nested-wait", "thresholds": [50, 50], "boundaries": [1, 2]}, seed=0)
    s = r.summary
    assert s["n_completed"] == s["n_arrived"] == 9 and s["n_unfinished"] == 0


# ---- parameters and the azure-conv runs -------------------------------------------------------
@pytest.mark.parametrize("policy,params,needle", [
    ("wait", {"rule": "magic"}, "policy.rule"),
    ("wait", {"thresholds": [0, 2]}, "policy.thresholds"),
    ("wait", {"c": -1.0}, "policy.c"),
    ("wait", {"rates": [1, -2]}, "policy.rates"),
    ("nested-wait", {"gamma": 0.5}, "policy.gamma"),
    ("nested-wait", {"delta": 2.0}, "policy.delta"),
    ("nested-wait", {"boundaries": [5, 3]}, "policy.boundaries"),
    ("nested-wait", {"batch_size": -1}, "policy.batch_size"),
    ("fcfs-greedy-lifo", {"alpha": 0.1}, "policy.alpha"),
])
def test_ao_policies_reject_bad_parameters_in_one_line(policy, params, needle):
    with pytest.raises(PolicyError) as e:
        make_policy(policy, **params)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_wait_needs_a_threshold_per_type():
    sc = example2({"types": [{"rate": 4, "prompt": 1, "output": 1}, {"rate": 4, "prompt": 1, "output": 2}],
                   "n_requests": 20})
    with pytest.raises(PolicyError, match="policy.thresholds"):
        simulate(sc, {"name": "wait", "thresholds": [2]}, seed=0)


@pytest.mark.parametrize("policy", ["fcfs-greedy-lifo", "wait", "nested-wait"])
def test_ao_policies_on_azure_conv_conserve_requests(policy):
    r = simulate("azure-conv", policy, seed=1, overrides={"workload.n_requests": 300})
    s = r.summary
    assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"] == 300
    assert s["n_completed"] == 300 and not s["non_terminating"]


@pytest.mark.parametrize("scenario", ["azure-conv", "nested-synth4"])
@pytest.mark.parametrize("policy", ["fcfs-greedy-lifo", "wait", "nested-wait"])
def test_ao_policies_hold_only_when_the_plan_would_repeat(scenario, policy):
    # a wrong hold promise makes the engine's fast-forward differ from the step-by-step run
    runs = [simulate(scenario, policy, seed=3, overrides={"workload.n_requests": 200, "engine.fast_forward": ff})
            for ff in (True, False)]
    assert np.array_equal(runs[0].requests["completion_s"], runs[1].requests["completion_s"])
    assert runs[0].summary["iterations"] == runs[1].summary["iterations"]
