"""LLMSched-v1 under Gymnasium's standard wrappers and vector envs, as CleanRL-style code uses it.

The env keeps its episode statistics under ``info["episode_stats"]`` and leaves ``info["episode"]``
to ``RecordEpisodeStatistics`` (which refuses to overwrite it) and SB3's ``Monitor``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import llmsched_gym  # noqa: F401  (registers the ids)

ENV_ID = "llmsched_gym:LLMSched-v1"
SMALL = {"scenario": "jaillet-high", "K": 8, "overrides": {"workload.n_requests": 12}}


def _first_valid(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def test_record_episode_statistics_matches_the_envs_own_statistics():
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(ENV_ID, **SMALL))
    obs, info = env.reset(seed=3)
    total, steps = 0.0, 0
    while True:
        obs, reward, term, trunc, info = env.step(_first_valid(info["action_mask"]))
        total += reward
        steps += 1
        if term or trunc:
            break
    assert term and not trunc
    ours, theirs = info["episode_stats"], info["episode"]
    assert theirs["l"] == ours["l"] == steps
    assert theirs["r"] == pytest.approx(ours["r"], rel=1e-12) and ours["r"] == pytest.approx(total, rel=1e-12)
    # the return is minus the request-seconds: the summary's total latency
    assert ours["r"] == pytest.approx(-info["summary"]["e2e_s"]["mean"] * info["summary"]["n_completed"], rel=1e-9)
    assert list(env.return_queue) == [theirs["r"]]


def test_time_limit_truncates_and_the_wrapper_records_the_cut_episode():
    env = gym.wrappers.RecordEpisodeStatistics(gym.make(ENV_ID, max_episode_steps=5, **SMALL))
    _, info = env.reset(seed=0)
    for i in range(5):
        _, _, term, trunc, info = env.step(_first_valid(info["action_mask"]))
        assert term is False and trunc == (i == 4)
    assert info["episode"]["l"] == 5
    assert "episode_stats" not in info  # the env itself has not ended


def test_masks_are_reachable_through_gym_make_wrappers():
    env = gym.make(ENV_ID, **SMALL)
    _, info = env.reset(seed=1)
    with pytest.raises(AttributeError):
        env.action_masks()  # TimeLimit has no such attribute: reach the env as below
    via_unwrapped = env.unwrapped.action_masks()
    via_wrapper_attr = env.get_wrapper_attr("action_masks")()
    assert via_unwrapped.dtype == bool and via_unwrapped.shape == (env.action_space.n,)
    np.testing.assert_array_equal(via_unwrapped, via_wrapper_attr)
    np.testing.assert_array_equal(via_unwrapped, info["action_mask"].astype(bool))


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cleanrl_style_loop_with_vector_statistics_and_masks(mode):
    """CleanRL's pattern: ``gym.make_vec`` (or SyncVectorEnv of thunks) + RecordEpisodeStatistics,
    masked random actions from ``infos["action_mask"]``, episodes read from ``infos["episode"]``."""
    n = 3
    envs = gym.make_vec(ENV_ID, num_envs=n, vectorization_mode=mode, **SMALL)
    envs = gym.wrappers.vector.RecordEpisodeStatistics(envs)
    rng = np.random.default_rng(0)
    obs, infos = envs.reset(seed=list(range(n)))
    returns = np.zeros(n)
    lengths = np.zeros(n, int)
    prev_done = np.zeros(n, bool)
    finished: list[tuple[float, int, float, int]] = []
    for _ in range(300):
        masks = infos["action_mask"].astype(bool)
        assert masks.shape == (n, envs.single_action_space.n) and masks.any(axis=1).all()
        np.testing.assert_array_equal(np.stack(envs.unwrapped.call("action_masks")), masks)
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in masks])
        obs, rewards, term, trunc, infos = envs.step(actions)
        assert obs in envs.observation_space
        # next-step autoreset: the step after an episode's end only resets that env
        returns[~prev_done] += rewards[~prev_done]
        lengths[~prev_done] += 1
        done = term | trunc
        if done.any():
            ep, own = infos["episode"], infos["episode_stats"]
            for i in np.flatnonzero(done):
                assert infos["_episode"][i] and infos["_episode_stats"][i]
                finished.append((float(ep["r"][i]), int(ep["l"][i]), float(own["r"][i]), int(own["l"][i])))
                assert ep["r"][i] == pytest.approx(returns[i], rel=1e-9) and ep["l"][i] == lengths[i]
        returns[prev_done] = 0.0
        lengths[prev_done] = 0
        prev_done = done
    envs.close()
    assert len(finished) >= n  # every env finished at least one episode of 12 requests in 300 steps
    for r, length, own_r, own_l in finished:
        assert length == own_l and r == pytest.approx(own_r, rel=1e-9) and r < 0


def test_sb3_monitor_and_make_vec_env_log_episode_returns():
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("sb3_contrib")
    from sb3_contrib.common.maskable.utils import get_action_masks
    from stable_baselines3.common.env_util import make_vec_env

    venv = make_vec_env(ENV_ID, n_envs=2, seed=0, env_kwargs=SMALL)
    venv.reset()
    seen = []
    for _ in range(200):
        masks = get_action_masks(venv)
        _, _, dones, infos = venv.step(np.array([_first_valid(m) for m in masks]))
        for done, info in zip(dones, infos, strict=True):
            if done:
                assert info["episode"]["l"] == info["episode_stats"]["l"]
                assert info["episode"]["r"] == pytest.approx(info["episode_stats"]["r"], abs=1e-5)
                seen.append(info["episode"]["r"])
    venv.close()
    assert len(seen) >= 2


def test_the_vector_loop_example_runs_and_reports_episode_returns(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "vector_loop.py"
    spec = importlib.util.spec_from_file_location("vector_loop", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--num-envs", "2", "--steps", "300", "--set", "workload.n_requests=20"]) == 0
    lines = capsys.readouterr().out.splitlines()
    finished = [x for x in lines if "finished an episode" in x]
    assert len(finished) >= 2 and lines[-1].startswith(f"{len(finished)} episodes; mean return -")
    # the return is minus the request-seconds: 20 requests x the mean E2E
    ret, e2e = (float(finished[0].split("return ")[1].split(",")[0]),
                float(finished[0].split("mean E2E ")[1].split(" s")[0]))
    assert ret == pytest.approx(-20 * e2e, rel=0.02)
    assert module.main(["--set", "engine.block_size=0"]) == 2
