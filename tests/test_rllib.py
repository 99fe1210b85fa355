"""Ray RLlib PPO on LLMSched-v1: masked actions, two training iterations into a relative --out, the policy
evaluated against fcfs through a relative --model; RLlib agent files load without unpickling anything
(a crafted ``rl_module/`` checkpoint creates no marker unless ``--trust-model`` is given)."""

from __future__ import annotations

import json
import pickle
import runpy
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.rllib")

from agents.agent import load_agent  # noqa: E402
from agents.rllib import (  # noqa: E402
    MaskedObservation,
    MaskedPPOModule,
    make_masked_env,
    save_rllib_module,
)
from agents.storage import AgentFileError  # noqa: E402
from llmsched_gym.cli import main  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "rllib_ppo.py"


def test_masked_observation_carries_the_envs_current_mask():
    env = make_masked_env({"scenario": "jaillet-low", "env_kwargs": {"K": 4, "admission": "current"},
                           "overrides": {"workload.n_requests": 20}})
    assert isinstance(env, MaskedObservation)
    obs, _ = env.reset(seed=3)
    for _ in range(50):
        assert obs in env.observation_space
        mask = env.unwrapped.action_masks()
        np.testing.assert_array_equal(obs["action_mask"], mask.astype(np.float32))
        allowed = np.flatnonzero(mask)
        obs, _, terminated, truncated, _ = env.step(int(allowed[0]))
        if terminated or truncated:
            break


