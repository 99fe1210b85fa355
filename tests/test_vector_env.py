"""The native vector env (``llmsched_gym.env.vector``) and its SB3 adapter (``agents.vec``).

Everything is checked against the single env: the same seeds and actions give the same
observations, rewards, terminations, truncations, masks and infos, bit for bit, across
automatic resets in both autoreset modes; and PPO trained on the adapter is the same computation
as PPO trained on ``DummyVecEnv`` (identical weights after learning).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from conftest import quiet
from hypothesis import given
from hypothesis import strategies as st

import llmsched_gym  # noqa: F401  (registers the ids)
from llmsched_gym.config import ConfigError
from llmsched_gym.env import ENV_ID
from llmsched_gym.env.bench import random_masked_action
from llmsched_gym.env.llmsched_env import LLMSchedEnv
from llmsched_gym.env.modes import rank_scores
from llmsched_gym.env.vector import LLMSchedVectorEnv

SMALL = {"workload.n_requests": 12}
MODES = [
    ("select", {}),
    ("priority", {"budget": 64}),
    ("subset", {"admission": "current"}),
    ("knob", {}),
    ("meta", {}),
    ("tune", {}),
    ("select", {"flat": True, "admission": "future", "order": "shortest"}),
]


def _obs_row(obs, i):
    return obs[i] if isinstance(obs, np.ndarray) else {k: v[i] for k, v in obs.items()}


def _assert_obs_equal(got, want):
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    else:
        assert set(got) == set(want)
        for k in want:
            assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k


def _actions(refs, rng):
    """One random action per reference env (valid by its mask, one in ten from the whole space)."""
    out = []
    for env in refs:
        a = env.action_space.sample() if rng.random() < 0.1 else random_masked_action(env, rng)
        out.append(a)
    return out


def _stack(actions):
    return np.stack([np.asarray(a) for a in actions])


@pytest.mark.parametrize("mode,kw", MODES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(MODES)])
def test_next_step_autoreset_equals_single_envs_bit_for_bit(mode, kw):
    n = 3
    vec = LLMSchedVectorEnv(n, "jaillet-high", action_mode=mode, K=6, overrides=SMALL, **kw)
    refs = [LLMSchedEnv("jaillet-high", action_mode=mode, K=6, overrides=SMALL, **kw) for _ in range(n)]
    for env in refs:
        env.action_space.seed(7)
    obs, infos = vec.reset(seed=40)
    ref_obs = [env.reset(seed=40 + i) for i, env in enumerate(refs)]
    for i in range(n):
        _assert_obs_equal(_obs_row(obs, i), ref_obs[i][0])
        assert np.array_equal(infos["action_mask"][i], ref_obs[i][1]["action_mask"])
    rng = np.random.default_rng(3)
    done = [False] * n
    episodes = 0
    for _ in range(400):
        actions = _actions(refs, rng)
        obs, rew, term, trunc, infos = vec.step(_stack(actions))
        masks = vec.action_masks()
        for i, env in enumerate(refs):
            if done[i]:  # NEXT_STEP: this step resets, reward 0, the action is ignored
                o, info = env.reset()
                r, te, tr = 0.0, False, False
                episodes += 1
            else:
                o, r, te, tr, info = env.step(actions[i])
            done[i] = te or tr
            _assert_obs_equal(_obs_row(obs, i), o)
            assert (rew[i], term[i], trunc[i]) == (r, te, tr)
            assert np.array_equal(masks[i], env.action_masks())
            assert np.array_equal(infos["action_mask"][i], info["action_mask"])
            assert infos["invalid_actions"][i] == info["invalid_actions"]
            assert infos["clock_s"][i] == info["clock_s"]
            for k, v in info["reward_components"].items():
                assert infos["reward_components"][k][i] == v
            if "summary" in info:
                assert infos["_summary"][i] and infos["episode_stats"][i] == info["episode_stats"] \
                    | {"t": infos["episode_stats"][i]["t"]}
                assert infos["summary"][i]["serving"] == info["summary"]["serving"]
            else:
                assert "_summary" not in infos or not infos["_summary"][i]
    assert episodes >= 3  # the automatic resets were exercised


def test_same_step_autoreset_returns_the_next_episode_and_the_final_observation():
    n = 2
    vec = LLMSchedVectorEnv(n, "jaillet-high", action_mode="priority", K=4, overrides=SMALL,
                            autoreset_mode="SameStep", episode_seeds=lambda i, j: 100 * i + j)
    refs = [LLMSchedEnv("jaillet-high", action_mode="priority", K=4, overrides=SMALL) for _ in range(n)]
    episode = [0] * n
    obs, _ = vec.reset(seed=5)  # episode_seeds decide, the first reset included
    for i, env in enumerate(refs):
        _assert_obs_equal(_obs_row(obs, i), env.reset(seed=100 * i)[0])
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(300):
        actions = [rng.uniform(-1, 1, 4).astype(np.float32) for _ in range(n)]
        obs, rew, term, trunc, infos = vec.step(_stack(actions))
        for i, env in enumerate(refs):
            o, r, te, tr, info = env.step(actions[i])
            assert (rew[i], term[i], trunc[i]) == (r, te, tr)
            if te or tr:
                ends += 1
                assert infos["_final_obs"][i]
                _assert_obs_equal(infos["final_obs"][i], o)
                assert infos["final_info"][i]["episode_stats"]["r"] == info["episode_stats"]["r"]
                episode[i] += 1
                o, _ = env.reset(seed=100 * i + episode[i])
            else:
                assert "_final_obs" not in infos or not infos["_final_obs"][i]
            _assert_obs_equal(_obs_row(obs, i), o)
    assert ends >= 2


def test_step_limit_truncates_like_time_limit():
    vec = LLMSchedVectorEnv(2, "jaillet-high", K=4, overrides=SMALL, max_episode_steps=5)
    ref = gym.make(f"llmsched_gym:{ENV_ID}", scenario="jaillet-high", K=4, overrides=SMALL, max_episode_steps=5)
    vec.reset(seed=0)
    ref.reset(seed=0)
    launch = 4  # K: the first launch action
    for _ in range(5):
        _, rew, term, trunc, _ = vec.step(np.array([launch, launch]))
        _, r, te, tr, _ = ref.step(launch)
        assert (rew[0], term[0], trunc[0]) == (r, te, tr)
    assert trunc.all() and not term.any()


def test_make_vec_returns_the_native_vector_env_and_bad_arguments_are_one_line_errors():
    v = gym.make_vec(f"llmsched_gym:{ENV_ID}", num_envs=2, vectorization_mode="vector_entry_point",
                     scenario="jaillet-high", K=4, overrides=SMALL)
    assert isinstance(v.unwrapped, LLMSchedVectorEnv) and v.num_envs == 2
    assert v.max_episode_steps == 1_000_000
    obs, infos = v.reset(seed=1)
    assert obs["queue"].shape == (2, v.single_observation_space["queue"].shape[0])
    assert v.observation_space.contains(obs)
    assert infos["action_mask"].shape == (2, 4 + 8 + 2)
    assert v.call("action_masks")[1].dtype == bool
    assert v.get_attr("K") == (4, 4)
    v.close()
    with pytest.raises(ConfigError, match="num_envs"):
        LLMSchedVectorEnv(0, "jaillet-high")
    with pytest.raises(ConfigError, match="autoreset_mode"):
        LLMSchedVectorEnv(1, "jaillet-high", autoreset_mode="Disabled")
    with pytest.raises(ConfigError, match="action_mode"):
        LLMSchedVectorEnv(1, "jaillet-high", action_mode="nope")
    with pytest.raises(ConfigError, match="seed"):
        LLMSchedVectorEnv(2, "jaillet-high").reset(seed=[1])


# ----------------------------------------------------------------------------------------------
# the SB3 adapter
sb3 = pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")


def _dummy(scenario, env_kwargs, n, base):
    from agents.train import training_venv

    return training_venv("dummy", scenario, env_kwargs, n, base)


def _native(scenario, env_kwargs, n, base):
    from agents.train import training_venv

    return training_venv("native", scenario, env_kwargs, n, base)


def test_sb3_adapter_steps_like_dummy_vec_env_over_training_workloads():
    kw = {"action_mode": "select", "K": 6, "overrides": SMALL}
    a, b = _dummy("jaillet-high", kw, 3, 1000), _native("jaillet-high", kw, 3, 1000)
    oa, ob = a.reset(), b.reset()
    _assert_obs_equal(ob, oa)
    rng = np.random.default_rng(1)
    ends = 0
    for _ in range(300):
        ma, mb = np.stack(a.env_method("action_masks")), np.stack(b.env_method("action_masks"))
        assert np.array_equal(ma, mb)
        acts = np.array([rng.choice(np.flatnonzero(m)) for m in ma])
        oa, ra, da, ia = a.step(acts)
        ob, rb, db, ib = b.step(acts)
        _assert_obs_equal(ob, oa)
        assert ra.dtype == rb.dtype == np.float32 and np.array_equal(ra, rb) and np.array_equal(da, db)
        for i in np.flatnonzero(da):
            ends += 1
            _assert_obs_equal(ib[i]["terminal_observation"], ia[i]["terminal_observation"])
            assert ib[i]["TimeLimit.truncated"] == ia[i]["TimeLimit.truncated"]
            assert ib[i]["episode"]["r"] == ia[i]["episode"]["r"] and ib[i]["episode"]["l"] == ia[i]["episode"]["l"]
            assert ib[i]["summary"]["serving"] == ia[i]["summary"]["serving"]
    assert ends >= 3
    # the training workloads: episode j of env r has seed 1000 + r + 3 j
    assert [e.unwrapped.episode_seed for e in b.venv.envs] == [e.unwrapped.episode_seed for e in a.envs]


def _ppo_params(vec, algo, mode):
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)
    kw = {"action_mode": mode, "K": 4, "overrides": SMALL}
    venv = VecNormalize(_native("jaillet-high", kw, 2, 1000) if vec == "native" else _dummy("jaillet-high", kw, 2, 1000),
                        norm_obs_keys=["running", "globals"], gamma=0.99)
    cls = MaskablePPO if algo == "maskable" else PPO
    model = cls("MultiInputPolicy", venv, n_steps=64, batch_size=32, n_epochs=2, seed=0, device="cpu",
                policy_kwargs={"net_arch": [16]})
    quiet(model).learn(256)
    return [p.detach().clone() for p in model.policy.parameters()], model


@pytest.mark.parametrize("algo,mode", [("maskable", "select"), ("ppo", "priority")])
def test_training_on_the_adapter_is_the_same_computation_as_on_dummy_vec_env(algo, mode):
    import torch

    pa, _ = _ppo_params("dummy", algo, mode)
    pb, model = _ppo_params("native", algo, mode)
    assert model.num_timesteps == 256
    assert len(model.ep_info_buffer) > 0  # the episodes' Monitor statistics reached SB3
    assert all(torch.equal(x, y) for x, y in zip(pa, pb, strict=True))


def test_sb3_adapter_env_method_and_attributes():
    v = _native("jaillet-high", {"action_mode": "subset", "K": 4, "overrides": SMALL}, 2, 0)
    v.reset()
    masks = v.env_method("action_masks")
    assert len(masks) == 2 and masks[0].shape == (8,)
    assert len(v.env_method("action_masks", indices=[1])) == 1
    assert v.get_attr("mode") == ["subset", "subset"]
    assert v.env_is_wrapped(gym.Wrapper) == [False, False]
    assert v.env_method("fallback_action")[0].tolist() == [0, 0, 0, 0]
    v.close()


def test_train_uses_the_native_vec_env_by_default_and_refuses_an_unknown_one(tmp_path):
    from agents.train import TrainConfig, train

    cfg = TrainConfig(scenario="jaillet-high", out=str(tmp_path), name="nat", timesteps=128, score_every=0,
                      progress=False, overrides=SMALL, hyperparams={"n_steps": 64, "batch_size": 32, "n_epochs": 1},
                      env_kwargs={"K": 4})
    meta = train(cfg)
    assert meta["vec"] == "native" and meta["timesteps"] == 128 and meta["episodes"] >= 1
    with pytest.raises(ConfigError, match="vec"):
        train(TrainConfig(scenario="jaillet-high", out=str(tmp_path), name="bad", vec="ray", timesteps=64))


def test_env_and_vector_env_agree_on_a_reset_that_ends_the_episode():
    # no request at all: the episode ends during reset; the first step reports it
    vec = LLMSchedVectorEnv(2, "jaillet-high", overrides={"workload.n_requests": 0})
    ref = LLMSchedEnv("jaillet-high", overrides={"workload.n_requests": 0})
    _, infos = vec.reset(seed=0)
    _, info = ref.reset(seed=0)
    assert infos["_summary"].all() and "summary" in info
    _, rew, term, trunc, _ = vec.step(np.array([32, 32]))
    _, r, te, tr, _ = ref.step(32)
    assert (rew[0], term[0], trunc[0]) == (r, te, tr)


def test_bench_train_reports_every_variant_of_each_mode():
    from llmsched_gym.bench import bench_train

    rep = bench_train("jaillet-high", modes=("priority",), timesteps=64, n_envs=4, base_envs=2,
                      hyperparams={"n_steps": 32, "batch_size": 32, "n_epochs": 1},
                      overrides={"workload.n_requests": 12})
    assert set(rep["runs"]) == {"priority"}
    for by_vec in rep["runs"].values():
        assert list(by_vec) == ["dummy", "native", "native x4"]
        assert [r["n_envs"] for r in by_vec.values()] == [2, 2, 4]
        # the x4 run keeps the rollout size: 2 envs x 32 steps = 4 envs x 16 steps
        assert [r["n_steps"] for r in by_vec.values()] == [32, 32, 16]
        for r in by_vec.values():
            assert r["steps"] == 64 and r["steps_per_cpu_s"] == pytest.approx(64 / r["learn_cpu_s"])
            assert 0 < r["learn_wall_s"] < r["process_wall_s"] and r["startup_wall_s"] > 0
            # the whole process's CPU time covers learn's (imports, set-up and exit come on top)
            assert r["process_cpu_s"] > r["learn_cpu_s"]
            assert r["steps_per_cpu_s_incl_startup"] == pytest.approx(64 / r["process_cpu_s"])
            assert r["workload"].startswith("jaillet-high")  # what the run trained on (a stand-in would say so)


def _ranked_like_the_env(row: np.ndarray, n: int) -> list[int] | None:
    """What ``PriorityMode.step`` admits from scores ``row`` with ``n`` slots shown (None: invalid)."""
    a = row.astype(np.float64)
    if not np.abs(a).max(initial=0.0) <= 1.0:
        return None
    s = a[:n]
    return np.argsort(-s, kind="stable")[: np.count_nonzero(s >= 0.0)].tolist()


@given(st.integers(1, 9), st.integers(1, 12), st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]))
def test_rank_scores_ranks_every_row_like_the_priority_step(n_envs, k, seed, dtype):
    rng = np.random.default_rng(seed)
    # coarse values: ties (ranked by slot), zeros of both signs, and rows out of range or NaN
    a = (rng.integers(-4, 5, (n_envs, k)) / 4.0).astype(dtype)
    a[rng.random((n_envs, k)) < 0.1] *= -0.0
    bad = rng.random(n_envs)
    a[bad < 0.15, 0] = np.nan
    a[(bad >= 0.15) & (bad < 0.3), -1] = 1.5
    shown = rng.integers(0, k + 1, n_envs).tolist()
    got = rank_scores(a, shown)
    assert got == [_ranked_like_the_env(a[i], shown[i]) for i in range(n_envs)]


def test_rank_scores_leaves_what_is_not_a_float_batch_to_the_envs():
    assert rank_scores(np.zeros((2, 3), np.int64), [3, 3]) == [None, None]
    assert rank_scores([[0.5, 0.2], [0.1, 0.0]], [2, 2]) == [None, None]
    assert rank_scores(np.zeros((3, 2), np.float32), [2, 2]) == [None, None]  # not one row per env
    assert rank_scores(np.zeros((2, 3), np.float32), [2, 2], k=2) == [None, None]  # rows of another width


def test_priority_vector_env_counts_invalid_rows_like_the_single_env():
    n, k = 3, 5
    vec = LLMSchedVectorEnv(n, "jaillet-high", action_mode="priority", K=k, overrides=SMALL, budget=64)
    refs = [LLMSchedEnv("jaillet-high", action_mode="priority", K=k, overrides=SMALL, budget=64) for _ in range(n)]
    obs, _ = vec.reset(seed=11)
    for i, env in enumerate(refs):
        env.reset(seed=11 + i)
    rng = np.random.default_rng(5)
    done = [False] * n
    invalid = 0
    for _ in range(300):
        a = rng.uniform(-1, 1, (n, k)).astype(np.float32)
        a[rng.random(n) < 0.1, 0] = np.nan
        a[rng.random(n) < 0.1, 1] = -1.25
        obs, rew, term, trunc, infos = vec.step(a)
        for i, env in enumerate(refs):
            if done[i]:
                o, _ = env.reset()
                r, te, tr, info = 0.0, False, False, None
            else:
                o, r, te, tr, info = env.step(a[i])
            done[i] = te or tr
            _assert_obs_equal(_obs_row(obs, i), o)
            assert (rew[i], term[i], trunc[i]) == (r, te, tr)
            if info is not None:
                assert infos["invalid_actions"][i] == info["invalid_actions"]
                invalid = max(invalid, info["invalid_actions"])
    assert invalid > 0
