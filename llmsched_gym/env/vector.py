"""A native vector env: ``N`` simulations of ``LLMSched-v1`` stepped in one process.

``gymnasium.make_vec("llmsched_gym:LLMSched-v1", num_envs=N, vectorization_mode="vector_entry_point",
scenario=..., action_mode=...)`` returns a :class:`LLMSchedVectorEnv`. It holds ``N``
:class:`~llmsched_gym.env.llmsched_env.LLMSchedEnv` instances (the single env, unchanged) and writes
their observations, rewards, terminations, truncations and action masks into arrays allocated
once, so that a learner runs one forward pass of its policy per ``N`` steps. Compared with
``SyncVectorEnv`` over ``gymnasium.make``, a step skips the wrappers (``TimeLimit``,
``OrderEnforcing``, the passive checker: the step limit is counted here) and the per-env info
dicts: the infos are batched arrays built directly.

Every observation, reward, termination, truncation and mask equals the single env's stepped with
the same actions and seeds (``tests/test_vector_env.py`` checks it bit for bit).

**Seeds.** ``reset(seed=s)`` seeds env ``i`` with ``s + i`` (as ``SyncVectorEnv`` does) or with
``s[i]`` for a list; an automatic reset draws the episode seed from the env's own generator,
unless ``episode_seeds`` is given: a function ``(env index, episode number) -> seed`` used for
every reset, the first included (``llmsched train`` uses it to keep training workloads disjoint
from the held-out seeds).

**Autoreset** (``autoreset_mode``, Gymnasium's :class:`~gymnasium.vector.AutoresetMode`):

* ``NEXT_STEP`` (Gymnasium's default): the step that ends an episode returns its last
  observation; the next step resets that env, ignores its action and returns reward 0.
* ``SAME_STEP`` (Stable-Baselines3's convention): the step that ends an episode resets the env at
  once and returns the first observation of the next episode; the last one is in
  ``infos["final_obs"]`` and the ending step's info in ``infos["final_info"]``.

**Infos**, batched as Gymnasium batches them (arrays with a boolean ``"_key"`` array telling which
envs hold a value): ``action_mask`` (``(N, n)`` int8, every step), ``invalid_actions`` and
``clock_s`` (``(N,)``), ``reward_components`` (a dict of ``(N,)`` arrays), and at the end of an
episode ``summary`` and ``episode_stats`` (object arrays). :meth:`action_masks` returns the
masks of the current observations as one ``(N, n)`` bool array.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from llmsched_gym.config import ConfigError
from llmsched_gym.env import MAX_EPISODE_STEPS
from llmsched_gym.env.llmsched_env import LLMSchedEnv
from llmsched_gym.env.modes import rank_scores


def _mask_len(env: LLMSchedEnv) -> int:
    """Length of ``env.action_masks()`` in its action mode (see the env's **Masks**)."""
    space = env.action_space
    if env.mode == "select" or env.mode == "meta":
        return int(space.n)
    if env.mode == "subset":
        return 2 * env.K
    return env.K


class LLMSchedVectorEnv(VectorEnv):
    """``num_envs`` copies of ``LLMSched-v1`` stepped in this process (see the module docstring).

    :param num_envs: number of simulations ``N``.
    :param scenario: the scenario, as for the single env; every other keyword argument of
        :class:`~llmsched_gym.env.llmsched_env.LLMSchedEnv` (``action_mode``, ``K``, ``reward``,
        ``overrides``, ...) applies to every copy.
    :param max_episode_steps: step limit of an episode (the registered one by default): the step
        that reaches it is truncated, as ``gymnasium.make``'s ``TimeLimit`` does.
    :param autoreset_mode: ``NEXT_STEP`` (default) or ``SAME_STEP`` (an ``AutoresetMode`` or its
        value, ``"NextStep"``/``"SameStep"``).
    :param episode_seeds: ``(env index, episode number) -> workload seed`` for every reset; by
        default ``reset(seed=...)`` and the env's own generator decide.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 2, scenario: str | dict = "jaillet-high", *,
                 max_episode_steps: int | None = MAX_EPISODE_STEPS,
                 autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
                 episode_seeds: Callable[[int, int], int] | None = None, **env_kwargs: Any) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int | np.integer) or num_envs < 1:
            raise ConfigError(f"num_envs: must be an integer >= 1, got {num_envs!r}")
        try:
            mode = AutoresetMode(autoreset_mode)
        except ValueError:
            mode = None
        if mode not in (AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP):
            raise ConfigError(f"autoreset_mode: {autoreset_mode!r} is not one of NextStep, SameStep")
        if max_episode_steps is not None and (isinstance(max_episode_steps, bool) or max_episode_steps < 1):
            raise ConfigError(f"max_episode_steps: must be an integer >= 1 or None, got {max_episode_steps!r}")
        if env_kwargs.get("render_mode") is not None:
            raise ConfigError("render_mode: the vector env does not render (use the single env)")
        self.num_envs = n = int(num_envs)
        self.envs = [LLMSchedEnv(scenario, **env_kwargs) for _ in range(n)]
        self.metadata = {**type(self).metadata, "autoreset_mode": mode}
        self.autoreset_mode = mode
        self.max_episode_steps = max_episode_steps
        self.episode_seeds = episode_seeds
        first = self.envs[0]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(first.observation_space, n)
        self.action_space = batch_space(first.action_space, n)
        self.flat = first.flat
        # every env writes its observation (the flat layout) into its row of one batch array; the
        # Dict parts are column blocks of it
        builder = first._obs
        self._obs = np.zeros((n, builder.size), np.float32)
        self._rows = list(self._obs)
        where = dict(builder.parts)
        self._parts = [] if self.flat else [(name, where[name]) for name in first.observation_space.spaces]
        self._rewards = np.zeros(n, np.float64)
        self._terminated = np.zeros(n, bool)
        self._truncated = np.zeros(n, bool)
        self._masks = np.zeros((n, _mask_len(first)), bool)
        self._invalid = np.zeros(n, np.int64)
        self._clock = np.zeros(n, np.float64)
        self._comp_names = ("latency", "throughput", "eviction", "slo", "fairness")
        self._comps: dict[str, np.ndarray] = {}
        # per-env counters as lists (cheaper than numpy scalars in the step loop)
        self._steps = [0] * n  # steps of the current episodes (the step limit)
        self._episodes = [0] * n  # resets so far, per env (episode_seeds' counter)
        self._needs_reset = [False] * n  # NEXT_STEP: ended at the last step
        self._rank = first.mode == "priority"
        self._k = first.K  # scores per row of a priority action
        self._no_rank = [None] * n
        self._started = False
        self._masks_fresh = False
        self.closed = False

    # ------------------------------------------------------------------------------------------
    def _write_obs(self, i: int, env: LLMSchedEnv) -> None:
        env._obs.observe(env.driver.recent, out=self._rows[i])

    def _batch_obs(self):
        if self.flat:
            return self._obs.copy()
        return {name: self._obs[:, part].copy() for name, part in self._parts}

    def _obs_row(self, i: int):
        if self.flat:
            return self._obs[i].copy()
        return {name: self._obs[i, part].copy() for name, part in self._parts}

    def _reset_one(self, i: int, seed: int | None, options: dict | None) -> dict[str, Any]:
        if self.episode_seeds is not None:
            seed = int(self.episode_seeds(i, self._episodes[i]))
        self._episodes[i] += 1
        self._steps[i] = 0
        self._needs_reset[i] = False
        env = self.envs[i]
        _, info = env.reset(seed=seed, options=options)
        self._write_obs(i, env)
        return info

    def _row_info(self, i: int, info: dict[str, Any]) -> None:
        """Write env ``i``'s per-step info into the batched arrays."""
        self._invalid[i] = info["invalid_actions"]
        self._clock[i] = info["clock_s"]
        comps = info["reward_components"]
        for name, value in comps.items():
            arr = self._comps.get(name)
            if arr is None:
                arr = self._comps[name] = np.zeros(self.num_envs, np.float64)
            arr[i] = value

    # ------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        """Reset every env (``seed``: an int seeds env ``i`` with ``seed + i``, a list one seed
        each); returns the batched observations and infos."""
        n = self.num_envs
        if seed is None or isinstance(seed, int | np.integer):
            seeds = [None if seed is None else int(seed) + i for i in range(n)]
        else:
            seeds = list(seed)
            if len(seeds) != n:
                raise ConfigError(f"seed: expected {n} seeds (one per env), got {len(seeds)}")
        self._comps = {}
        self._masks_fresh = False
        ends = []
        for i in range(n):
            info = self._reset_one(i, seeds[i], options)
            self._row_info(i, info)
            if "summary" in info:  # the episode ended during reset
                ends.append((i, info))
        self._started = True
        self._terminated[:] = False
        self._truncated[:] = False
        return self._batch_obs(), self._infos(ends, [])

    def step(self, actions):
        """Step every env with its row of ``actions``; see the module docstring for the autoreset."""
        ends, finals = self.step_arrays(actions, infos=True)
        return (self._batch_obs(), self._rewards.copy(), self._terminated.copy(), self._truncated.copy(),
                self._infos(ends, finals))

    def step_arrays(self, actions, infos: bool = False) -> tuple[list[tuple[int, dict]], list[tuple[int, Any, dict]]]:
        """Step every env, writing the observations, rewards, terminations and truncations into
        this env's arrays (read them with :meth:`observations` or through :meth:`step`); with
        ``infos`` also the per-step info arrays. Returns the envs whose episode ended (index and
        the ending step's info) and, in ``SAME_STEP`` mode, their last observations (index, last
        observation, info): what a learner's adapter needs without building batched infos."""
        if not self._started:
            raise RuntimeError("step() before reset()")
        envs, rewards, term, trunc = self.envs, self._rewards, self._terminated, self._truncated
        same_step = self.autoreset_mode is AutoresetMode.SAME_STEP
        limit = self.max_episode_steps
        steps, needs_reset = self._steps, self._needs_reset
        ends: list[tuple[int, dict]] = []
        finals: list[tuple[int, Any, dict]] = []
        self._masks_fresh = False
        # priority mode: every env's scores checked and ranked at once (the same slots in the same
        # order as each env's own step; an invalid row goes through the env's own step)
        ranked = rank_scores(actions, [len(env.dp.slots) for env in envs], self._k) if self._rank else self._no_rank
        for i in range(self.num_envs):
            env = envs[i]
            if needs_reset[i]:  # NEXT_STEP: the episode ended at the last step
                info = self._reset_one(i, None, None)
                rewards[i] = 0.0
                term[i] = trunc[i] = False
                if infos:
                    self._row_info(i, info)
                continue
            rank = ranked[i]
            r, te, tr, comps = env._step(actions[i] if rank is None else None, rank)
            steps[i] += 1
            if limit is not None and steps[i] >= limit:
                tr = True
            rewards[i], term[i], trunc[i] = r, te, tr
            if te or tr:
                info = env._info(comps)
                ends.append((i, info))
                if same_step:
                    finals.append((i, env._observe(), info))
                    info = self._reset_one(i, None, None)
                else:
                    self._write_obs(i, env)
                    needs_reset[i] = True
                if infos:
                    self._row_info(i, info)
            else:
                self._write_obs(i, env)
                if infos:
                    self._row_info(i, env._info(comps))
        return ends, finals

    def observations(self):
        """The current observations (a copy of the batch arrays)."""
        return self._batch_obs()

    @property
    def rewards(self) -> np.ndarray:
        """The last step's rewards (the array itself: it is overwritten by the next step)."""
        return self._rewards

    @property
    def terminations(self) -> np.ndarray:
        """The last step's terminations (the array itself)."""
        return self._terminated

    @property
    def truncations(self) -> np.ndarray:
        """The last step's truncations (the array itself)."""
        return self._truncated

    def _infos(self, ends: list[tuple[int, dict]], finals: list[tuple[int, Any, dict]]) -> dict[str, Any]:
        n = self.num_envs
        every = np.ones(n, bool)
        infos: dict[str, Any] = {
            "action_mask": self.action_masks().view(np.int8), "_action_mask": every,
            "invalid_actions": self._invalid.copy(), "_invalid_actions": every,
            "clock_s": self._clock.copy(), "_clock_s": every,
            "reward_components": {k: v.copy() for k, v in self._comps.items()},
            "_reward_components": every,
        }
        infos["reward_components"].update({f"_{k}": every for k in self._comps})
        if ends:
            for key in ("summary", "episode_stats"):
                vals = np.full(n, None, object)
                have = np.zeros(n, bool)
                for i, info in ends:
                    if key in info:
                        vals[i] = info[key]
                        have[i] = True
                infos[key], infos[f"_{key}"] = vals, have
        if finals:
            obs = np.full(n, None, object)
            fin = np.full(n, None, object)
            have = np.zeros(n, bool)
            for i, final, info in finals:
                obs[i], fin[i], have[i] = final, info, True
            infos["final_obs"], infos["_final_obs"] = obs, have
            infos["final_info"], infos["_final_info"] = fin, have.copy()
        return infos

    def action_masks(self) -> np.ndarray:
        """The masks of the current observations, ``(N, n)`` bool (a fresh array; the layout per
        action mode is the single env's **Masks**), computed once per step, when first asked."""
        if not self._masks_fresh:
            for i, env in enumerate(self.envs):
                self._masks[i] = env.action_masks()
            self._masks_fresh = True
        return self._masks.copy()

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call (or read) attribute ``name`` of every env; ``call("action_masks")`` returns the
        batch's masks without calling the envs."""
        if name == "action_masks":
            return tuple(self.action_masks())
        out = []
        for env in self.envs:
            attr = getattr(env, name)
            out.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(out)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env."""
        return tuple(getattr(env, name) for env in self.envs)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` of every env (``values``: one per env, or one for all)."""
        if not isinstance(values, list | tuple):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"set_attr: expected {self.num_envs} values, got {len(values)}")
        for env, v in zip(self.envs, values, strict=True):
            setattr(env, name, v)

    def close_extras(self, **kwargs: Any) -> None:
        for env in self.envs:
            env.close()


__all__ = ["LLMSchedVectorEnv", "MAX_EPISODE_STEPS"]
