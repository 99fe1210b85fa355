"""Sheng et al. 2024 (VTC) claims: Lemma 4.3, Theorem 4.4, the LCF/FCFS failure cases, the Table 2
analogue on vtc-arena, RPM rejections, and the fairness metric helpers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from baselines import PolicyError, make_policy
from llmsched_gym.core import fairness
from llmsched_gym.core.scheduler import BatchPlan
from llmsched_gym.sim import simulate

VTC_FAMILY = ["vtc", "vtc-weighted", "vtc-predict", "vtc-oracle", "lcf", "rpm", "drr"]
A10G = "affine"  # Sheng et al. 2024's Llama-2-7B / A10G fit


def scenario(arrival, client, prompt, output, kv=10_000, latency=A10G, weights=None, **engine) -> dict:
    ex = {"arrival_s": list(arrival), "client": list(client), "prompt_tokens": list(prompt),
          "output_tokens": list(output)}
    if weights is not None:
        ex["client_weight"] = list(weights)
    return {"name": "test", "workload": {"explicit": ex},
            "engine": {"kv_capacity_tokens": kv, "block_size": 1, "prefill_emits_token": True,
                       "overflow": "forbid", **engine},
            "latency": latency}


def uniform_stream(rate_rpm: float, t0: float, t1: float, offset: float = 0.0) -> np.ndarray:
    """The artifact's "uniform" pattern: evenly spaced arrivals at ``rate_rpm`` in [t0, t1)."""
    gap = 60.0 / rate_rpm
    return np.arange(t0 + offset, t1, gap)


def clients_workload(streams: list[np.ndarray], prompt: int = 256, output: int = 256) -> tuple:
    t = np.concatenate(streams)
    c = np.concatenate([np.full(len(s), i) for i, s in enumerate(streams)])
    order = np.argsort(t, kind="stable")
    n = len(t)
    return t[order], c[order], np.full(n, prompt), np.full(n, output)


class Recorder:
    """Wraps a counter policy; after every hook and decision records the counter spread over the
    waiting clients, and at every decision the true per-client service (input charged at
    admission, w_q per generated token, as in Theorem 4.4) and the backlogged clients."""

    def __init__(self, policy):
        self.p = policy
        self.spread: list[float] = []
        self.snaps: list[tuple[np.ndarray, frozenset]] = []
        self.admitted_input: np.ndarray | None = None

    def attach(self):
        rec, p = self, self.p
        cls = type(p)

        class Spy(cls):
            def on_arrival(self, rid, view):
                ok = super().on_arrival(rid, view)
                rec._spread()
                return ok

            def on_tokens(self, ids, n, view):
                super().on_tokens(ids, n, view)
                rec._spread()

            def on_finish(self, rid, view):
                super().on_finish(rid, view)
                rec._spread()

            def schedule(self, view):
                rec._snap(view)
                plan = super().schedule(view)
                rec._spread()
                rec._admit(view, plan)
                rec._snap(view, plan)
                return plan

        p.__class__ = Spy
        return p

    def _spread(self):
        p = self.p
        if p.waiting_clients:
            c = [p.counter[i] for i in p.waiting_clients]
            self.spread.append(max(c) - min(c))

    def _admit(self, view, plan: BatchPlan):
        wl = view.workload
        if self.admitted_input is None:
            self.admitted_input = np.zeros(wl.n_clients)
        for rid in plan.prefill:
            self.admitted_input[wl.client[rid]] += self.p.w_p * wl.prompt_tokens[rid]

    def _snap(self, view, plan: BatchPlan | None = None):
        wl = view.workload
        if self.admitted_input is None:
            self.admitted_input = np.zeros(wl.n_clients)
        out = np.bincount(wl.client, weights=view.generated, minlength=wl.n_clients)
        service = (self.admitted_input + self.p.w_q * out) / wl.client_weight
        waiting = [r for r in view.waiting if plan is None or r not in plan.prefill]
        self.snaps.append((service, frozenset(int(wl.client[r]) for r in waiting)))

    def max_backlogged_gap(self, n_clients: int) -> float:
        """max over pairs and over runs of snapshots where both are backlogged of
        max(D) - min(D), D = W_f - W_g."""
        worst = 0.0
        for f in range(n_clients):
            for g in range(f + 1, n_clients):
                lo = hi = None
                for service, back in self.snaps:
                    if f in back and g in back:
                        d = service[f] - service[g]
                        lo = d if lo is None else min(lo, d)
                        hi = d if hi is None else max(hi, d)
                        worst = max(worst, hi - lo)
                    else:
                        lo = hi = None
        return worst


