"""agents.optim.Adam: torch's Adam bit for bit, without importing ``torch._dynamo``."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import quiet

torch = pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")

from agents.optim import Adam  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _net() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def _steps(net: torch.nn.Module, opt: torch.optim.Optimizer, n: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(32, 6, generator=g)
        opt.zero_grad()
        net(x).pow(2).mean().backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        opt.step()


@pytest.mark.parametrize("kw", [{"lr": 3e-4, "eps": 1e-5}, {"lr": 1e-2, "weight_decay": 0.1, "amsgrad": True},
                                {"lr": 1e-3, "maximize": True, "betas": (0.8, 0.9)}])
def test_adam_equals_torch_adam_bit_for_bit_and_round_trips_its_state(kw):
    ours, theirs = _net(), _net()
    a, b = Adam(ours.parameters(), **kw), torch.optim.Adam(theirs.parameters(), **kw)
    _steps(ours, a, 25)
    _steps(theirs, b, 25)
    for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for i, st in sb["state"].items():
        assert set(st) == set(sa["state"][i])
        assert all(torch.equal(st[k], sa["state"][i][k]) for k in st)
    # torch's state loaded into ours (what --resume does with an older file) continues identically
    c = Adam(ours.parameters(), **kw)
    c.load_state_dict(copy.deepcopy(sb))  # (a state_dict shares the live tensors)
    _steps(ours, c, 5, seed=1)
    _steps(theirs, b, 5, seed=1)
    assert all(torch.equal(p, q) for p, q in zip(ours.parameters(), theirs.parameters(), strict=True))
    assert torch.is_grad_enabled()  # step() restores the grad mode it found


def test_ppo_learns_the_same_weights_with_either_adam_at_sb3s_settings():
    """SB3 gives its default Adam ``eps=1e-5``; :func:`with_optimizer` gives ours the same."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from agents.envs import make_env
    from agents.storage import with_optimizer

    def learn(opt_cls):
        venv = DummyVecEnv([lambda: make_env("jaillet-low", {"K": 4, "action_mode": "priority"},
                                             {"workload.n_requests": 40})])
        model = PPO("MultiInputPolicy", venv, n_steps=64, batch_size=32, n_epochs=2, seed=5, device="cpu",
                    policy_kwargs=with_optimizer({"net_arch": [16]}) if opt_cls is Adam else {"net_arch": [16]})
        assert type(model.policy.optimizer) is opt_cls
        quiet(model).learn(128)
        return model.policy.state_dict()

    ours, theirs = learn(Adam), learn(torch.optim.Adam)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_training_saving_and_loading_an_agent_never_import_torch_dynamo(tmp_path):
    """The point of the class: ``torch._dynamo`` costs about 0.7 s of every process's start-up.
    The agent files do not name the optimizer (the format is unchanged) and load with it."""
    code = (
        "import sys, json\n"
        "from agents.train import TrainConfig, train\n"
        "from agents.agent import load_agent\n"
        f"cfg = TrainConfig(scenario='jaillet-low', name='t', out={str(tmp_path)!r}, timesteps=256, n_envs=2,\n"
        "    overrides={'workload.n_requests': 40}, env_kwargs={'K': 4}, hyperparams={'n_steps': 64, 'batch_size': 64,\n"
        "    'n_epochs': 1}, bc_from='fcfs', bc_episodes=1, bc_epochs=1, score_every=0, progress=False)\n"
        "train(cfg)\n"
        f"agent = load_agent({str(tmp_path / 't')!r})\n"
        "print(json.dumps({'dynamo': 'torch._dynamo' in sys.modules,\n"
        "                  'optimizer': type(agent.model.policy.optimizer).__module__}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True, cwd=ROOT)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == {"dynamo": False, "optimizer": "agents.optim"}
    saved = json.loads((tmp_path / "t" / "model.json").read_text())
    assert "optimizer_class" not in saved["policy_kwargs"]


@pytest.mark.parametrize(("mode", "checked"), [("subset", False), ("priority", True)])
def test_masked_heads_learn_without_distribution_checks_and_restore_them(tmp_path, monkeypatch, mode, checked):
    """The masked (categorical) heads learn with torch.distributions' argument checks off (the same
    values, a fifth less CPU in subset mode); the Gaussian heads keep them; either way the
    setting is restored after learning."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3 import PPO

    from agents.train import TrainConfig, train

    seen = []
    for cls in (MaskablePPO, PPO):
        orig = cls.learn

        def learn(self, *a, _orig=orig, **k):
            seen.append(torch.distributions.Distribution._validate_args)
            return _orig(self, *a, **k)

        monkeypatch.setattr(cls, "learn", learn)
    before = torch.distributions.Distribution._validate_args
    cfg = TrainConfig(scenario="jaillet-low", name=mode, out=str(tmp_path), timesteps=64, n_envs=2,
                      overrides={"workload.n_requests": 30}, env_kwargs={"K": 4, "action_mode": mode},
                      hyperparams={"n_steps": 32, "batch_size": 32, "n_epochs": 1}, bc_from="none",
                      score_every=0, progress=False)
    train(cfg)
    assert seen == [checked and before]
    assert torch.distributions.Distribution._validate_args is before
