"""The ``ttft_tail`` reward component: minus the first-token waits beyond a threshold."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from llmsched_gym.config import ConfigError
from llmsched_gym.env.llmsched_env import LLMSchedEnv
from llmsched_gym.env.reward import RewardTracker, parse_weights

BURSTY = {"workload.n_requests": 60, "workload.arrival": {"type": "gamma", "rate": 50.0, "cv": 4.0}}


def _fake_engine(arrival: list[float]) -> SimpleNamespace:
    """The few engine fields the tracker reads, for a hand-driven episode."""
    n = len(arrival)
    wl = SimpleNamespace(arrival_s=np.asarray(arrival, float), has_slo=False, n_clients=1)
    return SimpleNamespace(workload=wl, counters=SimpleNamespace(total_decoded=0, recomputed_tokens_total=0),
                           clock=0.0, next_idx=0, first_token_s=np.full(n, np.nan))


def test_hinge_accrues_while_waiting_and_stops_at_the_first_token_or_the_rejection():
    tr = RewardTracker(parse_weights({"ttft_tail": {"weight": 2.0, "threshold_s": 0.5}}))
    e = _fake_engine([0.0, 1.0, 2.0])
    tr.reset(e)
    e.clock, e.next_idx = 1.2, 2  # request 0 late by 0.7 s, request 1 not yet (0.2 s < 0.5)
    total = 0.0
    r, c = tr.collect()
    total += c["ttft_tail"]
    assert c["ttft_tail"] == pytest.approx(-0.7)
    assert r == pytest.approx(-1.4)
    e.first_token_s[0] = 1.5  # request 0's first token: 1.0 s beyond, 0.3 more than before
    e.clock, e.next_idx = 2.0, 3  # request 1: 0.5 s beyond; request 2 just arrived
    r, c = tr.collect()
    total += c["ttft_tail"]
    assert c["ttft_tail"] == pytest.approx(-0.8)
    e.clock = 3.0
    tr.on_reject(2)  # request 2 rejected at 3.0: 0.5 s beyond, then no more
    e.first_token_s[1] = 2.25
    r, c = tr.collect()
    total += c["ttft_tail"]
    assert c["ttft_tail"] == pytest.approx(-(0.25 + 0.5))
    e.clock = 9.0
    r, c = tr.collect()
    assert c["ttft_tail"] == 0.0 and r == 0.0
    # the episode: minus sum max(0, TTFT - 0.5) = 1.0 + 0.75 + 0.5 (request 2 until its rejection)
    assert total == pytest.approx(-2.25)


@pytest.mark.parametrize("threshold", [0.0, 0.4, 2.0])
def test_the_episode_sums_to_minus_the_hinge_of_every_ttft(threshold):
    env = LLMSchedEnv("jaillet-high", overrides=BURSTY, action_mode="meta", candidates=["fcfs", "srpt"],
                      reward={"ttft_tail": {"weight": 0.5, "threshold_s": threshold}})
    _, info = env.reset(seed=3)
    rng = np.random.default_rng(0)
    comps, rewards, done = [], [], False
    while not done:
        _, r, term, trunc, info = env.step(int(rng.integers(2)))
        comps.append(info["reward_components"]["ttft_tail"])
        rewards.append(r)
        done = term or trunc
    e = env.engine
    ttft = e.first_token_s - e.workload.arrival_s
    assert not np.isnan(ttft).any()
    want = -np.maximum(ttft - threshold, 0.0).sum()
    assert sum(comps) == pytest.approx(want, rel=1e-9, abs=1e-9)
    assert sum(rewards) == pytest.approx(0.5 * want, rel=1e-9, abs=1e-9)
    assert max(comps) <= 0.0


def test_a_bare_weight_means_threshold_zero_and_the_component_is_absent_unless_weighted():
    assert parse_weights({"ttft_tail": 3.0}) == {"ttft_tail": {"weight": 3.0, "threshold_s": 0.0}}
    assert parse_weights("ttft_tail") == {"ttft_tail": {"weight": 1.0, "threshold_s": 0.0}}
    env = LLMSchedEnv("jaillet-high", overrides=BURSTY)
    _, info = env.reset(seed=0)
    assert "ttft_tail" not in info["reward_components"]
    _, _, _, _, info = env.step(env.action_space.sample())
    assert "ttft_tail" not in info["reward_components"]
    env = LLMSchedEnv("jaillet-high", overrides=BURSTY, reward={"latency": 1.0, "ttft_tail": 1.0})
    _, info = env.reset(seed=0)
    assert info["reward_components"]["ttft_tail"] == 0.0


@pytest.mark.parametrize("reward, message", [
    ({"ttft_tail": {"weight": 1.0, "thresh": 2.0}}, "reward.ttft_tail.thresh: unknown key; allowed: weight, threshold_s"),
    ({"ttft_tail": {"threshold_s": -1.0}}, "reward.ttft_tail.threshold_s: must be >= 0"),
    ({"ttft_tail": {"threshold_s": "soon"}}, "reward.ttft_tail.threshold_s: expected a number"),
    ({"ttft_tail": {"weight": float("inf")}}, "reward.ttft_tail.weight: must be finite"),
    ({"tail": 1.0}, "reward.tail: unknown component; allowed: latency, throughput, eviction, slo, fairness, ttft_tail"),
])
def test_bad_tail_weights_get_a_one_line_error_naming_the_field(reward, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_weights(reward)
