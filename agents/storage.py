"""Agent files that load without running code: weights in safetensors, everything else in JSON.

An agent is two files with the same stem (``model``, ``best_model``, ``checkpoints/model_N_steps``):

* ``STEM.safetensors``: tensors only: the policy's weights (``policy.*``) and the optimizer's
  state (``optimizer.*``, for ``--resume``). The format has no code paths: reading it cannot run
  anything.
* ``STEM.json``: what rebuilds the model around them: the algorithm, the policy class and its
  keyword arguments (classes by name, from an allow-list), the observation and action spaces, the
  PPO hyperparameters, the timestep count, the ``VecNormalize`` statistics and the env settings.

SB3's own ``model.zip`` stores parts of the model as cloudpickle and ``VecNormalize.save`` is a
pickle: loading either runs whatever code the file carries, so a downloaded agent could take over
the machine. They are read only when the user says they trust the file (``--trust-model``,
:func:`agents.agent.load_agent` ``trust_model=True``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

FORMAT = "llmsched-agent/1"
RLLIB_FORMAT = "llmsched-rllib-agent/1"
"""An RLlib policy module (:mod:`agents.rllib`) in the same two files: its weights and a JSON
description (spaces, network sizes) instead of RLlib's pickled ``rl_module/`` checkpoint."""
FORMATS = (FORMAT, RLLIB_FORMAT)
MAX_JSON_BYTES = 64 * 2**20
"""Largest agent description read (``STEM.json``); a genuine one is a few hundred kB."""
MAX_WEIGHTS_BYTES = 4 * 2**30
"""Largest weights file read (``STEM.safetensors``): 4 GiB, about a billion float32 weights."""
HYPERPARAMS = ("n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "learning_rate", "ent_coef",
               "clip_range", "vf_coef", "max_grad_norm")


class AgentFileError(ValueError):
    """An agent file is missing, malformed or does not match its description (one line)."""


# ---- spaces ------------------------------------------------------------------------------------
def describe_space(space: Any) -> dict[str, Any]:
    """A Gymnasium space as JSON (Box, Discrete, MultiDiscrete, MultiBinary, Dict)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {k: describe_space(v) for k, v in space.spaces.items()}}
    if isinstance(space, spaces.Box):
        return {"type": "Box", "low": space.low.tolist(), "high": space.high.tolist(), "shape": list(space.shape),
                "dtype": str(space.dtype)}
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist()}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    raise AgentFileError(f"space: {type(space).__name__} cannot be saved (Box, Discrete, MultiDiscrete, "
                         "MultiBinary or Dict)")


def build_space(d: Any) -> Any:
    """The space :func:`describe_space` described."""
    from gymnasium import spaces

    kind = d.get("type") if isinstance(d, dict) else None
    try:
        if kind == "Dict":
            return spaces.Dict({k: build_space(v) for k, v in d["spaces"].items()})
        if kind == "Box":
            if d["dtype"] not in ("float32", "float64", "int64", "int32", "uint8"):
                raise AgentFileError(f"space: Box dtype {d['dtype']!r} is not supported")
            return spaces.Box(np.asarray(d["low"], dtype=d["dtype"]), np.asarray(d["high"], dtype=d["dtype"]),
                              tuple(d["shape"]), dtype=d["dtype"])
        if kind == "Discrete":
            return spaces.Discrete(int(d["n"]), start=int(d.get("start", 0)))
        if kind == "MultiDiscrete":
            return spaces.MultiDiscrete(np.asarray(d["nvec"], dtype=np.int64))
        if kind == "MultiBinary":
            return spaces.MultiBinary(d["n"])
    except (KeyError, TypeError, ValueError) as err:
        if isinstance(err, AgentFileError):
            raise
        raise AgentFileError(f"space: malformed {kind} description ({err})") from None
    raise AgentFileError(f"space: type {kind!r} is not one of Box, Discrete, MultiDiscrete, MultiBinary, Dict")


class SpacesOnly(gym.Env):
    """A stand-in env with the agent's spaces: enough to build the model for inference."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        self.observation_space, self.action_space = observation_space, action_space

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        raise RuntimeError("the stand-in env of a loaded agent cannot be stepped")


# ---- policy keyword arguments ------------------------------------------------------------------
SB3_ADAM_KWARGS = {"eps": 1e-5}
"""The optimizer arguments SB3's actor-critic policies give ``torch.optim.Adam`` when none are named."""


