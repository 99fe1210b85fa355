"""LLMSched-v1 with Gymnasium's and Stable-Baselines3's checkers, vectorised envs and MaskablePPO."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env

import llmsched_gym  # noqa: F401  (registers the ids)
from llmsched_gym.core.records import request_table
from llmsched_gym.env.llmsched_env import LLMSchedEnv

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")

from conftest import quiet, small_cuts
from sb3_contrib import MaskablePPO  # noqa: E402
from sb3_contrib.common.maskable.evaluation import evaluate_policy  # noqa: E402
from stable_baselines3.common.env_checker import check_env as sb3_check_env  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize  # noqa: E402

ENV_ID = "llmsched_gym:LLMSched-v1"
SCENARIOS = small_cuts(40, ("jaillet-high", "echo-hybrid"), offline=10, sizes={"echo-hybrid": 15})


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


def make_thunk():
    def thunk():
        # invalid_action="raise": an action the mask forbids is an error, not a counted no-op
        return gym.make(ENV_ID, scenario="jaillet-high", K=8, invalid_action="raise",
                        overrides={"workload.n_requests": 30})
    return thunk


def test_dummy_and_subproc_vec_envs_with_vec_normalize_run_the_same_episodes_with_masks():
    runs, ends = [], []
    for vec_cls in (DummyVecEnv, SubprocVecEnv):
        kwargs = {"start_method": "fork"} if vec_cls is SubprocVecEnv else {}
        venv = VecNormalize(vec_cls([make_thunk(), make_thunk()], **kwargs), norm_obs_keys=["running", "globals"])
        trace, ended = [], []
        try:
            venv.seed(0)
            obs = venv.reset()
            assert set(obs) == {"queue", "running", "globals", "budgets"}
            rng = np.random.default_rng(0)
            for _ in range(200):
                masks = np.stack(venv.env_method("action_masks"))
                actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
                obs, rewards, dones, infos = venv.step(actions)
                trace.append(({k: v.copy() for k, v in obs.items()}, rewards.copy(), dones.copy()))
                ended += [(i, info["summary"]["n_completed"]) for i, info in enumerate(infos) if "summary" in info]
        finally:
            venv.close()
        runs.append(trace)
        ends.append(ended)
    # one process or one per env: the same episodes, step for step (rewards: SubprocVecEnv's come
    # back as float64, DummyVecEnv's as float32, so the normalised values agree to float32)
    for (obs_d, rew_d, done_d), (obs_s, rew_s, done_s) in zip(*runs, strict=True):
        for k in obs_d:
            np.testing.assert_array_equal(obs_d[k], obs_s[k])
        np.testing.assert_allclose(rew_d, rew_s, rtol=1e-6)
        np.testing.assert_array_equal(done_d, done_s)
    # an episode ended within the 200 steps, every one of its 30 requests served
    assert ends[0] == ends[1] and ends[0] and all(n == 30 for _, n in ends[0])


def test_gymnasium_make_vec_steps_each_env_as_the_single_env_would():
    kw = {"scenario": "jaillet-high", "K": 8, "overrides": {"workload.n_requests": 30}}
    envs = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync", **kw)
    singles = [gym.make(ENV_ID, **kw) for _ in range(2)]
    obs, infos = envs.reset(seed=0)  # the sub-envs get seeds 0 and 1
    alone = [env.reset(seed=i)[0] for i, env in enumerate(singles)]
    assert obs["queue"].shape == (2, 8 * 12)
    for _ in range(50):
        for i in range(2):
            for k in obs:
                np.testing.assert_array_equal(obs[k][i], alone[i][k])
            np.testing.assert_array_equal(infos["action_mask"][i], singles[i].unwrapped.action_masks())
        actions = np.array([np.flatnonzero(m)[0] for m in infos["action_mask"]])
        obs, rewards, term, trunc, infos = envs.step(actions)
        steps = [env.step(a) for env, a in zip(singles, actions, strict=True)]
        alone = [st[0] for st in steps]
        np.testing.assert_array_equal(rewards, [st[1] for st in steps])
        if term.any() or trunc.any():  # the vector env resets an ended env on its next step
            break
    envs.close()


class EpisodeSummaries(gym.Wrapper):
    """Keeps ``info["summary"]`` of every episode that ends, with ``in_system_s``: the
    request-seconds spent in the system (each arrived request from its arrival to its completion,
    or to the end of the run if unfinished), which the latency reward sums to minus."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.summaries: list[dict] = []

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if terminated or truncated:
            s = dict(info["summary"])
            t = request_table(self.env.unwrapped.engine)
            end = np.where(np.isnan(t["completion_s"]), s["sim_time_s"], t["completion_s"])
            s["in_system_s"] = float(np.sum(end - t["arrival_s"]))
            self.summaries.append(s)
        return obs, reward, terminated, truncated, info


