"""Wang et al. 2025 (Echo): the echo / echo-bs / echo-bs-e / echo-bs-e-s policies, the task-aware KV
eviction order, the estimators and the threshold."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from baselines import PolicyError, make_policy
from baselines.echo import EchoFamily
from baselines.echo_estimators import BatchTimeEstimator, OnlineKVPredictor
from llmsched_gym.core.kv import KVCache
from llmsched_gym.core.latency import LatencyModel
from llmsched_gym.core.request import OFFLINE, ONLINE, Workload
from llmsched_gym.sim import make_engine, simulate

POLICIES = ["echo-bs", "echo-bs-e", "echo-bs-e-s", "echo"]

# echo-hybrid's day compressed to two minutes (peak at 60 s), with an offline pool that never
# runs dry within the horizon; the predictor window shrinks with the day (1 h of 24 h = 5 s).
HYBRID_2MIN = {
    "workload.horizon_s": 120.0, "workload.arrival.period_s": 120.0, "workload.arrival.peak_s": 60.0,
    "workload.classes.offline.n_requests": 6000, "engine.horizon_s": 120.0,
}


def conserved(s: dict) -> bool:
    return s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"]


def explicit(arrival, prompt, output, cls, prefix=None, cap=10_000, bs=1, latency=None, ttft=1.0, tpot=0.05):
    """A scenario dict around hand-made arrays (online requests get the SLOs)."""
    cls = np.asarray(cls)
    wl = {"arrival_s": arrival, "prompt_tokens": prompt, "output_tokens": output, "task_class": cls.tolist(),
          "ttft_slo_s": np.where(cls == ONLINE, ttft, np.inf).tolist(),
          "tpot_slo_s": np.where(cls == ONLINE, tpot, np.inf).tolist()}
    if prefix is not None:
        wl["prefix"] = prefix
    return {"name": "echo-test", "workload": {"explicit": wl},
            "engine": {"kv_capacity_tokens": cap, "block_size": bs, "prefill_emits_token": True},
            "latency": latency or {"type": "affine", "prefill_base_s": 0.0, "prefill_per_seq_s": 0.0,
                                   "prefill_per_token_s": 1e-4, "prefill_per_ctx_s": 0.0,
                                   "decode_base_s": 0.01, "decode_per_seq_s": 0.0, "decode_per_kv_s": 0.0}}


# ---- the claims ------------------------------------------------------------------------
def test_echo_keeps_online_slo_above_90pct_while_beating_bs_offline_throughput():
    echo = simulate("echo-hybrid", "echo", seed=0, overrides=HYBRID_2MIN, policy_params={"window_s": 5.0}).summary
    bs = simulate("echo-hybrid", "echo-bs", seed=0, overrides=HYBRID_2MIN).summary
    assert conserved(echo) and conserved(bs)
    assert echo["by_class"]["online"]["slo_attainment"] >= 0.9
    # the pool never ran dry, so offline throughput is what the co-scheduling achieved
    assert echo["by_class"]["offline"]["completed"] < HYBRID_2MIN["workload.classes.offline.n_requests"]
    ratio = echo["by_class"]["offline"]["throughput_tokens_per_s"] / bs["by_class"]["offline"]["throughput_tokens_per_s"]
    assert ratio > 1.5


@pytest.mark.parametrize("policy", POLICIES)
def test_echo_family_runs_on_azure_conv_with_conservation(policy):
    s = simulate("azure-conv", policy, seed=0, overrides={"workload.n_requests": 1500}).summary
    assert conserved(s) and s["n_completed"] == s["n_arrived"] == 1500
    assert not s["non_terminating"] and s["kv_peak_frac"] <= 1.0


@pytest.mark.parametrize("policy", POLICIES)
def test_echo_family_finishes_echo_hybrid_with_conservation(policy):
    ov = {"workload.horizon_s": 30.0, "workload.classes.offline.n_requests": 200}
    s = simulate("echo-hybrid", policy, seed=1, overrides=ov).summary
    assert conserved(s) and s["n_completed"] == s["n_arrived"]
    assert s["by_class"]["offline"]["completed"] == 200


# ---- memory, conservation, fast-forward on random instances ---------------------------------------
@st.composite
def hybrid_instances(draw):
    seed = draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    n_on, n_off = draw(st.integers(0, 10)), draw(st.integers(0, 10))
    n = n_on + n_off
    arrival = np.concatenate([np.sort(rng.uniform(0, 1.0, n_on)), np.zeros(n_off)])
    cls = [ONLINE] * n_on + [OFFLINE] * n_off
    prompt = rng.integers(1, 60, n)
    output = rng.integers(1, 20, n)
    prefix = [[[int(g), 16]] if p > 16 else None for g, p in zip(rng.integers(0, 3, n), prompt, strict=True)]
    order = np.argsort(arrival, kind="stable")
    bs = draw(st.sampled_from([1, 4, 16]))
    need = int(((prompt + output + bs - 1) // bs * bs).max()) if n else bs
    cap = draw(st.integers(need, need * 3))
    sc = explicit(arrival[order].tolist(), prompt[order].tolist(), output[order].tolist(),
                  [cls[i] for i in order], [prefix[i] for i in order], cap=cap, bs=bs)
    params = {"chunk_size": draw(st.sampled_from([0, 8])), "max_num_seqs": draw(st.sampled_from([2, 256])),
              "max_batched_tokens": draw(st.sampled_from([0, 16, 8192]))}
    return sc, draw(st.sampled_from(POLICIES)), params, seed


@given(hybrid_instances())
def test_echo_family_never_overflows_and_conserves_requests(inst):
    # the policies run under overflow=forbid: any plan exceeding the KV capacity raises
    sc, policy, params, seed = inst
    if not sc["workload"]["explicit"]["arrival_s"]:
        return
    s = simulate(sc, policy, seed=seed, policy_params=params).summary
    assert conserved(s) and s["n_completed"] == s["n_arrived"]
    assert s["kv_peak_frac"] <= 1.0 and s["overflow_events"] == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_hold_promise_matches_step_by_step_run(policy):
    # no SLOs and no offline pool: decode-only plans hold; fast-forward must not change anything
    ov = {"workload.n_requests": 300}
    a = simulate("azure-conv", policy, seed=2, overrides=ov).summary
    b = simulate("azure-conv", policy, seed=2, overrides={**ov, "engine.fast_forward": False}).summary
    for k in ("sim_time_s", "iterations", "preemptions", "ttft_s", "e2e_s", "recomputed_tokens"):
        assert a[k] == b[k], k


# ---- the baselines' rules on constructed instances ------------------------------------------------
def _gate_instance():
    # online: 100-token prompt, 20 tokens; offline: a 10,000-token prompt (1 s of prefill)
    return explicit([0.0, 0.0], [100, 10_000], [20, 5], [ONLINE, OFFLINE], cap=20_000)


def test_bs_admits_offline_prefill_with_online_and_misses_ttft():
    r = simulate(_gate_instance(), "echo-bs", policy_params={"max_batched_tokens": 0})
    assert r.requests["first_scheduled_s"][1] == 0.0
    assert r.requests["ttft_s"][0] == pytest.approx(1.01)
    assert r.summary["slo_attainment"] == 0.0


def test_bs_e_defers_offline_prefill_until_the_online_deadline_allows():
    r = simulate(_gate_instance(), "echo-bs-e", policy_params={"estimator": "exact", "max_batched_tokens": 0})
    # 1 s of offline prefill never fits the 50 ms per-token budget while the request decodes
    assert r.requests["first_scheduled_s"][1] == r.requests["completion_s"][0]
    assert r.requests["ttft_s"][0] == pytest.approx(0.01)
    assert r.summary["slo_attainment"] == 1.0


def test_paper_deadline_banks_ttft_slack_that_the_mean_tpot_metric_rejects():
    # arrival + TTFT + i TPOT: after a 10 ms first token, token 1 may come 1.04 s later
    r = simulate(_gate_instance(), "echo-bs-e",
                 policy_params={"estimator": "exact", "max_batched_tokens": 0, "deadline": "paper"})
    first, done = r.requests["first_token_s"][0], r.requests["completion_s"][0]
    assert r.requests["first_scheduled_s"][1] == pytest.approx(first)
    assert done <= 0.0 + 1.0 + 19 * 0.05  # every per-token deadline met
    assert r.requests["tpot_s"][0] > 0.05 and r.summary["slo_attainment"] == 0.0


def test_bs_preempts_newest_offline_request_for_an_online_arrival():
    # two offline requests fill the KV; an online request arrives at 0.1 s
    sc = explicit([0.0, 0.0, 0.1], [40, 40, 40], [30, 30, 5], [OFFLINE, OFFLINE, ONLINE], cap=150)
    r = simulate(sc, "echo-bs")
    assert list(r.requests["preemptions"]) == [0, 1, 0]
    # admitted at the first iteration boundary after its arrival (decode steps take 10 ms)
    assert r.requests["queue_delay_s"][2] <= 0.01 + 1e-9


def _two_group_pool(policy):
    # A, B, A, B, ... with 64-token system prompts; the KV holds one request (6 blocks) + 1 block
    n = 8
    prefix = [[[1 + i % 2, 64]] for i in range(n)]
    sc = explicit([0.0] * n, [80] * n, [4] * n, [OFFLINE] * n, prefix=prefix, cap=112, bs=16)
    return simulate(sc, policy).summary


def test_echo_scheduler_follows_the_cached_prefix_where_fcfs_alternates():
    bs, s = _two_group_pool("echo-bs"), _two_group_pool("echo-bs-e-s")
    # FCFS alternates groups: each switch evicts all but the first head block of the other group
    assert bs["prefill_tokens"] == 8 * 80 - 6 * 16
    # Echo finishes a group while its prefix is cached: 2 misses, then 6 hits of 64 tokens
    assert s["prefill_tokens"] == 2 * 80 + 6 * 16
    assert _two_group_pool("echo")["prefill_tokens"] == 2 * 80 + 6 * 16


# ---- task-aware KV manager ------------------------------------------------------------------------
def _kv_with_idle_chains(n_chains: int = 3):
    """A KVCache whose chains 0..n-1 (2 blocks of 4 each) were computed and released in order."""
    wl = Workload(np.zeros(n_chains), np.full(n_chains, 9), np.ones(n_chains, dtype=int),
                  prefix=[((c, 8),) for c in range(n_chains)])
    kv = KVCache(64, 4, wl)
    for rid in range(n_chains):
        kv.used_blocks += 3
        kv.publish_prefix(rid, 9)
    for rid in range(n_chains):
        kv.used_blocks -= 3 - int(kv.shared[rid])
        kv.release_prefix(rid)
    return kv


def _evicted(kv: KVCache, n: int) -> list[int]:
    before = set(kv.cached_hashes())
    kv.make_room(kv.capacity_blocks - kv.used_blocks - kv.idle_blocks + n)
    after = set(kv.cached_hashes())
    return [h for h in before if h not in after]


def test_default_lru_evicts_least_recently_released_deeper_block_first():
    kv = _kv_with_idle_chains()
    h0 = kv.block_hashes(0)
    assert kv.next_evictions(2) == [h0[1], h0[0]]
    assert sorted(_evicted(kv, 3)) == sorted([h0[1], h0[0], kv.block_hashes(1)[1]])


def test_priority_eviction_takes_lowest_priority_first_with_lru_ties():
    kv = _kv_with_idle_chains()
    prio = {h: p for rid, p in ((0, 2.0), (1, 0.0), (2, 0.0)) for h in kv.block_hashes(rid)}
    kv.set_eviction_priority(prio.__getitem__)
    assert kv.idle_below(1.0) == 4
    # chain 0 (priority 2) survives although least recently used; chains 1 and 2 tie at 0, so
    # chain 1 (released first) goes before chain 2's deeper block
    assert sorted(_evicted(kv, 3)) == sorted([*kv.block_hashes(1), kv.block_hashes(2)[1]])
    # chain 0 becomes the cheapest once its priority drops below chain 2's
    for h in kv.block_hashes(0):
        prio[h] = -1.0
    kv.reprioritize(kv.block_hashes(0))
    assert sorted(_evicted(kv, 2)) == sorted(kv.block_hashes(0))


def test_echo_block_priority_rc_over_finished_online_over_finished_offline():
    # online request 0 and offline requests 1-5 over chains: A (1, 2), B (3), C (4, 5)
    prefix = [[[9, 32]], [[1, 32]], [[1, 32]], [[2, 32]], [[3, 32]], [[3, 32]]]
    sc = explicit([0.0] * 6, [40] * 6, [2] * 6, [ONLINE] + [OFFLINE] * 5, prefix=prefix, bs=16)
    engine, _ = make_engine(sc, "echo")
    engine.poll()  # every request arrives at t = 0
    pol, view = engine.scheduler, engine.view
    kv = engine.kv
    prio = {rid: pol._priority(kv.block_hashes(rid)[0]) for rid in range(6)}
    assert (prio[1], prio[3], prio[4]) == (2.0, 1.0, 2.0)
    for rid in (0, 3, 4):
        pol.on_finish(rid, view)
    assert pol._priority(kv.block_hashes(0)[0]) == 0.5  # finished online
    assert pol._priority(kv.block_hashes(3)[0]) == 0.0  # finished offline, rc = 0
    assert pol._priority(kv.block_hashes(4)[0]) == 1.0  # request 5 still needs chain C


def test_echo_offline_admissions_respect_the_active_kv_threshold():
    seen = []

    class Probe(type(make_policy("echo"))):
        def _greedy(self, b, now, limit, n_seqs, tokens, admit):
            before = set(admit)
            super()._greedy(b, now, limit, n_seqs, tokens, admit)
            if set(admit) - before:
                seen.append((b.mem, limit))

    ov = {**HYBRID_2MIN, "workload.classes.offline.n_requests": 300, "engine.horizon_s": 30.0,
          "engine.kv_capacity_tokens": 40_000}
    simulate("echo-hybrid", Probe(window_s=5.0, k_sigma=6.0), seed=0, overrides=ov)
    assert seen and all(mem <= limit for mem, limit in seen)
    assert min(limit for _, limit in seen) < 40_000 // 16  # the reserve did bind the limit


# ---- estimators -------------------------------------------------------------------------------------
class Eq678(LatencyModel):
    """A ground truth that is exactly Echo's Eq. 6-8 (decode uses mean(L), i.e. gamma = 0)."""

    name = "eq678"
    A, B, C, D, LAM = 2e-9, 5e-5, 0.01, 3e-6, 0.8

    def _p(self, n):
        return max(self.A * n * n + self.B * n, self.C)

    def batch_time(self, prefill_tokens, prefill_ctx_tokens, n_prefill, n_decode, decode_ctx_tokens):
        tp = self._p(prefill_tokens) if prefill_tokens else 0.0
        td = self.D * decode_ctx_tokens / n_decode if n_decode else 0.0
        if not (tp and td):
            return tp + td
        return self.LAM * max(tp, td) + (1 - self.LAM) * min(tp, td)


