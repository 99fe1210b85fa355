"""A trained agent as a policy: load it from a run folder and play whole episodes on seeded workloads.

A run folder (``runs/train/NAME``) holds ``model.json`` + ``model.safetensors`` (and the
``best_model`` pair; :mod:`agents.storage`: weights, normalisation statistics and settings, loaded
without unpickling) and ``run.json`` (algorithm, env settings, seeds). :func:`run_episode` drives
``LLMSched-v1`` with the agent on one seed until the workload is served, passing the action masks
at every prediction, and returns the same summary/requests/iterations triple as ``simulate()``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.envs import make_env  # noqa: F401  (a documented import: from agents.agent import make_env)
from agents.storage import (
    MAX_JSON_BYTES,
    RLLIB_FORMAT,
    AgentFileError,
    algo_class,
    build_model,
    is_maskable,
    read_agent_file,
    restore_vecnormalize,
)


@dataclass
class Agent:
    """A model plus the observation normalisation it was trained with.

    :ivar name: the label in reports, named for what it is (:func:`describe_run`).
    :ivar env_kwargs: the env settings it was trained with (action mode, admission, K, ...).
    """

    name: str
    model: Any
    vecnorm: Any = None
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    scenario: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    def uses_mask(self) -> bool:
        """Whether :meth:`act` takes the env's action mask."""
        return is_maskable(self.model)

    def act(self, obs: Any, mask: np.ndarray | None, deterministic: bool = True) -> Any:
        """The action for one observation (``mask``: ``env.action_masks()``, MaskablePPO only).

        Equivalent to ``model.predict`` for one observation, without its per-call bookkeeping
        (this runs once per env step in evaluations).
        """
        import torch
        from gymnasium import spaces

        if self.vecnorm is not None:
            obs = self.vecnorm.normalize_obs(obs)
        policy = self.model.policy
        if isinstance(obs, dict):
            obs_t: Any = {k: torch.as_tensor(v, dtype=torch.float32).unsqueeze(0) for k, v in obs.items()}
        else:
            obs_t = torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0)
        with torch.no_grad():
            if is_maskable(self.model):
                a = policy._predict(obs_t, deterministic, action_masks=mask)
            else:
                a = policy._predict(obs_t, deterministic)
        action = a.cpu().numpy()[0]
        space = self.model.action_space
        if isinstance(space, spaces.Box):
            action = np.clip(action, space.low, space.high)
        return action


def load_agent(path: str | Path, best: bool = False, trust_model: bool = False) -> Agent:
    """Load ``path``: a run folder, or one agent file in it (``model.json``, ``model.safetensors``);
    ``best`` picks ``best_model`` in a folder.

    Only the safe files are read (:mod:`agents.storage`: JSON and safetensors, no code runs). An
    SB3 ``.zip`` (and its ``vecnormalize`` pickle), from older runs or from elsewhere, is loaded
    only with ``trust_model=True`` (``--trust-model``): unpickling it runs any code it carries.
    An RLlib run (:mod:`agents.rllib`) is read from its ``model.json`` + ``model.safetensors`` the
    same way; its pickled ``rl_module/`` checkpoint likewise only with ``trust_model=True``.
    """
    p = Path(path)
    if not p.exists():
        raise AgentFileError(f"model: {p} does not exist")
    if p.is_dir() and p.name == "rl_module" and (p / "metadata.json").is_file():
        p = p.parent  # RLlib's checkpoint folder: its run folder
    run_dir = p if p.is_dir() else p.parent
    if run_dir.name == "checkpoints":
        run_dir = run_dir.parent
    if p.is_dir():
        stems = ("best_model", "model") if best else ("model", "best_model")
        stem = next((p / s for s in stems if (p / f"{s}.json").exists()), None)
        if stem is None:
            if (p / "rl_module").is_dir():  # an RLlib run saved before its model.json: pickle only
                return _rllib(p, trust_model)
            zips = [p / f"{s}.zip" for s in stems if (p / f"{s}.zip").exists()]
            if not zips:
                raise AgentFileError(f"model: no model.json or best_model.json in {p}")
            if not trust_model:
                raise AgentFileError(f"model: {p} holds only an SB3 zip ({zips[0].name}), which runs code stored in it "
                                     "when loaded; pass --trust-model only if you trust its source")
            return _load_trusted(zips[0], run_dir)
    elif p.suffix in (".json", ".safetensors"):
        stem = p.with_suffix("")
    elif p.suffix == ".zip":
        if not trust_model:
            raise AgentFileError(f"model: {p} is an SB3 zip, which runs code stored in it when loaded; "
                                 "pass --trust-model only if you trust its source")
        return _load_trusted(p, run_dir)
    else:
        raise AgentFileError(f"model: {p} is not a run folder, an agent file (.json, .safetensors) or an SB3 .zip")
    meta, tensors = read_agent_file(stem)
    if meta.get("format") == RLLIB_FORMAT:
        return _rllib(run_dir, trust_model)
    try:  # every field of the description may be anything: a wrong type is the file's error
        model = build_model(meta, tensors)
        vecnorm = None
        if meta.get("vecnormalize"):
            vecnorm = restore_vecnormalize(meta["vecnormalize"], model.get_env(), training=False)
        run = read_run_json(run_dir)
        best_at = meta.get("num_timesteps") if stem.name == "best_model" else None
        agent = Agent(describe_run(run, run_dir.name, best_at=best_at if isinstance(best_at, int) else None), model, vecnorm, meta.get("env_kwargs", run.get("env_kwargs", {})),
                      meta.get("scenario", run.get("scenario")), meta.get("overrides", run.get("overrides", {})))
    except (TypeError, AttributeError, KeyError, IndexError, ValueError, OverflowError) as err:
        if isinstance(err, AgentFileError):
            raise
        raise AgentFileError(f"model: {stem}.json is malformed ({type(err).__name__}: "
                             f"{' '.join(str(err).split())[:120]})") from None
    _check_agent_settings(agent, stem)
    return agent


