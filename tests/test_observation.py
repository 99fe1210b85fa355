"""``env/observation.py`` and ``env/driver.py`` on their own: exact feature values of constructed
states (the builder reads only its arguments: the engine, the decision point and the driver's
:class:`Recent`), its bounds as a property, and the driver's operations (what an action mode can do)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmsched_gym.core.information import information_of
from llmsched_gym.core.scenarios import resolve_scenario
from llmsched_gym.core.scheduler import BatchPlan
from llmsched_gym.env.actions import InvalidActionError
from llmsched_gym.env.decision import DecisionPoint
from llmsched_gym.env.driver import Driver
from llmsched_gym.env.modes import SelectMode
from llmsched_gym.env.observation import (
    GLOBAL_FEATURES,
    QUEUE_FEATURES,
    RUNNING_FEATURES,
    TIME_RANGE,
    G,
    ObservationBuilder,
    Q,
    R,
    Recent,
)
from llmsched_gym.sim import make_engine

CAP = 100  # KV capacity in tokens: token counts scale as log1p(x) / log1p(CAP)
NONE = {"type": "none"}  # the blind information model


def tok(x: float) -> float:
    return np.float32(math.log1p(x) / math.log1p(CAP))


def dur(t: float) -> float:  # the unit latency model: the time unit is one round
    return np.float32(min(math.log1p(t) / math.log1p(TIME_RANGE), 1.0))


def scenario(prompt, output, arrival, predictor=None, capacity=CAP) -> dict:
    wl: dict = {"explicit": {"arrival_s": list(arrival), "prompt_tokens": list(prompt), "output_tokens": list(output)}}
    if predictor is not None:
        wl["predictor"] = predictor
    return resolve_scenario({"name": "toy", "workload": wl, "latency": "unit",
                             "engine": {"kv_capacity_tokens": capacity, "block_size": 1, "prefill_emits_token": False,
                                        "overflow": "preempt_lifo_recompute"}})


class Setup:
    """An engine, its decision point, a driver that asks at every boundary, and the builder."""

    def __init__(self, spec: dict, k: int = 4, budgets=(None, 16)) -> None:
        self.e, _ = make_engine(spec, "fcfs", seed=0)
        self.dp = DecisionPoint(k, "arrival", "none", None)
        self.driver = Driver(self.dp)
        self.driver.start(self.e, budgets[0], lambda: True, BatchPlan)
        self.obs = ObservationBuilder(k, flat=False, budgets=budgets)
        self.obs.setup(self.e, self.dp, information_of(spec), spec["workload"].get("predictor"))
        self.driver.advance()

    def observe(self, last: Recent | None = None) -> dict[str, np.ndarray]:
        return self.obs.observe(last if last is not None else self.driver.recent)


def rows(o: dict[str, np.ndarray]) -> np.ndarray:
    return o["queue"].reshape(-1, len(QUEUE_FEATURES))


# ---------------------------------------------------------------------------------------------
# exact features of constructed states


def test_first_decision_features_are_exact():
    s = Setup(scenario([10, 20, 30], [4, 8, 2], [0.0, 0.0, 3.0]))
    assert s.obs.unit == 1.0 and s.e.clock == 0.0 and s.dp.slots == [0, 1]
    o = s.observe()
    q = rows(o)
    want0 = np.zeros(len(QUEUE_FEATURES), np.float32)
    want0[[Q["present"], Q["prompt"], Q["predicted_output"], Q["slo_slack"], Q["fits_now"], Q["fits_future"]]] = (
        1.0, tok(10), tok(4), 1.0, 1.0, 1.0)
    want1 = want0.copy()
    want1[[Q["prompt"], Q["predicted_output"]]] = tok(20), tok(8)
    assert q[0].tolist() == want0.tolist() and q[1].tolist() == want1.tolist()
    assert not q[2:].any()  # empty slots are all zeros
    assert not o["running"].any()  # nothing runs, nothing chosen, no token in the batch
    g = o["globals"]
    assert g[G["queue_len"]] == np.float32(math.log1p(2) / math.log1p(3))
    assert g[G["arrival_rate"]] == np.float32(math.log1p(2) / math.log1p(3))
    assert g[G["arrived"]] == np.float32(2 / 3)
    assert g[G["backlog"]] == tok(30)
    assert g[G["budget"]] == 2.0  # the first budget, unlimited
    assert g[[G["kv_used"], G["since_batch"], G["last_iteration"], G["stall"]]].tolist() == [0, 0, 0, 0]


def test_the_recent_batches_are_read_from_the_argument_only():
    s = Setup(scenario([10, 20, 30], [4, 8, 2], [0.0, 0.0, 3.0]))
    last = Recent(admit_s=-7.0, iter_s=3.0, prefill_tokens=25, decode_tokens=5, budget=64,
                  stalled={0: -2.0, 1: -1.0})
    g = s.observe(last)["globals"]
    assert g[G["since_batch"]] == dur(7.0)
    assert g[G["last_iteration"]] == dur(3.0)
    assert g[G["last_prefill_tokens"]] == tok(25)
    assert g[G["last_decode_tokens"]] == tok(5)
    assert g[G["budget"]] == tok(64)
    assert g[G["stall"]] == dur(2.0)  # the one that waited longest


def test_the_batch_being_formed_shows_in_the_running_part():
    s = Setup(scenario([10, 20, 30], [4, 8, 2], [0.0, 0.0, 3.0]))
    s.dp.select(0)  # request 0: prompt 10, 4 tokens to generate
    o = s.observe()
    r, g = o["running"], o["globals"]
    assert r[R["count"]] == tok(1) and r[R["selected"]] == tok(1)
    assert r[R["kv_used"]] == np.float32(10 / CAP)  # its prompt's KV, reserved
    assert r[R["batch_tokens"]] == tok(10)
    assert r[R["remaining_hist_1"]] == 1.0  # 4 remaining: the bin [2, 8)
    assert r[R["remaining_hist_0"]] == r[R["remaining_hist_2"]] == 0.0
    assert rows(o)[0, Q["prompt"]] == tok(20) and not rows(o)[1].any()  # the slots shifted
    assert g[G["queue_len"]] == np.float32(math.log1p(1) / math.log1p(3))
    assert g[G["backlog"]] == tok(20)


def test_blind_rows_and_running_part_show_only_what_a_server_knows():
    s = Setup(scenario([10, 20, 30], [4, 8, 2], [0.0, 0.0, 3.0], NONE))
    q = rows(s.observe())
    assert q[:2, Q["predicted_output"]].tolist() == [0, 0]  # nothing generated yet
    assert q[:2, Q["uncertainty"]].tolist() == [1, 1]
    assert q[:2, Q["fits_future"]].tolist() == [0, 0]
    s.dp.select(0)
    r = s.observe()["running"]
    assert r[R["remaining_hist_0"]] == 1.0  # generated so far: 0, the bin [0, 2)
    assert r[R["future_peak"]] == 0.0


def test_a_launch_shows_in_the_next_observation():
    s = Setup(scenario([10, 20, 30], [4, 8, 2], [0.0, 0.0, 3.0]))
    s.dp.select(0)
    s.dp.select(0)  # (request 1, shifted to slot 0)
    s.driver.launch(16)  # decodes none; prefills 10 of request 0 and 6 of request 1
    assert s.e.clock == 1.0 and s.e.prefilled[:2].tolist() == [10, 6]
    o = s.observe()
    r, g = o["running"], o["globals"]
    assert r[R["count"]] == tok(2)
    assert r[R["prefilling"]] == tok(1) and r[R["prefill_owed"]] == tok(14)
    assert r[R["batch_tokens"]] == tok(1 + 14)  # request 0 decodes, request 1 owes 14
    assert g[G["kv_used"]] == np.float32(16 / CAP)
    assert g[G["last_prefill_tokens"]] == tok(16) and g[G["last_iteration"]] == dur(1.0)
    assert g[G["since_batch"]] == dur(1.0) and g[G["budget"]] == tok(16)


# ---------------------------------------------------------------------------------------------
# properties

workloads = st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.lists(st.integers(1, 40), min_size=n, max_size=n),     # prompts
    st.lists(st.integers(1, 40), min_size=n, max_size=n),     # outputs, workload A
    st.lists(st.integers(1, 40), min_size=n, max_size=n),     # outputs, workload B
    st.lists(st.integers(0, 5), min_size=n, max_size=n),      # arrival gaps
))


def step_both(a: Setup, b: Setup, rng: np.random.Generator) -> None:
    """The same choice on both: select a random slot, or launch with a random budget."""
    if a.dp.slots and rng.random() < 0.6:
        i = int(rng.integers(len(a.dp.slots)))
        a.dp.select(i)
        b.dp.select(i)
    else:
        budget = [None, 16, 4][int(rng.integers(3))]
        a.driver.launch(budget)
        b.driver.launch(budget)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=workloads, blind=st.booleans(), seed=st.integers(0, 1000))
def test_observations_stay_in_their_space_and_blind_ones_ignore_output_lengths(case, blind, seed):
    prompt, out_a, out_b, gaps = case
    arrival = np.cumsum(gaps).astype(float).tolist()
    pred = NONE if blind else None
    a = Setup(scenario(prompt, out_a, arrival, pred, capacity=400))
    b = Setup(scenario(prompt, out_b, arrival, pred, capacity=400))
    rng = np.random.default_rng(seed)
    for _ in range(60):
        if a.driver.ended or b.driver.ended:
            break
        oa, ob = a.observe(), b.observe()
        assert oa in a.obs.space and ob in b.obs.space
        for part, table in (("queue", QUEUE_FEATURES), ("running", RUNNING_FEATURES), ("globals", GLOBAL_FEATURES)):
            assert oa[part].size % len(table) == 0
        if (a.e.state == 3).any() or (b.e.state == 3).any():
            break  # a completion tells output lengths apart under every model
        if blind:
            for part in oa:
                assert np.array_equal(oa[part], ob[part]), part
        step_both(a, b, rng)


# ---------------------------------------------------------------------------------------------
# the driver: what an action mode can do


def test_launch_with_nothing_chosen_and_nothing_running_waits_for_the_next_arrival():
    s = Setup(scenario([10, 20], [4, 8], [0.0, 5.0]))
    s.driver.launch(None)  # request 0 waits but is not chosen; an arrival is left: idle
    assert s.e.clock == 5.0 and s.e.state[0] == 1 and s.dp.slots == [0, 1]


def test_launch_with_nothing_left_to_arrive_starts_the_head_of_the_queue():
    s = Setup(scenario([10, 20], [4, 8], [0.0, 0.0]))
    s.driver.launch(None)
    assert s.e.running == [0] and s.driver.recent.admit_s == 0.0 and s.driver.recent.prefill_tokens == 10


def test_a_prefill_the_budget_does_not_reach_is_stalled_since_that_batch():
    s = Setup(scenario([10, 20], [4, 8], [0.0, 0.0]))
    s.dp.select(0)
    s.dp.select(0)
    s.driver.launch(16)  # request 1: 6 of 20 prefilled
    assert s.driver.recent.stalled == {}
    s.driver.launch(8)  # request 0 decodes one token, request 1 gets the 7 left
    assert s.e.prefilled[1] == 13 and s.driver.recent.prefill_tokens == 7 and s.driver.recent.stalled == {}
    s.driver.launch(1)  # the one token goes to request 0's decode: request 1 gets no chunk
    assert s.driver.recent.stalled == {1: 2.0}
    assert s.driver.recent.decode_tokens == 1 and s.driver.recent.prefill_tokens == 0
    s.driver.launch(None)  # request 1 gets the rest: no longer stalled
    assert s.driver.recent.stalled == {} and s.e.prefilled[1] == 20


def test_default_plan_waits_holds_or_pauses():
    s = Setup(scenario([10, 20, 5], [40, 40, 4], [0.0, 0.0, 50.0]))
    assert s.driver.default_plan().idle  # nothing runs, an arrival is left: wait for it
    s.dp.select(0)
    s.dp.select(0)
    s.driver.launch(None)
    plan = s.driver.default_plan()  # two run, the last budget unlimited: decode, fast-forward
    assert plan.hold and not plan.prefill and not plan.pause
    s.driver.recent.budget = 1  # fewer tokens than running requests: the newest one pauses
    plan = s.driver.default_plan()
    assert plan.pause == {1} and not plan.hold


def test_invalid_counts_or_raises():
    s = Setup(scenario([10], [4], [0.0]))
    s.driver.invalid("action 9 is masked")
    s.driver.invalid("action 9 is masked")
    assert s.driver.n_invalid == 2
    strict = Driver(s.dp, raise_invalid=True)
    with pytest.raises(InvalidActionError, match="action 9 is masked"):
        strict.invalid("action 9 is masked")


class RecordingDriver:
    """Stands in for the Driver: the select mode reaches the episode only through these."""

    def __init__(self, view) -> None:
        self.view = view
        self.recent = Recent(budget=16)
        self.calls: list[tuple] = []

    def launch(self, budget):
        self.calls.append(("launch", budget))

    def invalid(self, message):
        self.calls.append(("invalid", message.split(" (")[0]))


def test_the_select_mode_needs_only_the_drivers_operations():
    s = Setup(scenario([10, 20], [4, 8], [0.0, 0.0]))
    fake = RecordingDriver(s.e.view)
    mode = SelectMode(fake, s.dp, 4, (None, 16, 4), blind=False)
    mode.step(4 + 2)  # the launch with budgets[2]
    mode.step(3)  # slot 3 is empty: invalid, then the launch with the last budget
    mode.step(0)  # a slot: the decision point, not the driver
    assert fake.calls == [("launch", 4), ("invalid", "action 3 is masked"), ("launch", 16)]
    assert s.dp.sel == [0]
