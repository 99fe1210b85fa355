"""Input-dependent baselines for PPO: several rollouts on the same workload (``input_baseline`` in a recipe).

In a scheduling env most of the return's variance comes from the workload (the arrival sequence
and the request sizes), not from the agent: a busy workload gives a low return whatever the
agent does. A state-value critic cannot know the future arrivals, so its advantage estimates
carry that noise. Mao et al., "Variance Reduction for Reinforcement Learning in Input-Driven
Environments" (ICLR 2019, Section 4) show that a baseline may depend on the state *and on the
future input sequence* without biasing the policy gradient, and give a practical form: run
several rollouts on the same input sequence and use, at each time, the mean return of the other
rollouts at that time. Decima (Mao et al., SIGCOMM 2019, Section 5.3) trains this way, with all
parallel rollouts of an iteration sharing one job arrival sequence and the baseline interpolated
at equal wall-clock time.

Here:

* :class:`GroupSeeds` gives the native vector env's ``n_envs`` simulations ``n_envs / group_size``
  groups: the ``j``-th episode of every member of group ``g`` runs workload seed ``base + g +
  n_groups j`` (the same arrivals and requests); it records each env's current seed;
* :class:`InputBaselineBuffer` (PPO's ``rollout_buffer_class``) records, for every step, the
  simulated time at the decision and the workload seed, and replaces PPO's critic advantage by
  ``R_i(t) - b_i(t)``, where ``R_i(t)`` is the step's lambda-return (SB3's GAE return, bootstrapped
  by the critic at the rollout's end as usual) and ``b_i(t)`` the mean, over the *other* rollouts
  of the same workload, of their return-to-go interpolated at the same simulated time (the time,
  not the step index: rollouts that act differently take different numbers of steps to reach a
  given moment of the workload). Peers' returns from earlier rollouts of the same episode are
  kept (:class:`ReturnCurves`), so a rollout that runs behind its group still finds a baseline;
  where no peer covers the moment (the leader of its group, the first steps of a rollout buffer)
  the critic's GAE advantage is kept. The share of steps with an input-dependent baseline is
  logged as ``train/input_baseline_coverage``.

Leaving the rollout itself out of the mean keeps the baseline independent of its own actions
(unbiased, as in Kool et al., "Buy 4 REINFORCE Samples, Get a Baseline for Free!", ICLR 2019
workshop); with equal times the mean over all ``n`` rollouts would give the same advantages scaled
by ``(n - 1) / n``, which PPO's advantage normalisation removes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from stable_baselines3.common.buffers import DictRolloutBuffer, RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnvWrapper


@dataclass
class GroupSeeds:
    """Workload seeds shared by groups of envs: episode ``j`` of env ``rank`` runs seed ``base +
    rank // group_size + n_groups j``, so the members of a group run the same workloads in the same
    order. ``current[rank]``: the seed of the env's current episode (``-1`` before its first reset).

    :param base: the first seed.
    :param n_envs: number of envs (a multiple of ``group_size``).
    :param group_size: envs per group (>= 2: one rollout has no peer to compare with).
    """

    base: int
    n_envs: int
    group_size: int
    current: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2:
            raise ValueError(f"input_baseline.group_size: expected an integer >= 2, got {self.group_size!r}")
        if self.n_envs % self.group_size:
            raise ValueError(f"input_baseline.group_size: n_envs ({self.n_envs}) must be a multiple of the group "
                             f"size ({self.group_size})")
        self.current = np.full(self.n_envs, -1, np.int64)

    @property
    def n_groups(self) -> int:
        return self.n_envs // self.group_size

    def group(self, rank: int) -> int:
        return rank // self.group_size

    def __call__(self, rank: int, episode: int) -> int:
        seed = self.base + self.group(rank) + self.n_groups * episode
        self.current[rank] = seed
        return seed


class ReturnCurves:
    """Per workload seed and env, the return-to-go of every step seen so far, as points
    ``(simulated time at the decision, return)`` in time order; read by linear interpolation."""

    def __init__(self) -> None:
        self.points: dict[int, dict[int, tuple[list[np.ndarray], list[np.ndarray]]]] = {}

    def add(self, seed: int, env: int, times: np.ndarray, returns: np.ndarray) -> None:
        ts, rs = self.points.setdefault(int(seed), {}).setdefault(int(env), ([], []))
        ts.append(np.asarray(times, float))
        rs.append(np.asarray(returns, float))

    def curve(self, seed: int, env: int) -> tuple[np.ndarray, np.ndarray]:
        ts, rs = self.points[seed][env]
        return np.concatenate(ts), np.concatenate(rs)

    def peers(self, seed: int, env: int) -> list[int]:
        return [k for k in self.points.get(int(seed), {}) if k != env]

    def forget(self, keep: Any) -> None:
        """Drop the seeds for which ``keep(seed)`` is false."""
        for seed in [s for s in self.points if not keep(s)]:
            del self.points[seed]


def input_baseline(returns: np.ndarray, times: np.ndarray, seeds: np.ndarray,
                   curves: ReturnCurves | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The input-dependent baseline of every step of a rollout buffer.

    :param returns: ``(T, N)`` return-to-go of step ``t`` of env ``i``.
    :param times: ``(T, N)`` simulated time at each step's decision (non-decreasing within an episode).
    :param seeds: ``(T, N)`` workload seed of each step's episode (envs sharing a seed share the input).
    :param curves: the return curves of earlier buffers (updated with this one); ``None``: this buffer only.
    :returns: ``(baseline, covered)``: per step the mean over the other envs that ran the same seed
        of their return interpolated at the step's time, and whether at least one such env covers
        that time (where not, ``baseline`` is 0).
    """
    returns = np.asarray(returns, float)
    T, N = returns.shape
    curves = curves if curves is not None else ReturnCurves()
    for i in range(N):  # the segments of each env: runs of equal seeds
        s = seeds[:, i]
        cuts = [0, *np.flatnonzero(s[1:] != s[:-1]) + 1, T]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            curves.add(int(s[a]), i, times[a:b, i], returns[a:b, i])
    base = np.zeros((T, N))
    count = np.zeros((T, N))
    for i in range(N):
        for seed in np.unique(seeds[:, i]):
            rows = np.flatnonzero(seeds[:, i] == seed)
            tau = times[rows, i]
            for k in curves.peers(int(seed), i):
                t_k, r_k = curves.curve(int(seed), k)
                inside = (tau >= t_k[0]) & (tau <= t_k[-1])
                if inside.any():
                    base[rows[inside], i] += np.interp(tau[inside], t_k, r_k)
                    count[rows[inside], i] += 1
    covered = count > 0
    base[covered] /= count[covered]
    return base, covered