def _check_agent_settings(agent: Agent, stem: Path) -> None:
    """The env settings an agent file gives are of the types the env takes (one line naming the field)."""
    for name, value, kind in (("env_kwargs", agent.env_kwargs, dict), ("overrides", agent.overrides, dict),
                              ("scenario", agent.scenario, str)):
        if value is not None and not isinstance(value, kind):
            raise AgentFileError(f"model: {stem}.json: {name}: expected a {'mapping' if kind is dict else 'string'}, "
                                 f"got {type(value).__name__}")


def _rllib(run_dir: Path, trust_model: bool) -> Agent:
    """An RLlib run folder's agent: its policy from :func:`agents.rllib.load_module` (which needs the
    ``rllib`` extra), labelled from its ``run.json``."""
    try:
        from agents.rllib import load_module
    except ImportError:
        raise AgentFileError(f'model: {run_dir} is an RLlib run; install the extra: pip install -e ".[rllib]"') from None
    meta = read_run_json(run_dir)
    return RLlibAgent(describe_run(meta, run_dir.name), load_module(run_dir, trust_model), None,
                      meta.get("env_kwargs", {}), meta.get("scenario"), meta.get("overrides", {}))


class RLlibAgent(Agent):
    """An RLlib policy (:class:`agents.rllib.RLlibPolicy`) behind the :class:`Agent` interface:
    always masked, deterministic."""

    def uses_mask(self) -> bool:
        return True

    def act(self, obs: Any, mask: np.ndarray | None, deterministic: bool = True) -> Any:
        return self.model.act(obs, mask)


def read_run_json(run_dir: Path) -> dict[str, Any]:
    """``run_dir/run.json`` (``{}`` when absent); a malformed or oversized one is an AgentFileError."""
    path = run_dir / "run.json"
    if not path.exists():
        return {}
    if path.stat().st_size > MAX_JSON_BYTES:
        raise AgentFileError(f"model: {path} is larger than {MAX_JSON_BYTES // 2**20} MiB")
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise AgentFileError(f"model: {path} is not valid JSON ({type(err).__name__})") from None
    if not isinstance(run, dict):
        raise AgentFileError(f"model: {path} is not a JSON object")
    return run


def _load_trusted(model_path: Path, run_dir: Path) -> Agent:
    """SB3's own loading (cloudpickle) and the ``vecnormalize`` pickle: trusted files only."""
    import pickle
    import sys

    from stable_baselines3.common.vec_env import VecNormalize

    print(f"warning: --trust-model: loading {model_path} with pickle, which can run any code the file holds",
          file=sys.stderr)
    meta = read_run_json(run_dir)
    model = algo_class(meta.get("algo", "maskable-ppo")).load(str(model_path), device="cpu")
    model.policy.set_training_mode(False)
    vecnorm = None
    vn_path = vecnormalize_path(model_path)
    if vn_path.exists():
        with vn_path.open("rb") as f:
            vecnorm = pickle.load(f)  # noqa: S301 (the user trusts this file: --trust-model)
        if not isinstance(vecnorm, VecNormalize):
            raise AgentFileError(f"model: {vn_path} is not a VecNormalize pickle")
        vecnorm.training = False
    return Agent(describe_run(meta, run_dir.name), model, vecnorm, meta.get("env_kwargs", {}), meta.get("scenario"),
                 meta.get("overrides", {}))


