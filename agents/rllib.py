"""Ray RLlib PPO (new API stack) on ``LLMSched-v1``, with action masking; the trained policy is an agent
``llmsched evaluate`` plays like the Stable-Baselines3 ones.

Masking follows RLlib's action-masking example (``ActionMaskingTorchRLModule`` in
``ray.rllib.examples.rl_modules``), on the current PPO module: the env's observation becomes
``{"observations": the flat observation, "action_mask": env.action_masks()}``
(:class:`MaskedObservation`) and :class:`MaskedPPOModule` adds ``log(mask)`` (a large negative
number where masked) to the action logits, in exploration, inference and training alike, so a
masked action is never sampled and its probability never enters the loss. The ``select`` action
mode (``Discrete``) is the one this applies to.

A run folder (``runs/rllib/NAME``, relative or absolute) holds ``model.json`` + ``model.safetensors``
(the policy: its network sizes and spaces as JSON, its weights as safetensors; loading them runs no
code, as for the SB3 agents of :mod:`agents.storage`), ``rl_module/`` (the same policy in RLlib's own
checkpoint format, for ``RLModule.from_checkpoint``; that format is pickled, so ``llmsched evaluate``
reads it only with ``--trust-model``), ``run.json`` (``algo: rllib-ppo``, the env settings) and the
TensorBoard events: the same ``sched/*`` scalars as the SB3 training
(:data:`agents.callbacks.SUMMARY_SCALARS`, the mean over the episodes finished in the iteration)
plus ``rollout/ep_rew_mean``.

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

from agents.storage import RLLIB_FORMAT, AgentFileError, build_space, describe_space

ENV_NAME = "LLMSched-v1-masked"


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
    from agents.envs import make_env

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

    from llmsched_gym.config import run_folder, safe_run_name

    name = cfg.name or safe_run_name(f"{cfg.scenario}-rllib-ppo-s{cfg.seed}")
    # inside cfg.out, links followed; absolute: RLlib's checkpoint writer (pyarrow) takes a relative
    # path for a URI without a scheme
    run_dir = run_folder(cfg.out, name, "--name").resolve()
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
        module = algo.get_module()
        save_rllib_module(run_dir / "model", module, {"scenario": cfg.scenario, "overrides": cfg.overrides})
        module.save_to_path(str(run_dir / "rl_module"))
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


MAX_WIDTH = 4096
"""Widest hidden layer an RLlib agent file may describe (the project trains 32-256)."""
MAX_LAYERS = 16
"""Most hidden layers an RLlib agent file may describe."""
_MODEL_CONFIG_KEYS = {"fcnet_hiddens": "list", "fcnet_activation": "str", "head_fcnet_hiddens": "list",
                      "head_fcnet_activation": "str", "vf_share_layers": "bool", "fcnet_use_layernorm": "bool",
                      "head_fcnet_use_layernorm": "bool", "free_log_std": "bool", "log_std_clip_param": "float"}
"""The network settings an RLlib agent file keeps (RLlib's ``DefaultModelConfig`` fields that shape a
feed-forward PPO module); the rest stay RLlib's defaults."""
_ACTIVATIONS = ("tanh", "relu", "linear", "swish", "silu", "elu", "gelu", "sigmoid")


def save_rllib_module(stem: str | Path, module: Any, extra: dict[str, Any] | None = None) -> Path:
    """``STEM.safetensors`` (the module's weights) and ``STEM.json`` (format ``llmsched-rllib-agent/1``:
    the spaces and network sizes :func:`build_rllib_module` rebuilds it from); returns the JSON path."""
    from safetensors.torch import save_file

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    config = module.model_config if isinstance(module.model_config, dict) else asdict(module.model_config)
    meta = {"format": RLLIB_FORMAT, "algo": "rllib-ppo", "module": type(module).__name__,
            "observation_space": describe_space(module.observation_space),
            "action_space": describe_space(module.action_space),
            "model_config": {k: config[k] for k in _MODEL_CONFIG_KEYS if k in config}, **(extra or {})}
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, str(stem.with_suffix(".safetensors")), metadata={"format": RLLIB_FORMAT})
    path = stem.with_suffix(".json")
    path.write_text(json.dumps(meta, indent=1) + "\n")
    return path