def test_estimator_fit_recovers_the_paper_coefficients():
    est = BatchTimeEstimator.fit(Eq678())
    assert est.alpha == pytest.approx(Eq678.A, rel=1e-6)
    assert est.beta == pytest.approx(Eq678.B, rel=1e-6)
    assert est.c == pytest.approx(Eq678.C)
    assert est.gamma == pytest.approx(0.0, abs=1e-12) and est.delta == pytest.approx(Eq678.D, rel=1e-6)
    assert est.lam == pytest.approx(Eq678.LAM, rel=1e-6)
    assert est.batch([(3000, 3000)], 4, 4000, 1500) == pytest.approx(Eq678().batch_time(3000, 3000, 1, 4, 4000))


def test_online_kv_predictor_is_mean_plus_two_sigma_over_the_window():
    p = OnlineKVPredictor(window_s=3.0, k_sigma=2.0)
    for t, v in ((0.1, 10), (0.6, 30), (1.2, 40), (2.5, 60)):
        p.observe(t, v)
    p.observe(3.1, 0)  # closes the bucket of second 2
    assert p.prediction == pytest.approx(np.mean([20, 40, 60]) + 2 * np.std([20, 40, 60]))
    p.observe(4.0, 0)  # second 3 closes; second 0 leaves the 3 s window
    assert p.prediction == pytest.approx(np.mean([40, 60, 0]) + 2 * np.std([40, 60, 0]))