def with_optimizer(policy_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``policy_kwargs`` with :class:`agents.optim.Adam` as the optimizer where none is named, and
    the arguments SB3 gives its default Adam (:data:`SB3_ADAM_KWARGS`): torch's Adam, the same
    updates, without importing ``torch._dynamo`` (0.7 s of start-up)."""
    from agents.optim import Adam

    if "optimizer_class" in policy_kwargs:
        return dict(policy_kwargs)
    out = {"optimizer_class": Adam, **policy_kwargs}
    if out.get("optimizer_kwargs") is None:
        out["optimizer_kwargs"] = dict(SB3_ADAM_KWARGS)
    return out


def saved_policy_kwargs(policy_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``policy_kwargs`` as an agent file keeps them: without what :func:`with_optimizer` adds (a
    file names only what differs from SB3's defaults; loading adds it back)."""
    from agents.optim import Adam

    if policy_kwargs.get("optimizer_class") is not Adam:
        return policy_kwargs
    out = {k: v for k, v in policy_kwargs.items() if k != "optimizer_class"}
    if out.get("optimizer_kwargs") == SB3_ADAM_KWARGS:
        del out["optimizer_kwargs"]
    return out


def _classes() -> dict[str, Any]:
    """The classes an agent file may name (nothing else can be instantiated from a file)."""
    from torch import nn

    from agents.features import QueueSetExtractor, ReplicaScorer

    return {"QueueSetExtractor": QueueSetExtractor, "ReplicaScorer": ReplicaScorer, "ReLU": nn.ReLU, "Tanh": nn.Tanh, "ELU": nn.ELU,
            "LeakyReLU": nn.LeakyReLU, "GELU": nn.GELU, "SiLU": nn.SiLU}


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, type):
        name = v.__name__
        if _classes().get(name) is not v:
            raise AgentFileError(f"policy_kwargs: class {name} cannot be saved (allowed: {', '.join(_classes())})")
        return {"class": name}
    if isinstance(v, np.generic):
        return v.item()
    if v is None or isinstance(v, bool | int | float | str):
        return v
    raise AgentFileError(f"policy_kwargs: {type(v).__name__} values cannot be saved")


def _from_json(v: Any) -> Any:
    if isinstance(v, dict):
        if set(v) == {"class"}:
            cls = _classes().get(v["class"])
            if cls is None:
                raise AgentFileError(f"policy_kwargs: class {v['class']!r} is not one of {', '.join(_classes())}")
            return cls
        return {k: _from_json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_from_json(x) for x in v]
    return v


# ---- VecNormalize ------------------------------------------------------------------------------
def _rms(r: Any) -> dict[str, Any]:
    return {"mean": np.asarray(r.mean).tolist(), "var": np.asarray(r.var).tolist(), "count": float(r.count)}


def vecnormalize_stats(vn: Any) -> dict[str, Any]:
    """The statistics and settings of a ``VecNormalize`` as JSON."""
    rms = vn.__dict__.get("obs_rms")  # absent when the observations are not normalised
    obs = None if rms is None else {k: _rms(r) for k, r in rms.items()} if isinstance(rms, dict) else _rms(rms)
    return {"norm_obs": bool(vn.norm_obs), "norm_reward": bool(vn.norm_reward), "clip_obs": float(vn.clip_obs),
            "clip_reward": float(vn.clip_reward), "gamma": float(vn.gamma), "epsilon": float(vn.epsilon),
            "norm_obs_keys": list(vn.norm_obs_keys) if vn.norm_obs_keys is not None else None,
            "obs_rms": obs, "ret_rms": _rms(vn.ret_rms)}


def restore_vecnormalize(stats: dict[str, Any], venv: Any, training: bool) -> Any:
    """``venv`` wrapped in a ``VecNormalize`` with the saved settings and statistics."""
    from stable_baselines3.common.vec_env import VecNormalize

    try:
        vn = VecNormalize(venv, training=training, norm_obs=stats["norm_obs"], norm_reward=stats["norm_reward"],
                          clip_obs=stats["clip_obs"], clip_reward=stats["clip_reward"], gamma=stats["gamma"],
                          epsilon=stats["epsilon"], norm_obs_keys=stats["norm_obs_keys"])

        def fill(r: Any, d: dict[str, Any]) -> None:
            mean, var = np.asarray(d["mean"], dtype=np.float64), np.asarray(d["var"], dtype=np.float64)
            if mean.shape != np.shape(r.mean) or var.shape != np.shape(r.var):
                raise AgentFileError(f"vecnormalize: statistics of shape {mean.shape} for an observation of "
                                     f"shape {np.shape(r.mean)}")
            r.mean, r.var, r.count = mean, var, float(d["count"])

        if isinstance(vn.__dict__.get("obs_rms"), dict):
            for k, r in vn.obs_rms.items():
                fill(r, stats["obs_rms"][k])
        elif stats["norm_obs"]:
            fill(vn.obs_rms, stats["obs_rms"])
        fill(vn.ret_rms, stats["ret_rms"])
    except (KeyError, TypeError) as err:
        raise AgentFileError(f"vecnormalize: malformed statistics ({type(err).__name__}: {err})") from None
    return vn


