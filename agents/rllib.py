"""Ray RLlib PPO (new API stack) on ``LLMSched-v0``, with action masking; the trained policy is an agent
``llmsched evaluate`` plays like the Stable-Baselines3 ones.

Masking follows RLlib's action-masking example (``ActionMaskingTorchRLModule`` in
``ray.rllib.examples.rl_modules``), on the current PPO module: the env's observation becomes
``{"observations": the flat observation, "action_mask": env.action_masks()}``
(:class:`MaskedObservation`) and :class:`MaskedPPOModule` adds ``log(mask)`` (a large negative
number where masked) to the action logits, in exploration, inference and training alike, so a
masked action is never sampled and its probability never enters the loss. The ``select`` action
mode (``Discrete``) is the one this applies to.

A run folder (``runs/rllib/NAME``) holds ``rl_module/`` (the policy, RLlib's checkpoint format),
``run.json`` (``algo: rllib-ppo``, the env settings) and the TensorBoard events: the same ``sched/*``
scalars as the SB3 training (:data:`agents.callbacks.SUMMARY_SCALARS`, the mean over the episodes
finished in the iteration) plus ``rollout/ep_rew_mean``.

Needs the ``rllib`` extra (``pip install -e ".[rllib]"``; importing this module without it raises
ImportError); see the README for the versions.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.core.columns import Columns
from ray.rllib.utils.torch_utils import FLOAT_MIN

from agents.agent import Agent, describe_run

ENV_NAME = "LLMSched-v0-masked"


class MaskedObservation(gym.ObservationWrapper):
    """``{"observations": obs, "action_mask": mask}`` with the env's current mask as float32 (1 = allowed)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise ValueError(f"action_mode: RLlib masking needs a Discrete action space (select), got {env.action_space}")
        n = int(env.action_space.n)
        self.observation_space = gym.spaces.Dict({
            "observations": env.observation_space,
            "action_mask": gym.spaces.Box(0.0, 1.0, (n,), np.float32),
        })

    def observation(self, observation: np.ndarray) -> dict[str, np.ndarray]:
        return {"observations": observation, "action_mask": self.env.unwrapped.action_masks().astype(np.float32)}


def make_masked_env(config: dict[str, Any]) -> gym.Env:
    """RLlib's env creator: ``config`` holds ``scenario``, ``env_kwargs`` and ``overrides``."""
    from agents.agent import make_env

    env_kwargs = {**config.get("env_kwargs", {}), "flat": True, "action_mode": "select"}
    return MaskedObservation(make_env(config["scenario"], env_kwargs, config.get("overrides") or None))