def test_maskable_ppo_trains_and_evaluates_with_masks():
    import torch

    def make(stall_iterations: int | None = None):
        stall = {} if stall_iterations is None else {"engine.stall_iterations": stall_iterations}
        return gym.make(ENV_ID, scenario="jaillet-low", K=8, reward={"latency": 0.01},
                        overrides={"workload.n_requests": 40, **stall})

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny networks: threads only contend
    try:
        venv = DummyVecEnv([make, make])
        model = MaskablePPO("MultiInputPolicy", venv, n_steps=256, batch_size=128, n_epochs=2, seed=0,
                            policy_kwargs={"net_arch": [32]}, device="cpu")
        start = {k: v.clone() for k, v in model.policy.state_dict().items()}
        quiet(model).learn(total_timesteps=2048)
        env = EpisodeSummaries(make(stall_iterations=1000))  # a looping policy stops after 1,000 iterations
        returns, lengths = evaluate_policy(model, env, n_eval_episodes=1, use_masking=True, warn=False,
                                           return_episode_rewards=True)
        venv.close()
    finally:
        torch.set_num_threads(threads)
    assert model.num_timesteps == 2048  # four rollouts of 2 envs x 256 steps
    assert any(not torch.equal(start[k], v) for k, v in model.policy.state_dict().items())
    # the masked evaluation's return is the latency reward's total: minus 0.01 x the request-seconds
    # in the system. (This short training does not learn to serve: its deterministic policy can
    # loop, launching and preempting, until the loop detector ends the episode; the sum holds.)
    (summary,) = env.summaries
    assert summary["n_arrived"] == 40 and summary["n_rejected"] == 0 and lengths[0] > 0
    assert returns[0] == pytest.approx(-0.01 * summary["in_system_s"], rel=1e-6)
    if summary["n_completed"] == 40:
        assert summary["in_system_s"] == pytest.approx(summary["total_latency_s"])


@pytest.mark.parametrize("mode", ["select", "meta"])
def test_plain_ppo_with_defaults_runs_and_logs_episode_returns(mode):
    # unmasked PPO: invalid actions are no-ops; SB3 wraps the single env in its Monitor, whose
    # info["episode"] feeds the ep_info_buffer (rollout/ep_rew_mean in TensorBoard)
    from stable_baselines3 import PPO

    env = EpisodeSummaries(gym.make(ENV_ID, scenario="jaillet-low", action_mode=mode, K=8, reward={"latency": 0.01},
                                    overrides={"workload.n_requests": 20}))
    model = PPO("MultiInputPolicy", env, n_steps=128, batch_size=64, n_epochs=1, seed=0,
                policy_kwargs={"net_arch": [16]}, device="cpu")
    quiet(model).learn(total_timesteps=512)
    assert len(model.ep_info_buffer) == len(env.summaries) > 0
    ep, summary = model.ep_info_buffer[-1], env.summaries[-1]
    # the logged return is the episode's latency reward: minus 0.01 x the request-seconds in the
    # system (Monitor rounds it to 6 digits)
    assert summary["n_arrived"] == 20 and summary["n_rejected"] == 0 and ep["l"] > 0
    assert ep["r"] == pytest.approx(-0.01 * summary["in_system_s"], abs=2e-6)


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