# ---- save / load -------------------------------------------------------------------------------
def _value(v: Any) -> Any:
    """A hyperparameter as saved: a schedule is stored as its starting value."""
    return float(v(1.0)) if callable(v) else v


def save_agent(stem: str | Path, model: Any, vecnorm: Any = None, extra: dict[str, Any] | None = None) -> Path:
    """Write ``STEM.safetensors`` and ``STEM.json`` (module docstring); returns the JSON path.

    :param extra: more JSON to keep with the model (the env settings, the scenario).
    """
    from safetensors.torch import save_file

    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    tensors = {f"policy.{k}": v.detach().cpu().clone().contiguous() for k, v in model.policy.state_dict().items()}
    opt = model.policy.optimizer.state_dict()
    for idx, st in opt["state"].items():
        for name, t in st.items():
            tensors[f"optimizer.{idx}.{name}"] = t.detach().cpu().clone().contiguous()
    meta = {
        "format": FORMAT,
        "algo": algo_name(model),
        "policy": type(model.policy).__name__,
        "policy_kwargs": _jsonable(saved_policy_kwargs(model.policy_kwargs)),
        "observation_space": describe_space(model.observation_space),
        "action_space": describe_space(model.action_space),
        "hyperparams": {k: _value(getattr(model, k)) for k in HYPERPARAMS},
        "num_timesteps": int(model.num_timesteps),
        "n_updates": int(getattr(model, "_n_updates", 0)),
        "optimizer_param_groups": _jsonable(opt["param_groups"]),
        "vecnormalize": vecnormalize_stats(vecnorm) if vecnorm is not None else None,
        **(extra or {}),
    }
    save_file(tensors, str(stem.with_suffix(".safetensors")), metadata={"format": FORMAT})
    path = stem.with_suffix(".json")
    path.write_text(json.dumps(meta, indent=1) + "\n")
    return path


