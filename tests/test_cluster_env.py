"""LLMSchedCluster-v0: every router replays exactly through expert_action(strict=True), the
rewards telescope to the summary's total latency, check_env is clean, and the mask is the KV filter."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import llmsched_gym  # noqa: F401  (registers the envs)
from baselines.routers import ROUTERS
from llmsched_gym.cluster_sim import simulate_cluster
from llmsched_gym.config import ConfigError

OV = {"workload.n_requests": 120}


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_every_router_replays_exactly(router: str) -> None:
    env = gym.make("llmsched_gym:LLMSchedCluster-v0", scenario="azure-conv",
                   n_replicas=3, policy="vllm-v1", expert=router, overrides=OV, refresh_s=0.05)
    env.reset(seed=5)
    total, steps, done = 0.0, 0, False
    while not done:
        _, r, done, trunc, info = env.step(env.unwrapped.expert_action(strict=True))
        total += r
        steps += 1
        assert not trunc
    got = env.unwrapped.summary()
    want = simulate_cluster("azure-conv", "vllm-v1", router, 3, 5, OV, refresh_s=0.05).summary
    got.pop("wall_time_s"), want.pop("wall_time_s")
    assert got == want
    assert steps == 120 and info["done"]
    assert total == pytest.approx(-want["total_latency_s"], rel=1e-9)  # every request completed
    assert want["n_completed"] == 120


def test_check_env_and_mask() -> None:
    env = gym.make("llmsched_gym:LLMSchedCluster-v0", scenario="azure-conv", n_replicas=3, overrides={
        "workload.n_requests": 40}).unwrapped
    check_env(env)
    obs, info = env.reset(seed=0)
    assert obs.shape == (3 * 5 + 2,) and env.observation_space.contains(obs)
    assert info["action_mask"].tolist() == [True, True, True]
    with pytest.raises(ValueError, match=r"action: 7 is not a replica in 0\.\.2"):
        env.step(7)


def test_mask_drops_replicas_too_small_for_the_request() -> None:
    """Replica 1 has 2,000 tokens of KV: a 3,000-token request may only go to replicas 0 and 2."""
    from llmsched_gym.env.cluster_env import LLMSchedClusterEnv

    env = LLMSchedClusterEnv("jaillet-low", n_replicas=3, policy="fcfs",
                             overrides={"workload.n_requests": 5, "workload.prompt": 3000,
                                        "engine.kv_capacity_tokens": 100_000})
    env.reset(seed=0)
    env.cluster.view.kv_capacity[1] = 2000  # as a replica_overrides engine would set it
    assert env.action_masks().tolist() == [True, False, True]


def test_bad_arguments() -> None:
    from llmsched_gym.env.cluster_env import LLMSchedClusterEnv

    with pytest.raises(ConfigError, match=r"expert: unknown router 'oracle'"):
        LLMSchedClusterEnv(expert="oracle")
    with pytest.raises(ConfigError, match=r"n_replicas: expected an integer in 1\.\.4096, got 0"):
        LLMSchedClusterEnv(n_replicas=0)


def test_one_replica_has_no_decision() -> None:
    env = gym.make("llmsched_gym:LLMSchedCluster-v0", scenario="azure-conv", n_replicas=1,
                   overrides={"workload.n_requests": 30}).unwrapped
    obs, info = env.reset(seed=0)
    assert info["done"] and not obs.any()
    assert env.summary()["n_completed"] == 30
    np.testing.assert_array_equal(env.cluster.placement, np.zeros(30))


POOLS = {"prefill": {"n": 2}, "decode": {"n": 1}, "mixed": {"n": 1}}


@pytest.mark.parametrize("router", ["round-robin", "jsq", "token-jsq", "llm-d", "random", "splitwise-mixed"])
def test_pair_experts_replay_exactly(router: str) -> None:
    """With pools the action is a pair; following the pair router (and its decider) reproduces
    simulate_cluster(pools=...) exactly, and the rewards telescope to its total latency."""
    kw = dict(pools=POOLS, transfer={"bandwidth_gb_s": 5.0}, decider={"kind": "prompt_len", "min": 300})
    env = gym.make("llmsched_gym:LLMSchedCluster-v0", scenario="azure-conv", policy="vllm-v1", expert=router,
                   overrides=OV, **kw).unwrapped
    env.reset(seed=2)
    total, done = 0.0, False
    while not done:
        _, r, done, _, info = env.step(env.expert_action(strict=True))
        total += r
    got = env.summary()
    want = simulate_cluster("azure-conv", "vllm-v1", router, seed=2, overrides=OV, **kw).summary
    got.pop("wall_time_s"), want.pop("wall_time_s")
    assert got == want and want["n_completed"] == 120
    assert 0 < want["pools"]["disaggregated"] < 120  # the decider kept the short prompts whole
    assert total == pytest.approx(-want["total_latency_s"], rel=1e-9)


def test_pools_check_env_mask_and_the_agent_as_decider() -> None:
    from llmsched_gym.env.cluster_env import LLMSchedClusterEnv

    env = gym.make("llmsched_gym:LLMSchedCluster-v0", scenario="azure-conv", pools=POOLS,
                   overrides={"workload.n_requests": 30}).unwrapped  # made: check_env reads its spec
    assert isinstance(env, LLMSchedClusterEnv)
    check_env(env)
    obs, info = env.reset(seed=0)
    assert env.action_space.n == 16 and obs.shape == (4 * 7 + 2,)
    assert obs[5:28:7].tolist() == [0.0, 0.0, 1.0, 0.5]  # roles: prefill, prefill, decode, mixed
    mask = info["action_mask"].reshape(4, 4)
    # decode on 2 or 3; prefill on 0, 1 or the mixed 3, or whole on the decode replica itself
    assert mask.astype(int).tolist() == [[0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 1, 0], [0, 0, 1, 1]]
    done = False
    while not done:  # the agent keeps every request whole on replica 2: nothing is transferred
        _, _, done, _, info = env.step(2 * 4 + 2)
    s = env.summary()
    assert s["pools"]["local"] == 30 and s["pools"]["transfer"]["count"] == 0 and s["n_completed"] == 30
    env.reset(seed=0)
    env.step(0)  # (0, 0) cannot be: replica 0 does not decode; the lowest allowed pair (0, 2) is taken
    assert env.cluster.prefill_replica[0] == 0 and env.cluster.decode_replica[0] == 2
