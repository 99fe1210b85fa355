"""Train a PPO agent on ``LLMSched-v1`` (``llmsched train``), top to bottom:

1. settings: :class:`TrainConfig` (command line) over the scenario's entry of
   ``agents/hyperparams/{maskable_ppo,ppo}.yml`` (rl-zoo layout);
2. vectorised envs (the native vector env, ``DummyVecEnv`` or ``SubprocVecEnv``: ``--vec``) on training workloads whose seeds are
   disjoint from the validation workload (seed 99) and the default held-out test seeds (100-104);
   ``VecNormalize`` on the ``running`` and ``globals`` observations and on the reward;
3. the model: ``MaskablePPO`` (``select``/``subset``) or ``PPO`` (``priority``/``knob``) with the
   :class:`~agents.features.QueueSetExtractor`, or a checkpoint to resume;
4. optional behaviour cloning (``--bc-from POLICY``) on demonstrations from ``env.expert_action``;
5. ``learn`` with checkpoints, TensorBoard scalars, the validation score against every baseline
   (best model kept) and a progress bar; ``model`` + ``run.json``.

Outputs in ``runs/train/NAME/``, every model as a ``.json`` + ``.safetensors`` pair
(:mod:`agents.storage`: loads without unpickling, normalisation statistics included): ``model``,
``best_model``, ``checkpoints/model_N_steps``, ``tb/`` (TensorBoard) and ``run.json`` (settings,
seeds, baselines, final scores, wall time).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agents.agent import Agent, load_agent, run_episode
from agents.envs import is_routing, make_env
from agents.storage import (
    AgentFileError,
    algo_class,
    build_model,
    is_maskable,
    read_agent_file,
    restore_vecnormalize,
    save_agent,
    with_optimizer,
)
from llmsched_gym.config import (
    BEHAVIOUR_CLONING,
    HYPERPARAMS,
    ConfigError,
    check_hyperparams,
    load_yaml,
    parse_value,
    run_folder,
    safe_run_name,
)

HYPERPARAMS_DIR = Path(__file__).parent / "hyperparams"
VALIDATION_SEED = 99
TRAIN_SEED_BASE = 1000
PPO_KEYS = ("n_steps", "batch_size", "n_epochs", "gamma", "gae_lambda", "learning_rate", "ent_coef",
            "clip_range", "vf_coef", "max_grad_norm")


@dataclass
class TrainConfig:
    """What ``llmsched train`` takes; ``None`` means "from the hyperparameter file".

    :param env_kwargs: env settings over the file's (``action_mode``, ``admission``, ``K``, ...).
    :param overrides: scenario ``--set`` overrides over the file's ``env_kwargs.overrides``.
    :param hyperparams: ``--hp key=value`` over the file's entry (``n_steps``, ``learning_rate``...).
    :param bc_from: a baseline (name, or ``{"name": ..., **params}``) whose ``expert_action``
        demonstrations pre-train the policy; ``None``: the file's ``bc`` entry; ``"none"``: no cloning.
    :param bc_episodes: demonstration episodes (default: the file's, else 4).
    :param bc_epochs: cloning epochs over them (default: the file's, else 10).
    :param resume: a checkpoint (``.json``/``.safetensors``) or run folder to continue from.
    :param trust_model: allow ``resume`` to be an SB3 ``.zip`` (unpickled: it can run code).
    :param validation_requests: requests of the validation workload (default: the file's
        ``validation_requests``, else the training episodes' size); score checkpoints on the size
        the agent is tested on.
    :param score_every: rollouts between validation scores against the baselines (0 = never).
    :param max_minutes: stop learning after this much wall time since the start (``None``: no limit).
    """

    scenario: str = "jaillet-low"
    name: str | None = None
    out: str = "runs/train"
    algo: str | None = None
    timesteps: int | None = None
    seed: int = 0
    n_envs: int | None = None
    vec: str = "native"
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    hyperparams: dict[str, Any] = field(default_factory=dict)
    hyperparams_file: str | None = None
    bc_from: str | dict[str, Any] | None = None
    bc_episodes: int | None = None
    bc_epochs: int | None = None
    resume: str | None = None
    trust_model: bool = False
    checkpoint_every: int = 10_000
    score_every: int = 1
    validation_requests: int | None = None
    progress: bool = True
    torch_threads: int = 1
    max_minutes: float | None = None


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def parse_policy_spec(spec: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """A baseline for cloning: ``NAME``, ``NAME:key=value,key=value`` or ``{"name": ..., **params}``
    (checked by ``baselines.validate_spec``: an unknown name, parameter or value is a PolicyError);
    ``None`` or ``"none"``: no cloning."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "none"):
        return None
    from baselines import validate_spec

    return validate_spec(spec, "bc.from")


@dataclass(frozen=True)
class LinearSchedule:
    """``start`` times SB3's ``progress_remaining`` (1 at the start of ``learn``, 0 at its end)."""

    start: float

    def __call__(self, progress_remaining: float) -> float:
        return self.start * progress_remaining


def schedule(value: float | str) -> float | LinearSchedule:
    """A resolved hyperparameter for SB3: the number, or a :class:`LinearSchedule` for ``lin_X``."""
    return LinearSchedule(float(value[4:])) if isinstance(value, str) else value


def default_algo(action_mode: str) -> str:
    return "ppo" if action_mode in ("priority", "knob", "tune") else "maskable-ppo"


ROUTING_FILE = "routing.yml"
"""The hyperparameter file of routing scenarios (``LLMSchedCluster-v0``) when no ``--hyperparams`` is given."""
SCHEDULING_ENV_KEYS = ("action_mode", "admission", "K", "order")
"""``llmsched train``'s ``LLMSched-v1`` settings, which a routing scenario's env does not take."""


def hyperparams_path(algo: str, path: str | None = None, routing: bool = False) -> Path:
    """The hyperparameter file: ``path`` (``--hyperparams``), else ``agents/hyperparams/ALGO.yml``
    (``routing.yml`` for a routing scenario)."""
    if path:
        return Path(path)
    return HYPERPARAMS_DIR / (ROUTING_FILE if routing else f"{algo.replace('-', '_')}.yml")


def load_hyperparams(scenario: str, algo: str, path: str | None = None, routing: bool = False) -> dict[str, Any]:
    """The ``default`` entry of the algorithm's YAML with the scenario's entry merged over it; every
    entry is checked against :data:`llmsched_gym.config.HYPERPARAMS` (one-line ConfigError)."""
    p = hyperparams_path(algo, path, routing)
    table = load_yaml(p, "hyperparams")
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise ConfigError(f"hyperparams: {p}: expected a mapping of scenario names (and default) to entries, "
                          f"got a {type(table).__name__}")
    for key, entry in table.items():
        check_hyperparams(entry, f"hyperparams: {p}: {key}")
    return _merge(table.get("default") or {}, table.get(scenario) or {})


def resolve(cfg: TrainConfig) -> dict[str, Any]:
    """The effective hyperparameters: file entry, then the command line's values. A routing
    scenario (:func:`agents.envs.is_routing`) trains MaskablePPO on ``LLMSchedCluster-v0`` from
    ``routing.yml`` (``hp["routing"]`` is then True)."""
    routing = is_routing(cfg.scenario, cfg.overrides)
    mode = cfg.env_kwargs.get("action_mode")
    if routing:
        given = [k for k in SCHEDULING_ENV_KEYS if cfg.env_kwargs.get(k) is not None]
        if given:
            raise ConfigError(f"{given[0]}: {cfg.scenario} declares a cluster, so its agent routes (LLMSchedCluster-v0: "
                              "the action is the replica of each request); drop --" + given[0].replace("_", "-"))
        if cfg.algo not in (None, "maskable-ppo"):
            raise ConfigError(f"algo: a routing agent is trained with maskable-ppo (its action mask: the replicas "
                              f"that can take the request), got {cfg.algo!r}")
        algo = "maskable-ppo"
        hp = load_hyperparams(cfg.scenario, algo, cfg.hyperparams_file, routing=True)
    else:
        algo = cfg.algo or default_algo(mode or "select")
        hp = load_hyperparams(cfg.scenario, algo, cfg.hyperparams_file)
        mode = mode or hp.get("env_kwargs", {}).get("action_mode", "select")
        if cfg.algo is None and default_algo(mode) != algo:  # the file's mode decides when none was given
            algo = default_algo(mode)
            hp = load_hyperparams(cfg.scenario, algo, cfg.hyperparams_file)
        if algo == "maskable-ppo" and mode not in ("select", "subset", "meta"):
            raise ConfigError(f"algo: maskable-ppo needs action_mode select, subset or meta, got {mode!r} (use --algo ppo)")
    # programmatic values may be strings, as on the command line (--hp learning_rate=3e-5)
    over = {k: parse_value(v) if isinstance(v, str) else v for k, v in cfg.hyperparams.items()}
    hp = check_hyperparams(_merge(hp, over))
    hp["env_kwargs"] = _merge(hp.get("env_kwargs", {}), {k: v for k, v in cfg.env_kwargs.items() if v is not None})
    hp["env_kwargs"]["overrides"] = {**hp["env_kwargs"].get("overrides", {}), **cfg.overrides}
    if cfg.timesteps is not None:
        hp["n_timesteps"] = HYPERPARAMS["n_timesteps"].check("--timesteps", cfg.timesteps)
    if cfg.n_envs is not None:
        hp["n_envs"] = HYPERPARAMS["n_envs"].check("--n-envs", cfg.n_envs)
    if cfg.validation_requests is not None:
        hp["validation_requests"] = HYPERPARAMS["validation_requests"].check("--validation-requests",
                                                                            cfg.validation_requests)
    hp["algo"] = algo
    hp["routing"] = routing
    bc = dict(hp.pop("bc", None) or {})
    source = parse_policy_spec(cfg.bc_from if cfg.bc_from is not None else bc.get("from"))
    if routing and source is not None:
        raise ConfigError("bc.from: behaviour cloning clones LLMSched-v1's scheduling policies; a routing agent "
                          "starts from its recipe's route_prior (a router's weights) or from neutral")
    if not routing and "route_prior" in hp:
        raise ConfigError(f"route_prior: only for routing scenarios (a declared cluster); {cfg.scenario} has one engine")
    episodes = cfg.bc_episodes if cfg.bc_episodes is not None else bc.get("episodes", 4)
    epochs = cfg.bc_epochs if cfg.bc_epochs is not None else bc.get("epochs", 10)
    hp["bc"] = {"from": source, "episodes": BEHAVIOUR_CLONING["episodes"].check("--bc-episodes", episodes),
                "epochs": BEHAVIOUR_CLONING["epochs"].check("--bc-epochs", epochs)}
    return hp


def recipe(cfg: TrainConfig, hp: dict[str, Any]) -> dict[str, Any]:
    """Which recipe :func:`resolve` chose, and why (printed by ``llmsched train``, kept in ``run.json``).

    The rule: every setting comes from the command line if given there, else from the scenario's
    entry of the hyperparameter file, else from that file's ``default`` entry. The file is
    ``--hyperparams``, else the algorithm's (``maskable_ppo.yml`` for MaskablePPO, ``ppo.yml`` for
    PPO). The algorithm is ``--algo``, else the action mode's (PPO for ``priority``/``knob``/``tune``,
    which sb3-contrib cannot mask, MaskablePPO otherwise); the action mode is ``--action-mode``, else
    ``maskable_ppo.yml``'s entry, and when that entry names a PPO mode, ``ppo.yml``'s entry applies.
    """
    path = hyperparams_path(hp["algo"], cfg.hyperparams_file, hp.get("routing", False))
    table = load_yaml(path, "hyperparams") or {}
    entry = cfg.scenario if cfg.scenario in table else "default"
    try:
        shown = str(path.resolve().relative_to(HYPERPARAMS_DIR.parent.parent))
    except ValueError:
        shown = str(path)
    env = hp["env_kwargs"]
    own_env = ((table.get(entry) or {}).get("env_kwargs") or {}) if isinstance(table, dict) else {}
    teacher = hp["bc"]["from"]
    return {
        "file": shown, "entry": entry, "algo": hp["algo"],
        "algo_from": "--algo" if cfg.algo else "routing" if hp.get("routing") else "the action mode",
        "action_mode": "route" if hp.get("routing") else env.get("action_mode", "select"),
        "action_mode_from": "the scenario's cluster" if hp.get("routing") else
                            "--action-mode" if cfg.env_kwargs.get("action_mode") else
                            f"the file's {entry if 'action_mode' in own_env else 'default'} entry",
        "timesteps": int(hp["n_timesteps"]), "n_envs": int(hp.get("n_envs", 1)),
        "bc_from": teacher if teacher is None or isinstance(teacher, str) else dict(teacher),
    }


def recipe_line(r: dict[str, Any]) -> str:
    """The line ``llmsched train`` prints: ``recipe: agents/hyperparams/ppo.yml, entry azure-conv (over
    default): ppo (from the action mode), action mode priority (from --action-mode), 2,000,000 steps,
    2 envs``."""
    entry = r["entry"] if r["entry"] == "default" else f"{r['entry']} (over default)"
    bc = r["bc_from"] if isinstance(r["bc_from"], str) or r["bc_from"] is None else r["bc_from"]["name"]
    return (f"recipe: {r['file']}, entry {entry}: {r['algo']} (from {r['algo_from']}), action mode "
            f"{r['action_mode']} (from {r['action_mode_from']}), {r['timesteps']:,} steps, {r['n_envs']} env{'s' * (r['n_envs'] != 1)}"
            + (f", behaviour cloning of {bc}" if bc else ""))


class _TrainingWorkloads:
    """Env factory for worker ``rank``: episode ``j`` of worker ``r`` of ``n`` uses workload seed
    ``base + r + n j``, whatever seed SB3 passes, so training never sees the held-out seeds; in
    SB3's ``Monitor`` for the episode statistics."""

    def __init__(self, scenario: str, env_kwargs: dict, rank: int, n_envs: int, base: int) -> None:
        self.scenario, self.env_kwargs, self.rank, self.n_envs, self.base = scenario, env_kwargs, rank, n_envs, base

    def __call__(self):
        import gymnasium as gym

        scenario, env_kwargs, rank, n_envs, base = self.scenario, self.env_kwargs, self.rank, self.n_envs, self.base

        class SeedSequenceWrapper(gym.Wrapper):
            def __init__(self, env) -> None:
                super().__init__(env)
                self.episode = 0

            def reset(self, *, seed=None, options=None):
                s = base + rank + n_envs * self.episode
                self.episode += 1
                return self.env.reset(seed=s, options=options)

            def action_masks(self) -> np.ndarray:
                return self.env.unwrapped.action_masks()

        from stable_baselines3.common.monitor import Monitor

        # Monitor writes info["episode"], which SB3 logs as rollout/ep_rew_mean
        return Monitor(SeedSequenceWrapper(make_env(scenario, env_kwargs)))


VEC_KINDS = ("native", "dummy", "subproc")
"""``--vec``: the native vector env (:class:`agents.vec.NativeVecEnv`, the default), SB3's
``DummyVecEnv`` or ``SubprocVecEnv`` over ``Monitor``-wrapped single envs. All three give the same
observations, rewards and episode boundaries (the native one is tested bit for bit against
``dummy``)."""


@dataclass(frozen=True)
class EpisodeSeeds:
    """Workload seed of episode ``j`` of env ``rank``: ``base + rank + n_envs j``."""

    base: int
    n_envs: int

    def __call__(self, rank: int, episode: int) -> int:
        return self.base + rank + self.n_envs * episode


def training_venv(vec: str, scenario: str, env_kwargs: dict, n_envs: int, base: int) -> Any:
    """The training envs (SB3 ``VecEnv``): ``n_envs`` simulations on the training workloads
    (:class:`EpisodeSeeds` from ``base``), ``vec`` one of :data:`VEC_KINDS`."""
    if vec == "native":
        from agents.vec import NativeVecEnv

        return NativeVecEnv(scenario, env_kwargs, n_envs, episode_seeds=EpisodeSeeds(base, n_envs))
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    fns = [_TrainingWorkloads(scenario, env_kwargs, r, n_envs, base) for r in range(n_envs)]
    return SubprocVecEnv(fns) if vec == "subproc" else DummyVecEnv(fns)


MAX_INEXPRESSIBLE = 0.01
"""Behaviour cloning refuses a teacher with more inexpressible plans than this fraction."""


def collect_demonstrations(scenario: str, env_kwargs: dict, policy: str | dict, episodes: int, seed_base: int
                           ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, dict[str, float]]:
    """Observations, masks and actions of ``policy`` driving the env through ``expert_action``
    (attached as the env's expert, so policies with engine hooks work too)."""
    env = make_env(scenario, {**env_kwargs, "expert": policy})
    base = env.unwrapped
    obs_l: list[dict] = []
    masks: list[np.ndarray] = []
    acts: list[Any] = []
    e2e: list[float] = []
    inexpressible, first_reason = 0, ""
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed_base + ep)
        done = False
        while not done:
            # a plan the action mode cannot express (e.g. a request beyond the K slots) becomes
            # the launch action; more than MAX_INEXPRESSIBLE of them and the teacher is refused
            try:
                a = base.expert_action(strict=True)
            except ValueError as err:
                inexpressible += 1
                first_reason = first_reason or str(err)
                a = base.fallback_action()
            obs_l.append(obs)
            masks.append(base.action_masks())
            acts.append(a)
            obs, _, term, trunc, info = env.step(a)
            done = term or trunc
        e2e.append(info["summary"]["serving"]["mean_e2el_ms"])
    env.close()
    frac = inexpressible / max(len(acts), 1)
    if frac > MAX_INEXPRESSIBLE:
        name = policy if isinstance(policy, str) else policy.get("name")
        raise ValueError(f"bc.from: {name} cannot be cloned in action_mode={env_kwargs.get('action_mode', 'select')!r}: "
                         f"{inexpressible} of {len(acts)} plans ({frac:.1%}) are inexpressible, more than "
                         f"{MAX_INEXPRESSIBLE:.0%}; first: {first_reason}")
    obs_arr = {k: np.stack([o[k] for o in obs_l]) for k in obs_l[0]}
    return obs_arr, np.stack(masks), np.asarray(acts), {"expert_mean_e2el_ms": float(np.mean(e2e)), "steps": len(acts),
                                                          "inexpressible_frac": frac}


def set_action_bias(model: Any, value: float | list[float]) -> None:
    """Start a ``Box`` policy's mean action exactly at ``value`` (``action_bias`` in the hyperparameter
    file): a number for every dimension, or a list with one number per dimension, each in [-1, 1].

    The action layer's weights are zeroed and its bias set, so the initial mean action is ``value``
    whatever the observation (its weights still get gradients: PPO moves off it from the first
    update). In ``priority`` mode a decreasing list such as ``[0.9, 0.85, ..., 0.15]`` admits every
    visible request in slot order (with ``order: shortest``, shortest first) with margins that the
    first updates do not reshuffle; equal scores would keep slot order too, but any small change of
    the weights would reorder them arbitrarily."""
    import torch
    from gymnasium import spaces

    if not isinstance(model.action_space, spaces.Box):
        raise ValueError(f"action_bias: only for Box action spaces (priority, knob, tune), not {model.action_space}")
    dims = int(np.prod(model.action_space.shape))
    try:
        bias = np.full(dims, float(value)) if np.ndim(value) == 0 else np.array(value, dtype=float)
    except (TypeError, ValueError):
        bias = np.array([np.nan])
    if bias.shape != (dims,) or not np.all(np.abs(bias) <= 1.0):
        raise ValueError(f"action_bias: expected a number or {dims} numbers, each in [-1, 1], got {value!r}")
    with torch.no_grad():
        model.policy.action_net.weight.zero_()
        model.policy.action_net.bias.copy_(torch.as_tensor(bias, dtype=model.policy.action_net.bias.dtype))


def behaviour_clone(model: Any, vecnorm: Any, obs: dict[str, np.ndarray], masks: np.ndarray, actions: np.ndarray,
                    epochs: int, batch_size: int = 256, seed: int = 0) -> dict[str, float]:
    """Pre-train the policy by cross-entropy on the masked action distribution
    (``get_distribution(obs, action_masks).log_prob``); returns the final loss and accuracy."""
    import torch

    for key in vecnorm.norm_obs_keys or []:
        vecnorm.obs_rms[key].update(obs[key])
    norm = vecnorm.normalize_obs(obs)
    policy = model.policy
    from agents.optim import Adam

    opt = Adam(policy.parameters(), lr=1e-3)
    rng = np.random.default_rng(seed)
    n = len(actions)
    maskable = is_maskable(model)
    loss_v = acc = math.nan
    policy.set_training_mode(True)
    for _ in range(epochs):
        order = rng.permutation(n)
        for i in range(0, n, batch_size):
            idx = order[i:i + batch_size]
            obs_t, _ = policy.obs_to_tensor({k: v[idx] for k, v in norm.items()})
            act_t = torch.as_tensor(actions[idx], device=policy.device)
            dist = policy.get_distribution(obs_t, action_masks=masks[idx]) if maskable else policy.get_distribution(obs_t)
            loss = -dist.log_prob(act_t).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_v = float(loss.item())
    policy.set_training_mode(False)
    if maskable and actions.ndim == 1:
        with torch.no_grad():
            obs_t, _ = policy.obs_to_tensor(norm)
            pred = policy.get_distribution(obs_t, action_masks=masks).get_actions(deterministic=True).cpu().numpy()
        acc = float(np.mean(pred == actions))
    return {"bc_loss": loss_v, "bc_accuracy": acc, "bc_samples": n}


def validation_baselines(scenario: str, overrides: dict[str, Any]) -> dict[str, dict]:
    """Summaries of every applicable baseline on the validation workload (seed 99)."""
    from agents.report import run_baselines
    from baselines import available

    records, _ = run_baselines(scenario, available(), [VALIDATION_SEED], [1.0], overrides)
    return {r.policy: r.summary for r in records}


def route_baselines(scenario: str, overrides: dict[str, Any]) -> dict[str, dict]:
    """Routing: the summaries of every router (:data:`baselines.routers.ROUTERS`, each at its
    defaults) in front of the scenario's cluster on the validation workload (seed 99)."""
    from baselines.routers import ROUTERS
    from llmsched_gym.cluster_sim import simulate_cluster

    return {r: simulate_cluster(scenario, router=r, seed=VALIDATION_SEED, overrides=overrides).summary for r in ROUTERS}


def workload_line(scenario: str | dict, overrides: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """What the training workloads are on this machine: the line ``llmsched train`` prints, and
    ``run.json``'s ``workload`` (``title``, ``workload_source``, ``synthetic``). When the scenario's
    real trace is missing and a synthetic stand-in replaces it, the line says so in capitals (a run
    on a stand-in is not comparable with the leaderboard's figures)."""
    from llmsched_gym.data import synthetic_note
    from llmsched_gym.sim import what_runs

    # a cluster's replicas run the scenario's engine on its requests: describe those
    w = what_runs(scenario, {**overrides, "cluster": {}} if is_routing(scenario, overrides) else overrides)
    src = w["workload_source"]
    synthetic = src.get("kind") == "synthetic"
    line = f"workload: {w['title']}"
    if synthetic:
        line = (f"WARNING: SYNTHETIC STAND-IN: {w['title']}: the real trace is missing, so this run trains and is "
                f"scored on generated requests (`llmsched data download {src['name']}` fetches the real one)")
    elif synthetic_note(src):
        line = f"WARNING: {w['title']}"
    return line, {"title": w["title"], "workload_source": src, "synthetic": synthetic}


def _run_dir(cfg: TrainConfig, env_kwargs: dict[str, Any]) -> tuple[str, Path]:
    """The run's name and folder ``OUT/NAME`` (with ``checkpoints/``); with links followed it must
    stay inside OUT (a default name is made safe, a given one checked)."""
    name = cfg.name or safe_run_name(f"{cfg.scenario}-{env_kwargs.get('action_mode', 'select')}-s{cfg.seed}")
    run_dir = run_folder(cfg.out, name, "--name")
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    return name, run_dir


def _training_envs(cfg: TrainConfig, hp: dict[str, Any], n_envs: int, base: int) -> tuple[Any, dict[str, Any]]:
    """``(envs, extra PPO arguments)``: :func:`training_venv`, or for a recipe with
    ``input_baseline`` the envs in groups sharing workloads and the rollout buffer that uses them
    (:mod:`agents.input_baseline`)."""
    if hp.get("input_baseline"):
        from agents.input_baseline import input_baseline_setup

        return input_baseline_setup(hp["input_baseline"], cfg.vec, cfg.scenario, hp["env_kwargs"], n_envs, base,
                                    hp["algo"] == "maskable-ppo")
    vec = "dummy" if hp.get("routing") and cfg.vec == "native" else cfg.vec  # the native vector env is LLMSched-v1's
    return training_venv(vec, cfg.scenario, hp["env_kwargs"], n_envs, base), {}


def _model(cfg: TrainConfig, hp: dict[str, Any], venv: Any, run_dir: Path,
           extra: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """``(model, venv)``: a new model on ``venv`` wrapped in ``VecNormalize``, or the one
    ``cfg.resume`` names with its normalisation statistics; ``extra``: more PPO arguments."""
    from stable_baselines3.common.vec_env import VecNormalize

    from agents.features import QueueSetExtractor

    norm_kw = dict(hp.get("normalize") or {})
    gamma = float(hp.get("gamma", 0.99))
    cls = algo_class(hp["algo"])
    ppo_kw = {**{k: schedule(hp[k]) for k in PPO_KEYS if k in hp}, **(extra or {})}
    if cfg.resume:
        rp = Path(cfg.resume)
        if rp.suffix == ".zip":
            old = load_agent(rp, trust_model=cfg.trust_model)  # refused without trust_model
            venv = VecNormalize(venv, gamma=gamma, **norm_kw)
            if old.vecnorm is not None:
                venv.obs_rms, venv.ret_rms = old.vecnorm.obs_rms, old.vecnorm.ret_rms
            model = old.model
            model.set_env(venv)
            model.tensorboard_log = str(run_dir / "tb")
            return model, venv
        stem = rp / "model" if rp.is_dir() else rp.with_suffix("")
        if not stem.with_suffix(".json").exists():
            raise AgentFileError(f"resume: {stem.with_suffix('.json')} does not exist")
        saved, tensors = read_agent_file(stem)
        stats = saved.get("vecnormalize")
        venv = (restore_vecnormalize(stats, venv, training=True) if stats
                else VecNormalize(venv, gamma=gamma, **norm_kw))
        model = build_model(saved, tensors, env=venv, hyperparams=ppo_kw, tensorboard_log=str(run_dir / "tb"))
        if hp.get("routing"):
            from agents.heads import freeze_replica_head

            freeze_replica_head(model)
        return model, venv
    venv = VecNormalize(venv, gamma=gamma, **norm_kw)
    pk = dict(hp.get("policy_kwargs") or {})
    if hp.get("routing"):  # one function scores every replica (agents/features.py ReplicaScorer)
        from agents.features import ReplicaScorer

        extractor, keys = ReplicaScorer, ("hidden",)
    else:
        extractor, keys = QueueSetExtractor, ("slot_hidden", "context_hidden", "slot_out")
    policy_kwargs = with_optimizer({
        "features_extractor_class": extractor,
        "features_extractor_kwargs": {k: tuple(pk.pop(k)) if isinstance(pk.get(k), list) else pk.pop(k)
                                      for k in keys if k in pk},
        **pk,
    })
    model = cls(hp.get("policy", "MultiInputPolicy"), venv, seed=cfg.seed, device="cpu", verbose=0,
                tensorboard_log=str(run_dir / "tb"), policy_kwargs=policy_kwargs, **ppo_kw)
    if hp.get("routing"):
        from agents.heads import replica_head

        try:
            replica_head(model, hp.get("route_prior"))
        except ValueError as err:
            raise ConfigError(str(err)) from None
    if "action_bias" in hp:
        set_action_bias(model, hp["action_bias"])
    if hp.get("slot_head"):
        from agents.heads import slot_score_head

        slot_score_head(model)
    return model, venv


def _warm_start(cfg: TrainConfig, hp: dict[str, Any], model: Any, venv: Any, seed: int) -> dict[str, Any]:
    """Behaviour cloning of the recipe's teacher (``bc.from``) on demonstrations from workload
    seeds ``seed..``, before learning (not on a resumed run); what it did, for ``run.json``."""
    bc_cfg = hp["bc"]
    if not bc_cfg["from"] or cfg.resume:
        return {}
    t_bc = time.perf_counter()
    obs, masks, acts, info = collect_demonstrations(cfg.scenario, hp["env_kwargs"], bc_cfg["from"],
                                                    bc_cfg["episodes"], seed)
    bc = {"policy": bc_cfg["from"], **info, **behaviour_clone(model, venv, obs, masks, acts, bc_cfg["epochs"],
                                                               seed=cfg.seed)}
    bc["bc_seconds"] = time.perf_counter() - t_bc
    if cfg.progress:
        teacher = bc_cfg["from"] if isinstance(bc_cfg["from"], str) else bc_cfg["from"].get("name")
        print(f"      behaviour cloning of {teacher}: {bc['bc_samples']} steps from {bc_cfg['episodes']} episodes, "
              f"{bc_cfg['epochs']} epochs, accuracy {bc['bc_accuracy']:.3f}, {bc['bc_seconds']:.0f}s", flush=True)
    return bc


def _callbacks(cfg: TrainConfig, bc: dict[str, Any], evaluate: Callable[[Any], dict], save: Callable[[str], None],
               baselines: dict[str, Any], t0: float, tgt: Any = None) -> tuple[list[Any], Any, Any, Any]:
    """The callbacks of ``model.learn``: ``(all of them, the summary scalars, the validation
    scores or None, the wall-clock limit or None)``; ``tgt`` (:class:`agents.curves.Target`): the
    metric that picks ``best_model`` (default: the mean E2EL)."""
    from agents.callbacks import (
        BaselineScoreCallback,
        Checkpoints,
        RichProgressCallback,
        SummaryScalarsCallback,
        WallClockLimit,
    )

    summaries = SummaryScalarsCallback(bc)
    callbacks: list[Any] = [summaries, Checkpoints(cfg.checkpoint_every, save)]
    score = None
    if cfg.score_every:
        metric = {"metric": tgt.metric, "lower_is_better": tgt.lower_is_better} if tgt is not None else {}
        score = BaselineScoreCallback(evaluate, baselines, cfg.score_every, save=save, **metric)
        callbacks.append(score)
    limit = None
    if cfg.max_minutes is not None:
        if cfg.max_minutes <= 0:
            raise ConfigError(f"max_minutes: must be > 0, got {cfg.max_minutes!r}")
        limit = WallClockLimit(cfg.max_minutes, start=t0)
        callbacks.append(limit)
    if cfg.progress:
        callbacks.append(RichProgressCallback(score))
    return callbacks, summaries, score, limit


def _validation(baselines: dict[str, Any], final: dict[str, Any], score: Any) -> dict[str, Any]:
    """``run.json``'s ``validation``: the baselines' and the final agent's scores on the validation
    workload, and the best the agent reached relative to the best baseline (on the mean E2EL and on
    the task's metric, which chose ``best_model``)."""
    def brief(s: dict[str, Any]) -> dict[str, Any]:
        return {"mean_e2el_ms": s["serving"]["mean_e2el_ms"], "p99_ttft_ms": s["serving"]["p99_ttft_ms"],
                "completed": s["n_completed"], "arrived": s["n_arrived"]}

    return {
        "baselines": {k: brief(v) for k, v in baselines.items()},
        "final_agent": brief(final) if final else {},
        "best_rel_mean_e2el_vs_best": score.best_rel_e2el if score is not None else None,
        "selection": {"metric": score.metric, "lower_is_better": score.lower_is_better,
                      "best_baseline": score.best_task, "best_rel_vs_best": score.best_rel} if score is not None else None,
        "last_scores": score.last if score is not None else {},
    }


def _start_meta(cfg: TrainConfig, hp: dict[str, Any], chosen: Any, name: str, n_envs: int, base: int,
                bc: dict[str, Any]) -> dict[str, Any]:
    """``run.json`` as training starts: the settings and seeds (so that the checkpoints of an
    interrupted run can be evaluated)."""
    env_kwargs = hp["env_kwargs"]
    return {
        "name": name, "scenario": cfg.scenario, "algo": hp["algo"], "recipe": chosen, "config": asdict(cfg),
        "hyperparams": hp, "env_kwargs": env_kwargs, "overrides": env_kwargs.get("overrides", {}),
        "seeds": {"model": cfg.seed, "train_workloads": f"{base} + rank + n_envs * episode",
                  "validation_workload": VALIDATION_SEED, "bc_workloads": f"{base + 500}.." if bc else None},
        "n_envs": n_envs, "vec": "dummy" if hp.get("routing") and cfg.vec == "native" else cfg.vec, "bc": bc,
        "routing": bool(hp.get("routing")), "status": "training",
    }


def _validation_setup(cfg: TrainConfig, hp: dict[str, Any], run_dir: Path, curves: Any) -> tuple[dict, Any, Any, Any]:
    """``(baselines, env, curve, target)`` of the validation workload (seed ``VALIDATION_SEED``; a
    recipe's benchmark task gives its metric and workload): the baselines' summaries (none when
    ``score_every`` is 0), the env the agent is scored on, the learning curve (or None) and the
    :class:`agents.curves.Target` (what is measured, and what picks ``best_model``)."""
    from agents.curves import HINDSIGHT_SIMS, CurveSetup, LearningCurve, target

    env_kwargs = hp["env_kwargs"]
    val_over = dict(env_kwargs.get("overrides", {}))
    if hp.get("validation_requests"):
        val_over["workload.n_requests"] = int(hp["validation_requests"])
    curves = curves or CurveSetup()
    tgt = target(hp.get("task"), val_over, curves.tasks)  # a recipe's benchmark task: its metric and workload
    val_over = tgt.overrides
    routing = bool(hp.get("routing"))
    baselines = ((route_baselines if routing else validation_baselines)(cfg.scenario, val_over)
                 if cfg.score_every else {})
    val_env = make_env(cfg.scenario, {**env_kwargs, "overrides": val_over})
    curve = LearningCurve.for_run(run_dir, cfg.scenario, tgt, VALIDATION_SEED, val_env.unwrapped.information, baselines,
                                  (hp.get("curves") or {}).get("hindsight_sims", HINDSIGHT_SIMS),
                                  hindsight=curves.route_hindsight if routing else curves.hindsight,
                                  routing=routing) if cfg.score_every else None
    return baselines, val_env, curve, tgt


@contextlib.contextmanager
def _unchecked_distributions(off: bool) -> Iterator[None]:
    """``torch.distributions`` without its argument checks while the block runs (``off``), then
    as before. sb3-contrib's masked heads build a categorical distribution per action dimension
    and per forward pass, twice (masking rebuilds it), each checking its logits: a fifth to a
    third of the CPU time of learning in ``subset`` mode (2K dimensions), 5-25% in ``select`` and
    ``meta``. The checks change no value; a NaN in the logits still stops training at the next
    sample (``torch.multinomial`` refuses it). The Gaussian heads (``priority``, ``knob``, ``tune``)
    keep them: there a NaN would only become an invalid action."""
    import torch

    dist = torch.distributions.Distribution
    before = getattr(dist, "_validate_args", True)
    if off:
        dist.set_default_validate_args(False)
    try:
        yield
    finally:
        dist.set_default_validate_args(before)


def train(cfg: TrainConfig, curves: Any = None) -> dict[str, Any]:
    """Train (or resume) an agent; returns the contents of ``run.json``.

    ``curves``: an :class:`agents.curves.CurveSetup` (the benchmark's tasks and the hindsight
    search, which live above this layer; ``llmsched train`` passes them), or ``None``.

    The steps: resolve the hyperparameters (:func:`resolve`, :func:`recipe`); make the run folder;
    the training envs (:func:`training_venv`, workloads from seed ``TRAIN_SEED_BASE + 1000 * seed``
    on); the model (:func:`_model`: new or resumed); behaviour cloning (:func:`_warm_start`);
    ``run.json`` with the settings and seeds, written first so that the checkpoints of an
    interrupted run can be evaluated; the callbacks (scalars, checkpoints, validation scores
    against the baselines, time limit, progress) and the learning curve (:mod:`agents.curves`);
    ``model.learn``; the final files and scores.
    """
    import torch
    from stable_baselines3.common.callbacks import CallbackList

    t0 = time.perf_counter()
    torch.set_num_threads(max(1, cfg.torch_threads))
    hp = resolve(cfg)
    env_kwargs = hp["env_kwargs"]
    chosen = recipe(cfg, hp)
    print(recipe_line(chosen), flush=True)
    line, workload = workload_line(cfg.scenario, env_kwargs.get("overrides", {}))
    print(line, flush=True)
    name, run_dir = _run_dir(cfg, env_kwargs)
    if cfg.vec not in VEC_KINDS:
        raise ConfigError(f"vec: {cfg.vec!r} is not one of {', '.join(VEC_KINDS)}")
    n_envs = int(hp.get("n_envs", 1))
    base = TRAIN_SEED_BASE + 1000 * cfg.seed
    envs, extra = _training_envs(cfg, hp, n_envs, base)
    model, venv = _model(cfg, hp, envs, run_dir, extra)
    bc = _warm_start(cfg, hp, model, venv, base + 500)
    meta = {**_start_meta(cfg, hp, chosen, name, n_envs, base, bc), "workload": workload}
    (run_dir / "run.json").write_text(json.dumps(meta, indent=2, default=float) + "\n")

    baselines, val_env, curve, tgt = _validation_setup(cfg, hp, run_dir, curves)
    if curve is not None and workload["synthetic"]:
        curve.note = " (synthetic stand-in)"

    def evaluate(m: Any) -> dict:
        s = run_episode(Agent(name, m, venv, env_kwargs), val_env, VALIDATION_SEED)[0]
        if curve is not None:  # learning_curve.png, curve.json, tb/curves
            curve.record(int(m.num_timesteps), s)
        return s

    def save(stem: str) -> None:
        save_agent(run_dir / stem, model, venv, {"scenario": cfg.scenario, "env_kwargs": env_kwargs,
                                                 "overrides": env_kwargs.get("overrides", {})})

    callbacks, summaries, score, limit = _callbacks(cfg, bc, evaluate, save, baselines, t0, tgt)
    if extra:
        from agents.input_baseline import CoverageScalar

        callbacks.append(CoverageScalar())
    total = int(hp["n_timesteps"])
    remaining = total - model.num_timesteps if cfg.resume else total
    if not cfg.resume:
        # the untrained starting policy (action bias, clone): the benchmark scores it beside the agent,
        # so that learning is credited only with what training added
        save("start")
        if curve is not None:
            evaluate(model)  # the curve's first point: the start
    t_learn, c_learn = time.perf_counter(), time.process_time()
    if remaining > 0:
        with _unchecked_distributions(is_maskable(model)):
            model.learn(remaining, callback=CallbackList(callbacks), reset_num_timesteps=not cfg.resume,
                        tb_log_name="ppo")
    learn_s, learn_cpu_s = time.perf_counter() - t_learn, time.process_time() - c_learn
    save("model")
    if not (run_dir / "best_model.json").exists():
        save("best_model")
    final = evaluate(model) if cfg.score_every else {}
    if curve is not None:
        curve.close()
    model.logger.close()  # SB3's TensorBoard writer (it flushes after every dump; this ends its thread)
    venv.close()
    val_env.close()
    meta.update({
        "status": "done", "timesteps": int(model.num_timesteps),
        "validation": {**_validation(baselines, final, score), "curve": curve.as_dict() if curve is not None else None},
        "episodes": summaries.n_episodes, "stopped_by_time_limit": bool(limit is not None and limit.stopped),
        "learn_wall_s": learn_s, "learn_cpu_s": learn_cpu_s, "wall_s": time.perf_counter() - t0,
    })
    (run_dir / "run.json").write_text(json.dumps(meta, indent=2, default=float) + "\n")
    return meta