def test_rllib_example_trains_two_iterations_and_evaluate_plays_it_against_fcfs(ray_local, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths, as the README's commands use them
    ns = runpy.run_path(str(EXAMPLE))
    assert ns["main"](["--quick", "--env-runners", "2", "--out", "runs/rllib", "--name", "ppo"]) == 0
    run = Path("runs/rllib/ppo")
    meta = json.loads((run / "run.json").read_text())
    assert meta["algo"] == "rllib-ppo" and meta["timesteps"] >= 512
    assert json.loads((run / "model.json").read_text())["format"] == "llmsched-rllib-agent/1"
    assert (run / "model.safetensors").is_file() and (run / "rl_module").is_dir()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = EventAccumulator(str(run)).Reload().Tags()["scalars"]
    assert {"sched/mean_e2el_ms", "sched/completed_frac", "sched/episodes", "rollout/ep_rew_mean"} <= set(tags)

    assert main(["evaluate", "--model", str(run), "--policies", "fcfs", "--seeds", "100-101",
                 "--set", "workload.n_requests=30", "--set", "engine.stall_iterations=1000",
                 "--no-plots", "--quiet", "--out", "eval"]) == 0
    res = json.loads(Path("eval/results.json").read_text())
    by = {(r["policy"], r["seed"]): r["summary"] for r in res["runs"]}
    assert {p for p, _ in by} == {"fcfs", res["agents"][0]} and not res["skipped"]
    for (policy, _), s in by.items():
        # nothing is lost: a barely trained agent may preempt and re-admit until the loop detector
        # (here after 1,000 iterations without a completion) stops it (its preempt actions allow
        # that), and then says so; fcfs serves every request
        assert s["n_arrived"] == 30 and s["n_completed"] + s["n_unfinished"] + s["n_rejected"] == 30
        assert s["n_completed"] == 30 or (policy != "fcfs" and s["non_terminating"])
    # RLlib's own pickled checkpoint, in the relative folder, for those who trust it
    trusted, safe = load_agent(run / "rl_module", trust_model=True), load_agent(run)
    env = make_masked_env({"scenario": "jaillet-low", "env_kwargs": {"K": 16, "admission": "current"}})
    env.observation_space.seed(0)
    for _ in range(10):
        obs = env.observation_space.sample()
        assert trusted.act(obs["observations"], obs["action_mask"]) == safe.act(obs["observations"], obs["action_mask"])


class _Marker:
    """Unpickling this creates ``path`` (what an attacker's payload would do, harmlessly)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _module(hidden: list[int]) -> tuple[MaskedPPOModule, dict]:
    """An untrained masked PPO module (random weights) for the K=4 select env, and its env settings."""
    from dataclasses import asdict

    from ray.rllib.algorithms.ppo.ppo_catalog import PPOCatalog
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    env_kwargs = {"K": 4, "admission": "current"}
    env = make_masked_env({"scenario": "jaillet-low", "env_kwargs": env_kwargs})
    cfg = asdict(DefaultModelConfig(fcnet_hiddens=hidden, head_fcnet_hiddens=[]))
    return MaskedPPOModule(observation_space=env.observation_space, action_space=env.action_space,
                           inference_only=True, model_config=cfg, catalog_class=PPOCatalog), env_kwargs


def _craft_checkpoint(run: Path, marker: Path) -> None:
    """``rl_module/`` as RLlib writes it, its ``class_and_ctor_args.pkl`` a payload creating ``marker``."""
    (run / "rl_module").mkdir(parents=True)
    (run / "rl_module" / "class_and_ctor_args.pkl").write_bytes(pickle.dumps(_Marker(marker)))
    (run / "rl_module" / "module_state.pkl").write_bytes(pickle.dumps(_Marker(marker)))
    (run / "rl_module" / "metadata.json").write_text(json.dumps(
        {"class_and_ctor_args_file": "class_and_ctor_args.pkl", "state_file": "module_state",
         "ray_version": "2.60.0", "checkpoint_version": "2.1"}))


def test_rllib_agent_files_round_trip_and_a_crafted_checkpoint_is_never_unpickled(tmp_path, capsys):
    import torch

    marker = tmp_path / "pwned"
    module, env_kwargs = _module([8, 8])
    run = tmp_path / "run"
    _craft_checkpoint(run, marker)
    save_rllib_module(run / "model", module)
    (run / "run.json").write_text(json.dumps({"algo": "rllib-ppo", "scenario": "jaillet-low", "timesteps": 0,
                                             "env_kwargs": {**env_kwargs, "flat": True, "action_mode": "select"}}))
    agent = load_agent(run)  # the JSON + safetensors pair; the crafted checkpoint beside it is not read
    loaded = agent.model.module
    for name, t in module.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t)
    rng = np.random.default_rng(0)
    env = make_masked_env({"scenario": "jaillet-low", "env_kwargs": env_kwargs})
    for _ in range(20):
        obs = env.observation_space.sample()
        obs["action_mask"] = (rng.uniform(size=obs["action_mask"].shape) < 0.5).astype(np.float32)
        obs["action_mask"][0] = 1.0
        batch = {"obs": {k: torch.as_tensor(v).unsqueeze(0) for k, v in obs.items()}}
        with torch.no_grad():
            logits = module.forward_inference(batch)["action_dist_inputs"][0]
        a = agent.act(obs["observations"], obs["action_mask"])
        assert a == int(logits.argmax()) and obs["action_mask"][a] == 1.0
    assert not marker.exists()

    # the checkpoint alone: refused in one line naming --trust-model, through the API and the CLI
    for f in ("model.json", "model.safetensors"):
        (run / f).unlink()
    for target in (run, run / "rl_module"):
        with pytest.raises(AgentFileError, match="pass --trust-model only if you trust its source"):
            load_agent(target)
    capsys.readouterr()
    assert main(["evaluate", "--model", str(run), "--policies", "none", "--seeds", "1", "--quiet", "--no-plots",
                 "--out", str(tmp_path / "ev")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "rl_module" in err and "--trust-model" in err
    assert not marker.exists()
    # with --trust-model RLlib unpickles it: the crafted file is a real exploit
    try:
        load_agent(run, trust_model=True)
    except Exception:  # noqa: S110 (the crafted file is no module: what matters is the marker)
        pass
    assert marker.exists()


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["model_config"].update(fcnet_hiddens=[1_000_000_000]), "model_config.fcnet_hiddens: expected at most"),
    (lambda m: m["model_config"].update(fcnet_hiddens=[8] * 17), "model_config.fcnet_hiddens: expected at most"),
    (lambda m: m["model_config"].update(fcnet_activation="os.system"), "model_config.fcnet_activation: expected one of"),
    (lambda m: m["model_config"].update(catalog_class="x"), "model_config.catalog_class: unknown field"),
    (lambda m: m.update(module="Evil"), "module: 'Evil' is not MaskedPPOModule"),
    (lambda m: m["model_config"].update(fcnet_hiddens=[16]), "the weights do not match the described module"),
])
def test_malformed_rllib_agent_files_are_one_line_errors(tmp_path, edit, message):
    module, _ = _module([8])
    path = save_rllib_module(tmp_path / "model", module)
    meta = json.loads(path.read_text())
    edit(meta)
    path.write_text(json.dumps(meta))
    with pytest.raises(AgentFileError, match=message) as err:
        load_agent(tmp_path)
    assert "\n" not in str(err.value)