class InputBaselineMixin:
    """Rollout-buffer behaviour of :class:`InputBaselineBuffer` (plain or ``Dict`` observations).

    :param clock: the :class:`DecisionClock` around the training envs (the time and seed of every step).
    :param group_seeds: the envs' :class:`GroupSeeds`.
    """

    def _init_input(self, clock: DecisionClock, group_seeds: GroupSeeds) -> None:
        self.clock = clock
        self.group_seeds = group_seeds
        self.curves = ReturnCurves()
        self.last_coverage = float("nan")

    def reset(self) -> None:
        super().reset()  # type: ignore[misc]
        self.times = np.zeros((self.buffer_size, self.n_envs))  # type: ignore[attr-defined]
        self.seeds = np.zeros((self.buffer_size, self.n_envs), np.int64)  # type: ignore[attr-defined]

    def add(self, *args: Any, **kwargs: Any) -> None:
        pos = self.pos  # type: ignore[attr-defined]
        self.times[pos] = self.clock.times
        self.seeds[pos] = self.clock.seeds
        super().add(*args, **kwargs)  # type: ignore[misc]

    def compute_returns_and_advantage(self, last_values: Any, dones: np.ndarray) -> None:
        super().compute_returns_and_advantage(last_values, dones)  # type: ignore[misc]
        base, covered = input_baseline(self.returns, self.times, self.seeds, self.curves)
        self.advantages = np.where(covered, self.returns - base, self.advantages).astype(np.float32)
        self.last_coverage = float(covered.mean())
        gs = self.group_seeds
        lowest = {g: min(int(gs.current[r]) for r in range(gs.n_envs) if gs.group(r) == g) for g in range(gs.n_groups)}
        # a seed is needed while a member of its group has not passed it
        self.curves.forget(lambda seed: seed >= lowest[(seed - gs.base) % gs.n_groups])


class InputBaselineBuffer(InputBaselineMixin, RolloutBuffer):
    """:class:`InputBaselineMixin` over SB3's ``RolloutBuffer`` (Box observations)."""

    def __init__(self, *args: Any, clock: DecisionClock, group_seeds: GroupSeeds, **kwargs: Any) -> None:
        self._init_input(clock, group_seeds)
        super().__init__(*args, **kwargs)


class InputBaselineDictBuffer(InputBaselineMixin, DictRolloutBuffer):
    """:class:`InputBaselineMixin` over SB3's ``DictRolloutBuffer`` (the env's ``Dict`` observations)."""

    def __init__(self, *args: Any, clock: DecisionClock, group_seeds: GroupSeeds, **kwargs: Any) -> None:
        self._init_input(clock, group_seeds)
        super().__init__(*args, **kwargs)


