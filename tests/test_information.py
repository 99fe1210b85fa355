"""Information models (clairvoyant / predicted / blind): the predictor's calibration, the
summaries, the engine's guard on true lengths, and which policies are applicable where."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import small_cuts

import baselines
from baselines import NotApplicable, PolicyError, applicable, make_policy
from llmsched_gym.config import ConfigError
from llmsched_gym.core.information import (
    BLIND,
    CLAIRVOYANT,
    PREDICTED,
    GuardedWorkload,
    InformationError,
    information_of,
    provides,
)
from llmsched_gym.core.request import Workload, WorkloadError
from llmsched_gym.core.scenarios import get_scenario
from llmsched_gym.core.scheduler import BatchPlan, Scheduler
from llmsched_gym.core.traces import synthetic_azure_conv
from llmsched_gym.core.workload import (
    RANKER_SIGMA,
    RANKER_TAU,
    build_workload,
    kendall_tau,
    predict,
    sigma_for_tau,
)
from llmsched_gym.sim import make_engine, simulate

LOGNORMAL = {"type": "lognormal", "sigma": RANKER_SIGMA}
NONE = {"type": "none"}


def toy(predictor: dict | None = None, output=(5, 3, 8, 2)) -> dict:
    n = len(output)
    wl: dict = {"explicit": {"arrival_s": [0.0] * n, "prompt_tokens": [4] * n, "output_tokens": list(output)}}
    if predictor is not None:
        wl["predictor"] = predictor
    return {"name": "toy", "workload": wl, "engine": {"kv_capacity_tokens": 200, "block_size": 1},
            "latency": "unit", "policy": "fcfs"}


# ---- which model a scenario has -----------------------------------------------------------------
def test_the_model_follows_from_the_predictor():
    assert information_of({"workload": {"trace": {"format": "azure"}}}) == CLAIRVOYANT
    assert information_of({"workload": {"predictor": {"type": "oracle"}}}) == CLAIRVOYANT
    assert information_of({"predictor": {"type": "noisy", "x": 0.5}}) == PREDICTED  # a workload spec
    assert information_of({"workload": {"predictor": LOGNORMAL}}) == PREDICTED
    assert information_of({"workload": {"predictor": NONE}}) == BLIND
    # built-in scenarios: real serving is predicted, the paper's known-length model clairvoyant
    assert information_of(get_scenario("azure-conv")) == PREDICTED
    assert information_of(get_scenario("jaillet-high")) == CLAIRVOYANT
    assert information_of(get_scenario("jaillet-noisy")) == PREDICTED
    # a trace run on azure-conv's settings keeps its predictor
    assert information_of(get_scenario("trace:azure:/nowhere.csv")) == PREDICTED
    # a name is not resolved here (core.information sits below the scenarios): one line naming the type
    with pytest.raises(ConfigError, match="information: expected a scenario, a workload spec or a Workload"):
        information_of("azure-conv")


def test_a_built_workload_records_its_model_and_a_hand_made_one_is_clairvoyant():
    spec = {"arrival": {"type": "poisson", "rate": 5}, "n_requests": 50, "prompt": 10,
            "output": {"type": "uniform", "lo": 1, "hi": 100}}
    assert information_of(build_workload(spec, 0)) == CLAIRVOYANT
    assert information_of(build_workload({**spec, "predictor": LOGNORMAL}, 0)) == PREDICTED
    blind = build_workload({**spec, "predictor": NONE}, 0)
    assert information_of(blind) == BLIND
    assert not blind.predicted_output.any()  # no prediction at all
    # the predictor leaves the requests alone (common random numbers)
    assert np.array_equal(blind.output_tokens, build_workload(spec, 0).output_tokens)
    assert information_of(Workload([0.0], [3], [4])) == CLAIRVOYANT


@pytest.mark.parametrize(("predictor", "want"), [(None, CLAIRVOYANT), (LOGNORMAL, PREDICTED), (NONE, BLIND)])
def test_every_summary_names_the_information_model(predictor, want):
    s = simulate(toy(predictor), "fcfs").summary
    assert s["information"] == want
    assert s["n_completed"] == 4


def test_azure_conv_summaries_say_predicted():
    assert simulate("azure-conv", "sarathi", overrides={"workload.n_requests": 30}).summary["information"] == PREDICTED


def test_provides_orders_the_models():
    assert provides(CLAIRVOYANT, "true") and provides(PREDICTED, "predicted") and provides(BLIND, "nothing")
    assert not provides(PREDICTED, "true") and not provides(BLIND, "predicted")
    with pytest.raises(ValueError, match=r"^information: unknown 'psychic'; allowed: clairvoyant, predicted, blind$"):
        provides("psychic", "nothing")


def test_partial_zero_predictions_are_rejected_but_all_zeros_mean_none():
    Workload([0.0, 1.0], [3, 3], [4, 5], predicted_output=[0, 0])
    with pytest.raises(WorkloadError, match=r"^predicted_output: must be >= 1 \(request 1 has 0\)"):
        Workload([0.0, 1.0], [3, 3], [4, 5], predicted_output=[2, 0])


# ---- the predictor: a published ranker's Kendall's tau on chat traffic --------------------------
def test_lognormal_predictor_matches_the_published_rankers_tau_on_chat_traffic():
    out = synthetic_azure_conv(0).output_tokens[:6000]
    taus = [kendall_tau(out, predict(Workload(np.zeros(len(out)), np.ones(len(out)), out), "lognormal",
                                     seed, sigma=RANKER_SIGMA)) for seed in range(3)]
    assert abs(float(np.mean(taus)) - RANKER_TAU) < 0.02
    # and the error is real: far from the oracle's tau of 1
    assert max(taus) < 0.6


def test_sigma_for_tau_recovers_the_closed_form_on_lognormal_lengths():
    # log L ~ N(0, s^2), log pred = log L + sigma Z: Kendall's tau = (2 / pi) asin(s / sqrt(s^2 + sigma^2))
    rng = np.random.default_rng(5)
    s = 1.0
    lengths = np.rint(np.exp(6 + s * rng.standard_normal(8000))).astype(np.int64)
    got = sigma_for_tau(0.56, lengths, rng=1)
    want = s * math.sqrt(1 / math.sin(math.pi * 0.56 / 2) ** 2 - 1)
    assert abs(got - want) < 0.05


def test_azure_conv_calibration_constant_is_what_sigma_for_tau_finds():
    out = synthetic_azure_conv(0).output_tokens[:6000]
    assert abs(sigma_for_tau(RANKER_TAU, out, rng=0) - RANKER_SIGMA) < 0.05


def test_lognormal_predictor_is_median_unbiased_and_validated():
    true = np.full(20000, 100)
    pred = predict(Workload(np.zeros(len(true)), np.ones(len(true)), true), "lognormal", 0, sigma=0.7)
    assert pred.min() >= 1
    assert abs(float(np.median(pred)) - 100) <= 2
    assert np.array_equal(predict(Workload([0.0], [1], [37]), "lognormal", 0, sigma=0.0), [37])
    with pytest.raises(WorkloadError, match=r"^predictor\.sigma: expected a number >= 0 and <= 10, got -1"):
        build_workload({"arrival": {"type": "poisson", "rate": 1}, "n_requests": 3, "prompt": 1, "output": 2,
                        "predictor": {"type": "lognormal", "sigma": -1}}, 0)
    with pytest.raises(WorkloadError, match=r"^predictor\.type: unknown value 'psychic' \(allowed: oracle, "
                                            r"lognormal, noisy, bucketed, none\)"):
        build_workload({"arrival": {"type": "poisson", "rate": 1}, "n_requests": 3, "prompt": 1, "output": 2,
                        "predictor": {"type": "psychic"}}, 0)


# ---- the guard -----------------------------------------------------------------------------------
class Peek(Scheduler):
    """FCFS that reads one field once (to see what the view lets a policy read)."""

    name = "peek"

    def __init__(self, field: str) -> None:
        self.field = field
        self.seen = None

    def schedule(self, view):
        if self.seen is None:
            self.seen = np.array(view.workload.output_tokens if self.field == "true"
                                 else view.predicted_output)
        return BatchPlan.admit(list(view.waiting))


def test_clairvoyant_policies_read_the_true_lengths():
    p = Peek("true")
    simulate(toy(), p)
    assert p.seen.tolist() == [5, 3, 8, 2]


@pytest.mark.parametrize("predictor", [LOGNORMAL, NONE])
def test_true_lengths_raise_under_predicted_and_blind(predictor):
    model = information_of({"workload": {"predictor": predictor}})
    with pytest.raises(InformationError, match=rf"^workload\.output_tokens: the true output lengths are hidden "
                                               rf"under the '{model}' information model"):
        simulate(toy(predictor), Peek("true"))


def test_predictions_read_under_predicted_and_raise_under_blind():
    p = Peek("predicted")
    simulate(toy(LOGNORMAL), p)
    assert p.seen.min() >= 1 and len(p.seen) == 4
    with pytest.raises(InformationError, match=r"^predicted_output: there are no output-length predictions under "
                                               r"the 'blind' information model"):
        simulate(toy(NONE), Peek("predicted"))


def test_the_guarded_workload_reads_through_everything_else_and_refuses_copies():
    engine, _ = make_engine(toy(NONE), "fcfs")
    wl = engine.view.workload
    assert isinstance(wl, GuardedWorkload) and len(wl) == 4
    assert wl.prompt_tokens.tolist() == [4] * 4 and wl.n_clients == 1 and not wl.has_slo
    for name in ("take", "with_", "sorted"):
        with pytest.raises(InformationError, match=rf"^workload\.{name}: a policy cannot copy the workload"):
            getattr(wl, name)
    # the engine and the metrics keep the true lengths
    engine.run()
    assert engine.workload.output_tokens.tolist() == [5, 3, 8, 2]
    assert engine.generated.tolist() == [5, 3, 8, 2]


# ---- what policies need, and where they apply ----------------------------------------------------
def test_needs_depend_on_the_parameters():
    assert make_policy("sjf").needs() == "predicted"
    assert make_policy("mcsf", oracle=True).needs() == "true"
    assert make_policy("fcfs").needs() == "nothing"
    assert make_policy("fcfs", admission="reserve").needs() == "predicted"
    assert make_policy("lpm", memory="fit").needs() == "nothing"
    assert make_policy("vtc", memory="fit").needs() == "nothing"
    assert make_policy("vtc-predict", predictor="noisy", memory="fit").needs() == "predicted"
    assert make_policy("vtc-oracle").needs() == "true"
    assert make_policy("wait", thresholds=[1, 2]).needs() == "nothing"


def test_applicable_gives_the_reason_without_running():
    assert applicable("sjf", BLIND) == (False, "sjf needs output-length predictions; the task is blind")
    assert applicable("sjf", PREDICTED) == (True, "")
    assert applicable("mcsf:oracle=true", PREDICTED) == (
        False, "mcsf:oracle=true needs the true output lengths; the task is predicted")
    assert applicable({"name": "lpm", "memory": "fit"}, BLIND) == (True, "")
    assert applicable(make_policy("vtc-oracle"), CLAIRVOYANT) == (True, "")
    with pytest.raises(PolicyError, match="^policy: unknown 'nope'"):
        applicable("nope", BLIND)


def test_building_a_run_that_is_not_applicable_raises_one_line():
    with pytest.raises(NotApplicable, match=r"^sjf needs output-length predictions; the task is blind$"):
        simulate(toy(NONE), "sjf")
    with pytest.raises(NotApplicable, match=r"^vtc-oracle needs the true output lengths; the task is predicted$"):
        simulate("azure-conv", "vtc-oracle", overrides={"workload.n_requests": 20})


SHORT = small_cuts(60, ("azure-conv", "vtc-arena", "wait-high", "jaillet-high", "nested-synth4", "echo-hybrid"),
                   offline=20, sizes={"echo-hybrid": None},
                   extra={"azure-conv": {"engine.kv_capacity_tokens": 12000},
                          "echo-hybrid": {"workload.horizon_s": 4.0, "engine.horizon_s": 4.0}})
PAPER = {"wait": "wait-high", "nested-wait": "nested-synth4", "fcfs-greedy-lifo": "wait-high",
         "mcsf": "jaillet-high", "semi-online": "jaillet-high", "alpha-beta": "jaillet-high",
         "alpha-greedy": "jaillet-high"}


@pytest.mark.parametrize("predictor", [LOGNORMAL, NONE], ids=["predicted", "blind"])
@pytest.mark.parametrize("name", baselines.available())
def test_every_policy_runs_without_true_lengths_or_is_not_applicable(name, predictor):
    # a read of the true lengths (or, blind, of predictions) raises InformationError, which fails the run
    scenario = "echo-hybrid" if name.startswith("echo") else PAPER.get(name, "vtc-arena" if "vtc" in name or name in (
        "lcf", "drr", "rpm") else "azure-conv")
    model = information_of({"workload": {"predictor": predictor}})
    ok, reason = applicable(name, model)
    overrides = {**SHORT[scenario], "workload.predictor": predictor}
    if not ok:
        assert reason.startswith(f"{name} needs ") and reason.endswith(f"; the task is {model}")
        with pytest.raises(NotApplicable, match=f"^{reason}$"):
            simulate(scenario, name, overrides=overrides)
        return
    s = simulate(scenario, name, overrides=overrides).summary
    assert s["information"] == model
    assert s["n_arrived"] == s["n_completed"] + s["n_rejected"] + s["n_unfinished"]
    assert s["n_completed"] > 0


def test_blind_leaves_a_useful_set_of_policies():
    usable = [n for n in baselines.available() if applicable(n, BLIND)[0]]
    for name in ("fcfs", "vllm-v1", "vllm-v0", "sarathi", "echo", "alpha-greedy", "fcfs-greedy-lifo"):
        assert name in usable
    assert "sjf" not in usable and "mcsf" not in usable