@st.composite
def multi_client(draw):
    n_clients = draw(st.integers(2, 4))
    n = draw(st.integers(4, 40))
    client = draw(st.lists(st.integers(0, n_clients - 1), min_size=n, max_size=n))
    arrival = sorted(draw(st.lists(st.floats(0, 30, allow_nan=False), min_size=n, max_size=n)))
    prompt = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 80), min_size=n, max_size=n))
    kv = draw(st.integers(max(p + o for p, o in zip(prompt, output, strict=True)), 250))
    k = draw(st.sampled_from([0, 1, 10]))
    return arrival, client, prompt, output, kv, k, n_clients


@settings(max_examples=40, deadline=None)
@given(multi_client(), st.sampled_from(["vtc", "vtc-weighted", "vtc-oracle"]))
def test_vtc_counter_gap_between_waiting_clients_within_U_lemma_4_3(case, name):
    arrival, client, prompt, output, kv, k, n_clients = case
    weights = [1.0, 2.0, 3.0, 4.0][:n_clients] if name == "vtc-weighted" else None
    pol = Recorder(make_policy(name, admit_every=k, memory="sum"))
    pol.attach()
    simulate(scenario(arrival, client, prompt, output, kv=kv, latency="unit", weights=weights), pol.p)
    u = max(1.0 * max(prompt), 2.0 * kv)
    if weights is not None:
        u /= min(weights)
    assert max(pol.spread, default=0.0) <= u + 1e-9


def test_peak_reservation_can_exceed_lemma_4_3_bound_and_sum_reservation_cannot():
    # found by hypothesis: client 0's requests (55 and 70 output tokens) pass the peak check
    # together in M = 111 but decode 124 tokens after client 0's last selection, while client 1's
    # 28-token prompt waits for room; U = max(28, 2 * 111) = 222
    case = ([0.0] * 8, [0, 0, 0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1, 28, 1], [1, 55, 70, 1, 1, 1, 27, 1])
    spreads = {}
    for memory in ("reserve", "sum"):
        pol = Recorder(make_policy("vtc", admit_every=0, memory=memory))
        pol.attach()
        simulate(scenario(*case, kv=111, latency="unit"), pol.p)
        spreads[memory] = max(pol.spread)
    assert spreads["reserve"] == 225.0 > 222.0
    assert spreads["sum"] <= 222.0


@settings(max_examples=40, deadline=None)
@given(multi_client(), st.sampled_from(["vtc", "vtc-weighted"]))
def test_vtc_backlogged_service_gap_within_2U_theorem_4_4(case, name):
    arrival, client, prompt, output, kv, k, n_clients = case
    weights = [1.0, 2.0, 3.0, 4.0][:n_clients] if name == "vtc-weighted" else None
    rec = Recorder(make_policy(name, admit_every=k, memory="sum"))
    rec.attach()
    r = simulate(scenario(arrival, client, prompt, output, kv=kv, latency="unit", weights=weights), rec.p)
    assert r.summary["preemptions"] == 0
    u = max(1.0 * max(prompt), 2.0 * kv)
    if weights is not None:
        u /= min(weights)
    assert rec.max_backlogged_gap(n_clients) <= 2 * u + 1e-9


def _theorem_4_8_instance() -> tuple:
    # client 0 fills the whole pool at t = 0 (10 requests of 1 + 99 tokens, 10 more waiting);
    # client 1 arrives just after and must wait for that batch: W_0 - W_1 reaches ~ w_q M
    t = np.concatenate([np.zeros(20), [0.5]])
    c = np.concatenate([np.zeros(20, int), [1]])
    return scenario(t, c, np.ones(21, int), np.full(21, 99), kv=1000, latency="unit")