class MaskedPPOModule(DefaultPPOTorchRLModule):
    """RLlib's default PPO networks on ``obs["observations"]``, logits masked by ``obs["action_mask"]``."""

    def __init__(self, *, observation_space: gym.spaces.Dict, **kwargs: Any) -> None:
        # the networks are built for the observations alone; the mask only gates the logits
        self.observation_space_with_mask = observation_space
        super().__init__(observation_space=observation_space["observations"], **kwargs)

    def setup(self) -> None:
        super().setup()
        self.observation_space = self.observation_space_with_mask

    @staticmethod
    def _split(batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        obs = batch[Columns.OBS]
        return obs["action_mask"], {**batch, Columns.OBS: obs["observations"]}

    @staticmethod
    def _mask(out: dict[str, Any], mask: torch.Tensor) -> dict[str, Any]:
        out[Columns.ACTION_DIST_INPUTS] = out[Columns.ACTION_DIST_INPUTS] + torch.clamp(torch.log(mask), min=FLOAT_MIN)
        return out

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        mask, batch = self._split(batch)
        return self._mask(super()._forward(batch, **kwargs), mask)

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        mask, batch = self._split(batch)
        return self._mask(super()._forward_train(batch, **kwargs), mask)

    def compute_values(self, batch: dict[str, Any], embeddings: Any = None) -> torch.Tensor:
        if isinstance(batch[Columns.OBS], dict):
            _, batch = self._split(batch)
        return super().compute_values(batch, embeddings)


@dataclass
class RLlibConfig:
    """One RLlib PPO run. ``train_batch`` env steps per iteration, collected by ``env_runners``
    processes (0: in the driver); ``overrides`` shape the training episodes (e.g. a short
    ``workload.n_requests``)."""

    scenario: str = "jaillet-low"
    name: str | None = None
    out: str = "runs/rllib"
    iterations: int = 20
    env_runners: int = 2
    train_batch: int = 4000
    minibatch: int = 500
    epochs: int = 10
    lr: float = 3e-4
    gamma: float = 0.99
    hidden: tuple[int, ...] = (128, 128)
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    env_kwargs: dict[str, Any] = field(default_factory=lambda: {"admission": "current", "K": 16})


def _sched_callback() -> type:
    from ray.rllib.callbacks.callbacks import RLlibCallback

    from agents.callbacks import SUMMARY_SCALARS

    class SchedScalars(RLlibCallback):
        """Log every finished episode's scheduling metrics (``info["summary"]``) as ``sched/*``."""

        def on_episode_end(self, *, episode, metrics_logger, **kwargs) -> None:  # type: ignore[override]
            summary = episode.get_infos(-1).get("summary")
            if summary is None:
                return
            for key, get in SUMMARY_SCALARS:
                value = float(get(summary))
                if math.isfinite(value):
                    metrics_logger.log_value(f"sched/{key}", value, reduce="mean")
            metrics_logger.log_value("sched/episodes", 1, reduce="lifetime_sum")

    return SchedScalars


def build_config(cfg: RLlibConfig) -> Any:
    """The ``PPOConfig``: new API stack, the masking RLModule, ``cfg``'s sizes."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.tune.registry import register_env

    register_env(ENV_NAME, make_masked_env)
    env_config = {"scenario": cfg.scenario, "env_kwargs": cfg.env_kwargs, "overrides": cfg.overrides}
    return (
        PPOConfig()
        .environment(ENV_NAME, env_config=env_config)
        .env_runners(num_env_runners=cfg.env_runners, num_envs_per_env_runner=1)
        .training(train_batch_size_per_learner=cfg.train_batch, minibatch_size=cfg.minibatch,
                  num_epochs=cfg.epochs, lr=cfg.lr, gamma=cfg.gamma)
        .rl_module(rl_module_spec=RLModuleSpec(
            module_class=MaskedPPOModule,
            model_config=DefaultModelConfig(fcnet_hiddens=list(cfg.hidden), head_fcnet_hiddens=[])))
        .callbacks(_sched_callback())
        .debugging(seed=cfg.seed)
    )


def train_rllib(cfg: RLlibConfig, progress: bool = True) -> dict[str, Any]:
    """Train ``cfg.iterations`` PPO iterations, log ``sched/*`` to TensorBoard and save the policy
    into ``cfg.out / name``; returns ``run.json``'s content."""
    from torch.utils.tensorboard import SummaryWriter

    name = cfg.name or f"{cfg.scenario}-rllib-ppo-s{cfg.seed}"
    run_dir = Path(cfg.out) / name
    run_dir.mkdir(parents=True, exist_ok=True)
    algo = build_config(cfg).build_algo()
    writer = SummaryWriter(str(run_dir))
    t0 = time.perf_counter()
    steps = 0
    try:
        for it in range(cfg.iterations):
            result = algo.train()
            runners = result.get("env_runners", {})
            steps = int(result.get("num_env_steps_sampled_lifetime", runners.get("num_env_steps_sampled_lifetime", 0)))
            for key, value in runners.items():
                if key.startswith("sched/"):
                    writer.add_scalar(key, float(value), steps)
            if "episode_return_mean" in runners:
                writer.add_scalar("rollout/ep_rew_mean", float(runners["episode_return_mean"]), steps)
            writer.flush()
            if progress:
                e2e = runners.get("sched/mean_e2el_ms", math.nan)
                print(f"  iteration {it + 1}/{cfg.iterations}: {steps} steps, episodes finished so far "
                      f"{int(runners.get('sched/episodes', 0))}, Mean E2EL {e2e:.4g} ms", flush=True)
        algo.get_module().save_to_path(str(run_dir / "rl_module"))
    finally:
        writer.close()
        algo.stop()
    meta = {"algo": "rllib-ppo", "name": name, "scenario": cfg.scenario, "overrides": cfg.overrides,
            "env_kwargs": {**cfg.env_kwargs, "flat": True, "action_mode": "select"}, "timesteps": steps,
            "seed": cfg.seed, "learn_wall_s": time.perf_counter() - t0,
            "config": {k: v for k, v in asdict(cfg).items() if k not in ("overrides", "env_kwargs")}}
    (run_dir / "run.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


class RLlibPolicy:
    """A saved RLlib module as a deterministic, masked policy: the argmax of the masked logits."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def act(self, obs: np.ndarray, mask: np.ndarray) -> int:
        batch = {Columns.OBS: {"observations": torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0),
                               "action_mask": torch.as_tensor(mask, dtype=torch.float32).unsqueeze(0)}}
        with torch.no_grad():
            logits = self.module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS]
        return int(logits.argmax(-1)[0])


def load_module(run_dir: Path) -> RLlibPolicy:
    """The policy saved by :func:`train_rllib` in ``run_dir``."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    path = run_dir / "rl_module"
    if not path.is_dir():
        raise FileNotFoundError(f"model: no rl_module/ in {run_dir}")
    return RLlibPolicy(RLModule.from_checkpoint(str(path)))


def load_rllib_agent(run_dir: Path) -> Agent:
    """The agent of an RLlib run folder, for ``llmsched evaluate`` (:func:`agents.agent.load_agent`)."""
    meta_path = run_dir / "run.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return RLlibAgent(describe_run(meta, run_dir.name), load_module(run_dir), None, meta.get("env_kwargs", {}),
                      meta.get("scenario"), meta.get("overrides", {}))


class RLlibAgent(Agent):
    """An RLlib policy behind the :class:`~agents.agent.Agent` interface: always masked, deterministic."""

    def uses_mask(self) -> bool:
        return True

    def act(self, obs: Any, mask: np.ndarray | None, deterministic: bool = True) -> Any:
        return self.model.act(obs, mask)
