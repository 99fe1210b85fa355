"""LLMSched-v1 with Gymnasium's and Stable-Baselines3's checkers, vectorised envs and MaskablePPO."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env

import llmsched_gym  # noqa: F401  (registers the ids)
from llmsched_gym.env.llmsched_env import LLMSchedEnv

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

from sb3_contrib import MaskablePPO  # noqa: E402
from sb3_contrib.common.maskable.evaluation import evaluate_policy  # noqa: E402
from stable_baselines3.common.env_checker import check_env as sb3_check_env  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize  # noqa: E402

ENV_ID = "llmsched_gym:LLMSched-v1"
SCENARIOS = {
    "jaillet-high": {"workload.n_requests": 40},
    "echo-hybrid": {"workload.n_requests": 15, "workload.classes.offline.n_requests": 10},
}


@pytest.mark.parametrize("flat", [False, True])
@pytest.mark.parametrize("mode", ["select", "subset", "priority", "knob", "meta", "tune"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_gymnasium_and_sb3_check_env_pass_without_warnings(scenario, mode, flat):
    # default arguments: the checkers step random unmasked actions, which the env accepts (a
    # masked one is a counted no-op)
    env = gym.make(ENV_ID, scenario=scenario, action_mode=mode, flat=flat, overrides=SCENARIOS[scenario])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gym_check_env(env.unwrapped)
        sb3_check_env(env.unwrapped)
    assert [str(w.message) for w in caught] == []


def make_thunk(seed_offset: int = 0):
    def thunk():
        return gym.make(ENV_ID, scenario="jaillet-high", K=8, overrides={"workload.n_requests": 30})
    return thunk


def test_dummy_and_subproc_vec_envs_with_vec_normalize_step_with_masks():
    for vec_cls in (DummyVecEnv, SubprocVecEnv):
        kwargs = {"start_method": "fork"} if vec_cls is SubprocVecEnv else {}
        venv = VecNormalize(vec_cls([make_thunk(), make_thunk()], **kwargs), norm_obs_keys=["running", "globals"])
        try:
            obs = venv.reset()
            assert set(obs) == {"queue", "running", "globals", "budgets"}
            rng = np.random.default_rng(0)
            for _ in range(200):
                masks = np.stack(venv.env_method("action_masks"))
                actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
                obs, rewards, dones, infos = venv.step(actions)
                assert np.all(np.isfinite(obs["running"])) and np.all(np.isfinite(rewards))
        finally:
            venv.close()


def test_gymnasium_make_vec_runs():
    envs = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync", scenario="jaillet-high", K=8,
                        overrides={"workload.n_requests": 30})
    obs, infos = envs.reset(seed=0)
    assert obs["queue"].shape == (2, 8 * 12)
    for _ in range(50):
        masks = infos["action_mask"]
        actions = np.array([np.flatnonzero(m)[0] for m in masks])
        obs, rewards, term, trunc, infos = envs.step(actions)
        assert obs in envs.observation_space
    envs.close()


def test_maskable_ppo_trains_and_evaluates_with_masks():
    import torch

    def make():
        return gym.make(ENV_ID, scenario="jaillet-low", K=8, reward={"latency": 0.01},
                        overrides={"workload.n_requests": 40})

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny networks: threads only contend
    try:
        venv = DummyVecEnv([make, make])
        model = MaskablePPO("MultiInputPolicy", venv, n_steps=256, batch_size=128, n_epochs=2, seed=0,
                            policy_kwargs={"net_arch": [32]}, device="cpu")
        model.learn(total_timesteps=2048)
        mean, _ = evaluate_policy(model, make(), n_eval_episodes=2, use_masking=True, warn=False)
        venv.close()
    finally:
        torch.set_num_threads(threads)
    assert model.num_timesteps >= 2048
    assert np.isfinite(mean) and mean < 0


@pytest.mark.parametrize("mode", ["select", "meta"])
def test_plain_ppo_with_defaults_runs_and_logs_episode_returns(mode):
    # unmasked PPO: invalid actions are no-ops; SB3 wraps the single env in its Monitor, whose
    # info["episode"] feeds the ep_info_buffer (rollout/ep_rew_mean in TensorBoard)
    from stable_baselines3 import PPO

    env = gym.make(ENV_ID, scenario="jaillet-low", action_mode=mode, K=8, reward={"latency": 0.01},
                   overrides={"workload.n_requests": 20})
    model = PPO("MultiInputPolicy", env, n_steps=128, batch_size=64, n_epochs=1, seed=0,
                policy_kwargs={"net_arch": [16]}, device="cpu")
    model.learn(total_timesteps=512)
    assert len(model.ep_info_buffer) > 0
    ep = model.ep_info_buffer[-1]
    assert ep["l"] > 0 and np.isfinite(ep["r"]) and ep["r"] < 0


def test_registration_sets_a_step_limit():
    assert gym.spec("LLMSched-v1").max_episode_steps == 1_000_000
    env = gym.make(ENV_ID, scenario="jaillet-high", n_requests=10)
    assert env.spec.max_episode_steps == 1_000_000


def test_env_pickles_for_subprocesses():
    import pickle

    env = LLMSchedEnv("jaillet-high", n_requests=20)
    env.reset(seed=0)
    clone = pickle.loads(pickle.dumps(env))
    assert np.array_equal(clone.action_masks(), env.action_masks())