def test_theorem_4_8_instance_nearly_attains_U_and_vtc_never_exceeds_it():
    rec = Recorder(make_policy("vtc"))
    rec.attach()
    simulate(_theorem_4_8_instance(), rec.p)
    u = 2.0 * 1000
    assert 0.9 * u <= max(rec.spread) <= u
    assert 0.9 * u <= rec.max_backlogged_gap(2) <= 2 * u


def test_lcf_breaks_lemma_4_3_when_a_client_joins_late():
    # without the lift a newcomer starts at 0 while the backlogged client's counter is far above U
    t = np.concatenate([np.zeros(60), [400.0]])
    c = np.concatenate([np.zeros(60, int), [1]])
    sc = scenario(t, c, np.full(61, 10), np.full(61, 90), kv=200, latency="unit")
    spreads = {}
    for name in ("lcf", "vtc"):
        rec = Recorder(make_policy(name))
        rec.attach()
        simulate(sc, rec.p)
        spreads[name] = max(rec.spread)
    u = 2.0 * 200
    assert spreads["lcf"] > u >= spreads["vtc"]


def clients_scenario(rates_rpm: list[float], horizon_s: float, weights=None, **engine) -> dict:
    """Uniformly spaced arrivals per client (the artifact's "uniform"), 256/256 tokens, built with
    the workload spec's ``clients`` key; Sheng et al. 2024's engine (A10G fit, 10,000 tokens)."""
    clients = [{"arrival": {"type": "deterministic", "rate": r / 60.0}} for r in rates_rpm]
    if weights is not None:
        clients = [{**c, "weight": w} for c, w in zip(clients, weights, strict=True)]
    return {"name": "test", "workload": {"clients": clients, "horizon_s": horizon_s, "prompt": 256, "output": 256},
            "engine": {"kv_capacity_tokens": 10_000, "block_size": 1, "prefill_emits_token": True,
                       "overflow": "forbid", **engine},
            "latency": A10G}


def _overload() -> dict:
    # Fig. 3: C1 90 rpm, C2 180 rpm, 256/256, 6 minutes of uniform arrivals
    return clients_scenario([90, 180], 360.0)


def test_fcfs_fails_fig3_overload_test_while_vtc_stays_within_2U():
    u = 2.0 * 10_000
    times = np.linspace(30, 360, 60)  # both clients are backlogged throughout
    gap = {}
    for name in ("fcfs", "vtc"):
        r = simulate(_overload(), name, policy_params={"admission": "reserve"} if name == "fcfs" else {})
        w = fairness.service_curves(r, times, method="tokens")
        d = w[:, 0] - w[:, 1]
        gap[name] = d.max() - d.min()
    assert gap["fcfs"] > 2 * u
    assert gap["vtc"] < 2 * u
    assert gap["vtc"] < gap["fcfs"] / 10


def _dist_shift() -> dict:
    # Fig. 10: phase 1 (0-5 min) C1 30 rpm ON/OFF 60 s + C2 120 rpm; phase 2 (5-10 min) 60 + 60;
    # phase 3 (10-15 min) 30 + 90; 256/256 uniform. Our affine A10G fit serves ~1.9 such requests
    # per second against the paper's ~1.6 (97.5 rpm), so rates are scaled by 1.2 to keep its load.
    x = 1.2
    c1 = [uniform_stream(30 * x, a, a + 60, 0.5) for a in (0, 120, 240)]
    c1 += [uniform_stream(60 * x, 300, 600, 0.5), uniform_stream(30 * x, 600, 900, 0.5)]
    c2 = [uniform_stream(120 * x, 0, 300), uniform_stream(60 * x, 300, 600), uniform_stream(90 * x, 600, 900)]
    return scenario(*clients_workload([np.concatenate(c1), np.concatenate(c2)]))


def test_lcf_fails_fig10_phase2_test_while_vtc_serves_equally():
    ratio = {}
    for name in ("lcf", "vtc"):
        r = simulate(_dist_shift(), name)
        s = fairness.window_service(r, 360.0, 600.0)
        ratio[name] = s[0] / s[1]
    # LCF serves client 1 alone until its phase-1 deficit is repaid; VTC splits phase 2 evenly
    assert ratio["lcf"] > 1.4
    assert 0.9 < ratio["vtc"] < 1.1


