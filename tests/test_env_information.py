"""LLMSched-v1 under the information models: a blind observation carries no output length, what
needs predictions is refused or masked, and info/summaries name the model and the version."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llmsched_gym  # noqa: F401  (registers the env)
from baselines import NotApplicable
from llmsched_gym.env import ENV_ID
from llmsched_gym.env.actions import InvalidActionError
from llmsched_gym.env.bench import random_masked_action
from llmsched_gym.env.llmsched_env import LLMSchedEnv
from llmsched_gym.env.observation import GLOBAL_FEATURES, QUEUE_FEATURES, RUNNING_FEATURES, Q, R

NONE = {"type": "none"}


def explicit(arrival, prompt, output, predictor=None, kv=4096) -> dict:
    wl: dict = {"explicit": {"arrival_s": list(arrival), "prompt_tokens": list(prompt), "output_tokens": list(output)}}
    if predictor is not None:
        wl["predictor"] = predictor
    return {"name": "toy", "workload": wl, "latency": "unit",
            "engine": {"kv_capacity_tokens": kv, "block_size": 1, "overflow": "preempt_lifo_recompute"}}


def run_until_first_completion(scenario: dict, actions_seed: int, mode: str, steps: int = 400):
    """Observations, masks and rewards of a seeded random masked run, up to (and excluding) the
    first step after which some request has completed; the actions are drawn from ``actions_seed``."""
    env = LLMSchedEnv(scenario, action_mode=mode, K=4, flat=True, budgets=(None, 4, 2))
    rng = np.random.default_rng(actions_seed)
    obs, info = env.reset(seed=0)
    trace = [(obs, info["action_mask"], 0.0)]
    for _ in range(steps):
        if (env.engine.state == 3).any():
            break
        obs, reward, term, trunc, info = env.step(random_masked_action(env, rng))
        if (env.engine.state == 3).any():  # this step's observation follows a completion
            break
        trace.append((obs, info["action_mask"], reward))
        if term or trunc:
            break
    return trace


requests = st.integers(2, 7).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 6), min_size=n, max_size=n),        # arrival gaps
    st.lists(st.integers(1, 40), min_size=n, max_size=n),       # prompts
    st.lists(st.integers(1, 60), min_size=n, max_size=n),       # output lengths, workload A
    st.lists(st.integers(1, 60), min_size=n, max_size=n),       # output lengths, workload B
))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=requests, mode=st.sampled_from(["select", "subset", "priority"]), seed=st.integers(0, 1000))
def test_blind_observations_do_not_depend_on_output_lengths_before_a_completion(case, mode, seed):
    gaps, prompt, out_a, out_b = case
    arrival = np.cumsum(gaps).astype(float).tolist()
    a = run_until_first_completion(explicit(arrival, prompt, out_a, NONE), seed, mode)
    b = run_until_first_completion(explicit(arrival, prompt, out_b, NONE), seed, mode)
    n = min(len(a), len(b))
    assert n >= 1
    for (oa, ma, ra), (ob, mb, rb) in zip(a[:n], b[:n], strict=True):
        assert np.array_equal(oa, ob)
        assert np.array_equal(ma, mb)
        assert ra == rb


def test_clairvoyant_and_predicted_observations_do_show_output_lengths():
    # the control of the property above: the same pair of workloads, told apart at the first step
    arrival, prompt = [0.0, 0.0, 1.0], [8, 8, 8]
    for predictor in (None, {"type": "lognormal", "sigma": 0.1}):
        a = run_until_first_completion(explicit(arrival, prompt, [5, 50, 9], predictor), 0, "select")
        b = run_until_first_completion(explicit(arrival, prompt, [40, 3, 9], predictor), 0, "select")
        assert not np.array_equal(a[0][0], b[0][0])


def test_blind_queue_rows_show_generated_tokens_and_full_uncertainty():
    env = LLMSchedEnv(explicit([0.0, 0.0, 0.0], [8, 8, 8], [30, 30, 30], NONE, kv=60), K=4, budgets=(None,))
    obs, _ = env.reset(seed=0)
    q = obs["queue"].reshape(4, len(QUEUE_FEATURES))
    assert q[:3, Q["present"]].tolist() == [1, 1, 1]
    assert q[:3, Q["predicted_output"]].tolist() == [0, 0, 0]  # nothing generated yet
    assert q[:3, Q["uncertainty"]].tolist() == [1, 1, 1]
    assert q[:3, Q["fits_future"]].tolist() == [0, 0, 0]
    assert env.information == "blind"
    # run a few batches: the running part shows tokens generated so far (all past the first bin)
    for _ in range(3):
        env.step(0)
    env.step(4)  # launch the three
    for _ in range(6):
        obs, *_ = env.step(4)
    r = obs["running"]
    assert r[R["future_peak"]] == 0.0
    hist = r[R["remaining_hist_0"]:R["remaining_hist_0"] + 8]
    assert hist.sum() == pytest.approx(1.0) and hist[0] == 0.0


def test_prediction_choices_are_refused_under_blind_in_one_line():
    sc = explicit([0.0, 1.0], [4, 4], [5, 5], NONE)
    with pytest.raises(NotApplicable, match=r"^order: 'shortest' needs output-length predictions; the task is "
                                            r"blind \(allowed: arrival, prompt, deadline\)$"):
        LLMSchedEnv(sc, order="shortest")
    with pytest.raises(NotApplicable, match=r"^admission: 'future' needs output-length predictions; the task is "
                                            r"blind \(allowed: current, none\)$"):
        LLMSchedEnv(sc, admission="future")
    with pytest.raises(NotApplicable, match=r"^candidates: sjf needs output-length predictions; the task is blind$"):
        LLMSchedEnv(sc, action_mode="meta", candidates=["fcfs", "sjf"])
    with pytest.raises(NotApplicable, match=r"^expert: mcsf needs output-length predictions; the task is blind$"):
        LLMSchedEnv(sc, expert="mcsf")
    with pytest.raises(NotApplicable, match=r"^base: static:order=output needs output-length predictions"):
        LLMSchedEnv(sc, action_mode="tune", base={"name": "static", "order": "output"}, tune={"chunk_size": [8, 64]})
    # predicted tasks allow them; the true lengths stay out of reach
    pred = explicit([0.0, 1.0], [4, 4], [5, 5], {"type": "noisy", "x": 0.5})
    LLMSchedEnv(pred, order="shortest", admission="future", expert="mcsf")
    with pytest.raises(NotApplicable, match=r"^expert: mcsf:oracle=true needs the true output lengths; the task "
                                            r"is predicted$"):
        LLMSchedEnv(pred, expert={"name": "mcsf", "oracle": True})


def test_meta_defaults_keep_only_the_policies_the_model_allows():
    blind = LLMSchedEnv("azure-conv", action_mode="meta", overrides={"workload.predictor": NONE})
    assert [c.name for c in blind.switch.candidates] == ["fcfs", "sarathi", "vllm-v1", "vllm-v0"]
    predicted = LLMSchedEnv("azure-conv", action_mode="meta")
    assert [c.name for c in predicted.switch.candidates] == ["fcfs", "sjf", "srpt", "sarathi", "vllm-v1", "vllm-v0"]


def launched(predictor, **kw) -> LLMSchedEnv:
    """Two requests admitted and launched; at the third one's arrival both run (preemptable)."""
    env = LLMSchedEnv(explicit([0.0, 0.0, 1.0], [4, 4, 4], [20, 20, 20], predictor), K=2, budgets=(None,), **kw)
    env.reset(seed=0)
    for action in (0, 0, 2):
        env.step(action)
    assert len(env.engine.running) == 2
    return env


