"""Engine baselines: vLLM v1 / v0, Sarathi, SJF / SRPT (Ao et al. 2025, section 6)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from baselines import PolicyError, make_policy
from llmsched_gym.core.engine import Engine
from llmsched_gym.core.ledger import Ledger
from llmsched_gym.core.scheduler import BatchPlan
from llmsched_gym.sim import make_engine, simulate


def toy(arrival, prompt, output, capacity, block_size=1, emits=True, latency="unit", predicted=None) -> dict:
    explicit = {"arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output}
    if predicted is not None:
        explicit["predicted_output"] = predicted
    return {"name": "toy", "workload": {"explicit": explicit},
            "engine": {"kv_capacity_tokens": capacity, "block_size": block_size, "prefill_emits_token": emits,
                       "overflow": "forbid"},
            "latency": latency, "policy": "fcfs"}


def run_plans(scenario: dict, policy: str | dict, seed: int = 0):
    """Run the engine step by step; returns the engine and (time, waiting, plan) per decision."""
    engine, _ = make_engine(scenario, policy, seed=seed, log_batches=True)
    sched, view = engine.scheduler, engine.view
    steps: list[tuple[float, list[int], BatchPlan]] = []
    while engine.poll():
        waiting = list(view.waiting)
        plan = sched.schedule(view)
        steps.append((engine.clock, waiting, plan))
        engine.execute(plan)
    return engine, steps


# ---- vLLM v1 --------------------------------------------------------------------------------
# A and B (prompt 8, 6 tokens out) start together in a 20-token KV; C (prompt 1) arrives at
# t = 1.5. At t = 2 (unit batches) A's decode finds no free token: vLLM v1 preempts the newest
# running request, B, and admits nothing that step although C would fit.
PREEMPT_CASE = toy([0.0, 0.0, 1.5], [8, 8, 1], [6, 6, 5], capacity=20)


def test_vllm_v1_preempts_the_newest_running_request():
    engine, steps = run_plans(PREEMPT_CASE, "vllm-v1")
    first = next((t, p) for t, _, p in steps if p.preempt)
    assert first[0] == 2.0
    assert first[1].preempt == [1]
    assert engine.preemptions[0] == 0
    assert engine.n_completed == 3


def test_vllm_v1_admits_nothing_on_a_preempting_step():
    engine, steps = run_plans(PREEMPT_CASE, "vllm-v1")
    t, waiting, plan = next(s for s in steps if s[2].preempt)
    # C (1 prompt token + token 1) would fit: evicting B leaves 20 - 10 (A) - 1 (A's token) = 9
    assert waiting == [2]
    assert plan.prefill == {}
    # afterwards strict head-of-line: C never starts before the victim B, now at the queue head
    assert engine.first_scheduled_s[2] >= engine.first_scheduled_s[1] or engine.preemptions[1] == 0


def test_vllm_v1_resumed_request_reprefills_prompt_plus_generated():
    engine, steps = run_plans(PREEMPT_CASE, "vllm-v1")
    # B had produced token 1 at its prefill (t = 0) and token 2 at t = 1 when it was preempted
    assert engine.recomputed_tokens[1] == 8 + 2
    chunks = [c for b in engine.batches for rid, c, _ in b["prefill"] if rid == 1]
    assert chunks[0] == 8 and sum(chunks[1:]) == 8 + 2
    assert engine.generated[1] == 6 and engine.n_completed == 3


def test_vllm_v1_chunks_long_prefills_within_the_token_budget():
    sc = toy([0.0, 0.0], [10, 700], [30, 3], capacity=2000)
    engine, steps = run_plans(sc, {"name": "vllm-v1", "max_num_batched_tokens": 256,
                                   "long_prefill_token_threshold": 200})
    chunks = [c for b in engine.batches for rid, c, _ in b["prefill"] if rid == 1]
    # running A first (its prefill, then 1 decode token), then B's chunks capped at 200
    assert chunks == [200, 200, 200, 100]
    for b in engine.batches:
        assert sum(c for _, c, _ in b["prefill"]) + len(b["decode"]) <= 256


@given(
    st.lists(st.tuples(st.integers(0, 6), st.integers(1, 40), st.integers(1, 30)), min_size=1, max_size=12),
    st.sampled_from([1, 4]),
    st.integers(0, 1),
)
def test_vllm_v1_plans_fit_without_the_engine_evicting(reqs, block_size, emits):
    reqs.sort()
    cap = max(p + o for _, p, o in reqs) + block_size * 4 + 20
    sc = toy([float(a) for a, _, _ in reqs], [p for _, p, _ in reqs], [o for _, _, o in reqs],
             capacity=cap, block_size=block_size, emits=bool(emits))
    engine, steps = run_plans(sc, {"name": "vllm-v1", "max_num_batched_tokens": 48, "max_num_seqs": 5})
    assert engine.n_completed == len(reqs)
    # every preemption is the policy's own (newest first), never the engine's fallback
    assert engine.n_preempt_events == sum(len(p.preempt) for _, _, p in steps)
    for _, waiting, p in steps:
        if p.preempt:
            assert not set(p.prefill) & set(waiting)
    for b in engine.batches:
        assert sum(c for _, c, _ in b["prefill"]) + len(b["decode"]) <= 48
    assert int(engine.iteration_log()["n_running"].max()) <= 5


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 24), st.integers(1, 40)), min_size=8, max_size=24),
    st.sampled_from([1, 4, 16]),
    st.integers(4, 60),
    st.integers(0, 1),
)
def test_vllm_v1_counts_an_all_decode_batch_at_once_as_its_scan_does(reqs, block_size, budget, emits):
    """Eight or more running requests that all decode: vLLM v1 counts their blocks with one array
    operation when the budget reaches the last of them (a budget of 4 to 60 tokens: some stop the
    scan early); every plan of a run with preemptions (a KV for about half the requests) equals the
    request-by-request scan's on the same state."""
    import baselines.vllm as vllm_mod

    reqs.sort()
    cap = max(p + o for _, p, o in reqs) + sum(p + o for _, p, o in reqs) // 2 + 2 * block_size
    sc = toy([float(a) for a, _, _ in reqs], [p for _, p, _ in reqs], [o for _, _, o in reqs],
             capacity=cap, block_size=block_size, emits=bool(emits))
    sc["engine"]["overflow"] = "preempt_lifo_recompute"
    engine, _ = make_engine(sc, {"name": "vllm-v1", "max_num_batched_tokens": budget})
    sched, view = engine.scheduler, engine.view
    counted: list[int] = []  # the batches counted at once
    lockstep: list[int] = []  # ... of which from the engine's decode set (O(1))
    real = Engine.decode_blocks

    def checked(e: Engine) -> int:
        got = real(e)
        assert got == Ledger.decodes(e.ledger, e.running)  # the lockstep count is the KV count
        counted.append(len(e.running))
        if e._ds is not None and len(e._ds.members) == len(e.running):
            lockstep.append(got)
        return got

    with mock.patch.object(Engine, "decode_blocks", checked):
        while engine.poll():
            plan = sched.schedule(view)
            with mock.patch.object(vllm_mod, "_DECODES_AT_ONCE", 10**9):
                assert sched.schedule(view) == plan
            engine.execute(plan)
    assert engine.n_completed == len(reqs)
    if len(reqs) >= 16 and block_size == 1 and budget >= 40:  # 8 running decode at some point
        assert counted and min(counted) >= 8
    if counted and len(counted) >= 4:
        assert lockstep  # the decode set is current for most all-decode steps


