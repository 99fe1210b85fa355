"""Agent files load without running code (``agents/storage.py``).

* A crafted ``vecnormalize.pkl`` and a crafted SB3 ``model.zip`` (each creating a marker file when
  unpickled) in an agent folder: ``llmsched evaluate --model DIR`` creates no marker, whether the
  folder also holds a genuine agent (it is evaluated) or not (one-line error naming
  ``--trust-model``). With ``--trust-model`` the zip is unpickled (the marker appears: the crafted
  files are real exploits) after a one-line warning.
* Saving and loading round-trip the weights, the normalisation and the actions exactly.
* Malformed agent files are one-line errors naming the file and what is wrong.
"""

from __future__ import annotations

import base64
import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sb3_contrib")
pytest.importorskip("safetensors")

from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize  # noqa: E402

from agents.agent import load_agent, make_env  # noqa: E402
from agents.storage import AgentFileError, save_agent  # noqa: E402
from agents.train import _TrainingWorkloads  # noqa: E402
from llmsched_gym.cli import main  # noqa: E402

ENV = {"K": 4, "overrides": {"workload.n_requests": 30}}


class _Marker:
    """Unpickling this creates ``path`` (what an attacker's payload would do, harmlessly)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _craft(folder: Path, marker: Path) -> None:
    """A pickled ``vecnormalize.pkl`` and an SB3 ``model.zip`` whose ``data`` holds a serialized payload."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = base64.b64encode(pickle.dumps(_Marker(marker))).decode()
    for name in ("vecnormalize.pkl", "best_vecnormalize.pkl"):
        (folder / name).write_bytes(pickle.dumps(_Marker(marker)))
    data = {"policy_class": {":type:": "<class 'abc.ABCMeta'>", ":serialized:": payload},
            "observation_space": {":type:": "x", ":serialized:": payload}}
    with zipfile.ZipFile(folder / "model.zip", "w") as z:
        z.writestr("data", json.dumps(data))
        z.writestr("_stable_baselines3_version", "2.3.0")
    (folder / "run.json").write_text(json.dumps({"scenario": "jaillet-low", "algo": "maskable-ppo",
                                                 "env_kwargs": ENV, "timesteps": 0}))


def _genuine(folder: Path) -> tuple:
    """An untrained MaskablePPO with fitted normalisation statistics, saved safely in ``folder``."""
    from sb3_contrib import MaskablePPO

    from agents.features import QueueSetExtractor

    venv = VecNormalize(DummyVecEnv([_TrainingWorkloads("jaillet-low", ENV, 0, 1, 1000)]),
                        norm_obs_keys=["running", "globals"])
    model = MaskablePPO("MultiInputPolicy", venv, n_steps=64, batch_size=32, seed=0, device="cpu",
                        policy_kwargs={"features_extractor_class": QueueSetExtractor,
                                       "features_extractor_kwargs": {"slot_hidden": (8,), "context_hidden": (4,),
                                                                     "slot_out": 2}, "net_arch": [16]})
    obs = venv.reset()
    for _ in range(40):  # some statistics
        obs, *_ = venv.step(np.array([4]))
    save_agent(folder / "model", model, venv, {"scenario": "jaillet-low", "env_kwargs": ENV})
    return model, venv, obs


def _evaluate(folder: Path, out: Path, *extra: str) -> int:
    return main(["evaluate", "--model", str(folder), "--scenario", "jaillet-low", "--policies", "none", "--seeds",
                 "100", "--set", "workload.n_requests=30", "--out", str(out), "--no-plots", "--quiet",
                 # an untrained agent may loop (launch, preempt): the loop detector stops it after 1,000 iterations
                 "--set", "engine.stall_iterations=1000", *extra])


def test_crafted_pickle_and_zip_alone_are_refused_without_running_them(tmp_path, capsys):
    marker = tmp_path / "pwned"
    _craft(tmp_path / "agent", marker)
    assert _evaluate(tmp_path / "agent", tmp_path / "ev") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--trust-model" in err and "model.zip" in err
    assert main(["evaluate", "--model", str(tmp_path / "agent" / "model.zip"), "--policies", "none"]) == 2
    assert main(["evaluate", "--model", str(tmp_path / "agent" / "vecnormalize.pkl"), "--policies", "none"]) == 2
    assert not marker.exists()


def test_crafted_files_beside_a_genuine_agent_are_never_read(tmp_path):
    marker = tmp_path / "pwned"
    _craft(tmp_path / "agent", marker)
    _genuine(tmp_path / "agent")
    assert _evaluate(tmp_path / "agent", tmp_path / "ev") == 0
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    assert [r["policy"] for r in res["runs"]] == ["maskable-ppo select, neutral start, 0 steps"]  # played (untrained: it serves little)
    assert not marker.exists()


def test_trust_model_unpickles_the_zip_after_a_one_line_warning(tmp_path, capsys):
    marker = tmp_path / "pwned"
    _craft(tmp_path / "agent", marker)
    with pytest.raises(Exception):  # noqa: B017 (the crafted zip is no model: what matters is the marker)
        load_agent(tmp_path / "agent", trust_model=True)
    assert marker.exists()
    err = capsys.readouterr().err
    assert err.startswith("warning: --trust-model: loading") and err.count("\n") == 1