# ---- parameters ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("policy", "params", "needle"), [
    ("echo", {"max_num_seqs": 0}, "policy.max_num_seqs"),
    ("echo", {"k_sigma": -1.0}, "policy.k_sigma"),
    ("echo-bs-e-s", {"candidates": 0}, "policy.candidates"),
    ("echo-bs-e", {"estimator": "magic"}, "policy.estimator"),
    ("echo-bs-e", {"deadline": "soon"}, "policy.deadline"),
    ("echo-bs", {"window_s": 5.0}, "policy.window_s"),
])
def test_bad_parameters_raise_one_line_policy_errors(policy, params, needle):
    with pytest.raises(PolicyError, match=needle.replace(".", r"\.")) as e:
        make_policy(policy, **params)
    assert "\n" not in str(e.value)


def test_family_members_are_the_papers_cumulative_build_up():
    axes = {p: (c.use_estimator, c.greedy, c.task_aware) for p in POLICIES
            for c in [type(make_policy(p))] if issubclass(c, EchoFamily)}
    assert axes == {"echo-bs": (False, False, False), "echo-bs-e": (True, False, False),
                    "echo-bs-e-s": (True, True, False), "echo": (True, True, True)}


def test_kv_predictor_with_a_window_shorter_than_a_bucket_predicts_the_last_bucket():
    """A window under one bucket used to drop every bucket, and the prediction became NaN (found by
    the fuzzer drawing ``window_s`` from the policy's parameters)."""
    p = OnlineKVPredictor(window_s=0.5, k_sigma=2.0, bucket_s=1.0)
    for now, demand in [(0.1, 100.0), (0.7, 300.0), (1.2, 50.0), (2.5, 80.0)]:
        p.observe(now, demand)
    assert p.prediction == 50.0  # the closed bucket [1, 2): one sample, no deviation
