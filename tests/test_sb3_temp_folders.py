"""No litter in the temp dir: SB3 makes an empty ``SB3-<date>`` folder there at every ``learn``
that has neither ``tensorboard_log`` nor a logger of its own. ``llmsched train`` logs into its run
folder (``tb/``), and the tests that call ``learn`` directly give the model a logger that writes
nothing (``conftest.quiet``)."""

from __future__ import annotations

import tempfile

import pytest
from conftest import quiet

pytest.importorskip("sb3_contrib")

SMALL = {"workload.n_requests": 30}


def _sb3_folders(tmp) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith("SB3-"))


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """``tempfile.gettempdir()`` (where SB3 puts its folders) redirected to an empty folder."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    return tmp


def _ppo(env_kwargs):
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents.envs import make_env

    venv = DummyVecEnv([lambda: make_env("jaillet-low", env_kwargs, SMALL)])
    return PPO("MultiInputPolicy", venv, n_steps=32, batch_size=32, n_epochs=1, seed=0, device="cpu",
               policy_kwargs={"net_arch": [8]})


def test_a_bare_learn_litters_the_temp_dir_and_a_quiet_one_does_not(temp_dir):
    """The control (SB3's own behaviour, so that the redirection is known to catch the folder)
    and the helper the tests use."""
    kw = {"K": 4, "action_mode": "priority"}
    quiet(_ppo(kw)).learn(32)
    assert _sb3_folders(temp_dir) == []
    _ppo(kw).learn(32)
    assert len(_sb3_folders(temp_dir)) == 1


@pytest.mark.parametrize("bc_from", ["none", "fcfs"])
def test_llmsched_train_logs_into_its_run_folder_only(temp_dir, tmp_path, bc_from):
    """A short ``llmsched train`` (with and without behaviour cloning first), and a resume of it:
    TensorBoard events under the run folder's ``tb/``, no SB3 folder in the temp dir."""
    from agents.train import TrainConfig, train

    cfg = TrainConfig(scenario="jaillet-low", name="tiny", out=str(tmp_path / "runs"), timesteps=64, n_envs=2,
                      overrides=SMALL, env_kwargs={"K": 4, "action_mode": "priority"},
                      hyperparams={"n_steps": 32, "batch_size": 32, "n_epochs": 1}, bc_from=bc_from,
                      bc_episodes=1, bc_epochs=1, score_every=0, progress=False)
    train(cfg)
    train(TrainConfig(**{**cfg.__dict__, "name": "tiny-resumed", "resume": str(tmp_path / "runs" / "tiny"),
                         "timesteps": 128}))
    for name in ("tiny", "tiny-resumed"):
        assert list((tmp_path / "runs" / name / "tb").rglob("events.out.tfevents.*")), name
    assert _sb3_folders(temp_dir) == []
