"""Workload generators: determinism, statistical targets, structure, spec validation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmsched_gym.core import workload as W
from llmsched_gym.core.request import OFFLINE, ONLINE, WorkloadError
from llmsched_gym.core.workload import structured

RICH_SPEC = {
    "n_requests": 500,
    "clients": [{"rate": 2.0, "weight": 1}, {"rate": 6.0, "weight": 3, "output": 50}],
    "prompt": {"type": "lognormal", "mean": 40.62, "median": 11, "max": 2048},
    "output": {"type": "uniform", "lo": 1, "hi": 300},
    "prefix": {"type": "system", "groups": 4, "tokens": 64},
    "classes": {"offline": {"n_requests": 50, "prompt": 1000, "output": 20}},
    "predictor": {"type": "noisy", "x": 0.3},
}


def _rows(wl: W.Workload) -> dict:
    return {name: getattr(wl, name) for name in structured._ROW_ARRAYS} | {"prefix": wl.prefix}


# --- determinism --------------------------------------------------------------------------------


def test_same_seed_gives_identical_arrays():
    a, b = W.build_workload(RICH_SPEC, seed=7), W.build_workload(RICH_SPEC, seed=7)
    for name, value in _rows(a).items():
        other = _rows(b)[name]
        assert other == value if name == "prefix" else np.array_equal(other, value), name
    assert np.array_equal(a.client_weight, b.client_weight)


def test_different_seeds_differ():
    a, b = W.build_workload(RICH_SPEC, seed=1), W.build_workload(RICH_SPEC, seed=2)
    assert not np.array_equal(a.arrival_s, b.arrival_s)


def test_changing_the_predictor_keeps_arrivals_and_lengths():
    a = W.build_workload(RICH_SPEC, seed=3)
    b = W.build_workload({**RICH_SPEC, "predictor": {"type": "bucketed", "edges": [64, 512]}}, seed=3)
    assert np.array_equal(a.arrival_s, b.arrival_s)
    assert np.array_equal(a.output_tokens, b.output_tokens)
    assert not np.array_equal(a.predicted_output, b.predicted_output)


# --- arrival processes --------------------------------------------------------------------------

PROCESSES = {
    "poisson": lambda n, h, rng: W.poisson(5.0, n=n, horizon_s=h, rng=rng),
    "gamma": lambda n, h, rng: W.gamma(5.0, 2.0, n=n, horizon_s=h, rng=rng),
    "deterministic": lambda n, h, rng: W.deterministic(5.0, n=n, horizon_s=h),
    "on_off": lambda n, h, rng: W.on_off(10.0, 3.0, 7.0, n=n, horizon_s=h, rng=rng),
    "piecewise": lambda n, h, rng: W.piecewise([2.0, 10.0, 1.0], [5.0, 8.0], n=n, horizon_s=h, rng=rng),
    "diurnal": lambda n, h, rng: W.diurnal(5.0, 0.8, 20.0, n=n, horizon_s=h, rng=rng),
    "round_counts": lambda n, h, rng: W.round_counts([0.2, 0.3, 0.5], n=n, horizon_s=h, rng=rng),
}


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(PROCESSES)), n=st.none() | st.integers(0, 300),
       horizon=st.none() | st.floats(0.5, 60.0), seed=st.integers(0, 2**32 - 1))
def test_arrivals_are_sorted_nonnegative_and_respect_bounds(kind, n, horizon, seed):
    if n is None and horizon is None:
        n = 10
    t = PROCESSES[kind](n, horizon, np.random.default_rng(seed))
    assert t.dtype == np.float64
    assert np.all(t >= 0) and np.all(np.diff(t) >= 0)
    if horizon is not None:
        assert np.all(t < horizon)
    if n is not None:
        assert len(t) <= n
        if horizon is None:
            assert len(t) == n


def test_poisson_rate_and_exponential_gaps():
    t = W.poisson(50.0, horizon_s=400.0, rng=0)
    assert len(t) / 400.0 == pytest.approx(50.0, rel=0.02)
    gaps = np.diff(W.poisson(50.0, n=20000, rng=1))
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)


def test_gamma_matches_rate_and_cv():
    gaps = np.diff(W.gamma(5.53, 1 / math.sqrt(0.87), n=40000, rng=0))
    assert 1 / gaps.mean() == pytest.approx(5.53, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(0.87), rel=0.03)


def test_deterministic_arrivals_are_k_over_rate():
    assert W.deterministic(4.0, n=4).tolist() == [0.25, 0.5, 0.75, 1.0]
    assert W.deterministic(4.0, horizon_s=1.0).tolist() == [0.25, 0.5, 0.75]


def test_all_at_zero():
    assert W.all_at_zero(3).tolist() == [0.0, 0.0, 0.0]


def test_on_off_is_silent_when_off_and_poisson_when_on():
    t = W.on_off(20.0, 2.0, 8.0, horizon_s=2000.0, rng=0)
    assert np.all(np.mod(t, 10.0) < 2.0)
    assert len(t) / (2000.0 * 0.2) == pytest.approx(20.0, rel=0.03)


def test_piecewise_thinning_hits_each_rate():
    t = W.piecewise([2.0, 20.0, 5.0], [100.0, 200.0], horizon_s=300.0, rng=0)
    counts = np.histogram(t, [0, 100, 200, 300])[0] / 100.0
    assert counts == pytest.approx([2.0, 20.0, 5.0], rel=0.1)


def test_diurnal_thinning_mean_and_peak_to_trough():
    t = W.diurnal(10.0, 5 / 7, 100.0, peak_s=25.0, horizon_s=5000.0, rng=0)
    assert len(t) / 5000.0 == pytest.approx(10.0, rel=0.03)
    phase = np.mod(t, 100.0)
    peak = np.sum(np.abs(phase - 25.0) < 5.0)
    trough = np.sum(np.abs(phase - 75.0) < 5.0)
    assert peak / trough == pytest.approx(6.0, rel=0.15)


def test_round_counts_are_integer_rounds_with_the_pmf_mean():
    t = W.round_counts([0.25, 0.25, 0.25, 0.25], horizon_s=4000, rng=0)
    assert np.all(t == np.floor(t)) and t.max() < 4000
    assert len(t) / 4000 == pytest.approx(1.5, rel=0.03)
    assert np.bincount(t.astype(int)).max() <= 3
    spec = {"arrival": {"type": "round_counts", "dist": "binomial", "B": 4, "p": 0.5},
            "horizon_s": 2000, "prompt": 5, "output": 3}
    assert len(W.build_workload(spec, 0)) / 2000 == pytest.approx(2.0, rel=0.03)


# --- lengths ------------------------------------------------------------------------------------


def test_lognormal_params_match_the_published_statistics():
    mu, sigma = W.lognormal_params(40.62, 11)
    assert (mu, sigma) == pytest.approx((math.log(11), 1.616), abs=1e-3)
    assert W.lognormal_params(85.32, 45)[1] == pytest.approx(1.131, abs=1e-3)


def test_lognormal_sampler_has_the_requested_mean_and_median():
    x = W.lognormal(211, 129, 200_000, rng=0)
    assert np.median(x) == pytest.approx(129, rel=0.02)
    assert x.mean() == pytest.approx(211, rel=0.02)


@settings(max_examples=30, deadline=None)
@given(lo=st.integers(1, 50), width=st.integers(0, 50), cap=st.integers(1, 200), seed=st.integers(0, 1000))
def test_length_samplers_stay_in_range(lo, width, cap, seed):
    assert set(W.uniform(lo, lo + width, 200, seed)) <= set(range(lo, lo + width + 1))
    for x in (W.zipf(1.5, 200, seed, max_tokens=cap), W.lognormal(50, 10, 200, seed, max_tokens=cap),
              W.empirical([0, 5, 10_000], 200, seed, max_tokens=cap)):
        assert x.dtype == np.int64 and x.min() >= 1 and x.max() <= cap


def test_empirical_resamples_the_given_values():
    assert set(W.empirical([3, 7, 11], 500, rng=0)) == {3, 7, 11}
    assert W.fixed(9, 3).tolist() == [9, 9, 9]


# --- structured workloads -----------------------------------------------------------------------


def test_typed_mixture_rates_and_lengths_per_type():
    wl = W.typed_mixture([(1.0, 100, 10), (3.0, 20, 50)], horizon_s=2000.0, rng=0)
    counts = np.bincount(wl.type_id) / 2000.0
    assert counts == pytest.approx([1.0, 3.0], rel=0.05)
    assert set(zip(wl.type_id.tolist(), wl.prompt_tokens.tolist(), wl.output_tokens.tolist(), strict=True)) == {
        (0, 100, 10), (1, 20, 50)}


def test_typed_spec_allows_length_specs_per_type():
    spec = {"horizon_s": 100, "types": [{"rate": 2, "prompt": 10, "output": {"type": "uniform", "lo": 1, "hi": 4}},
                                        {"rate": 1, "prompt": 500, "output": 7}]}
    wl = W.build_workload(spec, 0)
    assert set(wl.output_tokens[wl.type_id == 0]) <= {1, 2, 3, 4}
    assert set(wl.prompt_tokens[wl.type_id == 1]) == {500}


def test_clients_get_ids_weights_and_their_rate_share():
    spec = {"horizon_s": 500, "prompt": 10, "output": 10,
            "clients": [{"rate": 1.0, "weight": 1}, {"rate": 3.0, "weight": 2.5},
                        {"arrival": {"type": "deterministic", "rate": 2.0}, "output": 99}]}
    wl = W.build_workload(spec, 0)
    assert wl.client_weight.tolist() == [1.0, 2.5, 1.0]
    assert np.bincount(wl.client) / 500 == pytest.approx([1.0, 3.0, 2.0], rel=0.1)
    assert set(wl.output_tokens[wl.client == 2]) == {99}
    assert np.all(np.diff(wl.arrival_s) >= 0)


def test_offline_class_arrives_at_zero_without_slo_online_has_defaults():
    wl = W.build_workload(RICH_SPEC, 0)
    off, on = wl.task_class == OFFLINE, wl.task_class == ONLINE
    assert off.sum() == 50 and on.sum() == 500
    assert np.all(wl.arrival_s[off] == 0) and np.all(np.isinf(wl.ttft_slo_s[off]))
    assert np.all(wl.ttft_slo_s[on] == 1.0) and np.all(wl.tpot_slo_s[on] == 0.05)


def test_system_prompts_prepend_a_shared_segment_with_unique_ids_per_stream():
    wl = W.build_workload(RICH_SPEC, 0)
    online = np.flatnonzero(wl.task_class == ONLINE)
    ids = {wl.prefix[i][0][0] for i in online}
    assert ids == set(range(8))  # 4 groups for each of the 2 clients
    assert all(wl.prefix[i][0][1] == 64 and wl.prompt_tokens[i] >= 65 for i in online)
    assert all(wl.prefix[i] is None for i in np.flatnonzero(wl.task_class == OFFLINE))


def test_definition4_users_and_docs_never_overlap():
    wl = W.regular_shuffled_queue(50, 4, 20, 5, s=2.0, base_tokens=7, rng=0, first_segment_id=100)
    assert len(wl) == 200 and np.all(wl.prompt_tokens == 32)
    assert wl.arrival_s.tolist() == (2.0 * np.arange(1, 201)).tolist()
    base = {p[0] for p in wl.prefix}
    users = [p[1][0] for p in wl.prefix]
    docs = [p[2][0] for p in wl.prefix]
    assert base == {(100, 7)}
    assert sorted(np.unique(users, return_counts=True)[1]) == [4] * 50  # each user exactly k times
    assert len(set(docs)) == 200  # every doc unique
    assert not (set(users) & set(docs)) and 100 not in set(users) | set(docs)


def test_definition4_toy_order_without_shuffle():
    wl = W.regular_shuffled_queue(2, 2, 5, 5, s=0.0, shuffle=False)
    assert [p[0][0] for p in wl.prefix] == [0, 1, 0, 1]  # U1D1, U2D2, U1D3, U2D4
    assert wl.arrival_s.tolist() == [0.0] * 4 and wl.output_tokens.tolist() == [1] * 4


def test_users_spec_with_poisson_arrivals_and_global_segment_ids():
    spec = {"prefix": {"type": "users", "users": 25, "k": 4, "user_tokens": 600, "doc_tokens": 150,
                       "base_tokens": 50},
            "arrival": {"type": "poisson", "rate": 3.0},
            "classes": {"offline": {"n_requests": 10, "prompt": 100, "output": 5,
                                    "prefix": {"type": "system", "groups": 2, "tokens": 10}}}}
    wl = W.build_workload(spec, 0)
    online = np.flatnonzero(wl.task_class == ONLINE)
    assert len(online) == 100 and np.all(wl.prompt_tokens[online] == 800)
    online_ids = {seg for i in online for seg, _ in wl.prefix[i]}
    offline_ids = {seg for i in np.flatnonzero(wl.task_class == OFFLINE) for seg, _ in wl.prefix[i]}
    assert len(online_ids) == 1 + 25 + 100 and not online_ids & offline_ids


# --- predictors ---------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(x=st.floats(0.0, 0.9), seed=st.integers(0, 1000))
def test_noisy_predictions_stay_within_the_error_band(x, seed):
    wl = W.Workload(np.zeros(300), np.ones(300), np.arange(1, 301))
    pred = W.predict(wl, "noisy", seed, x=x)
    true = wl.output_tokens
    assert np.all(pred >= 1)
    assert np.all(pred >= np.floor(true * (1 - x)) - 1) and np.all(pred <= np.ceil(true * (1 + x)) + 1)


def test_oracle_and_bucketed_predictions():
    wl = W.Workload(np.zeros(5), np.ones(5), np.array([1, 10, 11, 100, 500]))
    assert W.predict(wl, "oracle").tolist() == [1, 10, 11, 100, 500]
    assert W.predict(wl, "bucketed", edges=[10, 100, 200]).tolist() == [10, 10, 100, 100, 200]
    assert W.predict(wl, "bucketed", edges=[10, 100, 200], point="mid").tolist() == [5, 5, 55, 55, 150]


# --- spec validation ----------------------------------------------------------------------------

BASE = {"arrival": {"type": "poisson", "rate": 1.0}, "n_requests": 10, "prompt": 5, "output": 5}


@pytest.mark.parametrize("change, message", [
    ({"foo": 1}, "foo: unknown key (allowed: n_requests, horizon_s, arrival, prompt, output, predictor, "
                 "clients, classes, prefix, types, trace)"),
    ({"arrival": {"type": "poison"}}, "arrival.type: unknown value 'poison' (allowed: poisson, gamma, "
                                       "deterministic, all_at_zero, on_off, piecewise, diurnal, round_counts)"),
    ({"arrival": {"type": "poisson", "rate": -1}}, "arrival.rate: expected a number > 0, got -1"),
    ({"arrival": {"type": "gamma", "rate": 1}}, "arrival.cv: required for type 'gamma'"),
    ({"arrival": {"type": "poisson", "rate": 1, "cv": 2}}, "arrival.cv: unknown key (allowed: type, rate)"),
    ({"prompt": "x"}, "prompt: expected an integer >= 1 and <= 2,147,483,647, got 'x'"),
    ({"output": {"type": "lognormal", "mean": 5, "median": 9}},
     "output.mean: expected a number >= median (9), got 5"),
    ({"predictor": {"type": "noisy", "x": 2}}, "predictor.x: expected a number >= 0 and <= 1, got 2"),
    ({"n_requests": None}, "n_requests: give n_requests and/or horizon_s"),
    ({"trace": {"format": "parquet"}}, "prompt: not allowed with trace (the trace supplies it)"),
])
def test_bad_specs_raise_one_line_errors_naming_the_field(change, message):
    spec = {k: v for k, v in {**BASE, **change}.items() if v is not None}
    with pytest.raises(WorkloadError) as err:
        W.build_workload(spec, 0)
    assert str(err.value) == message and "\n" not in message


def test_bad_trace_format_names_the_allowed_values():
    with pytest.raises(WorkloadError, match=r"^trace.format: unknown value 'parquet' \(allowed: azure, vtc, csv"):
        W.build_workload({"trace": {"format": "parquet"}}, 0)
