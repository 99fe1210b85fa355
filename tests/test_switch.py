"""``core.switch.Switch``: several policies behind one Scheduler (the env's ``meta`` mode).

* A Switch whose active candidate never changes runs exactly as that policy alone, for every
  registered policy, even with the stateful policies listening as the other candidates.
* Switching at random over every registered policy keeps every plan valid (no PlanError), every
  request accounted for, every stateful policy's queue equal to the engine's, and every run
  terminating with all requests finished (no loop-detector truncation).
* A whole-prefill policy that takes over from a chunking one finishes the prefills left
  unfinished; RPM serves the arrivals it refused but the active policy accepted.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from conftest import ORACLE, small_cuts, summaries_equal
from hypothesis import given, settings
from hypothesis import strategies as st

import baselines
from baselines import make_policy
from baselines.echo import EchoFamily
from baselines.klpm import _PrefixAware
from baselines.mcsf import MCSF
from baselines.vtc import _CounterPolicy, _FairAdmission
from llmsched_gym.core.metrics import summarize
from llmsched_gym.core.scheduler import BatchPlan, Scheduler
from llmsched_gym.core.switch import Switch
from llmsched_gym.sim import make_engine, simulate

# azure-conv is run clairvoyant here, so that every registered policy (vtc-oracle, which reads the
# true lengths, too) can be a candidate; tests/test_information.py covers the predicted task
SMALL = small_cuts(60, ("azure-conv", "jaillet-high", "vtc-arena", "klpm-toy", "wait-high", "nested-synth4",
                        "echo-hybrid"), offline=10, sizes={"echo-hybrid": 20}, extra={"azure-conv": ORACLE})
# small KV so that requests queue, preempt and chunk
TIGHT = {
    "azure-conv": {"workload.n_requests": 120, "engine.kv_capacity_tokens": 16000, **ORACLE},
    "jaillet-high": {"workload.n_requests": 120, "engine.kv_capacity_tokens": 6000},
    "vtc-arena": {"workload.n_requests": 120, "engine.kv_capacity_tokens": 4000},
    "klpm-toy": {},
    "wait-high": {"workload.n_requests": 120, "engine.kv_capacity_tokens": 20000},
    "echo-hybrid": {"workload.n_requests": 40, "workload.classes.offline.n_requests": 40,
                    "engine.kv_capacity_tokens": 24000},
}
PAPER = {
    "mcsf": "jaillet-high", "alpha-beta": "jaillet-high", "alpha-greedy": "jaillet-high", "semi-online": "jaillet-high",
    "fcfs-greedy-lifo": "wait-high", "wait": "wait-high", "nested-wait": "nested-synth4",
    "vllm-v0": "wait-high", "vllm-v1": "wait-high", "sarathi": "wait-high",
    "vtc": "vtc-arena", "vtc-weighted": "vtc-arena", "vtc-predict": "vtc-arena", "vtc-oracle": "vtc-arena",
    "lcf": "vtc-arena", "rpm": "vtc-arena", "drr": "vtc-arena",
    "lpm": "klpm-toy", "k-lpm": "klpm-toy", "sglang-lpm": "klpm-toy",
    "echo": "echo-hybrid", "echo-bs": "echo-hybrid", "echo-bs-e": "echo-hybrid", "echo-bs-e-s": "echo-hybrid",
    "fcfs": "azure-conv", "sjf": "azure-conv", "srpt": "azure-conv", "static": "azure-conv",
}
# candidates that listen to the engine's hooks but force no engine setting: alongside any policy
# they must leave its run untouched
LISTENERS = ["mcsf", "srpt", "k-lpm", "vtc", "vtc-predict", "drr", "rpm"]


def run_switch(scenario: str, sw: Switch, seed: int, overrides: dict, choose=None, check=None):
    """Drive the engine loop with ``sw``; ``choose(k, view)`` sets the active candidate."""
    engine, _ = make_engine(scenario, sw, seed, overrides)
    view = engine.view
    k = 0
    while engine.poll():
        if choose is not None:
            sw.active = choose(k, view)
        waiting = list(view.waiting)
        plan = sw.schedule(view)
        if check is not None:
            check(sw.candidates[sw.active], view, waiting, plan)
        engine.execute(plan)
        k += 1
    return engine, summarize(engine, scenario, sw.name, 0.0)


# ---- the Switch itself ----------------------------------------------------------------------
def test_switch_api():
    vtc, fcfs, beta = make_policy("vtc"), make_policy("fcfs"), make_policy("alpha-beta", beta=0.3)
    sw = Switch([fcfs, vtc, beta, make_policy("vllm-v1")])
    assert sw.name == "switch" and sw.active == 0 and sw.candidates[1] is vtc
    for hook in ("on_arrival", "on_tokens", "on_preempt", "on_finish"):
        assert sw.wants(hook)  # vtc wants them, fcfs does not
    assert not sw.wants("on_prefill")
    assert not Switch([fcfs]).wants("on_arrival")
    # first candidate that sets a key wins
    assert sw.engine_overrides == {"overflow": "clear_bernoulli", "overflow_beta": 0.3, "preempt_mode": "recompute",
                                   "prefix_cap_prompt_minus_one": True}
    with pytest.raises(ValueError, match="at least one"):
        Switch([])
    with pytest.raises(ValueError, match="listed twice"):
        Switch([fcfs, fcfs])


def test_reset_gives_every_candidate_the_same_stream():
    a, b = make_policy("lpm"), make_policy("lpm")
    sw = Switch([a, b])
    rng = np.random.default_rng(5)
    sw.reset(None, rng)
    assert a.rng is not b.rng and a.rng is not rng
    assert a.rng.random(4).tolist() == b.rng.random(4).tolist() == copy.deepcopy(rng).random(4).tolist()


class _Recorder(Scheduler):
    name = "recorder"

    def __init__(self, accept: bool = True) -> None:
        self.accept, self.seen = accept, []

    def on_arrival(self, req_id, view):
        self.seen.append(req_id)
        return self.accept

    def reject_reason(self, req_id):
        return "recorder says no"

    def schedule(self, view):
        return BatchPlan.admit(view.waiting)


@pytest.mark.parametrize("active", [0, 1])
def test_the_active_candidate_alone_decides_rejections(active):
    no, yes = _Recorder(accept=False), _Recorder(accept=True)
    sw = Switch([no, yes])
    sw.active = active
    engine, s = run_switch("azure-conv", sw, 0, {"workload.n_requests": 10})
    if active == 0:
        # rejected by the active candidate; the others are not told of a request that never enters
        assert s["n_rejected"] == 10 and set(engine.reject_reason.values()) == {"recorder says no"}
        assert no.seen == list(range(10)) and yes.seen == []
    else:
        # the inactive candidate's refusal is ignored
        assert s["n_rejected"] == 0 and s["n_completed"] == 10
        assert no.seen == yes.seen == list(range(10))


# ---- a fixed Switch is the policy alone -------------------------------------------------------
@pytest.mark.parametrize("name", baselines.available())
def test_fixed_switch_runs_as_the_policy_alone(name):
    scenario = PAPER[name]
    ref = simulate(scenario, name, 3, SMALL[scenario])
    sw = Switch([make_policy(name), make_policy("fcfs")])
    engine, _ = make_engine(scenario, sw, 3, SMALL[scenario])
    engine.run()
    s = summarize(engine, scenario, "switch", 0.0)
    summaries_equal(ref.summary, s)
    assert np.array_equal(ref.engine.completion_s, engine.completion_s, equal_nan=True)


@pytest.mark.parametrize("name", baselines.available())
def test_fixed_switch_with_stateful_listeners_runs_as_the_policy_alone(name):
    # the policy first (its engine overrides win), then listeners that see every hook; on a tight
    # azure-conv so that requests queue, preempt and (for the chunking policies) prefill in chunks
    scenario = "echo-hybrid" if name.startswith("echo") else "azure-conv"
    overrides = TIGHT[scenario]
    ref = simulate(scenario, name, 1, overrides).summary
    sw = Switch([make_policy(name)] + [make_policy(n) for n in LISTENERS if n != name])
    engine, s = run_switch(scenario, sw, 1, overrides)
    summaries_equal(ref, s)
    check_final(sw, engine)  # the listeners followed: empty queues, DRR charged for everything
    # and the same policy last, the active index pointing at it
    sw = Switch([make_policy("fcfs"), make_policy(name)])
    _, s = run_switch(scenario, sw, 1, overrides, choose=lambda k, view: 1)
    summaries_equal(ref, s)


# ---- switching at random ------------------------------------------------------------------------
def queued(pol: Scheduler, view) -> list[int] | None:
    """The requests ``pol`` holds as waiting (None: it keeps no queue, or has not started)."""
    if isinstance(pol, MCSF):
        return [r for _, r in pol._queue]
    if isinstance(pol, _FairAdmission):
        if not pol._ready:
            return None
        assert pol._active == {c for c, q in enumerate(pol._queue) if q}
        ids = [r for c in pol._active for r in pol._queue[c]]
        assert pol._n_queued == len(ids)
        return ids
    if isinstance(pol, EchoFamily):
        if not pol._ready:
            return None
        pool = list(pol._fcfs) if not pol.greedy else [r for g in pol._groups.values() for r in g]
        assert pol._n_pool == len(pool)
        if pol.greedy:
            assert set(pol._where) == set(pool)
        return list(pol._online) + pool
    return None


def check_in_sync(pol: Scheduler, view, waiting: list[int], plan: BatchPlan) -> None:
    """After the active policy's decision its queue is the engine's minus what it admitted."""
    admitted = [r for r in plan.prefill if view.state[r] == 1]
    assert set(admitted) <= set(waiting)
    ids = queued(pol, view)
    if ids is not None:
        assert len(ids) == len(set(ids)), f"{pol.name}: duplicate queue entries"
        assert sorted(ids + admitted) == sorted(waiting), f"{pol.name}: queue out of sync with the engine"
    if isinstance(pol, _PrefixAware):
        need = min((pol._need(view, r) for r in waiting), default=math.inf)
        assert pol._min_need(view) == need


def check_final(sw: Switch, engine) -> None:
    """Every request finished; every policy, once synced, holds no queue and owes no charge."""
    view = engine.view
    wl = engine.workload
    for pol in sw.candidates:
        if isinstance(pol, MCSF):
            assert pol.sync(view) == []
        elif isinstance(pol, _FairAdmission) and pol._ready:
            pol._sync(view)
            assert not pol._active and pol._n_queued == 0
            if isinstance(pol, _CounterPolicy) and pol.name in ("lcf", "drr"):
                # every request charged exactly h(prompt, output) (no lift), whoever admitted it
                done = engine.state == 3
                want = np.bincount(wl.client[done], minlength=pol.n_clients,
                                   weights=pol.w_p * wl.prompt_tokens[done] + pol.w_q * wl.output_tokens[done])
                assert pol._charged[done].all()
                assert np.allclose(pol.counter, want, rtol=1e-12), pol.name
        elif isinstance(pol, EchoFamily) and pol._ready:
            pol._sync(view)
            assert not pol._online and pol._n_pool == 0
            assert not any(pol._count.values())  # every offline request finished


@pytest.mark.parametrize("scenario", ["azure-conv", "jaillet-high", "vtc-arena", "echo-hybrid", "klpm-toy", "wait-high"])
@given(seed=st.integers(0, 2**16), stay=st.sampled_from([0.0, 0.8]),
       forced=st.sampled_from([None, "preempt_lifo_recompute"]))
@settings(max_examples=3, deadline=None, derandomize=True)
def test_random_switching_keeps_every_policy_valid_and_every_request(scenario, seed, stay, forced):
    # every registered policy is a candidate; the active one is redrawn at every decision (kept
    # with probability ``stay``), so each stateful policy meets requests the others admitted,
    # preempted or prefilled in part. Overflow: the Switch's merged engine overrides
    # (clear_bernoulli, alpha-beta's, the first candidate that sets it) or vLLM's LIFO handler.
    sw = Switch([make_policy(n) for n in baselines.available()])
    overrides = dict(TIGHT[scenario])
    if forced:
        overrides["engine.overflow"] = forced
    rng = np.random.default_rng(seed)
    n = len(sw.candidates)

    def choose(k, view):
        return sw.active if k and rng.random() < stay else int(rng.integers(n))

    engine, s = run_switch(scenario, sw, seed, overrides, choose, check_in_sync)
    assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"]
    assert not engine.non_terminating and engine.stop_reason == "all requests finished"
    assert s["n_completed"] + s["n_rejected"] == len(engine.workload)
    check_final(sw, engine)


# ---- taking over for good -----------------------------------------------------------------------
@pytest.mark.parametrize("name", baselines.available())
def test_a_policy_taking_over_finishes_what_the_others_left(name):
    # Sarathi with 64-token chunks runs until some prefills are unfinished (and RPM has refused
    # arrivals Sarathi accepted), then ``name`` runs alone: every request still completes
    cands = [make_policy(name), make_policy("sarathi", chunk_size=64), make_policy("rpm", limit=1)]
    cands += [make_policy(n) for n in LISTENERS if n not in (name, "rpm")]
    sw = Switch(cands)
    taken = []

    def choose(k, view):
        if not taken and k >= 20 and view.n_in_prefill:
            taken.append(k)
        return 0 if taken else 1

    scenario = "echo-hybrid" if name.startswith("echo") else "azure-conv"
    engine, s = run_switch(scenario, sw, 0, {**TIGHT[scenario], "engine.overflow": "preempt_lifo_recompute"},
                           choose, check_in_sync)
    assert taken, "no unfinished prefill to take over"
    assert not engine.non_terminating and engine.stop_reason == "all requests finished"
    assert s["n_completed"] + s["n_rejected"] == len(engine.workload)  # rpm rejects once in charge
    check_final(sw, engine)


def test_rpm_serves_the_requests_it_refused_but_another_policy_accepted():
    # FCFS decides until some arrival RPM refused waits in the engine's queue; then RPM alone
    rpm = make_policy("rpm", limit=1)
    sw = Switch([make_policy("fcfs"), rpm])
    adopted: list[int] = []

    def choose(k, view):
        if not adopted:
            adopted.extend(r for r in rpm._refused if view.state[r] == 1)
        return 1 if adopted else 0

    engine, s = run_switch("vtc-arena", sw, 0, TIGHT["vtc-arena"], choose, check_in_sync)
    assert adopted and (engine.state[adopted] == 3).all()
    assert not engine.non_terminating and s["n_completed"] + s["n_rejected"] == len(engine.workload)