def test_weighted_vtc_serves_overloaded_clients_in_weight_ratio():
    # Fig. 16: four overloaded clients (48, 48, 72, 96 rpm) with weights 1:2:3:4
    sc = clients_scenario([48, 48, 72, 96], 360.0, weights=[1, 2, 3, 4])
    s = fairness.window_service(simulate(sc, "vtc-weighted"), 60.0, 300.0)
    np.testing.assert_allclose(s / s[0], [1, 2, 3, 4], rtol=0.1)


def test_vtc_lift_raises_returning_client_to_lowest_waiting_counter_and_lcf_does_not():
    # client 0 is backlogged from t = 0; client 1 sends its first request at t = 60
    t = np.concatenate([np.zeros(40), [60.0]])
    c = np.concatenate([np.zeros(40, int), [1]])
    sc = scenario(t, c, np.full(41, 100), np.full(41, 100), kv=1000)
    seen = {}
    for name in ("vtc", "lcf"):
        pol = make_policy(name)
        base = type(pol)

        class Spy(base):
            def on_arrival(self, rid, view, _name=name):
                ok = super().on_arrival(rid, view)
                if rid == 40:
                    seen[_name] = (self.counter[1], self.counter[0])
                return ok

        pol.__class__ = Spy
        simulate(sc, pol)
    c1, c0 = seen["vtc"]
    assert c1 == c0 > 0
    assert seen["lcf"][0] == 0


@pytest.mark.parametrize("name,kw", [
    ("vtc", {}), ("vtc-oracle", {}), ("vtc-predict", {"predictor": "last5"}),
    ("vtc-predict", {"predictor": "ema5"}), ("vtc-predict", {"predictor": "noisy"}),
    ("vtc", {"cost": "profiled"}), ("vtc-predict", {"cost": "profiled-artifact"}),
])
def test_single_client_counter_equals_its_service_after_all_finish(name, kw):
    # with one client there is no lift above its own counter, so every charge (up-front
    # prediction, per-token excess, refund at finish) must add up to sum h(n_p, n_q)
    rng = np.random.default_rng(3)
    n = 30
    p, o = rng.integers(1, 60, n), rng.integers(1, 60, n)
    sc = scenario(np.sort(rng.uniform(0, 5, n)), np.zeros(n, int), p, o, kv=400)
    pol = make_policy(name, **kw)
    simulate(sc, pol)
    h = fairness.make_cost(kw.get("cost", "linear"))
    assert pol.counter[0] == pytest.approx(float(h(p, o).sum()))


def test_lcf_counters_equal_per_client_service():
    wl = clients_workload([uniform_stream(90, 0, 60, 0.3), uniform_stream(180, 0, 60, 0.1)], 50, 70)
    pol = make_policy("lcf")
    r = simulate(scenario(*wl, kv=2000), pol)
    np.testing.assert_allclose(pol.counter, r.summary["fairness"]["service_per_client"])


@pytest.mark.parametrize("name,memory", [("vtc", "reserve"), ("vtc", "fit"), ("rpm", "reserve"), ("drr", "fit"),
                                         ("vtc-predict", "reserve")])
def test_hold_fast_forward_gives_the_step_by_step_run(name, memory):
    wl = clients_workload([uniform_stream(90, 0, 120, 0.3), uniform_stream(180, 0, 120, 0.1)], 64, 200)
    engine = {"overflow": "preempt_lifo_recompute"}
    kw = {"memory": memory}
    ff = simulate(scenario(*wl, kv=3000, **engine), name, policy_params=kw)
    step = simulate(scenario(*wl, kv=3000, fast_forward=False, **engine), name, policy_params=kw)
    for col in ("first_token_s", "completion_s", "preemptions"):
        np.testing.assert_array_equal(ff.requests[col], step.requests[col])
    assert ff.summary["iterations"] == step.summary["iterations"]


def test_admission_cadence_waits_K_decode_iterations():
    # one request running, a second arriving right away: it is admitted only after K decodes
    sc = scenario([0.0, 0.001], [0, 1], [10, 10], [50, 50], kv=1000, latency="unit")
    for k in (0, 3, 10):
        r = simulate(sc, "vtc", policy_params={"admit_every": k})
        assert r.requests["first_scheduled_s"][1] == 1 + k