# ---- vLLM v0 --------------------------------------------------------------------------------
def test_vllm_v0_runs_prefill_only_batches_and_decodes_only_without_prefill():
    sc = toy([0.0, 0.0, 2.5, 2.5, 6.0], [20, 30, 10, 40, 5], [6, 4, 8, 3, 2], capacity=400)
    r = simulate(sc, "vllm-v0", seed=0)
    log = r.iterations
    has_prefill = log["n_prefill_tokens"] > 0
    assert has_prefill.any() and (~has_prefill).any()
    assert np.all(log["n_decode"][has_prefill] == 0)
    assert r.summary["n_completed"] == 5


def test_vllm_v0_keeps_the_block_watermark_free_at_admission():
    # 10 blocks of 16, watermark 20 % = 2 blocks: each 40-token prompt (+ token 1) takes 3
    # blocks, so only two are admitted at once (4 blocks left; a third would leave 1 < 2)
    sc = toy([0.0] * 3, [40] * 3, [2] * 3, capacity=160, block_size=16)
    engine, steps = run_plans(sc, {"name": "vllm-v0", "watermark": 0.2})
    assert list(steps[0][2].prefill) == [0, 1]
    assert steps[0][2].decode is False
    assert engine.n_completed == 3


def test_vllm_v0_padded_token_limit_cuts_the_prefill_batch():
    sc = toy([0.0] * 4, [10, 100, 10, 10], [2] * 4, capacity=1000)
    _, steps = run_plans(sc, {"name": "vllm-v0", "max_num_batched_tokens": 250})
    # 2 x 100 = 200 fits, 3 x 100 = 300 does not
    assert list(steps[0][2].prefill) == [0, 1]


