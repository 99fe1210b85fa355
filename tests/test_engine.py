"""Engine invariants: conservation, memory, token accounting, determinism, fast-forward exactness."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from baselines import make_policy
from llmsched_gym.core.engine import Engine, EngineConfig
from llmsched_gym.core.latency import LinearKVLatency, UnitLatency, make_latency
from llmsched_gym.core.metrics import summarize
from llmsched_gym.core.records import request_table
from llmsched_gym.core.request import Workload
from llmsched_gym.core.scheduler import BatchPlan, PlanError, Scheduler
from llmsched_gym.sim import simulate

HANDLERS = ["forbid", "clear_all", "clear_bernoulli", "preempt_lifo_recompute", "swap"]


@st.composite
def configs(draw):
    n = draw(st.integers(1, 25))
    seed = draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    round_mode = draw(st.booleans())
    if round_mode:
        arrival = np.sort(rng.integers(0, 20, n)).astype(float)
    else:
        arrival = np.sort(rng.uniform(0, 2.0, n))
    prompt = rng.integers(1, 40, n)
    output = rng.integers(1, 30, n)
    prefix = None
    if draw(st.booleans()):
        prefix = [((int(g), 16),) if p >= 16 else None for g, p in zip(rng.integers(0, 3, n), prompt, strict=True)]
    wl = Workload(arrival_s=arrival, prompt_tokens=prompt, output_tokens=output, prefix=prefix)
    bs = draw(st.sampled_from([1, 4, 16]))
    need = int(((prompt + output + bs - 1) // bs * bs).max())
    cap = draw(st.integers(need, need * 4))
    overflow = draw(st.sampled_from(HANDLERS))
    admission = "reserve" if overflow == "forbid" else draw(st.sampled_from(["fit", "reserve"]))
    cfg = EngineConfig(
        kv_capacity_tokens=cap, block_size=bs, prefill_emits_token=draw(st.booleans()), overflow=overflow,
        overflow_beta=0.5, preempt_mode=draw(st.sampled_from(["recompute", "restart"])),
        latency_noise_cv=draw(st.sampled_from([0.0, 0.1])), stall_iterations=3000,
    )
    latency = UnitLatency() if round_mode else LinearKVLatency(0.01, 1e-4)
    return wl, cfg, latency, admission, seed


def run(wl, cfg, latency, admission, seed, **kw):
    e = Engine(wl, cfg, latency, make_policy("fcfs", admission=admission), seed=seed, **kw)
    e.run()
    return e


def canonical(e: Engine) -> str:
    s = summarize(e, "t", "fcfs")
    s.pop("wall_time_s")
    table = {k: np.asarray(v).tolist() for k, v in request_table(e).items()}
    log = {k: np.asarray(v).tolist() for k, v in e.iteration_log().items()}
    return json.dumps({"summary": s, "requests": table, "log": log}, sort_keys=True, default=str)


@given(configs())
def test_no_request_is_lost(c):
    e = run(*c)
    s = summarize(e)
    assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"]
    if not e.non_terminating:
        assert s["n_completed"] == len(c[0])


@given(configs())
def test_tokens_decoded_equal_outputs_plus_partial_progress(c):
    e = run(*c)
    done = e.state == 3
    live = (e.state == 1) | (e.state == 2)
    expect = int(e.workload.output_tokens[done].sum() + e.generated[live].sum()) + e.discarded_tokens
    assert e.total_decoded == expect
    assert np.all(e.generated[done] == e.workload.output_tokens[done])


@given(configs())
def test_kv_never_exceeds_capacity_in_forbid_mode(c):
    wl, cfg, latency, admission, seed = c
    if cfg.overflow != "forbid":
        cfg.overflow = "forbid"
        admission = "reserve"
    e = run(wl, cfg, latency, admission, seed)
    log = e.iteration_log()
    assert np.all(log["kv_used"] <= log["kv_capacity"])
    assert e.kv_peak_blocks <= e.kv.capacity_blocks


@given(configs())
def test_fast_forward_equals_step_by_step(c):
    wl, cfg, latency, admission, seed = c
    cfg.fast_forward = True
    a = canonical(run(wl, cfg, latency, admission, seed))
    cfg.fast_forward = False
    b = canonical(run(wl, cfg, latency, admission, seed))
    assert a == b


@pytest.mark.parametrize("scenario", ["jaillet-low", "vtc-arena", "echo-hybrid"])
def test_fast_forward_equals_step_by_step_on_scenarios(scenario, request):
    if scenario == "vtc-arena":
        request.getfixturevalue("traces_dir")
    over = {"workload.n_requests": 300} if scenario != "vtc-arena" else {"workload.n_requests": 300}
    if scenario == "echo-hybrid":
        over = {"workload.horizon_s": 60.0, "workload.classes.offline.n_requests": 40}
    a = simulate(scenario, seed=3, overrides={**over, "engine.fast_forward": True})
    b = simulate(scenario, seed=3, overrides={**over, "engine.fast_forward": False})
    a.summary.pop("wall_time_s")
    b.summary.pop("wall_time_s")
    assert a.summary == b.summary
    for k in a.iterations:
        np.testing.assert_array_equal(a.iterations[k], b.iterations[k])
    assert a.summary["iterations"] > 0


def test_same_seed_gives_byte_identical_summary_json():
    def js(seed):
        s = simulate("jaillet-low", seed=seed, overrides={"workload.n_requests": 400}).summary
        s.pop("wall_time_s")
        return json.dumps(s, sort_keys=True)

    assert js(5) == js(5)
    assert js(5) != js(6)


def test_iteration_log_matches_contract_and_busy_time():
    r = simulate("echo-hybrid", seed=0, overrides={"workload.horizon_s": 60.0,
                                                   "workload.classes.offline.n_requests": 40})
    log = r.iterations
    from llmsched_gym.core.engine import LOG_COLUMNS

    assert set(LOG_COLUMNS) <= set(log)
    assert len(log["t_start"]) == r.summary["iterations"]
    np.testing.assert_allclose(log["duration"].sum(), r.engine.busy_time, rtol=1e-9)
    assert np.all(np.diff(log["t_start"]) >= 0)


def test_prefix_cache_hits_reduce_prefill_and_are_counted():
    # two requests share a 32-token system prompt; the second arrives after the first finished
    wl = Workload(arrival_s=[0.0, 10.0], prompt_tokens=[40, 40], output_tokens=[2, 2],
                  prefix=[((7, 32),), ((7, 32),)])
    cfg = EngineConfig(kv_capacity_tokens=256, block_size=16)
    e = Engine(wl, cfg, UnitLatency(), make_policy("fcfs"), seed=0)
    e.run()
    assert e.cached_tokens.tolist() == [0, 32]
    assert e.total_prefill_tokens == 40 + 8
    assert summarize(e)["prefix_hit_rate"] == pytest.approx(32 / 80)


def test_prefix_cache_evicts_least_recently_used_blocks():
    # capacity of 5 blocks of 4: request 0 caches 2 blocks (A), request 1 caches 2 blocks (B);
    # request 2 needs room, so the LRU group (A) is evicted and a later A-request misses
    wl = Workload(arrival_s=[0, 10, 20, 30], prompt_tokens=[9, 9, 9, 9], output_tokens=[1, 1, 8, 1],
                  prefix=[((1, 8),), ((2, 8),), None, ((1, 8),)])
    cfg = EngineConfig(kv_capacity_tokens=20, block_size=4, prefill_emits_token=True)
    e = Engine(wl, cfg, UnitLatency(), make_policy("fcfs"), seed=0)
    e.run()
    assert e.kv.evicted_blocks >= 2
    assert e.cached_tokens[3] == 0


def test_swap_pays_transfer_time_both_ways():
    wl = Workload(arrival_s=[0.0], prompt_tokens=[100], output_tokens=[10])

    class SwapOnce(Scheduler):
        name = "swap-once"

        def schedule(self, view):
            if view.waiting and view.iteration == 3:
                return BatchPlan.admit(view.waiting)
            if view.waiting and view.iteration == 0:
                return BatchPlan.admit(view.waiting)
            if view.iteration == 2 and view.running:
                return BatchPlan(preempt=list(view.running), decode=False)
            return BatchPlan()

    cfg = EngineConfig(kv_capacity_tokens=1000, preempt_mode="swap", swap_gb_s=1.0, kv_bytes_per_token=1_000_000)
    e = Engine(wl, cfg, UnitLatency(), SwapOnce(), seed=0)
    e.run()
    assert e.n_completed == 1 and e.recomputed_tokens.sum() == 0
    # 100 prefill + 2 decoded tokens = 102 tokens of 1 MB at 1 GB/s, out and back in
    assert e.busy_time == pytest.approx(e.n_iterations + 2 * 0.102)


def test_swap_out_mid_prefill_resumes_the_prefill_where_it_stopped():
    # chunks of 40: swapped out after the first chunk, swapped back in, it owes 60 more tokens
    wl = Workload(arrival_s=[0.0], prompt_tokens=[100], output_tokens=[3])

    class SwapMidPrefill(Scheduler):
        name = "swap-mid-prefill"

        def schedule(self, view):
            if view.iteration == 1 and view.running:
                return BatchPlan(preempt=list(view.running), decode=False)
            if view.waiting:
                return BatchPlan(prefill={view.waiting[0]: 40})
            run = [r for r in view.running if view.prefilled[r] < view.prefill_target[r]]
            return BatchPlan(prefill={r: 40 for r in run})

    cfg = EngineConfig(kv_capacity_tokens=1000, preempt_mode="swap")
    e = Engine(wl, cfg, UnitLatency(), SwapMidPrefill(), seed=0)
    counts = []
    while e.poll():
        e.execute(e.scheduler.schedule(e.view))
        counts.append(e.n_in_prefill)
    assert e.n_completed == 1 and e.recomputed_tokens.sum() == 0
    assert e.total_prefill_tokens == 100  # nothing prefilled twice
    # in prefill after the first chunk, not while swapped out, again until its last chunk (80 -> 100)
    assert counts[:4] == [1, 0, 1, 0] and min(counts) >= 0


def test_recompute_preemption_reprefills_prompt_plus_generated():
    wl = Workload(arrival_s=[0.0], prompt_tokens=[10], output_tokens=[5])

    class PreemptOnce(Scheduler):
        name = "preempt-once"
        done = False

        def schedule(self, view):
            if view.waiting:
                return BatchPlan.admit(view.waiting)
            if view.generated[0] == 3 and not self.done:
                self.done = True
                return BatchPlan(preempt=[0], decode=False)
            return BatchPlan()

    e = Engine(wl, EngineConfig(kv_capacity_tokens=100), UnitLatency(), PreemptOnce(), seed=0)
    e.run()
    assert e.recomputed_tokens[0] == 10 + 3
    assert e.total_prefill_tokens == 10 + 13
    assert e.generated[0] == 5 and e.n_completed == 1


def test_forbid_refuses_an_infeasible_plan_naming_the_request():
    wl = Workload(arrival_s=[0, 0], prompt_tokens=[60, 60], output_tokens=[5, 5])
    cfg = EngineConfig(kv_capacity_tokens=100, overflow="forbid")

    class Greedy(Scheduler):
        name = "greedy"

        def schedule(self, view):
            return BatchPlan.admit(view.waiting)

    with pytest.raises(PlanError, match=r"request 1 .*prefill 60"):
        Engine(wl, cfg, UnitLatency(), Greedy(), seed=0).run()


def test_a_request_larger_than_the_capacity_is_rejected_with_its_reason_and_the_rest_served():
    wl = Workload(arrival_s=[0, 1, 2], prompt_tokens=[60, 30, 70], output_tokens=[50, 20, 40])
    for bs, unit in ((1, "110 tokens"), (16, "7 blocks of 16")):
        e = Engine(wl, EngineConfig(kv_capacity_tokens=100, block_size=bs), UnitLatency(), make_policy("fcfs"))
        e.run()
        assert e.state.tolist() == [4, 3, 4] and e.n_completed == 1 and e.n_rejected == 2
        assert e.reject_reason[0] == f"needs {unit} of KV (prompt 60 + output 50 tokens), more than the capacity of " + (
            "100" if bs == 1 else "6")


def test_an_empty_workload_is_a_clean_empty_run():
    e = Engine(Workload(arrival_s=[], prompt_tokens=[], output_tokens=[]), EngineConfig(), UnitLatency(),
               make_policy("fcfs"))
    e.run()
    assert (e.n_iterations, e.n_completed, e.non_terminating, e.stop_reason) == (0, 0, False, "all requests finished")


def test_horizon_reports_unfinished_requests():
    s = simulate("jaillet-high", seed=0, overrides={"workload.n_requests": 2000, "engine.horizon_s": 5.0}).summary
    assert s["n_unfinished"] > 0
    assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"]
    assert s["stop_reason"] == "horizon"


def test_round_mode_counts_unit_iterations():
    wl = Workload(arrival_s=[0, 0, 1], prompt_tokens=[1, 1, 1], output_tokens=[3, 2, 1])
    cfg = EngineConfig(kv_capacity_tokens=100, prefill_emits_token=False)
    e = Engine(wl, cfg, make_latency("unit"), make_policy("fcfs"), seed=0)
    e.run()
    # prefill round + o decode rounds, completion at the end of the last round
    assert e.completion_s.tolist() == [4.0, 3.0, 3.0]
