"""Stable-Baselines3's ``VecEnv`` over the native vector env (``llmsched train --vec native``).

:class:`NativeVecEnv` drives :class:`~llmsched_gym.env.vector.LLMSchedVectorEnv` in its
``SAME_STEP`` autoreset mode, which is SB3's convention: an ending step returns the next
episode's first observation, with the last one in ``info["terminal_observation"]`` and
``info["TimeLimit.truncated"]`` set when the episode was truncated rather than terminated (SB3
bootstraps those). It returns exactly what ``DummyVecEnv`` over ``Monitor``-wrapped single envs
returns (observations, float32 rewards, dones), so training on it is the same computation, only
cheaper: no wrappers, no per-env info dicts during an episode, and
``env_method("action_masks")`` (what sb3-contrib's ``get_action_masks`` and ``MaskablePPO`` call)
returns the whole batch's masks from one call.

Infos are ``{}`` during an episode; at its end they hold ``summary`` and ``episode_stats`` (the
single env's), ``episode`` (``r``, ``l``, ``t``: what SB3's ``Monitor`` writes, so
``rollout/ep_rew_mean`` is logged), ``terminal_observation`` and ``TimeLimit.truncated``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvStepReturn

from llmsched_gym.env.vector import MAX_EPISODE_STEPS, LLMSchedVectorEnv


class NativeVecEnv(VecEnv):
    """SB3 ``VecEnv`` of ``n_envs`` LLMSched-v1 simulations in this process.

    :param scenario: the scenario (name, file or dict).
    :param env_kwargs: the single env's keyword arguments (``action_mode``, ``K``, ``overrides``...).
    :param n_envs: number of simulations.
    :param episode_seeds: ``(env index, episode number) -> workload seed`` for every reset
        (``None``: the envs' own generators, seeded by :meth:`seed`).
    :param max_episode_steps: the step limit of an episode (``gymnasium.make``'s by default).
    """

    def __init__(self, scenario: str | dict, env_kwargs: dict[str, Any], n_envs: int,
                 episode_seeds: Callable[[int, int], int] | None = None,
                 max_episode_steps: int | None = MAX_EPISODE_STEPS) -> None:
        kw = dict(env_kwargs)
        kw.pop("max_episode_steps", None)
        self.venv = LLMSchedVectorEnv(n_envs, scenario, autoreset_mode=AutoresetMode.SAME_STEP,
                                      episode_seeds=episode_seeds, max_episode_steps=max_episode_steps, **kw)
        self.render_mode = None
        super().__init__(n_envs, self.venv.single_observation_space, self.venv.single_action_space)
        self._actions: np.ndarray | None = None
        self._wall0 = [time.perf_counter()] * n_envs

    # -- VecEnv API ---------------------------------------------------------------------------
    def reset(self):
        seeds = [s if s is None else int(s) for s in self._seeds]
        obs, _ = self.venv.reset(seed=seeds if any(s is not None for s in seeds) else None)
        self._wall0 = [time.perf_counter()] * self.num_envs
        self._reset_seeds()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        v = self.venv
        ends, finals = v.step_arrays(self._actions)
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        last = {i: obs for i, obs, _ in finals}
        now = time.perf_counter()
        for i, info in ends:
            out = infos[i]
            stats = info.get("episode_stats")
            if "summary" in info:
                out["summary"] = info["summary"]
            if stats is not None:
                out["episode_stats"] = stats
                out["episode"] = {"r": round(stats["r"], 6), "l": stats["l"], "t": round(now - self._wall0[i], 6)}
            out["TimeLimit.truncated"] = bool(v.truncations[i] and not v.terminations[i])
            out["terminal_observation"] = last[i]
            self._wall0[i] = now
        return (v.observations(), v.rewards.astype(np.float32), v.terminations | v.truncations, infos)

    def close(self) -> None:
        self.venv.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        envs = self._envs(indices)
        return [getattr(e, attr_name) for e in envs]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        for e in self._envs(indices):
            setattr(e, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        """Call ``method_name`` on the envs; ``"action_masks"`` returns every env's mask from the
        batch array, computed once per step."""
        if method_name == "action_masks" and not method_args and not method_kwargs:
            masks = self.venv.action_masks()
            return list(masks[self._indices(indices)])
        return [getattr(e, method_name)(*method_args, **method_kwargs) for e in self._envs(indices)]

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        return [False] * len(self._indices(indices))

    def get_images(self) -> Sequence[np.ndarray | None]:
        return [None] * self.num_envs

    # -- helpers ------------------------------------------------------------------------------
    def _indices(self, indices: VecEnvIndices) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        if isinstance(indices, int | np.integer):
            return [int(indices)]
        return [int(i) for i in indices]

    def _envs(self, indices: VecEnvIndices) -> list[Any]:
        return [self.venv.envs[i] for i in self._indices(indices)]


__all__ = ["NativeVecEnv"]
