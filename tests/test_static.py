"""The static heuristic family (``baselines/static.py``): each queue order on constructed
instances, the batch formers, ``sarathi`` reproduced by ``order=fcfs``, and the grid."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines import PolicyError, make_policy, policy_params
from baselines.static import NEEDS_PREDICTION, ORDERS, static_family
from llmsched_gym.sim import make_engine, simulate

# five requests at t = 0; the predictions differ from the true outputs on purpose
PROMPT = [5, 3, 8, 1, 4]
TRUE_OUT = [2, 6, 1, 4, 3]
PREDICTED = [1, 6, 2, 5, 3]


def toy(arrival, prompt, output, capacity=1000, predicted=None, block_size=1, latency="unit", **extra) -> dict:
    explicit = {"arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output, **extra}
    if predicted is not None:
        explicit["predicted_output"] = predicted
    return {"name": "toy", "workload": {"explicit": explicit},
            "engine": {"kv_capacity_tokens": capacity, "block_size": block_size, "prefill_emits_token": True,
                       "overflow": "forbid"},
            "latency": latency, "policy": "fcfs"}


def start_order(result) -> list[int]:
    first = result.requests["first_scheduled_s"]
    return [int(i) for i in np.argsort(first, kind="stable")]


@pytest.mark.parametrize(("order", "expected"), [
    ("fcfs", [0, 1, 2, 3, 4]),
    ("prompt", [3, 1, 4, 0, 2]),  # prompts 1, 3, 4, 5, 8
    ("output", [0, 2, 4, 3, 1]),  # predicted 1, 2, 3, 5, 6 (the true outputs would give 2, 0, 4, 3, 1)
    ("total", [0, 3, 4, 1, 2]),  # prompt + predicted 6, 6 (queue order breaks the tie), 7, 9, 10
])
def test_each_order_admits_in_the_exact_expected_order(order, expected):
    sc = toy([0.0] * 5, PROMPT, TRUE_OUT, predicted=PREDICTED)
    r = simulate(sc, {"name": "static", "order": order, "max_num_seqs": 1})
    assert start_order(r) == expected
    assert r.summary["n_completed"] == 5


def test_prompt_weight_adds_the_weighted_prompt_to_the_output_key():
    # keys predicted + 0.5 x prompt: 3.5, 7.5, 6, 5.5, 5 (output alone: [0, 2, 4, 3, 1])
    sc = toy([0.0] * 5, PROMPT, TRUE_OUT, predicted=PREDICTED)
    r = simulate(sc, {"name": "static", "order": "output", "prompt_weight": 0.5, "max_num_seqs": 1})
    assert start_order(r) == [0, 4, 3, 2, 1]


@pytest.mark.parametrize("chunk", [0, 256])
def test_output_with_prompt_weight_one_is_total_exactly(chunk):
    ov = {"workload.n_requests": 200, "engine.kv_capacity_tokens": 24000}
    a = simulate("azure-conv", {"name": "static", "order": "total", "chunk_size": chunk}, 4, ov).summary
    b = simulate("azure-conv", {"name": "static", "order": "output", "prompt_weight": 1.0, "chunk_size": chunk}, 4,
                 ov).summary
    _same(a, b)


def test_a_new_prompt_weight_resorts_the_cached_waiting_order():
    # the tune action mode sets prompt_weight between iterations while the waiting queue (and so
    # the cached order) may be unchanged: the next order must use the new keys
    sc = toy([0.0] * 5, PROMPT, TRUE_OUT, predicted=PREDICTED)
    engine, _ = make_engine(sc, {"name": "static", "order": "output", "max_num_seqs": 1}, 0)
    assert engine.poll()  # the five arrivals wait
    pol, view = engine.scheduler, engine.view
    assert pol.waiting_order(view)[0] == [int(r) for r in np.argsort(np.array(PREDICTED), kind="stable")]
    pol.prompt_weight = 0.5
    assert pol.waiting_order(view)[0] == [0, 4, 3, 2, 1]


def test_lpm_admits_the_request_sharing_the_cached_prefix_first():
    # 0 = U1 D0 runs alone; then U1 is cached and 3 = U1 D3 goes before 1 = U2 D1 and 2 = U3 D2
    prefix = [[[1, 40], [10, 10]], [[2, 40], [11, 10]], [[3, 40], [12, 10]], [[1, 40], [13, 10]]]
    sc = toy([0.0, 0.1, 0.1, 0.1], [50] * 4, [2] * 4, prefix=prefix)
    lpm = simulate(sc, {"name": "static", "order": "lpm", "max_num_seqs": 1})
    assert start_order(lpm) == [0, 3, 1, 2]
    assert lpm.requests["cached_tokens"][3] == 40
    fcfs = simulate(sc, {"name": "static", "order": "fcfs", "max_num_seqs": 1})
    assert start_order(fcfs) == [0, 1, 2, 3]


def test_lpm_falls_back_to_fcfs_above_128_waiting_requests_as_sglang():
    n = 130
    prefix = [[[1 + (i == n - 1), 40], [100 + i, 10]] for i in range(n)]
    prefix[0] = [[2, 40], [99, 10]]  # the last request shares 0's prefix, 128 others wait with it
    sc = toy([0.0] + [0.1] * (n - 1), [50] * n, [1] * n, prefix=prefix)
    r = simulate(sc, {"name": "static", "order": "lpm", "max_num_seqs": 1})
    assert start_order(r) == list(range(n))  # too many waiting: queue order, the hit is not preferred


@pytest.mark.parametrize("order", ["las", "mlfq"])
def test_las_and_mlfq_preempt_a_request_that_has_used_its_quanta(order):
    # 0 has decoded 5 tokens (level 2 with quantum 1) when 1 arrives at level 0 with the running
    # set full: 1 preempts 0 and finishes first; fcfs makes 1 wait for 0's 20 tokens
    sc = toy([0.0, 5.5], [4, 4], [20, 3])
    r = simulate(sc, {"name": "static", "order": order, "max_num_seqs": 1})
    assert r.summary["preemptions"] == 1
    assert r.requests["completion_s"][1] < r.requests["completion_s"][0]
    assert r.requests["first_scheduled_s"][1] == 6.0
    f = simulate(sc, {"name": "static", "order": "fcfs", "max_num_seqs": 1})
    assert f.summary["preemptions"] == 0
    assert f.requests["completion_s"][1] > f.requests["completion_s"][0]


def test_las_does_not_preempt_a_request_at_the_same_level():
    # quantum 4: 0 stays at level 0 through its 3 tokens, so 1 (level 0 too) never preempts it;
    # with quantum 1 it is at level 1 after its first token (prefill emits it) and 1 preempts it
    sc = toy([0.0, 0.5], [4, 4], [3, 3])
    r = simulate(sc, {"name": "static", "order": "las", "max_num_seqs": 1, "quantum": 4})
    assert r.summary["preemptions"] == 0
    assert r.requests["first_scheduled_s"].tolist() == [0.0, 3.0]
    r = simulate(sc, {"name": "static", "order": "las", "max_num_seqs": 1, "quantum": 1})
    assert r.summary["preemptions"] == 1
    assert r.requests["first_scheduled_s"].tolist() == [0.0, 1.0]


def test_mlfq_levels_demote_by_doubling_quanta_and_skip_join_by_prefill_time():
    sc = toy([0.0] * 4, [10, 1000, 4000, 20], [5] * 4, capacity=100_000, latency="calibrated:llama-2-7b/a100")
    engine, _ = make_engine(sc, {"name": "static", "order": "mlfq", "quantum": 1})
    pol, view, lat = engine.scheduler, engine.view, engine.latency
    entry = pol.entry_levels(view)
    for i, p in enumerate([10, 1000, 4000, 20]):
        ratio = lat.batch_time(p, 0, 1, 0, 0) / lat.batch_time(0, 0, 0, 1, p)
        assert 2.0 ** entry[i] >= ratio > (2.0 ** (entry[i] - 1) if entry[i] else 0)
    assert entry[0] <= 1 < entry[1] < entry[2]
    # las: every request enters level 0; with quantum 1 the levels by tokens generated are
    # 0 | 1 1 | 2 2 2 2 | 3 ...
    las, _ = make_engine(sc, {"name": "static", "order": "las", "quantum": 1})
    assert las.scheduler.entry_levels(las.view).tolist() == [0, 0, 0, 0]
    got = []
    for g in range(8):
        las.generated[0] = g
        got.append(int(las.scheduler.levels(las.view, np.array([0]))[0]))
    assert got == [0, 1, 1, 2, 2, 2, 2, 3]
    # entering at level e, the first demotion comes after 2^e tokens
    e = int(entry[1])
    for g, want in ((2**e - 1, e), (2**e, e + 1), (3 * 2**e - 1, e + 1), (3 * 2**e, e + 2)):
        engine.generated[1] = g
        assert pol.levels(view, np.array([1]))[0] == want


def test_whole_prefill_and_chunked_batch_shapes():
    sc = toy([0.0, 0.0, 3.0], [10, 7, 9], [4, 4, 4])
    whole = simulate(sc, {"name": "static", "order": "prompt", "chunk_size": 0}, log_batches=True)
    chunks = {}
    for b in whole.engine.batches:
        for rid, c, _ in b["prefill"]:
            chunks.setdefault(rid, []).append(c)
    assert chunks == {0: [10], 1: [7], 2: [9]}  # every prompt in one piece
    assert whole.engine.batches[0]["prefill"] and len(whole.engine.batches[0]["prefill"]) == 2
    cut = simulate(sc, {"name": "static", "order": "prompt", "chunk_size": 4}, log_batches=True)
    chunks = {}
    for b in cut.engine.batches:
        tokens = sum(c for _, c, _ in b["prefill"]) + len(b["decode"])
        assert tokens <= 4
        for rid, c, _ in b["prefill"]:
            chunks.setdefault(rid, []).append(c)
    assert chunks[1] == [4, 3]  # the shorter prompt first
    assert sum(chunks[0]) == 10 and max(chunks[0]) <= 4 and sum(chunks[2]) == 9
    assert cut.summary["n_completed"] == whole.summary["n_completed"] == 3


def _same(a: dict, b: dict) -> None:
    skip = {"policy", "wall_time_s"}
    assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}


@pytest.mark.parametrize(("scenario", "n"), [("azure-conv", 200), ("jaillet-high", 300)])
@pytest.mark.parametrize(("chunk", "seqs"), [(512, 128), (256, 16), (2048, 256)])
def test_fcfs_reproduces_sarathi_exactly(scenario, n, chunk, seqs):
    ov = {"workload.n_requests": n}
    a = simulate(scenario, {"name": "sarathi", "chunk_size": chunk, "max_num_seqs": seqs}, 3, ov).summary
    b = simulate(scenario, {"name": "static", "order": "fcfs", "chunk_size": chunk, "max_num_seqs": seqs}, 3,
                 ov).summary
    _same(a, b)


def test_fcfs_defaults_are_sarathis_and_whole_prefill_is_an_unbounded_budget():
    assert {k: v for k, v in policy_params("static").items() if k not in ("order", "quantum", "prompt_weight")} == \
        policy_params("sarathi")
    ov = {"workload.n_requests": 200}
    _same(simulate("azure-conv", "sarathi", 5, ov).summary, simulate("azure-conv", "static", 5, ov).summary)
    a = simulate("azure-conv", {"name": "sarathi", "chunk_size": 10**9}, 5, ov).summary
    b = simulate("azure-conv", {"name": "static", "chunk_size": 0}, 5, ov).summary
    _same(a, b)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5), st.integers(1, 30), st.integers(1, 20)), min_size=1, max_size=12),
       st.sampled_from(ORDERS), st.sampled_from([0, 4, 16]), st.integers(1, 4))
def test_every_order_completes_every_request_within_the_kv(reqs, order, chunk, seqs):
    arrival = sorted(a for a, _, _ in reqs)
    prompt = [p for _, p, _ in reqs]
    output = [o for _, _, o in reqs]
    sc = toy(arrival, prompt, output, capacity=64, block_size=4)
    r = simulate(sc, {"name": "static", "order": order, "chunk_size": chunk, "max_num_seqs": seqs})
    assert r.summary["n_completed"] == len(reqs)
    assert r.summary["kv_peak_frac"] <= 1.0
    assert np.all(r.requests["completion_s"] >= r.requests["arrival_s"])


def test_static_family_grid_and_information():
    full = static_family("clairvoyant")
    assert len(full) == 7 * 6 * 2
    assert static_family("predicted") == full
    blind = static_family("blind")
    assert len(blind) == 5 * 6 * 2
    assert not {s["order"] for s in blind} & set(NEEDS_PREDICTION)
    assert {s["chunk_size"] for s in full} == {0, 128, 256, 512, 1024, 2048}
    for spec in blind:
        make_policy(**spec)  # every spec builds
    with pytest.raises(PolicyError, match="information: unknown 'psychic'; allowed: clairvoyant, predicted, blind"):
        static_family("psychic")


def test_orders_that_need_predictions_say_so():
    assert make_policy("static", order="output").reads_prediction
    assert make_policy("static", order="total").reads_prediction
    assert not any(make_policy("static", order=o).reads_prediction for o in ORDERS if o not in NEEDS_PREDICTION)


@pytest.mark.parametrize(("params", "message"), [
    ({"order": "sjf"}, "policy.order: unknown 'sjf'; allowed: fcfs, prompt, output, total, las, mlfq, lpm"),
    ({"chunk_size": -1}, "policy.chunk_size: must be >= 0"),
    ({"max_num_seqs": 0}, "policy.max_num_seqs: must be >= 1"),
    ({"quantum": 0}, "policy.quantum: must be >= 1"),
    ({"budget": 3}, "policy.budget: unknown parameter"),
    ({"order": "output", "prompt_weight": -0.5}, "policy.prompt_weight: must be a finite number >= 0, got -0.5"),
    ({"order": "prompt", "prompt_weight": 0.5}, "policy.prompt_weight: only order 'output' reads it, got order 'prompt'"),
])
def test_bad_parameters_are_one_line_errors(params, message):
    with pytest.raises(PolicyError, match=message.replace("(", r"\(")):
        make_policy("static", **params)