# ---- Sarathi --------------------------------------------------------------------------------
def test_sarathi_decodes_first_then_chunks_the_prefill_within_the_budget():
    sc = toy([0.0, 0.5], [10, 1200], [50, 2], capacity=4000)
    engine, _ = run_plans(sc, "sarathi")
    chunks = [c for b in engine.batches for rid, c, _ in b["prefill"] if rid == 1]
    # A decodes one token every step, so B gets 512 - 1 per step
    assert chunks == [511, 511, 178]
    mixed = [b for b in engine.batches if b["prefill"] and b["decode"]]
    assert len(mixed) == 3
    for b in engine.batches:
        assert sum(c for _, c, _ in b["prefill"]) + len(b["decode"]) <= 512


def test_sarathi_preempts_the_newest_running_request_on_a_block_shortage():
    engine, steps = run_plans(PREEMPT_CASE, "sarathi")
    first = next(p for _, _, p in steps if p.preempt)
    assert first.preempt == [1]
    assert engine.n_completed == 3


# ---- SJF / SRPT -----------------------------------------------------------------------------
def test_sjf_admits_the_shortest_predicted_job_first():
    # one request fits at a time (prompt 5 + output <= 12 within 20 tokens, two would not)
    sc = toy([0.0] * 4, [5] * 4, [12, 3, 8, 1], capacity=20, emits=False)
    r = simulate(sc, "sjf", seed=0)
    order = np.argsort(r.requests["completion_s"], kind="stable")
    assert order.tolist() == [3, 1, 2, 0]
    assert r.summary["preemptions"] == 0


def test_srpt_preempts_a_longer_running_request_for_a_shorter_arrival():
    # A (prompt 100, 30 out) runs alone; B (prompt 40, 2 out) arrives at t = 3: beside A (103
    # tokens, growing) it would need 42 more tokens at its completion, past the 140 of KV
    sc = toy([0.0, 3.0], [100, 40], [30, 2], capacity=140, emits=False)
    engine, steps = run_plans(sc, "srpt")
    t, _, plan = next(s for s in steps if s[2].preempt)
    assert t == 3.0 and plan.preempt == [0] and list(plan.prefill) == [1]
    assert engine.completion_s[1] < engine.completion_s[0]
    # non-preemptive SJF lets A finish first
    r = simulate(sc, "sjf", seed=0)
    assert r.requests["completion_s"][0] < r.requests["completion_s"][1]


def test_sjf_fit_admission_overflow_goes_to_the_engine_handler():
    r = simulate("azure-conv", {"name": "sjf", "admission": "fit"}, seed=0,
                 overrides={"workload.n_requests": 150})
    s = r.summary
    assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"] == 150


# ---- parameters and the azure-conv runs -------------------------------------------------------
@pytest.mark.parametrize("policy,params,needle", [
    ("vllm-v1", {"max_num_seqs": 0}, "policy.max_num_seqs"),
    ("vllm-v1", {"watermark": 1.5}, "policy.watermark"),
    ("vllm-v1", {"block": 3}, "policy.block"),
    ("vllm-v0", {"max_num_batched_tokens": -1}, "policy.max_num_batched_tokens"),
    ("sarathi", {"chunk_size": 0}, "policy.chunk_size"),
    ("sjf", {"admission": "maybe"}, "policy.admission"),
    ("srpt", {"max_num_seqs": -2}, "policy.max_num_seqs"),
])
def test_engine_policies_reject_bad_parameters_in_one_line(policy, params, needle):
    with pytest.raises(PolicyError) as e:
        make_policy(policy, **params)
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("policy", ["vllm-v1", "vllm-v0", "sarathi", "sjf", "srpt"])
def test_engine_policies_on_azure_conv_conserve_requests(policy):
    r = simulate("azure-conv", policy, seed=1, overrides={"workload.n_requests": 300})
    s = r.summary
    assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"] == 300
    assert s["n_completed"] == 300 and not s["non_terminating"]
    assert s["kv_peak_frac"] <= 1.0


@pytest.mark.parametrize("policy", ["vllm-v1", "vllm-v0", "sarathi", "sjf", "srpt", {"name": "sjf", "admission": "fit"}])
def test_engine_policies_hold_only_when_the_plan_would_repeat(policy):
    # a wrong hold promise makes the engine's fast-forward differ from the step-by-step run
    runs = [simulate("azure-conv", policy, seed=2, overrides={"workload.n_requests": 150, "engine.fast_forward": ff})
            for ff in (True, False)]
    assert np.array_equal(runs[0].requests["completion_s"], runs[1].requests["completion_s"])
    assert runs[0].summary["iterations"] == runs[1].summary["iterations"]