def test_preempt_longest_is_masked_under_blind_and_counted_invalid():
    newest, longest = 3, 4  # K = 2, one budget: slots 0-1, launch 2, preempts 3 and 4
    env = launched(NONE)
    mask = env.action_masks()
    assert mask[newest] and not mask[longest]
    env.step(longest)  # invalid: launches the batch formed so far, preempts nothing
    assert env.dp.victims == [] and env.unwrapped.driver.n_invalid == 1
    with pytest.raises(InvalidActionError):
        launched(NONE, invalid_action="raise").step(longest)
    pred = launched({"type": "noisy", "x": 0.2})
    assert pred.action_masks()[newest] and pred.action_masks()[longest]


@pytest.mark.parametrize(("predictor", "want"), [(None, "clairvoyant"), ({"type": "lognormal", "sigma": 0.7},
                                                                         "predicted"), (NONE, "blind")])
def test_info_and_summary_name_the_model_and_the_version(predictor, want):
    env = gym.make(f"llmsched_gym:{ENV_ID}", scenario=explicit([0.0, 1.0], [4, 4], [3, 3], predictor))
    _, info = env.reset(seed=0)
    assert (info["information"], info["env"]) == (want, "LLMSched-v1")
    term = trunc = False
    while not (term or trunc):
        _, _, term, trunc, info = env.step(env.unwrapped.fallback_action())
    assert info["summary"]["information"] == want and info["summary"]["env"] == "LLMSched-v1"


def test_v0_is_retired_with_a_pointer_to_v1():
    with pytest.raises(gym.error.DeprecatedEnv, match=r"LLMSched-v1"), \
            pytest.warns(DeprecationWarning, match="LLMSched-v0 is out of date"):
        gym.make("llmsched_gym:LLMSched-v0")


def test_feature_tables_say_what_blind_shows():
    meanings = {n: m for n, _, _, m in (*QUEUE_FEATURES, *RUNNING_FEATURES, *GLOBAL_FEATURES)}
    assert "blind: tokens generated so far" in meanings["predicted_output"]
    assert "blind: 1" in meanings["uncertainty"]
    assert "blind: 0" in meanings["future_peak"]
    assert "Version history" in LLMSchedEnv.__doc__ and "LLMSched-v1" in LLMSchedEnv.__doc__