def read_agent_file(stem: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(description, tensors)`` of ``STEM.json`` + ``STEM.safetensors``; no code is run."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    stem = Path(stem)
    jpath, wpath = stem.with_suffix(".json"), stem.with_suffix(".safetensors")
    for p, limit in ((jpath, MAX_JSON_BYTES), (wpath, MAX_WEIGHTS_BYTES)):
        if not p.is_file():
            raise AgentFileError(f"model: {p} does not exist")
        if p.stat().st_size > limit:
            raise AgentFileError(f"model: {p} is {p.stat().st_size / 2**20:,.0f} MiB, more than the "
                                 f"{limit / 2**20:,.0f} MiB an agent file may have")
    try:
        meta = json.loads(jpath.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise AgentFileError(f"model: {jpath} is not valid JSON ({type(err).__name__}: {err})") from None
    if not isinstance(meta, dict) or meta.get("format") not in FORMATS:
        raise AgentFileError(f"model: {jpath} is not an agent description (format {' or '.join(map(repr, FORMATS))} "
                             "expected)")
    try:
        tensors = load_file(str(wpath), device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise AgentFileError(f"model: {wpath} is not a valid safetensors file ({err})") from None
    return meta, tensors


def _check_policy_kwargs(cls: Any, policy: str, kwargs: Any) -> None:
    """``policy_kwargs`` name only parameters the policy (and its features extractor) takes."""
    import inspect

    if not isinstance(kwargs, dict):
        raise AgentFileError(f"policy_kwargs: expected a mapping, got {type(kwargs).__name__}")
    policy_cls = cls.policy_aliases.get(policy, policy) if hasattr(cls, "policy_aliases") else None
    if policy_cls is None or isinstance(policy_cls, str):
        return
    skip = {"self", "observation_space", "action_space", "lr_schedule"}
    allowed = [p for p in inspect.signature(policy_cls.__init__).parameters if p not in skip]
    for key in kwargs:
        if key not in allowed:
            raise AgentFileError(f"policy_kwargs.{key}: unknown for {policy_cls.__name__}; allowed: {', '.join(allowed)}")
    extractor = kwargs.get("features_extractor_class")
    fe_kwargs = kwargs.get("features_extractor_kwargs") or {}
    if not isinstance(fe_kwargs, dict):
        raise AgentFileError("policy_kwargs.features_extractor_kwargs: expected a mapping")
    if isinstance(extractor, type) and fe_kwargs:
        params = inspect.signature(extractor.__init__).parameters
        fe_allowed = [p for p in params if p not in ("self", "observation_space")]
        for key in fe_kwargs:
            if key not in fe_allowed:
                raise AgentFileError(f"policy_kwargs.features_extractor_kwargs.{key}: unknown for {extractor.__name__}; "
                                     f"allowed: {', '.join(fe_allowed)}")


def build_model(meta: dict[str, Any], tensors: dict[str, Any], env: Any = None, hyperparams: dict[str, Any] | None = None,
                tensorboard_log: str | None = None) -> Any:
    """The SB3 model an agent file describes, with its weights (and, given ``env``, its optimizer
    state and timestep count, to continue training).

    :param env: the training VecEnv (``None``: a stand-in with the saved spaces, for inference).
    :param hyperparams: PPO hyperparameters over the saved ones (``--resume`` with new settings).
    """
    import torch
    from stable_baselines3.common.vec_env import DummyVecEnv

    from llmsched_gym.config import HYPERPARAMS as SCHEMA
    from llmsched_gym.config import ConfigError, check_network_sizes

    inference = env is None
    cls = algo_class(meta.get("algo", ""))
    policy = meta.get("policy")
    if policy not in ("MultiInputPolicy", "MlpPolicy", "MaskableMultiInputActorCriticPolicy",
                      "MaskableActorCriticPolicy", "MultiInputActorCriticPolicy", "ActorCriticPolicy"):
        raise AgentFileError(f"policy: {policy!r} is not an actor-critic policy of SB3 or sb3-contrib")
    policy = "MultiInputPolicy" if "MultiInput" in policy else "MlpPolicy"
    obs_space, act_space = build_space(meta.get("observation_space")), build_space(meta.get("action_space"))
    if env is None:
        env = DummyVecEnv([lambda: SpacesOnly(obs_space, act_space)])
    elif env.observation_space != obs_space or env.action_space != act_space:
        raise AgentFileError("model: the saved spaces differ from the env's (another action mode, K or scenario?)")
    saved = meta.get("hyperparams") or {}
    if not isinstance(saved, dict):
        raise AgentFileError(f"hyperparams: expected a mapping, got {type(saved).__name__}")
    policy_kwargs = meta.get("policy_kwargs") or {}
    try:  # the schema of hyperparameter files; sizes bounded before anything is allocated
        saved = {k: SCHEMA[k].check(f"hyperparams.{k}", v) if k in SCHEMA else v for k, v in saved.items()
                 if k in HYPERPARAMS}
        check_network_sizes("policy_kwargs", policy_kwargs)
    except ConfigError as err:
        raise AgentFileError(f"model: {err}") from None
    if inference:  # no rollout buffer is needed, so none of the saved size is allocated
        saved.update(n_steps=64, batch_size=64)
    policy_kwargs = _from_json(policy_kwargs)
    _check_policy_kwargs(cls, policy, policy_kwargs)
    policy_kwargs = with_optimizer(policy_kwargs)
    hp = {**saved, **(hyperparams or {})}
    try:
        model = cls(policy, env, device="cpu", verbose=0, policy_kwargs=policy_kwargs, tensorboard_log=tensorboard_log,
                    **hp)
    except (TypeError, ValueError, AssertionError, RuntimeError) as err:
        first = " ".join(str(err).split())[:160]
        raise AgentFileError(f"model: the described policy cannot be built ({type(err).__name__}: {first})") from None
    weights = {k[len("policy."):]: v for k, v in tensors.items() if k.startswith("policy.")}
    try:
        model.policy.load_state_dict(weights, strict=True)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0]
        raise AgentFileError(f"model: the weights do not match the described policy ({first})") from None
    model.policy.set_training_mode(False)
    groups = meta.get("optimizer_param_groups")
    if groups:
        state: dict[int, dict[str, torch.Tensor]] = {}
        for k, v in tensors.items():
            if k.startswith("optimizer."):
                _, idx, name = k.split(".", 2)
                state.setdefault(int(idx), {})[name] = v
        try:
            model.policy.optimizer.load_state_dict({"state": state, "param_groups": groups})
        except (ValueError, KeyError, RuntimeError) as err:
            raise AgentFileError(f"model: the optimizer state does not match the policy ({err})") from None
    model.num_timesteps = int(meta.get("num_timesteps", 0))
    model._n_updates = int(meta.get("n_updates", 0))
    return model


def is_maskable(model: Any) -> bool:
    """Whether ``model`` is sb3-contrib's MaskablePPO (its ``predict`` takes the action masks)."""
    from sb3_contrib import MaskablePPO

    return isinstance(model, MaskablePPO)


def algo_class(algo: str) -> Any:
    """The SB3 class of an algorithm name (``maskable-ppo``, ``ppo``); an AgentFileError otherwise."""
    from sb3_contrib import MaskablePPO

    from agents.lean import LeanPPO  # SB3's PPO with the same updates, less Python (agents/lean.py)

    classes = {"maskable-ppo": MaskablePPO, "ppo": LeanPPO}
    if algo not in classes:
        raise AgentFileError(f"algo: {algo!r} is not one of {', '.join(classes)}")
    return classes[algo]


def algo_name(model: Any) -> str:
    """``maskable-ppo`` or ``ppo``: the name :func:`algo_class` takes."""
    return "maskable-ppo" if is_maskable(model) else "ppo"
