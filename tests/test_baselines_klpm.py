"""Dexter et al. 2025 (k-LPM) claims: the toy example, k = 1 is FCFS, a huge k is LPM, Theorem 2's k-LPM
bound on a Definition 4 burst, SGLang's fallback and in-batch deprioritisation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines import PolicyError, make_policy
from llmsched_gym.sim import simulate

PREFIX_POLICIES = ["lpm", "k-lpm", "sglang-lpm"]
# Definition 2 with c_attn = 0: a batch costs its uncached prompt tokens, decoding is free
UNCACHED_TOKENS = {"type": "affine", "prefill_base_s": 0.0, "prefill_per_seq_s": 0.0, "prefill_per_token_s": 1.0,
                   "prefill_per_ctx_s": 0.0, "decode_base_s": 0.0, "decode_per_seq_s": 0.0, "decode_per_kv_s": 0.0}


def def4(users: int, k: int, u: int, d: int, s: float = 0.0, *, output: int = 1, kv: int | None = None,
         block_size: int = 1) -> dict:
    """A Definition 4 queue; the default pool holds one prompt and its output (the last-prompt
    cache of Definition 2)."""
    return {"name": "def4",
            "workload": {"prefix": {"type": "users", "users": users, "k": k, "user_tokens": u, "doc_tokens": d,
                                    "s": s}, "output": output},
            "engine": {"kv_capacity_tokens": kv or u + d + output, "block_size": block_size,
                       "prefill_emits_token": True, "overflow": "forbid", "prefix_cap_prompt_minus_one": False},
            "latency": UNCACHED_TOKENS}


def test_klpm_toy_example_max_ttft_40_for_fcfs_and_30_for_lpm():
    fcfs = simulate("klpm-toy", "fcfs")
    np.testing.assert_array_equal(fcfs.requests["ttft_s"], [10, 20, 30, 40])
    assert fcfs.summary["ttft_s"]["max"] == 40
    for seed in range(6):
        lpm = simulate("klpm-toy", "lpm", seed=seed)
        assert lpm.summary["ttft_s"]["max"] == 30
        assert sorted(lpm.requests["ttft_s"]) == [10, 15, 25, 30]
    two = simulate("klpm-toy", "k-lpm", policy_params={"k": 2})
    np.testing.assert_array_equal(two.requests["ttft_s"], [10, 25, 15, 30])


def test_lpm_breaks_ties_at_random():
    first = {int(np.argmin(simulate("klpm-toy", "lpm", seed=s).requests["ttft_s"])) for s in range(12)}
    assert len(first) > 1
    stable = {int(np.argmin(simulate("klpm-toy", "lpm", seed=s, policy_params={"ties": "stable"})
                            .requests["ttft_s"])) for s in range(4)}
    assert stable == {0}


@st.composite
def instances(draw):
    users, k = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    u, d = draw(st.integers(1, 30)), draw(st.integers(1, 30))
    s = draw(st.sampled_from([0.0, 1.0, 5.0, 20.0]))
    out = draw(st.integers(1, 4))
    bs = draw(st.sampled_from([1, 4]))
    spare = draw(st.integers(0, 3 * (u + d)))
    kv = -(-(u + d + out) // bs) * bs + spare
    memory = draw(st.sampled_from(["reserve", "fit"]))
    seed = draw(st.integers(0, 1000))
    return def4(users, k, u, d, s, output=out, kv=kv, block_size=bs), memory, seed


def _same_schedule(a, b) -> None:
    for col in ("first_scheduled_s", "first_token_s", "completion_s"):
        np.testing.assert_array_equal(a.requests[col], b.requests[col])


@settings(max_examples=40, deadline=None)
@given(instances())
def test_klpm_with_k_1_equals_fcfs_on_random_instances(case):
    sc, memory, seed = case
    sc["engine"]["overflow"] = "preempt_lifo_recompute"
    fcfs = simulate(sc, "fcfs", seed=seed, policy_params={"admission": memory})
    one = simulate(sc, "k-lpm", seed=seed, policy_params={"k": 1, "memory": memory})
    _same_schedule(fcfs, one)


@settings(max_examples=40, deadline=None)
@given(instances())
def test_klpm_with_huge_k_equals_lpm_on_random_instances(case):
    sc, memory, seed = case
    sc["engine"]["overflow"] = "preempt_lifo_recompute"
    kw = {"memory": memory, "ties": "stable"}
    lpm = simulate(sc, "lpm", seed=seed, policy_params=kw)
    huge = simulate(sc, "k-lpm", seed=seed, policy_params={**kw, "k": 10**9})
    _same_schedule(lpm, huge)


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 12), st.integers(2, 5), st.integers(1, 40), st.integers(1, 40), st.integers(0, 10**6))
def test_klpm_meets_theorem_2_bound_on_a_definition_4_burst(users, k, u, d, seed):
    # s = 0 (all queries at t = 0, so T = s n = 0): k-LPM with k = repetitions serves one whole
    # user group per cycle, max TTFT <= n (u / k + d); FCFS is never better
    n = users * k
    sc = def4(users, k, u, d)
    klpm = simulate(sc, "k-lpm", seed=seed, policy_params={"k": k}).summary
    fcfs = simulate(sc, "fcfs", seed=seed).summary
    assert klpm["ttft_s"]["max"] <= n * (u / k + d) + 1e-9
    assert fcfs["ttft_s"]["max"] >= klpm["ttft_s"]["max"]
    assert klpm["n_completed"] == n


def test_lpm_beats_fcfs_on_a_large_burst_as_theorem_2_predicts():
    users, k, u, d = 100, 4, 20, 5
    n = users * k
    lpm = simulate(def4(users, k, u, d), "lpm").summary["ttft_s"]["max"]
    fcfs = simulate(def4(users, k, u, d), "fcfs").summary["ttft_s"]["max"]
    assert lpm == pytest.approx(n * (u / k + d))  # every user prefix computed once
    assert fcfs >= 0.95 * n * (u + d)  # almost every query recomputes its user prefix


def test_sglang_lpm_falls_back_to_fcfs_above_the_queue_threshold():
    # more than 2 waiting: FCFS picks U1D1 then U2D2; with 2 left it matches U2 (U2D4 first)
    r = simulate("klpm-toy", "sglang-lpm", policy_params={"fcfs_above": 2})
    np.testing.assert_array_equal(r.requests["ttft_s"], [10, 20, 35, 25])
    plain = simulate("klpm-toy", "sglang-lpm")
    assert plain.summary["ttft_s"]["max"] == 30


def test_sglang_lpm_deprioritises_requests_sharing_a_prefix_with_an_earlier_waiting_one():
    # A = U1D1, B = U1D2, C = U2D3 (user prefixes of 40 tokens), empty cache, two admitted per
    # iteration: SGLang admits A and C and leaves B for the hit on U1; a plain sort admits A, B
    ex = {"arrival_s": [0, 0, 0], "prompt_tokens": [50, 50, 50], "output_tokens": [1, 1, 1],
          "prefix": [[[1, 40], [11, 10]], [[1, 40], [12, 10]], [[2, 40], [13, 10]]]}
    sc = {"name": "inbatch", "workload": {"explicit": ex},
          "engine": {"kv_capacity_tokens": 1000, "block_size": 1, "overflow": "forbid"}, "latency": UNCACHED_TOKENS}
    sg = simulate(sc, "sglang-lpm", policy_params={"max_batch": 2})
    assert sg.requests["first_scheduled_s"][2] < sg.requests["first_scheduled_s"][1]
    assert sg.requests["cached_tokens"][1] == 40
    lpm = simulate(sc, "lpm", policy_params={"max_batch": 2, "ties": "stable"})
    assert lpm.requests["first_scheduled_s"][1] < lpm.requests["first_scheduled_s"][2]


def test_max_prefill_tokens_caps_each_admission():
    r = simulate(def4(4, 2, 10, 10, kv=1000), "lpm", policy_params={"max_prefill_tokens": 40})
    assert r.iterations["n_prefill_tokens"].max() <= 40


@pytest.mark.parametrize("name", PREFIX_POLICIES)
def test_every_prefix_policy_conserves_requests_on_azure_conv_and_klpm_toy(name):
    for sc, ov in (("azure-conv", {"workload.n_requests": 300}), ("klpm-toy", {})):
        s = simulate(sc, name, overrides=ov).summary
        assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"]
        assert s["n_completed"] == s["n_arrived"], (sc, s["stop_reason"])


def test_prefix_hit_rate_is_reported_in_tokens():
    r = simulate(def4(10, 4, 20, 5), "lpm")
    # each of 10 users' 20-token prefix is computed once and hit 3 times: 600 of 1000 tokens
    assert r.summary["prefix_hit_tokens"] == 10 * 3 * 20
    assert r.summary["prefix_hit_rate"] == pytest.approx(600 / 1000)


@pytest.mark.parametrize("name,kw,param", [
    ("k-lpm", {"k": 0}, "k"), ("lpm", {"ties": "first"}, "ties"), ("lpm", {"hit_metric": "blocks"}, "hit_metric"),
    ("sglang-lpm", {"fcfs_above": -1}, "fcfs_above"), ("lpm", {"memory": "none"}, "memory"),
    ("k-lpm", {"max_batch": -1}, "max_batch"), ("sglang-lpm", {"in_batch_threshold": -5}, "in_batch_threshold"),
])
def test_bad_parameters_raise_one_line_policy_error_naming_it(name, kw, param):
    with pytest.raises(PolicyError, match=rf"^policy\.{param}:"):
        make_policy(name, **kw)