def check_model_config(config: Any) -> dict[str, Any]:
    """An RLlib agent file's ``model_config``: known keys, JSON values of the right kind, layer widths
    within :data:`MAX_WIDTH` and :data:`MAX_LAYERS` (checked before anything is allocated)."""
    if not isinstance(config, dict):
        raise AgentFileError(f"model_config: expected a mapping, got {type(config).__name__}")
    out: dict[str, Any] = {}
    for key, value in config.items():
        kind = _MODEL_CONFIG_KEYS.get(key)
        if kind is None:
            raise AgentFileError(f"model_config.{key}: unknown field; allowed: {', '.join(_MODEL_CONFIG_KEYS)}")
        if kind == "list":
            if (not isinstance(value, list) or len(value) > MAX_LAYERS
                    or not all(isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= MAX_WIDTH for w in value)):
                raise AgentFileError(f"model_config.{key}: expected at most {MAX_LAYERS} layer widths, each an "
                                     f"integer in [1, {MAX_WIDTH}], got {str(value)[:60]}")
        elif kind == "str":
            if value not in _ACTIVATIONS:
                raise AgentFileError(f"model_config.{key}: expected one of {', '.join(_ACTIVATIONS)}, got {value!r}")
        elif kind == "bool":
            if not isinstance(value, bool):
                raise AgentFileError(f"model_config.{key}: expected true or false, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise AgentFileError(f"model_config.{key}: expected a number, got {value!r}")
        out[key] = value
    return out


def build_rllib_module(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Any:
    """The inference module an RLlib agent file describes, with its weights; no pickle is read."""
    from ray.rllib.algorithms.ppo.ppo_catalog import PPOCatalog
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    if meta.get("module") != MaskedPPOModule.__name__:
        raise AgentFileError(f"module: {meta.get('module')!r} is not {MaskedPPOModule.__name__}")
    obs_space, act_space = build_space(meta.get("observation_space")), build_space(meta.get("action_space"))
    if (not isinstance(obs_space, gym.spaces.Dict) or set(obs_space.spaces) != {"observations", "action_mask"}
            or not isinstance(act_space, gym.spaces.Discrete)):
        raise AgentFileError("observation_space: an RLlib agent needs {observations, action_mask} and a Discrete "
                             "action space")
    config = asdict(DefaultModelConfig(**check_model_config(meta.get("model_config", {}))))
    module = MaskedPPOModule(observation_space=obs_space, action_space=act_space, inference_only=True,
                             model_config=config, catalog_class=PPOCatalog)
    try:
        module.load_state_dict(tensors, strict=True)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0]
        raise AgentFileError(f"model: the weights do not match the described module ({first})") from None
    module.eval()
    return module


def load_module(run_dir: Path, trust_model: bool = False) -> RLlibPolicy:
    """The policy saved by :func:`train_rllib` in ``run_dir``: from ``model.json`` + ``model.safetensors``
    (no code runs), or, with ``trust_model`` only, from RLlib's pickled ``rl_module/`` checkpoint."""
    from agents.storage import read_agent_file

    if (run_dir / "model.json").is_file():
        meta, tensors = read_agent_file(run_dir / "model")
        try:
            return RLlibPolicy(build_rllib_module(meta, tensors))
        except (TypeError, AttributeError, KeyError, IndexError, ValueError, OverflowError) as err:
            if isinstance(err, AgentFileError):
                raise
            raise AgentFileError(f"model: {run_dir / 'model.json'} is malformed ({type(err).__name__}: "
                                 f"{' '.join(str(err).split())[:120]})") from None
    path = run_dir / "rl_module"
    if not path.is_dir():
        raise AgentFileError(f"model: no model.json or rl_module/ in {run_dir}")
    if not trust_model:
        raise AgentFileError(f"model: {run_dir} holds only an RLlib checkpoint (rl_module/), which RLlib loads with "
                             "pickle (it runs code stored in it); pass --trust-model only if you trust its source")
    import sys

    from ray.rllib.core.rl_module.rl_module import RLModule

    print(f"warning: --trust-model: loading {path} with pickle, which can run any code the file holds", file=sys.stderr)
    return RLlibPolicy(RLModule.from_checkpoint(str(path.resolve())))
