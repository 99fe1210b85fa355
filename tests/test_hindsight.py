"""The hindsight reference (``llmsched_gym/hindsight.py``): its priority scheduler replays the static
orders exactly, it finds the brute-force optimum over orders on a tiny instance, it is never
worse than its start, and it is deterministic."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from baselines.static import static_family
from llmsched_gym.config import ConfigError
from llmsched_gym.hindsight import CHUNKS, SEQS, TRUE_LENGTHS, PriorityOrder, blame, hindsight
from llmsched_gym.sim import make_engine, simulate


def toy(arrival, prompt, output, capacity, predicted=None) -> dict:
    explicit = {"arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output}
    if predicted is not None:
        explicit["predicted_output"] = predicted
    return {"name": "toy", "workload": {"explicit": explicit},
            "engine": {"kv_capacity_tokens": capacity, "block_size": 1, "prefill_emits_token": True,
                       "overflow": "forbid"},
            "latency": "unit", "policy": "fcfs"}


# a long request first and four short ones in a KV of 22 tokens: FCFS makes the short ones wait
TINY = toy([0.0, 0.0, 0.0, 1.0, 2.0], [10, 3, 3, 4, 2], [9, 2, 3, 2, 5], capacity=22)
MEAN_E2E = "e2e_s.mean"


def _same(a: dict, b: dict) -> None:
    skip = {"policy", "wall_time_s"}
    assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


@pytest.mark.parametrize("order", ["fcfs", "prompt", "output", "total", "las", "mlfq"])
def test_priority_vector_of_an_orders_keys_replays_the_static_policy_exactly(order):
    # las and mlfq in a KV of 30,000 tokens, where they preempt; output and total in the
    # scenario's, where nothing is preempted (the static orders then key a preempted request by
    # its remaining output, a fixed vector by its whole output)
    kv = {"engine.kv_capacity_tokens": 30000} if order not in ("output", "total") else {}
    ov = {"workload.n_requests": 200, **kv, **TRUE_LENGTHS}
    engine, _ = make_engine("azure-conv", "fcfs", 4, ov)
    wl = engine.workload
    equal = np.zeros(len(wl))  # the queue order breaks every tie
    keys = {"fcfs": equal, "prompt": wl.prompt_tokens, "output": wl.output_tokens,
            "total": wl.prompt_tokens + wl.output_tokens, "las": equal, "mlfq": equal}[order]
    levels = order if order in ("las", "mlfq") else "none"
    for chunk, seqs in ((256, 128), (0, 32)):
        ref = simulate("azure-conv", {"name": "static", "order": order, "chunk_size": chunk, "max_num_seqs": seqs}, 4,
                       ov).summary
        got = simulate("azure-conv", PriorityOrder(keys, chunk, seqs, levels), 4, ov).summary
        _same(ref, got)
        if levels != "none":
            assert ref["preemptions"] > 0


def brute_force(scenario: dict, chunk: int, seqs: int) -> float:
    """The best mean E2E over every admission order x levels mode at one budget and cap."""
    engine, _ = make_engine(scenario, "fcfs")
    n = len(engine.workload)
    best = np.inf
    for perm in itertools.permutations(range(n)):
        p = np.empty(n)
        p[list(perm)] = np.arange(n)
        for levels in PriorityOrder.LEVELS:
            s = simulate(scenario, PriorityOrder(p, chunk, seqs, levels)).summary
            if s["n_completed"] == n:
                best = min(best, s["e2e_s"]["mean"])
    return best


def test_hindsight_finds_the_brute_force_optimum_over_orders_on_a_tiny_instance():
    # on this instance the budget and the cap never bind (prompts of at most 10 tokens, at most 5
    # requests): every knob of the search space gives the same schedule, so orders are the whole space
    for p in (np.arange(5.0), np.array([4.0, 3, 2, 1, 0])):
        for levels in PriorityOrder.LEVELS:
            values = {simulate(TINY, PriorityOrder(p, c, m, levels)).summary["e2e_s"]["mean"]
                      for c in CHUNKS for m in SEQS}
            assert len(values) == 1
    opt = brute_force(TINY, 0, 16)
    fcfs = simulate(TINY, {"name": "static", "order": "fcfs"}).summary["e2e_s"]["mean"]
    assert opt < fcfs  # the instance leaves room
    r = hindsight(TINY, {}, 0, MEAN_E2E, True, start=[{"name": "static", "order": "fcfs"}], sims=200, rng=1)
    assert r.value == pytest.approx(opt, abs=1e-12)
    assert r.start_value == fcfs
    assert r.headroom == pytest.approx((fcfs - opt) / fcfs)
    # the reported schedule has the reported value
    again = simulate(TINY, PriorityOrder(r.priority, r.spec["chunk_size"], r.spec["max_num_seqs"],
                                         r.spec["levels"])).summary
    assert again["e2e_s"]["mean"] == r.value


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hindsight_is_never_worse_than_any_start_and_the_start_is_the_best_static_spec(seed):
    ov = {"workload.n_requests": 120}
    starts = [s for s in static_family("clairvoyant") if s["chunk_size"] in (0, 256)]
    r = hindsight("jaillet-high", ov, seed, "serving.mean_e2el_ms", True, start=starts, sims=12, rng=seed)
    values = [simulate("jaillet-high", s, seed, {**ov, **TRUE_LENGTHS}).summary["serving"]["mean_e2el_ms"]
              for s in starts]
    assert r.start_value == min(values)
    assert r.start_spec == starts[int(np.argmin(values))]
    assert r.value <= r.start_value
    assert all(r.value <= v for v in values)
    assert r.trace == sorted(r.trace, reverse=True) and r.trace[-1] == r.value
    assert len(starts) < r.n_sims <= len(starts) + 12  # a move that would change nothing is not run


def test_higher_is_better_metrics_search_upwards():
    r = hindsight(TINY, {}, 0, "requests_per_s", False, start=[{"name": "static", "order": "fcfs"}], sims=40)
    assert r.value >= r.start_value
    assert r.headroom >= 0.0


def test_hindsight_is_deterministic_under_its_seed():
    args = ("jaillet-high", {"workload.n_requests": 100}, 3, "serving.mean_e2el_ms", True)
    start = [{"name": "static", "order": "prompt", "chunk_size": 256}]
    a = hindsight(*args, start=start, sims=30, rng=7)
    b = hindsight(*args, start=start, sims=30, rng=7)
    assert a.value == b.value and a.trace == b.trace and a.spec == b.spec
    assert (a.priority is None and b.priority is None) or np.array_equal(a.priority, b.priority)


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ConfigError, match="metric: 'serving.nope' is not in the run summary"):
        hindsight(TINY, {}, 0, "serving.nope", True, start=[{"name": "static"}], sims=0)
    with pytest.raises(ConfigError, match="sims: must be >= 0, got -1"):
        hindsight(TINY, {}, 0, MEAN_E2E, True, sims=-1)
    with pytest.raises(ConfigError, match="start: needs at least one policy spec"):
        hindsight(TINY, {}, 0, MEAN_E2E, True, start=[], sims=0)


def test_blame_points_at_the_requests_that_make_the_metric():
    sc = toy([0.0] * 5, [4, 4, 4, 4, 4], [6, 5, 4, 3, 2], capacity=100)
    r = simulate(sc, {"name": "static", "order": "fcfs", "max_num_seqs": 1})
    engine = r.engine
    wait = r.requests["queue_delay_s"]
    ttft = r.requests["ttft_s"]
    assert list(wait) == sorted(wait) and wait[0] == 0  # served one by one in arrival order
    promote, demote = blame(engine, "serving.mean_e2el_ms")
    np.testing.assert_array_equal(promote, wait)  # the longest waits first
    assert demote[0] == 6 and demote[-1] == 0  # admitted while others waited, weighted by output
    promote, _ = blame(engine, "serving.p99_ttft_ms")
    assert promote[-1] == ttft[-1] and np.all(promote[ttft < np.quantile(ttft, 0.97)] == 0)
    # TTFT SLO of 6 s: near misses promoted (the nearest most), misses by more than the SLO demoted
    slo = toy([0.0] * 5, [4, 4, 4, 4, 4], [6, 5, 4, 3, 2], capacity=100)
    slo["workload"]["explicit"]["ttft_slo_s"] = [6.0] * 5
    r = simulate(slo, {"name": "static", "order": "fcfs", "max_num_seqs": 1})
    ttft = r.requests["ttft_s"]
    promote, demote = blame(r.engine, "slo_attainment")
    near = (ttft > 6) & (ttft <= 12)
    far = ttft > 12
    assert near.any() and far.any()
    np.testing.assert_allclose(promote[near], 1 / (1 + (ttft[near] - 6) / 6))
    assert np.all(promote[~near] == 0) and np.all(demote[far] > 0) and np.all(demote[ttft <= 6] == 0)