def test_rpm_rejects_over_limit_and_reports_them():
    # one client sending 30 requests in 10 s at limit 5 per 60 s window
    sc = scenario(np.linspace(0, 10, 30), np.zeros(30, int), np.full(30, 20), np.full(30, 20))
    r = simulate(sc, "rpm", policy_params={"limit": 5})
    s = r.summary
    assert s["n_rejected"] == 25 and s["n_completed"] == 5
    assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"]
    assert (r.requests["state"] == 4).sum() == 25
    assert all("rpm" in why for why in r.engine.reject_reason.values())


def test_rpm_fixed_window_resets_each_minute_and_sliding_window_slides():
    t = np.array([10, 20, 30, 59, 61, 62, 75.0])
    sc = scenario(t, np.zeros(7, int), np.full(7, 20), np.full(7, 20))
    fixed = simulate(sc, "rpm", policy_params={"limit": 2, "window": "fixed"})
    sliding = simulate(sc, "rpm", policy_params={"limit": 2})
    np.testing.assert_array_equal(fixed.requests["state"], [3, 3, 4, 4, 3, 3, 4])
    np.testing.assert_array_equal(sliding.requests["state"], [3, 3, 4, 4, 4, 4, 3])


def test_reservation_never_evicts_under_forbid_and_fit_mode_evicts(traces_dir):
    strict = simulate("vtc-arena", "vtc", overrides={"engine.overflow": "forbid"})
    assert strict.summary["preemptions"] == 0 and strict.summary["n_completed"] == 1500
    loose = simulate("vtc-arena", "vtc", policy_params={"memory": "fit", "admit_every": 0})
    assert loose.summary["preemptions"] > 0


@pytest.fixture(scope="module")
def arena(request):
    from tests.conftest import TRACES

    if not TRACES.is_dir():
        pytest.skip("../shared/traces is absent")
    ov = {"engine.overflow": "forbid"}
    runs = {
        "fcfs": simulate("vtc-arena", "fcfs"),
        "lcf": simulate("vtc-arena", "lcf", overrides=ov),
        "vtc": simulate("vtc-arena", "vtc", overrides=ov),
        "rpm5": simulate("vtc-arena", "rpm", overrides=ov, policy_params={"limit": 5}),
    }
    return {k: (r, fairness.tick_service_difference(r)) for k, r in runs.items()}


def test_vtc_max_service_difference_below_fcfs_and_lcf_on_vtc_arena(arena):
    vtc = arena["vtc"][1]["max"]
    assert vtc < arena["fcfs"][1]["max"]
    assert vtc < arena["lcf"][1]["max"]
    assert arena["vtc"][1]["avg"] < arena["fcfs"][1]["avg"]


def test_summary_fairness_block_reports_the_per_tick_difference_over_time(arena):
    for name in ("fcfs", "vtc"):
        run, ticks = arena[name]
        f = run.summary["fairness"]
        assert f["tick_diff"] == {k: ticks[k] for k in ("max", "avg", "var")}
        curves = np.asarray(f["service_over_time"]["per_client"])
        assert curves.shape == (run.engine.workload.n_clients, len(f["service_over_time"]["t_s"]))
        assert np.all(np.diff(curves, axis=1) >= -1e-9)  # cumulative service never decreases
        assert f["max_accumulated_gap"] == pytest.approx((curves.max(axis=0) - curves.min(axis=0)).max())
    assert arena["vtc"][0].summary["fairness"]["tick_diff"]["max"] < arena["fcfs"][0].summary["fairness"]["tick_diff"]["max"]


def test_rpm5_delivers_under_60_percent_of_vtc_throughput_on_vtc_arena(arena):
    rpm, vtc = arena["rpm5"][0], arena["vtc"][0]
    assert fairness.throughput_in_out(rpm) < 0.6 * fairness.throughput_in_out(vtc)
    assert rpm.summary["n_rejected"] > 0


@pytest.mark.parametrize("name", VTC_FAMILY)
def test_every_vtc_family_policy_conserves_requests_on_azure_conv_and_vtc_arena(name, traces_dir):
    for sc, ov in (("azure-conv", {"workload.n_requests": 300}), ("vtc-arena", {"workload.n_requests": 300})):
        if name == "vtc-oracle":  # needs the true lengths: azure-conv's clairvoyant variant
            ov = {**ov, "workload.predictor": {"type": "oracle"}}
        s = simulate(sc, name, overrides=ov).summary
        assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"]
        assert s["n_completed"] + s["n_rejected"] == s["n_arrived"], (sc, s["stop_reason"])