def buffer_class(observation_space: Any, maskable: bool) -> type:
    """The input-baseline rollout buffer for an observation space and algorithm."""
    from gymnasium import spaces

    if maskable:
        from sb3_contrib.common.maskable.buffers import MaskableDictRolloutBuffer, MaskableRolloutBuffer

        base = MaskableDictRolloutBuffer if isinstance(observation_space, spaces.Dict) else MaskableRolloutBuffer

        class Maskable(InputBaselineMixin, base):  # type: ignore[valid-type, misc]
            def __init__(self, *args: Any, clock: DecisionClock, group_seeds: GroupSeeds, **kwargs: Any) -> None:
                self._init_input(clock, group_seeds)
                super().__init__(*args, **kwargs)

        return Maskable
    return InputBaselineDictBuffer if isinstance(observation_space, spaces.Dict) else InputBaselineBuffer


class DecisionClock(VecEnvWrapper):
    """Wraps the native vector env (:class:`agents.vec.NativeVecEnv`) and, before every step,
    records each simulation's clock (simulated seconds) and workload seed: the decision the step's
    action makes is taken at ``times[i]`` on workload ``seeds[i]``."""

    def __init__(self, venv: Any, group_seeds: GroupSeeds) -> None:
        super().__init__(venv)
        self.group_seeds = group_seeds
        self.times = np.zeros(venv.num_envs)
        self.seeds = np.zeros(venv.num_envs, np.int64)

    def reset(self) -> Any:
        return self.venv.reset()

    def step_async(self, actions: np.ndarray) -> None:
        self.times = np.array([e.engine.clock for e in self.venv.venv.envs], float)
        self.seeds = self.group_seeds.current.copy()
        self.venv.step_async(actions)

    def step_wait(self) -> Any:
        return self.venv.step_wait()


class CoverageScalar(BaseCallback):
    """Logs ``train/input_baseline_coverage``: the share of the last rollout's steps whose advantage
    used the input-dependent baseline (the rest kept the critic's)."""

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        cov = getattr(self.model.rollout_buffer, "last_coverage", None)
        if cov is not None:
            self.logger.record("train/input_baseline_coverage", cov)


INPUT_BASELINE_KEYS = ("group_size",)


def input_baseline_venv(scenario: str, env_kwargs: dict, n_envs: int, base: int, group_size: int
                        ) -> tuple[DecisionClock, GroupSeeds]:
    """The training envs for an ``input_baseline`` recipe: a native vector env whose groups of
    ``group_size`` envs share workload seeds, wrapped in a :class:`DecisionClock`."""
    from agents.vec import NativeVecEnv

    seeds = GroupSeeds(base, n_envs, group_size)
    return DecisionClock(NativeVecEnv(scenario, env_kwargs, n_envs, episode_seeds=seeds), seeds), seeds


def check_input_baseline(spec: Any, n_envs: int, vec: str, path: str = "input_baseline") -> int | None:
    """The group size of a recipe's ``input_baseline`` entry (``{group_size: G}``; ``None``/absent:
    off), checked against ``n_envs`` and the vector env kind (one-line ValueError)."""
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) - set(INPUT_BASELINE_KEYS):
        raise ValueError(f"{path}: expected {{group_size: G}} with G >= 2 dividing n_envs, got {spec!r}")
    g = spec.get("group_size")
    if isinstance(g, bool) or not isinstance(g, int) or g < 2 or n_envs % g:
        raise ValueError(f"{path}.group_size: expected an integer >= 2 that divides n_envs ({n_envs}), got {g!r}")
    if vec != "native":
        raise ValueError(f"{path}: needs the native vector env (--vec native), not {vec!r}")
    return g


def input_baseline_setup(spec: dict[str, Any], vec: str, scenario: str, env_kwargs: dict, n_envs: int, base: int,
                         maskable: bool) -> tuple[DecisionClock, dict[str, Any]]:
    """For ``llmsched train``: the training envs of a recipe with ``input_baseline: {group_size: G}``
    and the PPO keyword arguments that install :class:`InputBaselineMixin`'s buffer."""
    g = check_input_baseline(spec, n_envs, vec)
    clock, seeds = input_baseline_venv(scenario, env_kwargs, n_envs, base, g)
    cls = buffer_class(clock.observation_space, maskable)
    return clock, {"rollout_buffer_class": cls, "rollout_buffer_kwargs": {"clock": clock, "group_seeds": seeds}}


__all__ = ("GroupSeeds", "ReturnCurves", "input_baseline", "InputBaselineBuffer", "InputBaselineDictBuffer",
           "DecisionClock", "CoverageScalar", "buffer_class", "input_baseline_venv", "input_baseline_setup",
           "check_input_baseline")