def test_save_and_load_round_trip_weights_normalisation_and_actions(tmp_path):
    model, venv, obs = _genuine(tmp_path / "agent")
    agent = load_agent(tmp_path / "agent")
    assert agent.env_kwargs == ENV and agent.scenario == "jaillet-low"
    saved, loaded = model.policy.state_dict(), agent.model.policy.state_dict()
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)
    for key in ("running", "globals"):
        assert np.array_equal(agent.vecnorm.obs_rms[key].mean, venv.obs_rms[key].mean)
        assert np.array_equal(agent.vecnorm.obs_rms[key].var, venv.obs_rms[key].var)
    assert agent.vecnorm.norm_obs_keys == ["running", "globals"] and not agent.vecnorm.training
    env = make_env("jaillet-low", {"K": 4}, {"workload.n_requests": 30})
    o, _ = env.reset(seed=3)
    ref = agent.vecnorm.normalize_obs(o)
    mine = venv.normalize_obs(o)
    assert all(np.array_equal(ref[k], mine[k]) for k in o)
    mask = env.unwrapped.action_masks()
    a, _ = model.predict(mine, action_masks=mask, deterministic=True)
    assert int(agent.act(o, mask)) == int(a)


def test_malformed_agent_files_are_one_line_errors(tmp_path):
    _genuine(tmp_path / "a")
    desc = json.loads((tmp_path / "a" / "model.json").read_text())

    def broken(change) -> str:
        d = json.loads(json.dumps(desc))
        change(d)
        (tmp_path / "a" / "model.json").write_text(json.dumps(d))
        with pytest.raises(AgentFileError) as e:
            load_agent(tmp_path / "a")
        return str(e.value)

    assert "format 'llmsched-agent/1' or 'llmsched-rllib-agent/1' expected" in broken(lambda d: d.pop("format"))
    assert "class 'os.system' is not one of QueueSetExtractor" in broken(
        lambda d: d["policy_kwargs"].update(features_extractor_class={"class": "os.system"}))
    assert "the weights do not match the described policy" in broken(
        lambda d: d["policy_kwargs"].update(net_arch=[17]))
    assert "algo: 'a2c' is not one of maskable-ppo, ppo" in broken(lambda d: d.update(algo="a2c"))
    (tmp_path / "a" / "model.json").write_text("{not json")
    with pytest.raises(AgentFileError, match=r"model\.json is not valid JSON"):
        load_agent(tmp_path / "a")
    (tmp_path / "a" / "model.json").write_text(json.dumps(desc))
    (tmp_path / "a" / "model.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(AgentFileError, match=r"model\.safetensors is not a valid safetensors file"):
        load_agent(tmp_path / "a")
    with pytest.raises(AgentFileError, match="no model.json or best_model.json"):
        load_agent(tmp_path)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["policy_kwargs"].update(net_arch=[1_000_000_000]),
     "model: policy_kwargs.net_arch[0]: a layer of 1,000,000,000 units"),
    (lambda d: d["policy_kwargs"].update(net_arch=[8] * 17), "model: policy_kwargs.net_arch: 17 layers; at most 16"),
    (lambda d: d["policy_kwargs"]["features_extractor_kwargs"].update(slot_out=10**6),
     "model: policy_kwargs.features_extractor_kwargs.slot_out: a layer of 1,000,000 units"),
    (lambda d: d["policy_kwargs"].update(bogus=1), "policy_kwargs.bogus: unknown for MaskableMultiInputActorCriticPolicy"),
    (lambda d: d["policy_kwargs"]["features_extractor_kwargs"].update(bogus=1),
     "policy_kwargs.features_extractor_kwargs.bogus: unknown for QueueSetExtractor; allowed: slot_hidden"),
    (lambda d: d["hyperparams"].update(n_steps=1e9), "model: hyperparams.n_steps: expected an integer in [1, 1,048,576]"),
    (lambda d: d["hyperparams"].update(n_steps=2.5), "model: hyperparams.n_steps: expected an integer"),
    (lambda d: d["hyperparams"].update(gamma="x"), "model: hyperparams.gamma: expected a number in [0, 1], got 'x'"),
])
def test_agent_file_sizes_and_keys_are_checked_before_anything_is_allocated(tmp_path, change, message):
    import tracemalloc

    _genuine(tmp_path / "a")
    desc = json.loads((tmp_path / "a" / "model.json").read_text())
    change(desc)
    (tmp_path / "a" / "model.json").write_text(json.dumps(desc))
    tracemalloc.start()
    try:
        with pytest.raises(AgentFileError) as e:
            load_agent(tmp_path / "a")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert peak < 50 * 2**20  # refused from the description, not after trying to allocate


def test_a_saved_rollout_size_is_not_allocated_for_inference(tmp_path):
    _genuine(tmp_path / "a")
    desc = json.loads((tmp_path / "a" / "model.json").read_text())
    desc["hyperparams"]["n_steps"] = 2**20  # within the bound, but a buffer evaluate never needs
    (tmp_path / "a" / "model.json").write_text(json.dumps(desc))
    agent = load_agent(tmp_path / "a")
    assert agent.model.n_steps == 64 and agent.model.rollout_buffer.buffer_size == 64