@pytest.mark.parametrize("name,kw,param", [
    ("vtc", {"admit_every": -1}, "admit_every"), ("vtc", {"memory": "lazy"}, "memory"),
    ("vtc", {"w_q": 0}, "w_q"), ("vtc", {"cost": "flops"}, "cost"), ("lcf", {"max_running": -2}, "max_running"),
    ("rpm", {"limit": -1}, "limit"), ("rpm", {"window": "hour"}, "window"), ("drr", {"quantum": 0}, "quantum"),
    ("vtc-predict", {"predictor": "llm"}, "predictor"), ("vtc-predict", {"noise": 2}, "noise"),
    ("vtc-weighted", {"weights": [1, -1]}, "weights"), ("vtc", {"alpha": 1}, "alpha"),
])
def test_bad_parameters_raise_one_line_policy_error_naming_it(name, kw, param):
    with pytest.raises(PolicyError, match=rf"^policy\.{param}:") as e:
        make_policy(name, **kw)
    assert "\n" not in str(e.value)


def test_custom_cost_function_is_charged():
    sc = scenario([0.0, 0.0], [0, 0], [10, 20], [5, 7], kv=200)
    pol = make_policy("vtc", cost=lambda n_p, n_q: 3 * np.asarray(n_p) + 10 * np.asarray(n_q))
    simulate(sc, pol)
    assert pol.counter[0] == pytest.approx(3 * 30 + 10 * 12)


def test_drr_keeps_overloaded_clients_close():
    r = simulate(_overload(), "drr", policy_params={"quantum": 256.0})
    w = fairness.service_curves(r, np.linspace(30, 360, 60), method="tokens")
    d = w[:, 0] - w[:, 1]
    assert d.max() - d.min() < 2 * 2.0 * 10_000


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 5), st.floats(0.1, 100)), min_size=1, max_size=20),
       st.lists(st.floats(-1, 20), min_size=1, max_size=10))
def test_cumulative_service_matches_bruteforce(pieces, times):
    start = np.array([p[0] for p in pieces])
    end = start + np.array([p[1] for p in pieces])
    amount = np.array([p[2] for p in pieces])
    t = np.array(times)
    got = fairness._cumulative(start, end, amount, t)
    span = np.where(end > start, end - start, 1.0)
    with np.errstate(over="ignore"):  # a tiny span: inf, clipped to 1
        frac = np.where(end[None] > start[None], np.clip((t[:, None] - start[None]) / span[None], 0, 1),
                        (t[:, None] >= start[None]).astype(float))
    np.testing.assert_allclose(got, (frac * amount[None]).sum(axis=1), atol=1e-6)


def test_fairness_report_reads_a_result_or_its_engine_alike():
    r = simulate(_overload(), "vtc")
    a, b = fairness.fairness_report(r), fairness.fairness_report(r.engine)
    assert a == b
    assert a["tick_diff"]["max"] >= a["tick_diff"]["avg"] >= 0
    assert len(a["service_over_time"]["per_client"]) == 2
    assert a["throughput_in_out_tokens_per_s"] == pytest.approx(
        (512 * r.summary["n_completed"]) / (r.engine.clock - r.engine.workload.arrival_s[0]))
    times = np.linspace(0, r.engine.clock, 50)
    gap = fairness.accumulated_gap(r, times)
    w = fairness.service_curves(r, times)
    np.testing.assert_allclose(gap, np.abs(w[:, 0] - w[:, 1]))
    assert w[-1].sum() == pytest.approx(768 * r.summary["n_completed"])


def test_tick_difference_is_zero_when_every_client_gets_what_it_asks():
    # one client: s_max - s_j = 0 at every tick
    sc = scenario(np.arange(0, 600, 5.0), np.zeros(120, int), np.full(120, 10), np.full(120, 10))
    d = fairness.tick_service_difference(simulate(sc, "vtc"))
    assert d["max"] == 0 and len(d["values"]) == 19
    assert d["ticks"][0] == pytest.approx(28.5)