def describe_run(meta: dict[str, Any], folder: str, start: bool = False, best_at: int | None = None) -> str:
    """An agent's label in reports, named for what it is: its algorithm, action mode and structure,
    then its training: ``ppo priority/prompt-order budget 256, 166k steps``, ``maskable-ppo select,
    bc: sarathi, 41k steps``, ``ppo tune: sarathi chunk_size, 60k steps``; ``start`` names the untrained
    starting policy of the run (``..., untrained start``); a run that started from zero scores and no
    cloning (or, in the discrete modes, from the head's initialisation and no cloning) says ``neutral
    start``, except in ``tune`` and ``knob`` modes, whose zero action runs the recipe's base policy; a ``meta`` run names its candidates (``maskable-ppo meta over sarathi/vtc, neutral start,
    1.2M steps``); a routing run says ``maskable-ppo route, prior prefix_hit=2,queued_spread=1,kv_free=1,
300k steps`` or ``maskable-ppo route, neutral start, ...``. The run folder's name when ``run.json`` is
missing. ``best_at``: the label of the run's best model, saved at that many steps (``..., best model at
36.9k of 851k steps``)."""
    if not meta:
        return f"{folder} (untrained start)" if start else folder
    def size(steps: int) -> str:
        return f"{steps / 1e6:.3g}M" if steps >= 1_000_000 else f"{steps / 1e3:.3g}k" if steps >= 1000 else str(steps)

    total = int(meta.get("timesteps") or 0)
    trained = ("untrained start" if start else f"best model at {size(best_at)} of {size(total)} steps"
               if best_at is not None else f"{size(total)} steps")
    bc = (meta.get("bc") or {}).get("policy")
    if isinstance(bc, dict):
        bc = bc.get("name", "") + ":" + ",".join(f"{k}={v}" for k, v in bc.items() if k != "name")
    env_kwargs = meta.get("env_kwargs") or {}
    mode = env_kwargs.get("action_mode", "select")
    hyper = meta.get("hyperparams") or {}
    if meta.get("routing"):  # LLMSchedCluster-v0: the replica of each request, from a router's weights or neutral
        prior = {k: v for k, v in (hyper.get("route_prior") or {}).items() if k != "scale" and v}
        how = "prior " + ",".join(f"{k}={v:g}" for k, v in prior.items()) if prior else "neutral start"
        return f"{meta.get('algo', 'agent')} route, {how}, {trained}"
    if mode == "tune":  # what the agent sets at every decision
        knobs = env_kwargs.get("tune") or {"chunk_size": (), "max_num_seqs": ()}
        base = env_kwargs.get("base", "sarathi")
        structure = f"tune: {base if isinstance(base, str) else base.get('name')} {'+'.join(knobs)}"
    elif mode == "meta" and env_kwargs.get("candidates"):  # the policies the agent switches between
        names = [c if isinstance(c, str) else c.get("name", "?") for c in env_kwargs["candidates"]]
        structure = f"meta over {'/'.join(names)}"
    else:
        structure = mode + (f"/{env_kwargs['order']}-order" if env_kwargs.get("order") else "")
        if env_kwargs.get("budget"):
            structure += f" budget {env_kwargs['budget']}"
    bias = hyper.get("action_bias")
    # no prior, no clone: zero scores, or a discrete head (select, subset, meta) at its initialisation;
    # never tune or knob, whose zero action runs their base policy (a structure chosen by the recipe)
    neutral = not bc and mode not in ("tune", "knob") and (
        not np.any(np.asarray(bias, dtype=float)) if bias is not None else mode in ("select", "subset", "meta"))
    parts = [structure, f"bc: {bc}" if bc else "", "neutral start" if neutral else "", trained]
    return f"{meta.get('algo', 'agent')} " + ", ".join(p for p in parts if p)


def vecnormalize_path(model_path: Path) -> Path:
    """``model.zip`` -> ``vecnormalize.pkl``; ``best_model.zip`` -> ``best_vecnormalize.pkl``;
    ``model_N_steps.zip`` -> ``model_vecnormalize_N_steps.pkl`` (SB3's checkpoint naming)."""
    m = re.fullmatch(r"(.*)_(\d+)_steps", model_path.stem)
    if m:
        return model_path.with_name(f"{m.group(1)}_vecnormalize_{m.group(2)}_steps.pkl")
    return model_path.with_name(model_path.stem.replace("model", "vecnormalize") + ".pkl")


def run_episode(agent: Agent, env: Any, seed: int, deterministic: bool = True
                ) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Play one whole episode on workload ``seed``; returns (summary, requests, iterations)."""
    from llmsched_gym.core.records import request_table

    base = env.unwrapped
    obs, info = env.reset(seed=seed)
    done = False
    while not done:
        mask = base.action_masks() if agent.uses_mask() else None
        action = agent.act(obs, mask, deterministic)
        obs, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    summary = dict(info["summary"])
    engine = getattr(base, "engine", None)
    requests = request_table(engine) if engine is not None else {}
    iterations = engine.iteration_log() if engine is not None else {}
    return summary, requests, iterations
