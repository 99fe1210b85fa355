"""The per-slot score head (agents/heads.py): the start is the action bias, the head is equivariant,
and agents with it save and load."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import VecNormalize

from agents.features import QueueSetExtractor
from agents.heads import slot_score_head
from agents.train import set_action_bias
from agents.vec import NativeVecEnv

ENV = {"action_mode": "priority", "order": "arrival", "K": 8, "budget": 128, "admission": "current",
       "overrides": {"workload.n_requests": 40}}


def _model(slot_out: int = 1, pi: list[int] | None = None) -> tuple[PPO, dict]:
    venv = VecNormalize(NativeVecEnv("jaillet-low", ENV, 2), norm_obs_keys=["running", "globals"])
    model = PPO("MultiInputPolicy", venv, device="cpu", seed=0, n_steps=64, batch_size=64,
                policy_kwargs={"features_extractor_class": QueueSetExtractor,
                               "features_extractor_kwargs": {"slot_out": slot_out},
                               "net_arch": {"pi": pi or [], "vf": [16]}})
    return model, venv.reset()


def _mean(model: PPO, obs: dict) -> np.ndarray:
    with torch.no_grad():
        return model.policy.get_distribution(model.policy.obs_to_tensor(obs)[0]).distribution.mean.numpy()


def test_the_start_is_exactly_the_action_bias():
    model, obs = _model()
    ramp = [0.9 - 0.1 * i for i in range(8)]
    set_action_bias(model, ramp)
    slot_score_head(model)
    np.testing.assert_allclose(_mean(model, obs), [ramp, ramp], atol=1e-6)


def test_one_function_scores_every_slot_whatever_its_position():
    model, obs = _model()
    set_action_bias(model, 0.0)
    slot_score_head(model)
    with torch.no_grad():  # a learned projection: the score now depends on the slot's features
        model.policy.features_extractor.slot_score.weight.normal_(generator=torch.Generator().manual_seed(1))
    rng = np.random.default_rng(0)
    q = rng.random((2, 8, obs["queue"].shape[1] // 8)).astype(np.float32)
    perm = rng.permutation(8)
    a = {**obs, "queue": q.reshape(2, -1)}
    b = {**obs, "queue": q[:, perm].reshape(2, -1)}
    ma, mb = _mean(model, a), _mean(model, b)
    np.testing.assert_allclose(ma[:, perm], mb, atol=1e-5)  # permuting the slots permutes the scores
    assert np.ptp(ma[0]) > 0.01  # and they differ between requests


@pytest.mark.parametrize("slot_out, pi, why", [(4, None, "slot_out: 1"), (1, [16], "net_arch")])
def test_a_model_the_head_does_not_fit_is_a_one_line_error(slot_out, pi, why):
    model, _ = _model(slot_out, pi)
    with pytest.raises(ValueError, match=why):
        slot_score_head(model)


def test_an_agent_with_the_head_saves_and_loads(tmp_path):
    from agents.agent import load_agent
    from agents.storage import save_agent

    model, obs = _model()
    set_action_bias(model, 0.0)
    slot_score_head(model)
    with torch.no_grad():
        model.policy.features_extractor.slot_score.weight.fill_(0.3)
    save_agent(tmp_path / "model", model, model.get_env(), {"scenario": "jaillet-low", "env_kwargs": ENV})
    again = load_agent(tmp_path)
    np.testing.assert_allclose(_mean(again.model, obs), _mean(model, obs), atol=1e-6)
